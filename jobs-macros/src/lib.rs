//! Macros of the `jobs` crate: `#[derive(Job)]` and `#[jobs::handler]`.
//!
//! Use them through `jobs` (`use jobs::Job;`, `#[jobs::handler]`); this crate is not
//! meant to be depended on directly. The generated code reaches everything through
//! `::jobs::__private`.

mod attr;
mod derive;
mod duration;
mod handler;
mod test;

use proc_macro::TokenStream;

/// Implements `jobs::Job` for a struct or enum and registers its kind.
///
/// See the `jobs` crate documentation for the `#[job(...)]` keys.
#[proc_macro_derive(Job, attributes(job))]
pub fn derive_job(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    derive::expand(&input).into()
}

/// Registers an `async fn(job: T, ctx: jobs::JobContext) -> Result<(), jobs::JobError>`
/// as the handler of `T`'s kind.
#[proc_macro_attribute]
pub fn handler(args: TokenStream, input: TokenStream) -> TokenStream {
    handler::expand(args.into(), input.into()).into()
}

/// A test with a database of its own: `#[jobs::test] async fn name(pool: PgPool) { .. }`
/// creates a database on the server of `DATABASE_URL`, migrates it, runs the test on a
/// tokio runtime with a pool to it, and drops it when the test passes (a failed test's
/// is kept, its name printed).
#[proc_macro_attribute]
pub fn test(args: TokenStream, input: TokenStream) -> TokenStream {
    test::expand(args.into(), input.into()).into()
}
