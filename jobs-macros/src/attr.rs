//! Parsing of the `#[job(...)]` attribute into typed settings.

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprArray, ExprLit, Lit, LitBool, LitInt, LitStr};

use crate::duration::parse_millis;

/// A duration setting in whole milliseconds.
pub(crate) struct Millis {
    pub value: u64,
    /// The string it was written as.
    pub span: Span,
    /// Its text, as written (`"10m"`), for messages in the user's own units.
    pub text: String,
}

/// The lease setting.
pub(crate) enum Lease {
    Heartbeat(Millis),
    Transaction,
}

/// Everything the attribute said, each with the token it came from.
#[derive(Default)]
pub(crate) struct JobAttr {
    pub kind: Option<LitStr>,
    /// `kind` was written, even if its value was wrong: no "missing kind" error then.
    pub kind_given: bool,
    pub key: Vec<LitStr>,
    pub key_span: Option<Span>,
    pub max_attempts: Option<u32>,
    pub backoff: Option<Millis>,
    pub max_backoff: Option<Millis>,
    pub lease: Option<Lease>,
    pub cancel_on_lease_loss: Option<bool>,
    pub timeout: Option<Millis>,
    pub concurrency: Option<u32>,
    pub global_concurrency: Option<u32>,
    /// `rate = "600/1m"`: the starts, and the window.
    pub rate: Option<(u32, Millis)>,
    /// `partition = "tenant"` or `partition = ["tenant", "region"]`.
    pub partition: Vec<LitStr>,
    pub partition_span: Option<Span>,
    pub retain: Option<Millis>,
    pub every: Option<Millis>,
    pub every_span: Option<Span>,
    /// The cron expression, checked.
    pub cron: Option<LitStr>,
    /// The time zone of the cron expression, checked.
    pub timezone: Option<LitStr>,
    /// The kind's default priority, 0 to 9.
    pub priority: Option<i16>,
}

const KIND: &str = "kind";
const KEY: &str = "key";
const MAX_ATTEMPTS: &str = "max_attempts";
const BACKOFF: &str = "backoff";
const MAX_BACKOFF: &str = "max_backoff";
const LEASE: &str = "lease";
const CANCEL_ON_LEASE_LOSS: &str = "cancel_on_lease_loss";
const TIMEOUT: &str = "timeout";
const CONCURRENCY: &str = "concurrency";
const GLOBAL_CONCURRENCY: &str = "global_concurrency";
const RATE: &str = "rate";
const PARTITION: &str = "partition";
const RETAIN: &str = "retain";
const EVERY: &str = "every";
const CRON: &str = "cron";
const TIMEZONE: &str = "timezone";
const PRIORITY: &str = "priority";

/// Each key with an example of its value, shown when the value is wrong or missing.
const EXAMPLES: &[(&str, &str)] = &[
    (KIND, "kind = \"session.delete\""),
    (
        KEY,
        "key = \"session_id\" or key = [\"tenant\", \"session_id\"]",
    ),
    (MAX_ATTEMPTS, "max_attempts = 5"),
    (BACKOFF, "backoff = \"1s\""),
    (MAX_BACKOFF, "max_backoff = \"1h\""),
    (LEASE, "lease = \"30s\" or lease = \"transaction\""),
    (CANCEL_ON_LEASE_LOSS, "cancel_on_lease_loss = false"),
    (TIMEOUT, "timeout = \"5m\""),
    (CONCURRENCY, "concurrency = 4"),
    (GLOBAL_CONCURRENCY, "global_concurrency = 8"),
    (RATE, "rate = \"600/1m\""),
    (
        PARTITION,
        "partition = \"tenant\" or partition = [\"tenant\", \"region\"]",
    ),
    (RETAIN, "retain = \"7d\""),
    (EVERY, "every = \"10m\""),
    (CRON, "cron = \"0 3 * * *\""),
    (TIMEZONE, "timezone = \"Europe/Paris\""),
    (PRIORITY, "priority = 2"),
];

/// Durations that make no sense at zero: a lease that is over at once, a handler
/// cancelled at once, a period of nothing.
const NONZERO: &[&str] = &[LEASE, TIMEOUT, EVERY];

const KEYS: &[&str] = &[
    KIND,
    KEY,
    MAX_ATTEMPTS,
    BACKOFF,
    MAX_BACKOFF,
    LEASE,
    CANCEL_ON_LEASE_LOSS,
    TIMEOUT,
    CONCURRENCY,
    GLOBAL_CONCURRENCY,
    RATE,
    PARTITION,
    RETAIN,
    EVERY,
    CRON,
    TIMEZONE,
    PRIORITY,
];

/// Collects errors so that one compile shows every mistake.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }
    pub fn finish(self) -> Result<(), syn::Error> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Reads every `#[job(...)]` attribute of the item.
pub(crate) fn parse(attrs: &[Attribute], errors: &mut Errors) -> JobAttr {
    let mut out = JobAttr::default();
    let mut seen: Vec<String> = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("job")) {
        let result = attr.parse_nested_meta(|meta| {
            let ident = meta
                .path
                .segments
                .iter()
                .map(|s| s.ident.to_string())
                .collect::<Vec<_>>()
                .join("::");
            if !KEYS.contains(&ident.as_str()) {
                skip_value(&meta)?;
                errors.push(meta.error(unknown_key_message(&ident)));
                return Ok(());
            }
            if seen.contains(&ident) {
                errors.push(meta.error(format!("duplicate job attribute `{ident}`")));
            }
            seen.push(ident.clone());
            if ident == KIND {
                out.kind_given = true;
            }
            if !meta.input.peek(syn::Token![=]) {
                // `#[job(kind)]` or `#[job(max_attempts(5))]`: say what the value looks like.
                skip_value(&meta)?;
                let example = example(&ident);
                errors.push(meta.error(format!("expected a value: {example}")));
                return Ok(());
            }
            let value = ungroup(meta.value()?.parse()?);
            match ident.as_str() {
                // #[job(kind = "session.delete")]
                KIND => match string(&value, example(KIND)) {
                    Ok(lit) if lit.value().is_empty() => errors.push(syn::Error::new(
                        lit.span(),
                        "the job kind must not be empty",
                    )),
                    Ok(lit) if lit.value().contains('\0') => errors.push(syn::Error::new(
                        lit.span(),
                        "the job kind must not contain a NUL character",
                    )),
                    Ok(lit) => out.kind = Some(lit),
                    Err(e) => errors.push(e),
                },
                // #[job(key = "session_id")] or #[job(key = ["tenant", "session_id"])]
                KEY => {
                    out.key_span = Some(value.span());
                    match key_fields(&value, KEY) {
                        Ok(fields) => out.key = fields,
                        Err(e) => errors.push(e),
                    }
                }
                // #[job(max_attempts = 5)]
                MAX_ATTEMPTS => match positive(&value, example(MAX_ATTEMPTS)) {
                    Ok(n) => out.max_attempts = Some(n),
                    Err(e) => errors.push(e),
                },
                // #[job(backoff = "1s")]
                BACKOFF => out.backoff = duration(&value, BACKOFF, errors),
                // #[job(max_backoff = "1h")]
                MAX_BACKOFF => out.max_backoff = duration(&value, MAX_BACKOFF, errors),
                // #[job(lease = "30s")] or #[job(lease = "transaction")]
                LEASE => match string(&value, example(LEASE)) {
                    Ok(lit) if lit.value() == "transaction" => out.lease = Some(Lease::Transaction),
                    Ok(lit)
                        if !lit
                            .value()
                            .trim_start()
                            .starts_with(|c: char| c.is_ascii_digit()) =>
                    {
                        errors.push(syn::Error::new(
                            lit.span(),
                            format!("expected a duration or \"transaction\": {}", example(LEASE)),
                        ));
                    }
                    Ok(_) => {
                        out.lease = duration(&value, LEASE, errors).map(Lease::Heartbeat);
                    }
                    Err(e) => errors.push(e),
                },
                // #[job(cancel_on_lease_loss = false)]
                CANCEL_ON_LEASE_LOSS => match &value {
                    Expr::Lit(ExprLit {
                        lit: Lit::Bool(LitBool { value, .. }),
                        ..
                    }) => out.cancel_on_lease_loss = Some(*value),
                    other => errors.push(syn::Error::new_spanned(
                        other,
                        format!(
                            "expected `true` or `false`: {}",
                            example(CANCEL_ON_LEASE_LOSS)
                        ),
                    )),
                },
                // #[job(timeout = "5m")]
                TIMEOUT => out.timeout = duration(&value, TIMEOUT, errors),
                // #[job(concurrency = 4)]
                CONCURRENCY => match positive(&value, example(CONCURRENCY)) {
                    Ok(n) => out.concurrency = Some(n),
                    Err(e) => errors.push(e),
                },
                // #[job(global_concurrency = 8)]
                GLOBAL_CONCURRENCY => match positive(&value, example(GLOBAL_CONCURRENCY)) {
                    Ok(n) => out.global_concurrency = Some(n),
                    Err(e) => errors.push(e),
                },
                // #[job(rate = "600/1m")]
                RATE => match string(&value, example(RATE)) {
                    Ok(lit) => match rate(&lit) {
                        Ok(rate) => out.rate = Some(rate),
                        Err(e) => errors.push(e),
                    },
                    Err(e) => errors.push(e),
                },
                // #[job(partition = "tenant")] or #[job(partition = ["tenant", "region"])]
                PARTITION => {
                    out.partition_span = Some(value.span());
                    match key_fields(&value, PARTITION) {
                        Ok(fields) => out.partition = fields,
                        Err(e) => errors.push(e),
                    }
                }
                // #[job(retain = "7d")]
                RETAIN => out.retain = duration(&value, RETAIN, errors),
                // #[job(every = "10m")]
                EVERY => {
                    out.every_span = Some(value.span());
                    out.every = duration(&value, EVERY, errors);
                }
                // #[job(cron = "0 3 * * *")]
                CRON => match string(&value, example(CRON)) {
                    Ok(lit) => match <croner::Cron as std::str::FromStr>::from_str(&lit.value()) {
                        Ok(_) => out.cron = Some(lit),
                        Err(e) => errors.push(syn::Error::new(
                            lit.span(),
                            format!(
                                "not a cron expression{} ({e}): five fields (minute hour day-of-month month day-of-week), or six with seconds first, e.g. {}",
                                bad_cron_field(&lit.value())
                                    .map(|(name, field)| format!(": its {name} field `{field}` is not valid"))
                                    .unwrap_or_default(),
                                example(CRON)
                            ),
                        )),
                    },
                    Err(e) => errors.push(e),
                },
                // #[job(timezone = "Europe/Paris")]
                TIMEZONE => match string(&value, example(TIMEZONE)) {
                    Ok(lit) => match <chrono_tz::Tz as std::str::FromStr>::from_str(&lit.value()) {
                        Ok(_) => out.timezone = Some(lit),
                        Err(_) => errors.push(syn::Error::new(
                            lit.span(),
                            format!(
                                "not an IANA time zone: `{}`; e.g. {}, or \"UTC\"",
                                lit.value(),
                                example(TIMEZONE)
                            ),
                        )),
                    },
                    Err(e) => errors.push(e),
                },
                // #[job(priority = 2)]
                PRIORITY => match &value {
                    Expr::Lit(ExprLit {
                        lit: Lit::Int(n), ..
                    }) if n.base10_parse::<i16>().is_ok_and(|p| (0..=9).contains(&p)) => {
                        out.priority = n.base10_parse::<i16>().ok();
                    }
                    other => errors.push(syn::Error::new_spanned(
                        other,
                        format!(
                            "expected a priority from 0 (claimed first) to 9: {}",
                            example(PRIORITY)
                        ),
                    )),
                },
                _ => unreachable!("every key in KEYS has an arm"),
            }
            Ok(())
        });
        if let Err(e) = result {
            errors.push(e);
        }
    }
    out
}

/// Consumes the value of a key that cannot be used, so that parsing goes on to the
/// next key and reports its mistakes too.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        let _: Expr = meta.value()?.parse()?;
    } else if meta.input.peek(syn::token::Paren) {
        let _: proc_macro2::TokenTree = meta.input.parse()?;
    }
    Ok(())
}

/// The expression inside the invisible groups around a value that a `macro_rules!`
/// macro passed on as an `expr` fragment: `#[job(kind = $kind)]`.
fn ungroup(mut value: Expr) -> Expr {
    while let Expr::Group(group) = value {
        value = *group.expr;
    }
    value
}

fn example(key: &str) -> &'static str {
    EXAMPLES
        .iter()
        .find(|(k, _)| *k == key)
        .map_or("", |(_, example)| example)
}

fn unknown_key_message(key: &str) -> String {
    format!(
        "unknown job attribute `{key}`; expected one of: {}",
        KEYS.join(", ")
    )
}

fn string(value: &Expr, example: &str) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s.clone()),
        other => Err(syn::Error::new_spanned(
            other,
            format!("expected a string literal: {example}"),
        )),
    }
}

fn positive(value: &Expr, example: &str) -> syn::Result<u32> {
    let err = || {
        syn::Error::new_spanned(
            value,
            format!("expected a whole number of at least 1: {example}"),
        )
    };
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(n), ..
        }) => match parse_int(n) {
            Some(v) if v >= 1 => Ok(v),
            _ => Err(err()),
        },
        _ => Err(err()),
    }
}

/// `"600/1m"`: at least one start, per a window of at least a millisecond.
fn rate(lit: &LitStr) -> syn::Result<(u32, Millis)> {
    let text = lit.value();
    let err = |why: String| syn::Error::new(lit.span(), format!("{why}: {}", example(RATE)));
    let Some((starts, per)) = text.split_once('/') else {
        return Err(err(format!(
            "`{text}` is not a rate: starts, a slash, and a window"
        )));
    };
    let starts = match starts.trim().parse::<u32>() {
        Ok(n) if n >= 1 => n,
        _ => {
            return Err(err(format!(
                "`{}` is not a whole number of starts of at least 1",
                starts.trim()
            )));
        }
    };
    match parse_millis(per) {
        Ok(0) => Err(err("a rate's window must be longer than zero".to_owned())),
        Ok(ms) => Ok((
            starts,
            Millis {
                value: ms,
                span: lit.span(),
                text: per.trim().to_owned(),
            },
        )),
        Err(why) => Err(err(format!("the window {why}"))),
    }
}

fn parse_int(n: &LitInt) -> Option<u32> {
    n.base10_parse::<u32>().ok()
}

fn duration(value: &Expr, key: &str, errors: &mut Errors) -> Option<Millis> {
    match string(value, example(key)) {
        Ok(lit) => match parse_millis(&lit.value()) {
            Ok(0) if NONZERO.contains(&key) => {
                errors.push(syn::Error::new(
                    lit.span(),
                    format!("`{key}` must be longer than zero: {}", example(key)),
                ));
                None
            }
            Ok(value) => Some(Millis {
                value,
                span: lit.span(),
                text: lit.value().trim().to_owned(),
            }),
            Err(msg) => {
                errors.push(syn::Error::new(lit.span(), msg));
                None
            }
        },
        Err(e) => {
            errors.push(e);
            None
        }
    }
}

fn key_fields(value: &Expr, key: &str) -> syn::Result<Vec<LitStr>> {
    let message = format!("expected a field name or a list of them: {}", example(key));
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(vec![s.clone()]),
        Expr::Array(ExprArray { elems, .. }) if !elems.is_empty() => elems
            .iter()
            .map(|e| match ungroup(e.clone()) {
                Expr::Lit(ExprLit {
                    lit: Lit::Str(s), ..
                }) => Ok(s),
                other => Err(syn::Error::new_spanned(other, &message)),
            })
            .collect(),
        other => Err(syn::Error::new_spanned(other, &message)),
    }
}

/// The first field of a cron expression that croner refuses, with its name: each field
/// is read alone, with `*` in the others. None when the expression has neither five
/// nor six fields, or no field is wrong by itself.
fn bad_cron_field(expression: &str) -> Option<(&'static str, String)> {
    let fields: Vec<&str> = expression.split_whitespace().collect();
    let names: &[&'static str] = match fields.len() {
        5 => &["minute", "hour", "day-of-month", "month", "day-of-week"],
        6 => &[
            "second",
            "minute",
            "hour",
            "day-of-month",
            "month",
            "day-of-week",
        ],
        _ => return None,
    };
    (0..fields.len()).find_map(|i| {
        let probe: Vec<&str> = (0..fields.len())
            .map(|j| if j == i { fields[i] } else { "*" })
            .collect();
        <croner::Cron as std::str::FromStr>::from_str(&probe.join(" "))
            .is_err()
            .then(|| (names[i], fields[i].to_owned()))
    })
}
