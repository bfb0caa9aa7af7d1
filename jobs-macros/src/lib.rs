//! Macros of the `jobs` crate: `#[derive(Job)]` and `#[jobs::handler]`.
//!
//! Use them through `jobs` (`use jobs::Job;`, `#[jobs::handler]`); this crate is not
//! meant to be depended on directly. The generated code reaches everything through
//! `::jobs::__private`.

mod attr;
mod derive;
mod duration;
mod handler;

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
