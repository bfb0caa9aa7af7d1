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

use sqlx::types::chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::admin::JobState;
use crate::context::JobError;
use crate::enqueue::EnqueueOutcome;
use crate::error::Error;
use crate::history::AttemptError;
use crate::job::Job;
use crate::runtime::executor::Claimed;
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
/// use jobs::sqlx;
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
    let rows: Vec<(i64, String)> = crate::pooler::query_as(crate::sql::LIVE_PAYLOADS)
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

/// Runs `job`'s handler once, inline, and returns its result: a unit test of a
/// handler that goes through the database as the runtime does.
///
/// The job is enqueued (coalescing into a pending job of its key, like any enqueue)
/// and claimed for real, whatever its run-after, so fenced transactions, transaction
/// mode, checkpoints and the attempt history work as under a runtime; then the
/// handler's outcome is written as a runtime writes it (the job completes, is retried
/// later, fails, or is snoozed), and [`jobs::admin::get`](crate::admin::get) shows the
/// row. No heartbeat renews the lease meanwhile: a handler that runs longer than its
/// kind's lease loses its claim, as one whose runtime stopped would. The kind's timeout
/// applies. A panic in the handler is written as a failed attempt and then resumed.
///
/// The result is the handler's own, or what the runtime records instead: an error
/// for a timeout, for a fenced transaction dropped without `commit()`, and a
/// lease-lost error when the claim was gone before the completion. A job of a key
/// whose job is running (a re-run mark, not a run) and a kind without a handler in
/// this binary are permanent errors, and run nothing.
///
/// It needs a database, on purpose: a handler's context is its job's row (the fenced
/// transaction checks the claim's token on it, a checkpoint is written to it,
/// transaction mode commits the completion with the handler's writes), so a mode
/// without one would either fake those (and a test would pass against behaviour
/// production does not have) or refuse them. As River's test worker does, it runs the
/// handler over the real row instead; with [`#[jobs::test]`](crate::test) each test
/// gets a migrated database of its own.
///
/// ```no_run
/// # use jobs::sqlx;
/// use jobs::{Job, JobContext, JobError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Job, Serialize, Deserialize)]
/// #[job(kind = "invoice.send", key = "invoice_id")]
/// struct SendInvoice {
///     invoice_id: i64,
/// }
///
/// #[jobs::handler]
/// async fn send_invoice(job: SendInvoice, _ctx: JobContext) -> Result<(), JobError> {
///     if job.invoice_id < 0 {
///         return Err(JobError::permanent("no such invoice"));
///     }
///     Ok(())
/// }
///
/// # async fn test(pool: sqlx::PgPool) {
/// assert!(jobs::testing::perform(&pool, &SendInvoice { invoice_id: 7 }).await.is_ok());
/// let err = jobs::testing::perform(&pool, &SendInvoice { invoice_id: -1 }).await.unwrap_err();
/// assert!(err.is_permanent());
/// # }
/// ```
pub async fn perform<J: Job>(pool: &PgPool, job: &J) -> Result<(), JobError> {
    let handlers = crate::registry::handlers()
        .map_err(|e| JobError::permanent(format!("the handlers of this binary: {e}")))?;
    let Some(&handler) = handlers.get(J::KIND) else {
        return Err(JobError::permanent(format!(
            "no handler for kind `{}` in this binary: add #[jobs::handler] to an async fn taking the job",
            J::KIND
        )));
    };
    let row = crate::enqueue::NewJob::new(job, Duration::ZERO)
        .map_err(|e| JobError::permanent(format!("cannot enqueue the job: {e}")))?;
    let enqueued = crate::enqueue::insert_one(pool, row)
        .await
        .map_err(|e| JobError::permanent(format!("cannot enqueue the job: {e}")))?;
    if enqueued.outcome == EnqueueOutcome::RerunMarked {
        return Err(JobError::permanent(format!(
            "job {} of this key is running: the enqueue marked it for a re-run, there is nothing to perform now",
            enqueued.id
        )));
    }
    let claimed: Option<(i32, i32, Uuid, String, Option<String>, i64)> =
        crate::pooler::query_as(crate::sql::CLAIM_ID)
            .bind(enqueued.id)
            .bind(crate::enqueue::millis(handler.config.lease_length()))
            .fetch_optional(pool)
            .await?;
    let Some((attempts, max_attempts, token, payload, trace, now_us)) = claimed else {
        return Err(JobError::permanent(format!(
            "job {} was claimed by someone else first (a runtime runs over this database)",
            enqueued.id
        )));
    };
    let claimed = Claimed {
        id: enqueued.id,
        attempt: u32::try_from(attempts).unwrap_or(0),
        max_attempts: u32::try_from(max_attempts).unwrap_or(0),
        token,
        payload,
        trace,
        claimed_at: std::time::Instant::now(),
        start_within: None,
        db_claimed_us: Some(now_us),
    };
    crate::runtime::executor::perform_inline(pool, handler, claimed).await
}

/// Runs a runtime over `pool` until no job of a kind with a handler in this binary is
/// claimable now or running, and returns how the runs ended. Jobs scheduled later
/// (including retries waiting out their backoff) stay pending; [`drain_with`] runs
/// them too, and reports each failed attempt's error.
///
/// ```no_run
/// # async fn test(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// // ... enqueue what the code under test enqueues ...
/// let counts = jobs::testing::drain(&pool).await?;
/// assert_eq!((counts.succeeded, counts.failed), (3, 0));
/// # Ok(()) }
/// ```
pub async fn drain(pool: &PgPool) -> Result<RunCounts, Error> {
    drain_with(pool, Drain::new()).await.map(|d| d.counts)
}

/// How [`drain_with`] drains.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drain {
    scheduled: bool,
}

impl Drain {
    /// Jobs due now only, as [`drain`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Also run jobs scheduled later at once: delayed enqueues, snoozes, and retries
    /// without waiting out their backoff (so a job that keeps failing runs until it is
    /// out of attempts), as Oban's `with_scheduled`. Periodic kinds (`every`) are left
    /// to their period: re-armed after each run, they would never let the drain end.
    pub fn with_scheduled(mut self, scheduled: bool) -> Self {
        self.scheduled = scheduled;
        self
    }
}

/// What a [`drain_with`] did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Drained {
    /// How the runs ended.
    pub counts: RunCounts,
    /// Every attempt that failed during the drain, per job in id order, oldest attempt
    /// first; also of a job that then succeeded and whose row its kind deleted (its
    /// state is then `done`).
    pub failures: Vec<DrainFailure>,
}

/// One failed attempt during a drain.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DrainFailure {
    /// The job's id.
    pub id: i64,
    /// The job's kind.
    pub kind: String,
    /// Where the job stands after the drain: `failed` when it is out of attempts or
    /// failed permanently, `pending` when a retry waits, `done` when it then succeeded
    /// (its row deleted or kept).
    pub state: JobState,
    /// The attempt: its number, what kind of failure, the message.
    pub error: AttemptError,
}

/// [`drain`], with options, reporting each failed attempt.
///
/// ```no_run
/// # use jobs::sqlx;
/// # async fn test(pool: sqlx::PgPool) -> Result<(), jobs::Error> {
/// use jobs::testing::{Drain, drain_with};
/// let drained = drain_with(&pool, Drain::new().with_scheduled(true)).await?;
/// for f in &drained.failures {
///     eprintln!("job {} ({}) attempt {}: {}", f.id, f.kind, f.error.attempt, f.error.message);
/// }
/// assert!(drained.failures.is_empty());
/// # Ok(()) }
/// ```
pub async fn drain_with(pool: &PgPool, options: Drain) -> Result<Drained, Error> {
    let handlers = crate::registry::handlers()?;
    let kinds: Vec<&'static str> = handlers.keys().copied().collect();
    let scheduled: Vec<&'static str> = handlers
        .values()
        .filter(|h| !h.config.is_periodic())
        .map(|h| h.kind)
        .collect();
    // The database's time, which the failures are compared with.
    let started: DateTime<Utc> = crate::pooler::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await?;
    let log = crate::runtime::FailureLog::default();
    let runtime = Runtime::new(pool.clone())
        .poll_interval(Duration::from_millis(10))
        .rescue_interval(Duration::from_millis(50))
        .log_failures(log.clone());
    let watcher = pool.clone();
    let watched = kinds.clone();
    let counts = runtime
        .run_counting(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if options.scheduled {
                    let _ = crate::pooler::query(crate::sql::MAKE_DUE)
                        .bind(&scheduled)
                        .execute(&watcher)
                        .await;
                }
                let busy: Result<bool, sqlx::Error> =
                    crate::pooler::query_scalar(crate::sql::ANY_DUE)
                        .bind(&watched)
                        .fetch_one(&watcher)
                        .await;
                if let Ok(false) = busy {
                    // A failure that committed between the two statements above left
                    // its retry scheduled: with nothing running now, one more pass
                    // finds every such job.
                    if options.scheduled {
                        let made = crate::pooler::query(crate::sql::MAKE_DUE)
                            .bind(&scheduled)
                            .execute(&watcher)
                            .await;
                        if made.is_ok_and(|m| m.rows_affected() > 0) {
                            continue;
                        }
                    }
                    return;
                }
            }
        })
        .await?;
    let rows = crate::pooler::query(crate::sql::FAILED_SINCE)
        .bind(&kinds)
        .bind(started.timestamp_micros() as f64 / 1e6)
        .fetch_all(pool)
        .await?;
    let mut failures = Vec::new();
    for row in &rows {
        use sqlx::Row;
        let id: i64 = row.try_get("id")?;
        let kind: String = row.try_get("kind")?;
        let state: String = row.try_get("state")?;
        let state: JobState = state.parse()?;
        for error in crate::history::from_row(row)? {
            if error.at >= started {
                failures.push(DrainFailure {
                    id,
                    kind: kind.clone(),
                    state,
                    error,
                });
            }
        }
    }
    // The attempts of jobs whose rows are gone (a retry that then succeeded, of a kind
    // without history), as the runtime logged them.
    let present: std::collections::HashSet<i64> = failures.iter().map(|f| f.id).collect();
    let logged = std::mem::take(&mut *log.lock().expect("lock poisoned"));
    let mut gone: Vec<DrainFailure> = logged
        .into_iter()
        .filter(|(id, ..)| !present.contains(id))
        .map(|(id, kind, error)| DrainFailure {
            id,
            kind: kind.to_owned(),
            state: JobState::Done,
            error,
        })
        .collect();
    if !gone.is_empty() {
        failures.append(&mut gone);
        failures.sort_by_key(|f| (f.id, f.error.attempt));
    }
    Ok(Drained { counts, failures })
}

/// A database of one test's own, made from `DATABASE_URL` (the server, user and
/// options; the database named there is not touched): created empty, migrated, and
/// dropped by [`TestDatabase::drop`]. `#[jobs::test]` makes one per test, so tests run
/// in parallel without seeing each other's jobs, and no second sqlx dependency (with
/// its `macros` feature, for `#[sqlx::test]`) is needed.
///
/// ```no_run
/// # async fn demo() -> Result<(), jobs::Error> {
/// let db = jobs::testing::TestDatabase::create("signup_sends_a_welcome").await?;
/// // ... the test, on db.pool() ...
/// db.drop().await?;
/// # Ok(()) }
/// ```
pub struct TestDatabase {
    pool: PgPool,
    name: String,
    server: sqlx::postgres::PgConnectOptions,
}

impl TestDatabase {
    /// Creates and migrates a database named after `test` and a fresh id, on the server
    /// of `DATABASE_URL`.
    pub async fn create(test: &str) -> Result<TestDatabase, Error> {
        use sqlx::ConnectOptions;
        let url = std::env::var("DATABASE_URL").map_err(|_| {
            Error::InvalidInput(
                "DATABASE_URL is not set: a test database is made on its server".to_owned(),
            )
        })?;
        let server: sqlx::postgres::PgConnectOptions = url.parse().map_err(|e| {
            Error::InvalidInput(format!("DATABASE_URL is not a PostgreSQL URL: {e}"))
        })?;
        let server = server.disable_statement_logging();
        let short: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(30)
            .collect();
        let name = format!("jobs_test_{short}_{}", Uuid::new_v4().simple());
        let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect_with(&server).await?;
        crate::pooler::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut admin)
            .await?;
        sqlx::Connection::close(admin).await?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .connect_with(server.clone().database(&name))
            .await?;
        crate::migrate(&pool).await?;
        Ok(TestDatabase { pool, name, server })
    }

    /// A pool to the test's database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The database's name (kept for a look when a test fails).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Closes the pool and drops the database.
    pub async fn drop(self) -> Result<(), Error> {
        self.pool.close().await;
        let mut admin =
            <sqlx::PgConnection as sqlx::Connection>::connect_with(&self.server).await?;
        crate::pooler::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        )))
        .execute(&mut admin)
        .await?;
        sqlx::Connection::close(admin).await?;
        Ok(())
    }
}

/// Runs the body of a `#[jobs::test]`: a runtime of tokio's, a [`TestDatabase`], the
/// test on its pool; the database is dropped when the test passes and kept (its name
/// printed) when it panics. Not for calling by hand: the attribute's generated code.
#[doc(hidden)]
pub fn run_test<F, Fut>(test: &str, body: F)
where
    F: FnOnce(PgPool) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime for the test");
    runtime.block_on(async {
        let db = TestDatabase::create(test)
            .await
            .unwrap_or_else(|e| panic!("cannot make the test's database: {e}"));
        let ran = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(body(
            db.pool().clone(),
        )))
        .await;
        match ran {
            Ok(()) => db
                .drop()
                .await
                .unwrap_or_else(|e| panic!("cannot drop the test's database: {e}")),
            Err(panic) => {
                eprintln!("the test's database is kept: {}", db.name());
                std::panic::resume_unwind(panic);
            }
        }
    });
}
