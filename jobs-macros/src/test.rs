//! `#[jobs::test]`: a test with a database of its own, made from `DATABASE_URL`,
//! migrated, and dropped when the test passes.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{ItemFn, ReturnType};

use crate::attr::Errors;

const SIGNATURE: &str = "expected `#[jobs::test] async fn name(pool: jobs::sqlx::PgPool) { .. }`";

pub(crate) fn expand(args: TokenStream, input: TokenStream) -> TokenStream {
    let item: ItemFn = match syn::parse2(input.clone()) {
        Ok(item) => item,
        Err(e) => {
            let e = syn::Error::new(
                e.span(),
                format!("#[jobs::test] goes on a function: {SIGNATURE}"),
            )
            .to_compile_error();
            return quote!(#e #input);
        }
    };
    let mut errors = Errors::default();
    if !args.is_empty() {
        errors.push(syn::Error::new_spanned(
            &args,
            "#[jobs::test] takes no arguments",
        ));
    }
    let sig = &item.sig;
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new_spanned(
            sig.fn_token,
            format!("a #[jobs::test] function must be async: {SIGNATURE}"),
        ));
    }
    if sig.inputs.len() != 1 {
        let span = if sig.inputs.is_empty() {
            sig.paren_token.span.join()
        } else {
            syn::spanned::Spanned::span(&sig.inputs)
        };
        errors.push(syn::Error::new(
            span,
            format!(
                "a #[jobs::test] function takes one argument, the pool of its database, not {}: {SIGNATURE}",
                sig.inputs.len()
            ),
        ));
    }
    if let ReturnType::Type(_, ty) = &sig.output {
        errors.push(syn::Error::new_spanned(
            ty,
            format!(
                "a #[jobs::test] function returns nothing (unwrap or expect instead): {SIGNATURE}"
            ),
        ));
    }
    if let Err(e) = errors.finish() {
        let e = e.to_compile_error();
        return quote!(#e #item);
    }
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = item;
    let name = &sig.ident;
    let arg = &sig.inputs;
    quote! {
        #[::core::prelude::v1::test]
        #(#attrs)*
        #vis fn #name() {
            async fn __jobs_test(#arg) #block
            ::jobs::testing::run_test(::core::stringify!(#name), __jobs_test);
        }
    }
}
