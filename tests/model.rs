//! The protocol model (`model/jobs.pml`) knows every statement the crate runs: the
//! names in its `/* statements ...: NAMES */` lines (modelled, read-only, or not
//! modelled) are exactly the names of `jobs::__private::statements()`. A statement
//! added to the code must be added to the model, at least to one of its lists.

use std::collections::BTreeSet;

#[test]
fn model_lists_every_statement() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/model/jobs.pml");
    let text = std::fs::read_to_string(path).expect("model/jobs.pml is readable");
    let mut model = BTreeSet::new();
    for line in text.lines() {
        let Some(list) = line.trim().strip_prefix("/* statements ") else {
            continue;
        };
        let (_, names) = list.split_once(':').expect("a statements line has a colon");
        let names = names.trim().strip_suffix("*/").expect("one line per list");
        model.extend(names.split_whitespace().map(str::to_owned));
    }
    let code: BTreeSet<String> = jobs::__private::statements()
        .into_iter()
        .map(|(name, _)| name.to_owned())
        .collect();
    let not_in_model: Vec<_> = code.difference(&model).collect();
    let not_in_code: Vec<_> = model.difference(&code).collect();
    assert!(
        not_in_model.is_empty() && not_in_code.is_empty(),
        "statements missing from model/jobs.pml: {not_in_model:?}; \
         named in the model but not in the code: {not_in_code:?}"
    );
}
