//! `#[jobs::handler]`: checks the signature and registers the function.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, ReturnType};

use crate::attr::Errors;

const SIGNATURE: &str =
    "expected `async fn name(job: MyJob, ctx: jobs::JobContext) -> Result<(), jobs::JobError>`";

pub(crate) fn expand(args: TokenStream, input: TokenStream) -> TokenStream {
    let item: ItemFn = match syn::parse2(input.clone()) {
        Ok(item) => item,
        Err(e) => {
            let mut e2 = syn::Error::new(
                e.span(),
                format!("#[jobs::handler] goes on a function: {SIGNATURE}"),
            );
            e2.combine(e);
            let e = e2.to_compile_error();
            return quote!(#e #input);
        }
    };
    let mut errors = Errors::default();
    if !args.is_empty() {
        errors.push(syn::Error::new_spanned(
            &args,
            "#[jobs::handler] takes no arguments; settings go in the job's #[job(...)] attribute",
        ));
    }
    let sig = &item.sig;
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new_spanned(
            sig.fn_token,
            format!("a job handler must be async: {SIGNATURE}"),
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.push(syn::Error::new_spanned(
            &sig.generics,
            format!("a job handler cannot be generic: {SIGNATURE}"),
        ));
    }
    if let Some(v) = &sig.variadic {
        errors.push(syn::Error::new_spanned(v, SIGNATURE));
    }
    let mut job_ty = None;
    for (i, arg) in sig.inputs.iter().enumerate() {
        match arg {
            FnArg::Receiver(r) => errors.push(syn::Error::new_spanned(
                r,
                format!("a job handler is a free function, not a method: {SIGNATURE}"),
            )),
            FnArg::Typed(t) if i == 0 => job_ty = Some(t.ty.clone()),
            FnArg::Typed(_) => {}
        }
    }
    if sig.inputs.len() != 2 {
        let span = if sig.inputs.is_empty() {
            sig.paren_token.span.join()
        } else {
            sig.inputs.span()
        };
        errors.push(syn::Error::new(
            span,
            format!(
                "a job handler takes two arguments, the job and its context, not {}: {SIGNATURE}",
                sig.inputs.len()
            ),
        ));
    }
    if let ReturnType::Default = sig.output {
        errors.push(syn::Error::new_spanned(
            sig,
            format!("a job handler returns `Result<(), jobs::JobError>`: {SIGNATURE}"),
        ));
    }
    if let Err(e) = errors.finish() {
        let e = e.to_compile_error();
        return quote!(#e #item);
    }
    let job_ty = job_ty.expect("validated: two typed arguments");
    let name = &sig.ident;
    let call = quote_spanned! {sig.span()=>
        ::jobs::__private::dispatch::<#job_ty, _, _>(input, #name)
    };
    let info = quote_spanned! {job_ty.span()=>
        ::jobs::__private::HandlerInfo::of::<#job_ty>
    };
    quote! {
        #item

        #[doc(hidden)]
        const _: () = {
            fn __jobs_handler(
                input: ::jobs::__private::HandlerInput,
            ) -> ::jobs::__private::HandlerFuture {
                #call
            }
            ::jobs::__private::inventory::submit! {
                #info(
                    ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#name)),
                    __jobs_handler,
                )
            }
        };
    }
}
