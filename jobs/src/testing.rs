//! Helpers for the tests of applications that use `jobs`: see what was enqueued, and
//! run every due job to completion in the test, as Oban.Testing and rivertest do.
//!
//! ```no_run
//! use jobs::{Job, JobContext, JobError};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Job, Serialize, Deserialize, Debug)]
//! #[job(kind = "mail.welcome", key = "user_id")]
//! struct Welcome {
//!     user_id: i64,
//! }
//!
//! #[jobs::handler]
//! async fn welcome(_job: Welcome, _ctx: JobContext) -> Result<(), JobError> {
//!     Ok(())
//! }
//!
//! // In a test with its own database, e.g. #[sqlx::test(migrator = "jobs::MIGRATOR")]:
//! async fn signup_sends_a_welcome(pool: sqlx::PgPool) {
//!     // ... the code under test enqueues ...
//!     # Welcome { user_id: 7 }.enqueue(&pool).await.unwrap();
//!     jobs::testing::assert_enqueued(&pool, |w: &Welcome| w.user_id == 7).await;
//!     let ran = jobs::testing::drain(&pool).await.unwrap();
//!     assert_eq!(ran.succeeded, 1);
//!     assert!(jobs::testing::enqueued::<Welcome>(&pool).await.unwrap().is_empty());
//! }
//! ```

use std::time::Duration;

use sqlx::PgPool;

use crate::error::Error;
use crate::job::Job;
use crate::runtime::{RunCounts, Runtime};

/// The live (pending or running) jobs of `J`'s kind, oldest first, deserialized.
///
/// Every live row of the kind must deserialize into `J`: one that does not (a row
/// enqueued by an older version of the type, or written by hand) makes the whole call
/// fail with an [`Error::InvalidInput`] that names the row's id and serde's error. A
/// helper that skipped such rows would let `assert!(enqueued::<J>(..).is_empty())` pass
/// while a job the handler cannot read is still queued. To look at those rows instead,
/// use [`enqueued_rows`].
pub async fn enqueued<'e, J: Job>(executor: impl sqlx::PgExecutor<'e>) -> Result<Vec<J>, Error> {
    let rows = enqueued_rows::<J>(executor).await?;
    if let Some(bad) = rows.undeserializable.first() {
        let others = match rows.undeserializable.len() - 1 {
            0 => String::new(),
            1 => " (and 1 more row)".to_owned(),
            n => format!(" (and {n} more rows)"),
        };
        return Err(Error::InvalidInput(format!(
            "the payload of live `{}` job {} does not deserialize{others}: {}; \
             jobs::testing::enqueued_rows lists such rows",
            J::KIND,
            bad.id,
            bad.error
        )));
    }
    Ok(rows.jobs)
}

/// The live (pending or running) jobs of `J`'s kind, oldest first, split into those
/// that deserialize into `J` and those that do not; see [`enqueued_rows`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnqueuedJobs<J> {
    /// The payloads that deserialize, oldest first.
    pub jobs: Vec<J>,
    /// The rows whose payload does not deserialize into `J`, oldest first.
    pub undeserializable: Vec<Undeserializable>,
}

/// A live job whose payload does not deserialize into the type asked for.
///
/// The runtime fails such a job permanently when it claims it, with a `last_error`
/// naming the kind and serde's error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Undeserializable {
    /// The job's id (the `id` column).
    pub id: i64,
    /// The payload as stored, as JSON text.
    pub payload: String,
    /// What serde said, e.g. `missing field `to` at line 1 column 12`.
    pub error: String,
}

/// Every live (pending or running) job of `J`'s kind, including those whose payload no
/// longer deserializes into `J`, which [`enqueued`] refuses.
///
/// Use it to test a change of a payload type against rows enqueued by the old one.
///
/// ```no_run
/// use jobs::Job;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Job, Serialize, Deserialize, Debug)]
/// #[job(kind = "mail.send")]
/// struct SendMail {
///     to: String,
/// }
///
/// # async fn check(pool: sqlx::PgPool) -> Result<(), jobs::Error> {
/// // A row the current type cannot read, as an older version might have left it.
/// sqlx::query("INSERT INTO jobs (kind, payload, max_attempts) VALUES ('mail.send', '{\"address\": \"a@example.com\"}', 20)")
///     .execute(&pool)
///     .await?;
/// SendMail { to: "b@example.com".into() }.enqueue(&pool).await?;
///
/// let rows = jobs::testing::enqueued_rows::<SendMail>(&pool).await?;
/// assert_eq!(rows.jobs.len(), 1);
/// assert_eq!(rows.jobs[0].to, "b@example.com");
/// assert_eq!(rows.undeserializable.len(), 1);
/// assert!(rows.undeserializable[0].error.contains("missing field `to`"));
/// # Ok(()) }
/// ```
pub async fn enqueued_rows<'e, J: Job>(
    executor: impl sqlx::PgExecutor<'e>,
) -> Result<EnqueuedJobs<J>, Error> {
    let rows: Vec<(i64, String)> = sqlx::query_as(crate::sql::LIVE_PAYLOADS)
        .bind(J::KIND)
        .fetch_all(executor)
        .await?;
    let mut out = EnqueuedJobs {
        jobs: Vec::with_capacity(rows.len()),
        undeserializable: Vec::new(),
    };
    for (id, payload) in rows {
        match serde_json::from_str(&payload) {
            Ok(job) => out.jobs.push(job),
            Err(e) => out.undeserializable.push(Undeserializable {
                id,
                payload,
                error: e.to_string(),
            }),
        }
    }
    Ok(out)
}

/// Panics unless a live job of `J`'s kind matches `matches`; the message lists the
/// payloads that are enqueued.
pub async fn assert_enqueued<'e, J>(
    executor: impl sqlx::PgExecutor<'e>,
    matches: impl Fn(&J) -> bool,
) where
    J: Job + std::fmt::Debug,
{
    let jobs = enqueued::<J>(executor)
        .await
        .expect("reading the enqueued jobs");
    assert!(
        jobs.iter().any(matches),
        "no enqueued `{}` job matches; enqueued: {jobs:#?}",
        J::KIND
    );
}

/// Runs a runtime over `pool` until no job of a kind with a handler in this binary is
/// claimable now or running, and returns how the runs ended. Jobs scheduled later
/// (including retries waiting out their backoff) stay pending.
pub async fn drain(pool: &PgPool) -> Result<RunCounts, Error> {
    let runtime = Runtime::new(pool.clone())
        .poll_interval(Duration::from_millis(10))
        .rescue_interval(Duration::from_millis(50));
    let kinds: Vec<&'static str> = crate::registry::handlers()?.keys().copied().collect();
    let watcher = pool.clone();
    runtime
        .run_counting(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let busy: Result<bool, sqlx::Error> = sqlx::query_scalar(crate::sql::ANY_DUE)
                    .bind(&kinds)
                    .fetch_one(&watcher)
                    .await;
                if let Ok(false) = busy {
                    return;
                }
            }
        })
        .await
}
