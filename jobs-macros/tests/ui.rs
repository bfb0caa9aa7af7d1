//! The error each mistake in `#[derive(Job)]` or `#[jobs::handler]` gives: one mistake
//! per file in `tests/ui/fail/`, with the compiler's output beside it.
//!
//! After changing a macro's messages, regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p jobs-macros --test ui` and read every `.stderr` it
//! wrote. What the macros accept is tested in `tests/pass.rs`.

#[test]
fn ui() {
    // Compile-fail cases only: trybuild then runs `cargo check`, which builds no
    // dependency's code. Passing cases in trybuild made it build and link a program
    // per case, with every dependency compiled again in its own target directory.
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
}
