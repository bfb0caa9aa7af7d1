//! Observability and test helpers: the span per run, the metrics, `jobs::testing`.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use jobs::{Job, JobContext, JobError};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "obs.flaky", key = "name", backoff = "1ms")]
struct Flaky {
    name: String,
}

#[jobs::handler]
async fn flaky(_job: Flaky, ctx: JobContext) -> Result<(), JobError> {
    if ctx.attempt() == 1 {
        return Err(JobError::retry("first attempt fails"));
    }
    Ok(())
}

#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "obs.hopeless", max_attempts = 1)]
struct Hopeless {}

#[jobs::handler]
async fn hopeless(_job: Hopeless, _ctx: JobContext) -> Result<(), JobError> {
    Err(JobError::permanent("never works"))
}

/// The recorder of this test binary, installed once.
fn snapshotter() -> &'static Snapshotter {
    static S: OnceLock<Snapshotter> = OnceLock::new();
    S.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("no other recorder");
        snapshotter
    })
}

type Metrics = Vec<(
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// Counter values and histogram sample counts, by name and labels, from one snapshot
/// (taking a snapshot drains the recorder's histograms).
fn metric(all: &Metrics, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
    all.iter()
        .find(|(key, ..)| {
            let key = key.key();
            key.name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => *n,
            DebugValue::Histogram(samples) => samples.len() as u64,
            DebugValue::Gauge(_) => 1,
        })
}

/// Records the fields of every `job` span when it closes, and of every warning.
type SpanFields = Vec<(String, String)>;

#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<SpanFields>>>, Arc<Mutex<Vec<SpanFields>>>);

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::Id,
        ctx: Context<'_, S>,
    ) {
        if attrs.metadata().name() == "job" {
            let mut fields = Vec::new();
            attrs.record(&mut Fields(&mut fields));
            ctx.span(id).unwrap().extensions_mut().insert(fields);
        }
    }
    fn on_record(&self, id: &tracing::Id, values: &tracing::span::Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<SpanFields>()
        {
            values.record(&mut Fields(fields));
        }
    }
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut fields = Vec::new();
            event.record(&mut Fields(&mut fields));
            self.1.lock().unwrap().push(fields);
        }
    }
    fn on_close(&self, id: tracing::Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id)
            && let Some(fields) = span.extensions_mut().remove::<SpanFields>()
        {
            self.0.lock().unwrap().push(fields);
        }
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn testing_helpers_span_and_metrics(pool: PgPool) {
    let snapshotter = snapshotter();
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    Flaky { name: "a".into() }.enqueue(&pool).await.unwrap();
    Flaky { name: "b".into() }.enqueue(&pool).await.unwrap();
    Hopeless {}.enqueue(&pool).await.unwrap();
    // A job scheduled later is not due: drain leaves it.
    Flaky {
        name: "later".into(),
    }
    .enqueue_in(&pool, Duration::from_secs(3600))
    .await
    .unwrap();

    jobs::testing::assert_enqueued(&pool, |f: &Flaky| f.name == "b").await;
    let enqueued = jobs::testing::enqueued::<Flaky>(&pool).await.unwrap();
    let names: Vec<&str> = enqueued.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "later"]);
    let missing = tokio::spawn({
        let pool = pool.clone();
        async move { jobs::testing::assert_enqueued(&pool, |f: &Flaky| f.name == "zzz").await }
    })
    .await;
    assert!(
        missing.is_err(),
        "assert_enqueued panics when nothing matches"
    );

    // The runtime spawns its tasks: the span layer must be the thread's default for
    // them too, so run the drain on this thread's runtime (a current-thread test).
    let ran = jobs::testing::drain(&pool).await.unwrap();
    assert_eq!(ran.succeeded, 2);
    assert_eq!(ran.retried, 2);
    assert_eq!(ran.failed, 1);
    let left = jobs::testing::enqueued::<Flaky>(&pool).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].name, "later");

    // Metrics through the facade.
    let all: Metrics = snapshotter.snapshot().into_vec();
    let metric = |name: &str, labels: &[(&str, &str)]| metric(&all, name, labels);
    assert_eq!(
        metric("jobs_claimed_total", &[("kind", "obs.flaky")]),
        Some(4)
    );
    assert_eq!(
        metric(
            "jobs_finished_total",
            &[("kind", "obs.flaky"), ("outcome", "succeeded")]
        ),
        Some(2)
    );
    assert_eq!(
        metric(
            "jobs_finished_total",
            &[("kind", "obs.flaky"), ("outcome", "retried")]
        ),
        Some(2)
    );
    assert_eq!(
        metric(
            "jobs_finished_total",
            &[("kind", "obs.hopeless"), ("outcome", "failed")]
        ),
        Some(1)
    );
    assert_eq!(
        metric("jobs_handler_duration_seconds", &[("kind", "obs.flaky")]),
        Some(4)
    );
    assert_eq!(
        metric("jobs_queue_wait_seconds", &[("kind", "obs.flaky")]),
        Some(4)
    );
    assert!(
        metric("jobs_depth", &[("kind", "obs.flaky")]).is_some(),
        "depth gauge published"
    );
    assert!(
        metric("jobs_lag_seconds", &[("kind", "obs.flaky")]).is_some(),
        "lag gauge published"
    );

    // One span per run, with the job's fields and its outcome.
    let spans_events = spans.1.clone();
    let spans = spans.0.lock().unwrap();
    let outcome_of = |fields: &Vec<(String, String)>, name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(spans.len(), 5, "{spans:?}");
    for fields in spans.iter() {
        assert!(outcome_of(fields, "job.id").is_some());
        assert!(outcome_of(fields, "job.attempt").is_some());
    }
    let mut outcomes: Vec<String> = spans
        .iter()
        .map(|f| {
            format!(
                "{}:{}",
                outcome_of(f, "job.kind").unwrap(),
                outcome_of(f, "job.outcome").unwrap()
            )
        })
        .collect();
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            "obs.flaky:retried",
            "obs.flaky:retried",
            "obs.flaky:succeeded",
            "obs.flaky:succeeded",
            "obs.hopeless:failed"
        ]
    );

    // A failed attempt's warning names the job itself: a subscriber that shows no span
    // fields still says which job failed.
    let warnings = spans_warnings(&spans_events);
    let failed: Vec<String> = warnings
        .iter()
        .filter(|f| outcome_of(f, "message").as_deref() == Some("job failed"))
        .map(|f| {
            assert!(outcome_of(f, "job.id").is_some(), "{f:?}");
            outcome_of(f, "job.kind").expect("job.kind on the event")
        })
        .collect();
    assert_eq!(failed.len(), 3, "{warnings:?}");
    assert_eq!(failed.iter().filter(|k| *k == "obs.hopeless").count(), 1);
}

fn spans_warnings(events: &Arc<Mutex<Vec<SpanFields>>>) -> Vec<SpanFields> {
    events.lock().unwrap().clone()
}
