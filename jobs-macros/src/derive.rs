//! `#[derive(Job)]`: validation and expansion.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::{Data, DeriveInput, Fields, LitStr};

use crate::attr::{self, Errors, JobAttr, Lease, Millis};

pub(crate) fn expand(input: &DeriveInput) -> TokenStream {
    let mut errors = Errors::default();
    let attr = attr::parse(&input.attrs, &mut errors);
    let key_fields = validate(input, &attr, &mut errors);
    match errors.finish() {
        Ok(()) => expand_impl(input, &attr, &key_fields),
        Err(e) => fallback(input, e),
    }
}

/// The shortest heartbeat lease: renewals come every third of a lease and must answer
/// within half of it, so below this one slow round trip loses the claim.
const MIN_LEASE_MS: u64 = 500;

/// The defaults of `backoff` and `max_backoff` (`JobConfig::DEFAULT`).
const DEFAULT_BACKOFF_MS: u64 = 1_000;
const DEFAULT_MAX_BACKOFF_MS: u64 = 3_600_000;

/// Settings that cannot work together.
fn check_durations(attr: &JobAttr, errors: &mut Errors) {
    let backoff = attr
        .backoff
        .as_ref()
        .map_or(DEFAULT_BACKOFF_MS, |b| b.value);
    let max_backoff = attr
        .max_backoff
        .as_ref()
        .map_or(DEFAULT_MAX_BACKOFF_MS, |b| b.value);
    if backoff > max_backoff {
        let span = attr
            .max_backoff
            .as_ref()
            .or(attr.backoff.as_ref())
            .map_or_else(Span::call_site, |b| b.span);
        // In the units the user wrote (or the defaults'), not in milliseconds.
        let written = |d: Option<&Millis>, default: &str| {
            d.map_or_else(
                || format!("\"{default}\", the default"),
                |d| format!("\"{}\"", d.text),
            )
        };
        errors.push(syn::Error::new(
            span,
            format!(
                "`backoff` ({}) is longer than `max_backoff` ({}): the first retry would already wait past the cap; lower `backoff` or raise `max_backoff` (defaults: backoff = \"1s\", max_backoff = \"1h\")",
                written(attr.backoff.as_ref(), "1s"),
                written(attr.max_backoff.as_ref(), "1h"),
            ),
        ));
    }
    if let Some(Lease::Heartbeat(lease)) = &attr.lease
        && lease.value < MIN_LEASE_MS
    {
        errors.push(syn::Error::new(
            lease.span,
            format!(
                "a lease of \"{}\" is too short to keep: the runtime renews it every third of a lease and each renewal must answer within half of one; use at least lease = \"500ms\"",
                lease.text
            ),
        ));
    }
}

/// A partition splits a global concurrency or a rate, and names fields of the struct.
fn check_partition(input: &DeriveInput, attr: &JobAttr, errors: &mut Errors) {
    let Some(span) = attr.partition_span else {
        return;
    };
    if attr.global_concurrency.is_none() && attr.rate.is_none() {
        errors.push(syn::Error::new(
            span,
            "`partition` splits a limit: add global_concurrency = N (at most N running per partition) or rate = \"N/1m\" (at most N starts per partition in any minute)",
        ));
    }
    if attr.partition.len() > 4 {
        errors.push(syn::Error::new(
            span,
            format!(
                "`partition` names {} fields: at most 4",
                attr.partition.len()
            ),
        ));
    }
    let fields: Vec<String> = match &input.data {
        Data::Struct(s) => s
            .fields
            .iter()
            .filter_map(|f| f.ident.as_ref().map(ToString::to_string))
            .collect(),
        _ => Vec::new(),
    };
    for lit in &attr.partition {
        if !fields.contains(&lit.value()) {
            errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "`partition` names no field: `{}` has no field `{}`",
                    input.ident,
                    lit.value()
                ),
            ));
        }
    }
}

/// Checks what parsing alone cannot: a kind is given, key fields exist, no generics.
/// Returns the key fields, each with the span of the string in `key = ...` that names it.
fn validate(input: &DeriveInput, attr: &JobAttr, errors: &mut Errors) -> Vec<(syn::Ident, Span)> {
    if !attr.kind_given {
        errors.push(syn::Error::new_spanned(
            &input.ident,
            "missing job kind: add #[job(kind = \"session.delete\")]",
        ));
    }
    if !input.generics.params.is_empty() {
        errors.push(syn::Error::new_spanned(
            &input.generics,
            "a job type cannot be generic: its kind names one concrete type",
        ));
    }
    if let (Some(span), false) = (attr.every_span, attr.key.is_empty()) {
        errors.push(syn::Error::new(
            span,
            "a periodic job (`every`) cannot have a `key`: the runtime keeps one live job of the kind",
        ));
    }
    if let (Some(cron), false) = (&attr.cron, attr.key.is_empty()) {
        errors.push(syn::Error::new(
            cron.span(),
            "a cron job cannot have a `key`: the runtime keeps one live job of the kind",
        ));
    }
    if let (Some(cron), Some(_)) = (&attr.cron, attr.every_span) {
        errors.push(syn::Error::new(
            cron.span(),
            "a job has either `every` or `cron`, not both",
        ));
    }
    if let (Some(zone), None) = (&attr.timezone, &attr.cron) {
        errors.push(syn::Error::new(
            zone.span(),
            "`timezone` reads a `cron` schedule: add cron = \"...\", or remove it",
        ));
    }
    check_durations(attr, errors);
    check_partition(input, attr, errors);
    let mut found = Vec::new();
    if attr.key.is_empty() {
        return found;
    }
    let named = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(named) => Some(named),
            _ => None,
        },
        _ => None,
    };
    let Some(named) = named else {
        errors.push(syn::Error::new(
            attr.key_span.unwrap_or_else(Span::call_site),
            "`key` names fields, so it needs a struct with named fields",
        ));
        return found;
    };
    for lit in &attr.key {
        let name = lit.value();
        match named
            .named
            .iter()
            .filter_map(|f| f.ident.as_ref())
            .find(|ident| *ident == name.as_str())
        {
            Some(ident) => found.push((ident.clone(), lit.span())),
            None => errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "`key` names no field: `{}` has no field `{name}`",
                    input.ident
                ),
            )),
        }
    }
    found
}

fn millis(ms: u64) -> TokenStream {
    quote!(::core::time::Duration::from_millis(#ms))
}

fn expand_impl(
    input: &DeriveInput,
    attr: &JobAttr,
    key_fields: &[(syn::Ident, Span)],
) -> TokenStream {
    let ident = &input.ident;
    let kind = attr.kind.as_ref().expect("validated: kind is present");

    let mut config = quote!(::jobs::JobConfig::DEFAULT);
    if let Some(n) = attr.max_attempts {
        config = quote!(#config.with_max_attempts(#n));
    }
    if let Some(d) = &attr.backoff {
        let d = millis(d.value);
        config = quote!(#config.with_backoff(#d));
    }
    if let Some(d) = &attr.max_backoff {
        let d = millis(d.value);
        config = quote!(#config.with_max_backoff(#d));
    }
    match &attr.lease {
        Some(Lease::Heartbeat(d)) => {
            let d = millis(d.value);
            config = quote!(#config.with_lease(::jobs::Lease::Heartbeat(#d)));
        }
        Some(Lease::Transaction) => {
            config = quote!(#config.with_lease(::jobs::Lease::Transaction));
        }
        None => {}
    }
    if let Some(b) = attr.cancel_on_lease_loss {
        config = quote!(#config.with_cancel_on_lease_loss(#b));
    }
    if let Some(d) = &attr.timeout {
        let d = millis(d.value);
        config = quote!(#config.with_timeout(#d));
    }
    if let Some(n) = attr.concurrency {
        config = quote!(#config.with_concurrency(#n));
    }
    if let Some(n) = attr.global_concurrency {
        config = quote!(#config.with_global_concurrency(#n));
    }
    if !attr.partition.is_empty() {
        let fields = &attr.partition;
        config = quote!(#config.with_partition(&[#(#fields),*]));
    }
    if let Some((starts, per)) = &attr.rate {
        let per = millis(per.value);
        config = quote!(#config.with_rate(#starts, #per));
    }
    if let Some(d) = &attr.retain {
        let d = millis(d.value);
        config = quote!(#config.with_retain(#d));
    }
    if let Some(d) = &attr.every {
        let d = millis(d.value);
        config = quote!(#config.with_every(#d));
    }
    if let Some(p) = attr.priority {
        config = quote!(#config.with_priority(#p));
    }
    if let Some(cron) = &attr.cron {
        let zone = attr
            .timezone
            .as_ref()
            .map_or_else(|| "UTC".to_owned(), LitStr::value);
        config = quote!(#config.with_cron(#cron, #zone));
    }

    // Each part is shown at the string that names its field, so that a field type
    // without `KeyPart` is reported there and not at the derive.
    let mut parts = key_fields.iter().map(|(field, span)| {
        let at = Span::call_site().located_at(*span);
        quote_spanned!(at=> ::jobs::KeyPart::key_part(&self.#field))
    });
    let key_body = match key_fields.len() {
        // A periodic kind's one live job has a fixed key, so that an explicit enqueue
        // coalesces into it instead of starting a second schedule.
        0 if attr.every.is_some() || attr.cron.is_some() => quote!(::core::option::Option::Some(
            ::std::string::String::from(::jobs::__private::PERIODIC_KEY)
        )),
        0 => quote!(::core::option::Option::None),
        1 => parts.next().expect("one key field"),
        _ => quote! {
            ::jobs::__private::join_key_parts(&[#(#parts),*])
        },
    };

    let periodic = attr
        .every_span
        .or(attr.cron.as_ref().map(LitStr::span))
        .map(|span| {
            quote_spanned! {span=>
                fn periodic_instance() -> ::core::option::Option<Self> {
                    ::core::option::Option::Some(<Self as ::core::default::Default>::default())
                }
            }
        });

    quote! {
        #[automatically_derived]
        impl ::jobs::Job for #ident {
            const KIND: &'static str = #kind;
            const CONFIG: ::jobs::JobConfig = #config;

            fn key(&self) -> ::core::option::Option<::std::string::String> {
                #key_body
            }

            #periodic
        }

        const _: () = {
            ::jobs::__private::inventory::submit! {
                ::jobs::__private::KindInfo::of::<#ident>(
                    ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#ident)),
                )
            }
        };
    }
}

/// The errors, plus an impl of the trait with placeholder values, so that one mistake
/// in the attribute does not also show up as "`Job` is not implemented" everywhere the
/// type is used.
fn fallback(input: &DeriveInput, errors: syn::Error) -> TokenStream {
    let errors = errors.to_compile_error();
    if !input.generics.params.is_empty() {
        return errors;
    }
    let ident = &input.ident;
    quote! {
        #errors
        #[automatically_derived]
        impl ::jobs::Job for #ident {
            const KIND: &'static str = "";
            const CONFIG: ::jobs::JobConfig = ::jobs::JobConfig::DEFAULT;
            fn key(&self) -> ::core::option::Option<::std::string::String> {
                ::core::unimplemented!()
            }
        }
    }
}
