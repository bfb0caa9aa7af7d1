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
pub async fn enqueued<'e, J: Job>(executor: impl sqlx::PgExecutor<'e>) -> Result<Vec<J>, Error> {
    let payloads: Vec<String> = sqlx::query_scalar(crate::sql::LIVE_PAYLOADS)
        .bind(J::KIND)
        .fetch_all(executor)
        .await?;
    payloads
        .iter()
        .map(|p| {
            serde_json::from_str(p).map_err(|e| {
                Error::InvalidInput(format!(
                    "a `{}` job's payload does not deserialize: {e}",
                    J::KIND
                ))
            })
        })
        .collect()
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
