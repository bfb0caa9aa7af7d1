//! A job type linked into a binary whose other kinds have handlers, but it has none:
//! the runtime says so at start, naming the type and its kind, and naming that kind in
//! `Runtime::kinds` is an error that names the type. (A binary of its own: the registry
//! is global.)

use std::sync::{Arc, Mutex};

use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "unhandled.handled")]
struct Handled {}

#[jobs::handler]
async fn handled(_job: Handled, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

/// Enqueued by this binary, run by another one (or by nobody: the forgotten handler).
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "unhandled.forgotten")]
struct Forgotten {}

/// The warnings logged in this thread.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        if *event.metadata().level() == tracing::Level::WARN {
            let mut message = Message(String::new());
            event.record(&mut message);
            self.0.lock().unwrap().push(message.0);
        }
    }
}

async fn start_and_stop(runtime: jobs::Runtime) -> (Result<(), jobs::Error>, Vec<String>) {
    use tracing_subscriber::layer::SubscriberExt;
    let warnings = Warnings::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let result = runtime.run_until(async {}).await;
    let seen = warnings.0.lock().unwrap().clone();
    (result, seen)
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_type_without_a_handler_is_named_at_start(pool: PgPool) {
    let _ = Forgotten {};
    let (result, warnings) = start_and_stop(jobs::Runtime::new(pool.clone())).await;
    result.unwrap();
    let about: Vec<&String> = warnings
        .iter()
        .filter(|w| w.contains("has no handler"))
        .collect();
    assert_eq!(about.len(), 1, "{warnings:?}");
    assert!(
        about[0].contains("registry_unhandled::Forgotten")
            && about[0].contains("`unhandled.forgotten`"),
        "{about:?}"
    );

    // A runtime that names its kinds has said which ones it runs: no warning.
    let (result, warnings) =
        start_and_stop(jobs::Runtime::new(pool).kinds(["unhandled.handled"])).await;
    result.unwrap();
    assert!(
        !warnings.iter().any(|w| w.contains("has no handler")),
        "{warnings:?}"
    );
}

#[tokio::test]
async fn naming_a_kind_without_a_handler_is_an_error_that_names_its_type() {
    // Never connected: the check happens before the runtime touches the database.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap();
    let err = jobs::Runtime::new(pool.clone())
        .kinds(["unhandled.handled", "unhandled.forgotten"])
        .run_until(async {})
        .await
        .unwrap_err();
    assert!(matches!(err, jobs::Error::Registry(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("kind `unhandled.forgotten`")
            && text.contains("registry_unhandled::Forgotten")
            && text.contains("#[jobs::handler]"),
        "{text}"
    );

    // A kind that no type declares either.
    let err = jobs::Runtime::new(pool)
        .kinds(["unhandled.typo"])
        .run_until(async {})
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no #[derive(Job)] type in it declares that kind"),
        "{err}"
    );
}
