//! The trace context a job carries from its enqueue to its runs.
//!
//! With the `opentelemetry` feature, an enqueue stores the W3C `traceparent` of the
//! current span (as a layer of `tracing-opentelemetry` records it) in the job's row,
//! and each run's `job` span continues that trace: as its parent on the first attempt,
//! as a link on a retry (a retry is its own trace, linked to the one that asked for
//! the job). Without the feature, or without such a layer, or outside any span, the
//! column stays NULL and nothing is read or written for it.

/// The current span's OpenTelemetry context as a W3C `traceparent`
/// (`00-{trace id}-{span id}-{flags}`), if it has a valid one.
#[cfg(feature = "opentelemetry")]
pub(crate) fn current() -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let span = tracing::Span::current();
    if span.is_disabled() {
        return None;
    }
    let context = span.context();
    let span = context.span();
    let sc = span.span_context();
    sc.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    })
}

/// Without the `opentelemetry` feature, no context is stored.
#[cfg(not(feature = "opentelemetry"))]
pub(crate) fn current() -> Option<String> {
    None
}

/// Makes `span` (a run of a job at `attempt`, 1 for the first) continue the trace of
/// the enqueue that stored `traceparent`: its child on the first attempt, linked to
/// it on a retry. A context that does not parse is ignored.
#[cfg(feature = "opentelemetry")]
pub(crate) fn continue_in(span: &tracing::Span, traceparent: Option<&str>, attempt: u32) {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let Some(remote) = traceparent.and_then(parse) else {
        return;
    };
    if attempt <= 1 {
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    } else {
        span.add_link(remote);
    }
}

/// Without the `opentelemetry` feature, a run's span starts a trace of its own.
#[cfg(not(feature = "opentelemetry"))]
pub(crate) fn continue_in(_span: &tracing::Span, _traceparent: Option<&str>, _attempt: u32) {}

/// A W3C `traceparent` of version `00`, as a remote span context.
#[cfg(feature = "opentelemetry")]
fn parse(traceparent: &str) -> Option<opentelemetry::trace::SpanContext> {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    let mut parts = traceparent.split('-');
    let (Some("00"), Some(trace), Some(span), Some(flags), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    if trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

#[cfg(all(test, feature = "opentelemetry"))]
mod tests {
    use super::parse;

    #[test]
    fn parses_a_w3c_traceparent_and_refuses_others() {
        let sc = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert!(parse(bad).is_none(), "{bad:?} parsed");
        }
    }
}
