//! Compile tests of `#[derive(Job)]` and `#[jobs::handler]`: what they accept, and the
//! error each mistake gives.
//!
//! After changing a macro's messages, regenerate the expected output with
//! `TRYBUILD=overwrite cargo test --test ui` and read every `.stderr` it wrote.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
