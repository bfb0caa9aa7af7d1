//! Traces cross the queue (feature `opentelemetry`): the span that enqueued a job is the
//! parent of its first run's span, and a retry's span links to it; the run's span
//! follows OpenTelemetry's conventions for messaging. The spans go to the SDK's
//! in-memory exporter, through the `tracing-opentelemetry` layer an application
//! installs.

use std::sync::OnceLock;

use jobs::testing::{Drain, drain_with};
use jobs::{Job, JobContext, JobError};
use opentelemetry::trace::{SpanId, SpanKind, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "traces.receipt", max_attempts = 3)]
struct Receipt {
    order: i64,
    /// Fail the first attempt.
    flaky: bool,
}

#[jobs::handler]
async fn receipt(job: Receipt, ctx: JobContext) -> Result<(), JobError> {
    // A span of the handler's own: a child of the run's span.
    async {
        if job.flaky && ctx.attempt() == 1 {
            return Err(JobError::retry("the mail server is down"));
        }
        Ok(())
    }
    .instrument(tracing::info_span!("render", order = job.order))
    .await
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "traces.reindex", key = "index")]
struct Reindex {
    index: String,
    from: u32,
}

#[jobs::handler]
async fn reindex(_job: Reindex, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

/// One exporter for the process: the runtime's tasks run on the test runtime's worker
/// threads, so the subscriber must be the global one. Each test finds its own spans by
/// their trace ids.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let tracer = provider.tracer("tests");
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        exporter
    })
}

fn spans() -> Vec<SpanData> {
    exporter()
        .get_finished_spans()
        .expect("the exporter's spans")
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// The run spans that continue the request span `request`, as its children or linked
/// to it, by attempt. (Job ids repeat across the tests' databases; spans do not.)
fn runs_after(request: SpanId) -> Vec<SpanData> {
    let mut runs: Vec<SpanData> = spans()
        .into_iter()
        .filter(|s| {
            attribute(s, "job.id").is_some()
                && (s.parent_span_id == request
                    || s.links.iter().any(|l| l.span_context.span_id() == request))
        })
        .collect();
    runs.sort_by_key(|s| attribute(s, "job.attempt"));
    runs
}

/// Runs `f` inside a request's span (as an HTTP server's layer opens one), and returns
/// that span's ids once it has ended.
async fn in_request<T>(name: &str, f: impl Future<Output = T>) -> (T, TraceId, SpanId) {
    let span = tracing::info_span!("request", otel.name = name, otel.kind = "server");
    let out = f.instrument(span).await;
    let request = spans()
        .into_iter()
        .rfind(|s| s.name == name)
        .expect("the request's span was exported");
    (
        out,
        request.span_context.trace_id(),
        request.span_context.span_id(),
    )
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_run_continues_the_trace_of_the_request_that_enqueued_it(pool: PgPool) {
    exporter();
    let (enqueued, trace, request) = in_request("POST /orders/7", async {
        Receipt {
            order: 7,
            flaky: true,
        }
        .enqueue(&pool)
        .await
        .unwrap()
    })
    .await;

    // The row carries the request's W3C traceparent.
    let stored: Option<String> = sqlx::query_scalar("SELECT trace FROM jobs WHERE id = $1")
        .bind(enqueued.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, Some(format!("00-{trace}-{request}-01")));

    let drained = drain_with(&pool, Drain::new().with_scheduled(true))
        .await
        .unwrap();
    assert_eq!(drained.counts.succeeded, 1);

    let runs = runs_after(request);
    assert_eq!(runs.len(), 2, "one span per attempt");
    let (first, retry) = (&runs[0], &runs[1]);

    // The first run: a child of the request, in its trace.
    assert_eq!(first.span_context.trace_id(), trace);
    assert_eq!(first.parent_span_id, request);
    assert_eq!(first.name, "process traces.receipt");
    assert_eq!(first.span_kind, SpanKind::Consumer);
    for (key, value) in [
        ("messaging.system", "jobs"),
        ("messaging.operation.type", "process"),
        ("messaging.destination.name", "traces.receipt"),
        ("messaging.message.id", &enqueued.id.to_string()),
        ("job.attempt", "1"),
        ("job.outcome", "retried"),
    ] {
        assert_eq!(attribute(first, key).as_deref(), Some(value), "{key}");
    }
    // The handler's own span is the run's child.
    let render = spans()
        .into_iter()
        .find(|s| s.name == "render" && s.parent_span_id == first.span_context.span_id())
        .expect("the handler's span, under the first run");
    assert_eq!(render.span_context.trace_id(), trace);

    // The retry: a trace of its own, linked to the request.
    assert_ne!(retry.span_context.trace_id(), trace);
    assert_eq!(retry.parent_span_id, SpanId::INVALID);
    let links: Vec<_> = retry.links.iter().map(|l| l.span_context.clone()).collect();
    assert_eq!(links.len(), 1, "the retry links to the request");
    assert_eq!(links[0].trace_id(), trace);
    assert_eq!(links[0].span_id(), request);
    assert_eq!(attribute(retry, "job.attempt").as_deref(), Some("2"));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_coalesced_job_continues_the_trace_of_its_newest_trigger(pool: PgPool) {
    exporter();
    let enqueue = |from| {
        let pool = pool.clone();
        async move {
            Reindex {
                index: "products".into(),
                from,
            }
            .enqueue(&pool)
            .await
            .unwrap()
        }
    };
    let (first, first_trace, first_request) = in_request("PUT /products/1", enqueue(1)).await;
    let (second, trace, request) = in_request("PUT /products/2", enqueue(2)).await;
    assert_eq!(first.id, second.id, "one live job of the key");
    assert_ne!(first_trace, trace);

    drain_with(&pool, Drain::new()).await.unwrap();
    assert!(runs_after(first_request).is_empty());
    let runs = runs_after(request);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].span_context.trace_id(), trace);
    assert_eq!(runs[0].parent_span_id, request);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_enqueued_outside_any_span_stores_nothing_and_runs_in_a_trace_of_its_own(
    pool: PgPool,
) {
    exporter();
    let enqueued = Receipt {
        order: 8,
        flaky: false,
    }
    .enqueue(&pool)
    .await
    .unwrap();
    let stored: Option<String> = sqlx::query_scalar("SELECT trace FROM jobs WHERE id = $1")
        .bind(enqueued.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, None);

    drain_with(&pool, Drain::new()).await.unwrap();
    // The run's span: the parent of the handler's span for order 8.
    let all = spans();
    let render = all
        .iter()
        .find(|s| s.name == "render" && attribute(s, "order").as_deref() == Some("8"))
        .expect("the handler's span");
    let run = all
        .iter()
        .find(|s| s.span_context.span_id() == render.parent_span_id)
        .expect("the run's span");
    assert_eq!(attribute(run, "job.id"), Some(enqueued.id.to_string()));
    assert_eq!(run.parent_span_id, SpanId::INVALID, "a root");
    assert!(run.links.is_empty());
}
