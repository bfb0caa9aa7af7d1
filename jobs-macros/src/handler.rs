//! `#[jobs::handler]`: checks the signature and registers the function.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, ReturnType, Type};

use crate::attr::Errors;

const SIGNATURE: &str = "expected `async fn name(job: MyJob, ctx: jobs::JobContext) -> Result<(), jobs::JobError>` (or `Result<T, jobs::JobError>`, `T` a `Serialize` output)";

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
    if let Some(u) = &sig.unsafety {
        errors.push(syn::Error::new_spanned(
            u,
            format!("a job handler cannot be unsafe: {SIGNATURE}"),
        ));
    }
    if let Some(abi) = &sig.abi {
        errors.push(syn::Error::new_spanned(
            abi,
            format!("a job handler cannot have an ABI: {SIGNATURE}"),
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
    let mut arg_tys = Vec::new();
    for arg in &sig.inputs {
        match arg {
            FnArg::Receiver(r) => errors.push(syn::Error::new_spanned(
                r,
                format!("a job handler is a free function, not a method: {SIGNATURE}"),
            )),
            FnArg::Typed(t) => arg_tys.push(&t.ty),
        }
    }
    // The runtime hands the handler both values to own: a reference is never right, and
    // the type error it would give ("`&MyJob: Job` is not satisfied") hides why.
    for (ty, what) in arg_tys.iter().zip(["the job", "the context"]) {
        if let Type::Reference(r) = &***ty {
            errors.push(syn::Error::new_spanned(
                r,
                format!("{what} is passed by value, not by reference: {SIGNATURE}"),
            ));
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
    let ret_ty = match &sig.output {
        ReturnType::Type(_, ty) => Some(ty),
        ReturnType::Default => {
            errors.push(syn::Error::new_spanned(
                sig,
                format!("a job handler returns `Result<(), jobs::JobError>`: {SIGNATURE}"),
            ));
            None
        }
    };
    if let Err(e) = errors.finish() {
        let e = e.to_compile_error();
        return quote!(#e #item);
    }
    let (&[job_ty, ctx_ty], Some(ret_ty)) = (arg_tys.as_slice(), ret_ty) else {
        unreachable!("validated: two typed arguments and a return type");
    };
    let name = &sig.ident;
    // Named, not `const _`: in an impl block, where a handler cannot go (the registration
    // names the function without `Self::`), this leaves one error, "cannot find value
    // `name`", instead of also "`const` items in this context need a name".
    let registration = format_ident!("__JOBS_HANDLER_{}", name.unraw().to_string().to_uppercase());
    // Type errors point at the handler's own tokens: a wrong context type at the second
    // argument's type, a wrong return type at the return type. The `let` with a type
    // turns a wrong return type into one "mismatched types" error instead of an
    // unsatisfied bound of `dispatch`. The locals are shown at those tokens but resolved
    // at the call site, as the rest of the expansion is: the tokens may come from a
    // `macro_rules!` macro, whose hygiene would hide the locals from them.
    let at = |span: Span| Span::call_site().located_at(span);
    let ctx_arg = quote_spanned!(at(ctx_ty.span())=> __jobs_ctx);
    let callee = quote_spanned!(at(name.span())=> __jobs_handler);
    let result = quote_spanned! {at(ret_ty.span())=>
        let __jobs_result: ::core::result::Result<(), ::jobs::JobError> =
            ::jobs::__private::HandlerResult::into_job_result(__jobs_result, __jobs_output);
    };
    // One body (closures are checked with the static that holds them): a first argument
    // that is not a `Job` is reported once, at its type, not once per use.
    quote! {
        #item

        #[doc(hidden)]
        const #registration: () = {
            ::jobs::__private::inventory::submit! {
                ::jobs::__private::HandlerInfo::of::<#job_ty>(
                    ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#name)),
                    |__jobs_input| {
                        ::jobs::__private::dispatch::<#job_ty, _, _>(
                            __jobs_input,
                            |__jobs_job, __jobs_ctx| async move {
                                // Through a value: a direct call would set off
                                // clippy::unused_async on handlers that need no await.
                                let __jobs_handler = #name;
                                let __jobs_output = ::jobs::__private::OutputSlot::of(&__jobs_ctx);
                                let __jobs_result = #callee(__jobs_job, #ctx_arg).await;
                                #result
                                __jobs_result
                            },
                        )
                    },
                )
            }
        };
    }
}
