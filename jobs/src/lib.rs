//! Typed background jobs for Rust, stored in your application's own PostgreSQL database.
//!
//! A job is a row in the same database as the data it is about: a kind, an optional
//! dedup key, and a JSON payload, the serialized value of a Rust type. Enqueue it in the
//! same transaction as your own writes, and the job exists exactly when that transaction
//! commits. Every replica of your service runs a [`Runtime`]; the replicas claim
//! disjoint jobs under leases, renew the leases while the handlers run, retry failures
//! with exponential backoff, and park a job that keeps failing as `failed`, with its last
//! error, for an operator to look at. There is no broker and no leader election.
//!
//! # A first job
//!
//! A job type derives [`Job`](derive@Job) (and serde's traits), a handler is an `async fn`
//! marked [`#[jobs::handler]`](handler), and [`run`] claims jobs of every kind whose
//! handler is linked into the binary:
//!
//! ```no_run
//! use jobs::sqlx; // the sqlx the library is built on: no sqlx dependency of your own
//! use jobs::{Job, JobContext, JobError};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Job, Serialize, Deserialize)]
//! #[job(kind = "invoice.send", key = "invoice_id")]
//! struct SendInvoice {
//!     invoice_id: i64,
//! }
//!
//! #[jobs::handler]
//! async fn send_invoice(job: SendInvoice, ctx: JobContext) -> Result<(), JobError> {
//!     let email: String = sqlx::query_scalar("SELECT email FROM invoices WHERE id = $1")
//!         .bind(job.invoice_id)
//!         .fetch_one(ctx.pool())
//!         .await?; // any error is a failed attempt, retried after a backoff
//!     println!("sending invoice {} to {email}", job.invoice_id);
//!     Ok(())
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let pool = sqlx::PgPool::connect(&std::env::var("DATABASE_URL")?).await?;
//!     jobs::migrate(&pool).await?; // creates or upgrades the `jobs` table
//!
//!     // The invoice and its job commit together, or neither does.
//!     let mut tx = pool.begin().await?;
//!     let invoice_id: i64 =
//!         sqlx::query_scalar("INSERT INTO invoices (email) VALUES ($1) RETURNING id")
//!             .bind("customer@example.com")
//!             .fetch_one(&mut *tx)
//!             .await?;
//!     SendInvoice { invoice_id }.enqueue(&mut *tx).await?;
//!     tx.commit().await?;
//!
//!     // Runs `send_invoice` (and every other handler in this binary) until SIGINT or SIGTERM.
//!     jobs::run(pool).await?;
//!     Ok(())
//! }
//! ```
//!
//! A job runs at least once: a runtime that dies or stalls past its lease has its job
//! taken over and run again, so handlers must be idempotent.
//!
//! # Defining jobs
//!
//! `#[derive(Job)]` implements the [`Job`](trait@Job) trait from the `#[job(...)]`
//! attribute. Durations are strings in the `humantime` crate's grammar (the `jobsctl`
//! tool reads the same): a number and a unit, or a sum of them, `"250ms"`, `"30s"`,
//! `"1h30m"`, `"7d"`. A mistake in the attribute is a compile error on the offending
//! token, and so is a `backoff` above `max_backoff` or a lease under 500 ms.
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `kind = "invoice.send"` | required | the kind string stored in the `kind` column; one type per kind |
//! | `key = "field"`, `key = ["a", "b"]` | none | dedup key: at most one live (pending or running) job per key; an `Option` field that is `None` means no key; several fields are joined with `:` (escaped). Key fields implement [`KeyPart`] |
//! | `max_attempts = 20` | 20 | claims after which a failing job becomes `failed` |
//! | `backoff = "1s"` | 1s | base of the exponential backoff, `backoff * 2^(attempt - 1)`, with jitter keeping 50-100% of it |
//! | `max_backoff = "1h"` | 1h | cap of the backoff |
//! | `lease = "30s"` or `lease = "transaction"` | 30s | heartbeat lease length, at least 500 ms (renewed every third of it), or [transaction mode](#transaction-mode-ctxtx) |
//! | `cancel_on_lease_loss = false` | true | whether a handler whose lease is lost is cancelled at its next await point |
//! | `timeout = "5m"` | none | cancel the handler after this long; the attempt fails |
//! | `concurrency = 4` | none | at most this many jobs of the kind at once in one runtime |
//! | `global_concurrency = 8` | none | at most this many jobs of the kind running at once across every runtime on the database; an operator's value ([`admin::set_limits`]) wins over it |
//! | `rate = "600/1m"` | none | at most this many handler starts of the kind in any window of this length, across every runtime (the window slides; see [`MAX_RATE_WINDOW`] for an operator's) |
//! | `partition = "tenant"`, `partition = ["tenant", "region"]` | none | `global_concurrency` and `rate` hold per value of these payload fields (compared as JSON: `"1"` and `1` differ), at most four; a partition's backlog holds up no other |
//! | `retain = "7d"` | none | keep done rows this long (state `done`) instead of deleting them |
//! | `every = "10m"` | none | periodic: one live job of the kind across all replicas, re-armed one period after each completion; the type implements `Default` and has no `key` |
//! | `priority = 2` | 0 | the kind's default priority, 0 to 9 ([`MAX_PRIORITY`]): among the due jobs of the kind, a lower number is claimed first, then the earlier run-after, then the id; [`EnqueueOptions::priority`] overrides it for one job |
//! | `cron = "0 3 * * *"` | none | scheduled: one live job of the kind across all replicas (as `every`: `Default`, no `key`), due at each fire time of the cron expression (five fields, six with seconds first, or `@daily` and the like), following the zone's wall clock across daylight-saving changes; see [`CronSchedule`] |
//! | `timezone = "Europe/Paris"` | `UTC` | the IANA time zone `cron` is read in; fire times follow its wall clock across daylight-saving changes |
//!
//! The settings end up in [`Job::CONFIG`] (a [`JobConfig`]):
//!
//! ```
//! use std::time::Duration;
//!
//! use jobs::{Job, Lease};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Job, Serialize, Deserialize)]
//! #[job(
//!     kind = "replay.advance",
//!     key = ["session_id", "subsystem"],
//!     max_attempts = 5,
//!     backoff = "500ms",
//!     lease = "2m",
//!     timeout = "15m",
//!     concurrency = 4
//! )]
//! struct ReplayAdvance {
//!     session_id: i64,
//!     subsystem: String,
//! }
//!
//! #[derive(Job, Serialize, Deserialize, Default)]
//! #[job(kind = "sessions.purge", every = "10m", lease = "transaction")]
//! struct PurgeSessions {}
//!
//! let job = ReplayAdvance { session_id: 7, subsystem: "mail".into() };
//! assert_eq!(job.key().as_deref(), Some("7:mail"));
//! assert_eq!(ReplayAdvance::CONFIG.lease, Lease::Heartbeat(Duration::from_secs(120)));
//! assert_eq!(PurgeSessions::CONFIG.every, Some(Duration::from_secs(600)));
//! assert_eq!(PurgeSessions::CONFIG.lease, Lease::Transaction);
//! ```
//!
//! A row keeps the JSON it was enqueued with, so a changed payload type must still
//! deserialize the rows already in the table (add fields with `#[serde(default)]`,
//! rename with `#[serde(alias = "...")]`), or be a new kind. A payload that does not
//! deserialize fails its job permanently, with a `last_error` naming the kind and serde's
//! error.
//!
//! # Handlers and `JobError`
//!
//! A handler is `#[jobs::handler] async fn name(job: MyJob, ctx: JobContext) ->
//! Result<(), JobError>`, one per kind. It gets the deserialized payload and a
//! [`JobContext`]: the job's id, attempt and claim, and your pool. How it ends decides
//! what happens to the job ([`JobError`]):
//!
//! - `Ok(())`: the job is done (deleted, or kept as `done` with `retain`);
//! - any error, through `?` (or [`JobError::retry`]): the attempt failed; the job runs
//!   again after a backoff, until it runs out of attempts and becomes `failed`;
//! - [`JobError::permanent`]: the job becomes `failed` at once;
//! - [`JobError::snooze`]: the job runs again after the delay, without spending an
//!   attempt;
//! - [`JobError::lease_lost`]: the claim is gone (see [`JobContext::is_lease_lost`]); the
//!   runtime writes nothing for this attempt, since another runtime may own the job now.
//!
//! A panic is a failed attempt with the panic's message, and so is a `timeout`.
//!
//! # Fenced writes: `ctx.fenced_tx()`
//!
//! In the default lease mode, a handler whose lease expired (a long pause, a lost
//! connection) may still be running while another runtime runs the same job. Write the
//! job's results through [`JobContext::fenced_tx`]: a transaction that has verified and
//! locked this claim, in which [`FencedTx::commit`] also completes the job. A late result
//! from a lost claim is refused, and the results and the completion commit together or
//! not at all.
//!
//! ```no_run
//! use jobs::sqlx;
//! use jobs::{Job, JobContext, JobError};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Job, Serialize, Deserialize)]
//! #[job(kind = "report.build", key = "report_id", lease = "1m")]
//! struct BuildReport {
//!     report_id: i64,
//! }
//!
//! # async fn render(_id: i64) -> Result<String, std::io::Error> { Ok(String::new()) }
//! #[jobs::handler]
//! async fn build_report(job: BuildReport, ctx: JobContext) -> Result<(), JobError> {
//!     // The slow part, outside any transaction; the runtime renews the lease meanwhile.
//!     let body = render(job.report_id).await?;
//!     // Then a short transaction that holds the claim.
//!     let mut tx = ctx.fenced_tx().await?;
//!     sqlx::query("UPDATE reports SET body = $2 WHERE id = $1")
//!         .bind(job.report_id)
//!         .bind(body)
//!         .execute(&mut *tx)
//!         .await?;
//!     tx.commit().await?; // the report and the job's completion, together
//!     Ok(())
//! }
//! ```
//!
//! # Transaction mode: `ctx.tx()`
//!
//! With `lease = "transaction"`, everything the handler writes through
//! [`JobContext::tx`] commits in one transaction with the job's completion, exactly once,
//! or not at all (a failure, a snooze or a lost claim rolls it back). The claim itself is
//! committed first under a renewed lease ([`Lease::TRANSACTION_LEASE`]), so the attempt
//! counts even if the session dies; the transaction opens at the handler's first
//! `ctx.tx()` and locks the job's row only at its end, to check the claim and complete
//! the job, so an enqueue of the key never waits for the handler. For short,
//! database-only steps:
//!
//! ```no_run
//! use jobs::sqlx;
//! use jobs::{Job, JobContext, JobError};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Job, Serialize, Deserialize)]
//! #[job(kind = "ledger.apply", key = "entry_id", lease = "transaction")]
//! struct ApplyEntry {
//!     entry_id: i64,
//! }
//!
//! #[jobs::handler]
//! async fn apply_entry(job: ApplyEntry, ctx: JobContext) -> Result<(), JobError> {
//!     let mut tx = ctx.tx().await?;
//!     sqlx::query(
//!         "UPDATE accounts a SET balance = a.balance + e.amount
//!          FROM entries e WHERE e.id = $1 AND a.id = e.account_id AND NOT e.applied",
//!     )
//!     .bind(job.entry_id)
//!     .execute(&mut *tx)
//!     .await?;
//!     sqlx::query("UPDATE entries SET applied = true WHERE id = $1")
//!         .bind(job.entry_id)
//!         .execute(&mut *tx)
//!         .await?;
//!     Ok(()) // the runtime commits both updates with the job's completion
//! }
//! ```
//!
//! # Enqueueing
//!
//! [`Job::enqueue`] takes a pool (`&pool`), a connection, or a transaction
//! (`&mut *tx`, atomically with your own writes); [`Job::enqueue_in`] makes the job
//! claimable after a delay, on the database's clock; [`EnqueueBatch`] and
//! [`enqueue_all`] write many jobs in one statement. Each returns an [`Enqueued`]: the
//! row's id and an [`EnqueueOutcome`].
//!
//! A job with a key coalesces with the key's live job: if that job is pending, it takes
//! the new payload and run-after ([`EnqueueOutcome::Coalesced`]); if it is running, it is
//! marked to run once more when its claim ends ([`EnqueueOutcome::RerunMarked`]), so the
//! handler starts at least once after the last trigger. Either way the job gets a fresh
//! attempt budget.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use jobs::{EnqueueOutcome, Job};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Job, Serialize, Deserialize)]
//! #[job(kind = "index.refresh", key = "document_id")]
//! struct RefreshIndex {
//!     document_id: i64,
//! }
//!
//! # async fn enqueue(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
//! let first = RefreshIndex { document_id: 1 }.enqueue(&pool).await?;
//! assert_eq!(first.outcome, EnqueueOutcome::Inserted);
//!
//! // Another trigger of the same key, while the first is still pending: one job.
//! let again = RefreshIndex { document_id: 1 }
//!     .enqueue_in(&pool, Duration::from_secs(5))
//!     .await?;
//! assert_eq!((again.id, again.outcome), (first.id, EnqueueOutcome::Coalesced));
//!
//! // Many at once, in one round trip.
//! let docs: Vec<RefreshIndex> = (2..100).map(|document_id| RefreshIndex { document_id }).collect();
//! let results = jobs::enqueue_all(&pool, &docs).await?;
//! assert_eq!(results.len(), docs.len());
//! # Ok(()) }
//! ```
//!
//! # Running
//!
//! [`run`] runs a [`Runtime`] with its defaults until SIGINT or SIGTERM. The builder sets
//! the concurrency, the polling and rescue intervals, the shutdown grace, the kinds to
//! claim, and the retention of failed rows; [`Runtime::run_until`] stops on a future of
//! your own. Idle runtimes wake on a `NOTIFY` within milliseconds, and poll as well. A
//! runtime opens up to [`RUNTIME_CONNECTIONS`] connections of its own, with your pool's
//! settings; handlers use your pool.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! # async fn start(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let runtime = jobs::Runtime::new(pool)
//!     .concurrency(20)
//!     .shutdown_grace(Duration::from_secs(30))
//!     .kinds(["invoice.send", "report.build"])
//!     .retain_failed(Duration::from_secs(30 * 24 * 3600));
//! # drop(stop);
//! // ... give `stop` to whatever decides to shut down ...
//! runtime
//!     .run_until(async {
//!         stopped.await.ok();
//!     })
//!     .await
//! # }
//! ```
//!
//! # Operators
//!
//! Failed jobs stay in the table, with their last error, until someone retries or
//! discards them. [`admin`] has the operations an operator needs: [`admin::stats`]
//! (counts per kind and state, and the lag), [`admin::list`], [`admin::get`],
//! [`admin::retry`], [`admin::retry_kind`], [`admin::cancel`], [`admin::discard`] and
//! [`admin::prune`]. Each is safe while runtimes work. The project's operator CLI is
//! built on them.
//!
//! # Observability
//!
//! The library logs through [`tracing`](https://docs.rs/tracing) and installs no
//! subscriber: without one, a runtime that retries, fails or stops says nothing. Every run
//! of a handler is one span named `job` with the fields `job.id`, `job.kind`,
//! `job.attempt`, and `job.outcome` recorded at the end (`succeeded`, `retried`,
//! `failed`, `snoozed`, `lease_lost`, `handed_back`); a failed attempt's warning carries
//! `job.id` and `job.kind` itself as well. The span also carries OpenTelemetry's
//! conventions for messaging: `otel.name` (`process <kind>`), `otel.kind` (`consumer`),
//! `messaging.system` (`jobs`), `messaging.operation.type` (`process`),
//! `messaging.destination.name` (the kind) and `messaging.message.id` (the job's id).
//!
//! With the `opentelemetry` feature, traces cross the queue: an enqueue made inside a
//! span that has an OpenTelemetry context (through the
//! [`tracing-opentelemetry`](https://docs.rs/tracing-opentelemetry) layer) stores its
//! W3C `traceparent` in the job's row (the column `trace`), and the run's `job` span
//! continues that trace: as the enqueuing span's child on the first attempt, linked to
//! it on a retry. A trigger coalesced into a live job of its key brings its own context,
//! as it brings its payload. Without the feature, the layer, or a span, the column stays
//! NULL and nothing is done for it.
//!
//! With the `metrics` feature (`pgjobs = { version = "0.1", features = ["metrics"] }`)
//! the runtime also reports through the [`metrics`](https://docs.rs/metrics) facade,
//! labelled by `kind`: `jobs_claimed_total`, `jobs_finished_total` (with an `outcome`),
//! `jobs_handler_duration_seconds`, `jobs_queue_wait_seconds` (claim time minus
//! run-after, on the database's clock), and every 10 s the gauges `jobs_lag_seconds`
//! and `jobs_depth` (claimable jobs, counted up to 100,000). It installs no recorder.
//!
//! # Testing
//!
//! [`testing`] helps the tests of your application: [`testing::enqueued`] lists the live
//! jobs of a kind ([`testing::enqueued_rows`] also those whose payload no longer
//! deserializes), [`testing::assert_enqueued`] checks that one matches, and
//! [`testing::drain`] runs every due job to completion and reports how the runs ended
//! ([`RunCounts`]). Give each test a database of its own, for example with
//! `#[sqlx::test(migrator = "jobs::MIGRATOR")]` ([`MIGRATOR`]).
//!
//! # Guarantees
//!
//! - **At least once.** A job's handler runs until one run completes it.
//! - **One claim at a time.** A job is claimed by one runtime at a time, under a lease on
//!   the database's clock that the runtime renews while the handler runs.
//! - **Fenced results.** Every write the runtime makes for a claim checks that the claim
//!   is still current; [`JobContext::fenced_tx`] gives the handler the same check.
//! - **Transaction mode** commits the handler's writes and the completion exactly once.
//! - **Nothing lost.** Database outages are waited out with backoff; a trigger that
//!   arrives while its key's job runs marks it for a re-run instead of being dropped.
//! - **Failures are visible.** A job out of attempts, failed permanently, or whose payload
//!   does not deserialize stays `failed`, with its `last_error`.
//!
//! The project's README, in its source repository, takes a service from install to
//! production (the job table, the privileges a runtime needs, deploying behind a
//! pooler or in a schema of its own); RELIABILITY.md covers the guarantees in detail,
//! and `docs/` how claims, limits and the runtime's connections work.
#![forbid(unsafe_code)]

pub mod admin;
mod connect;
mod context;
mod enqueue;
mod error;
mod history;
mod job;
mod limits;
mod migrate;
mod outcome;
mod pooler;
mod registry;
mod runtime;
mod sql;
pub mod testing;
mod trace;
mod why;

pub use connect::{connect, connect_with};
pub use context::{FencedTx, JobContext, JobError, TxGuard};
pub use enqueue::{EnqueueBatch, EnqueueOptions, EnqueueOutcome, Enqueued, enqueue_all};
pub use error::Error;
pub use history::{AttemptError, FailureKind};
pub use job::{CronSchedule, Job, JobConfig, KeyPart, Lease, Rate};
pub use limits::{
    DEFAULT_MAX_PAYLOAD_BYTES, MAX_KEY_BYTES, MAX_KIND_BYTES, MAX_OUTPUT_BYTES, MAX_RATE_WINDOW,
    max_payload_bytes, set_max_payload_bytes,
};

/// The least urgent priority: priorities go from 0 (claimed first) to this.
pub const MAX_PRIORITY: i16 = 9;
/// Derives [`Job`](trait@Job) for a struct or enum, from its `#[job(...)]` attribute,
/// and registers its kind.
///
/// The type also needs serde's `Serialize` and `Deserialize`. The attribute's keys are
/// listed in the [crate documentation](crate#defining-jobs); `kind` is required.
///
/// ```
/// use jobs::Job;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Job, Serialize, Deserialize)]
/// #[job(kind = "session.delete", key = "session_id", max_attempts = 5)]
/// struct SessionDelete {
///     session_id: u64,
/// }
///
/// assert_eq!(SessionDelete::KIND, "session.delete");
/// assert_eq!(SessionDelete { session_id: 42 }.key().as_deref(), Some("42"));
/// ```
#[doc(inline)]
pub use jobs_macros::Job;

/// Registers an `async fn(job: T, ctx: JobContext) -> Result<(), JobError>` as the
/// handler of `T`'s kind.
///
/// Every kind a runtime claims needs exactly one handler linked into the binary; [`run`]
/// finds them at start and refuses to start on a kind with two. The attribute takes no
/// arguments: the kind's settings are in the job type's `#[job(...)]`.
///
/// ```no_run
/// use jobs::sqlx;
/// use jobs::{Job, JobContext, JobError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Job, Serialize, Deserialize)]
/// #[job(kind = "session.delete", key = "session_id")]
/// struct SessionDelete {
///     session_id: i64,
/// }
///
/// #[jobs::handler]
/// async fn delete_session(job: SessionDelete, ctx: JobContext) -> Result<(), JobError> {
///     sqlx::query("DELETE FROM sessions WHERE id = $1")
///         .bind(job.session_id)
///         .execute(ctx.pool())
///         .await?;
///     Ok(())
/// }
/// ```
#[doc(inline)]
pub use jobs_macros::handler;

/// A test with a database of its own, without a second sqlx dependency:
/// `#[jobs::test] async fn name(pool: jobs::sqlx::PgPool) { .. }` creates a database on
/// the server of `DATABASE_URL`, migrates it, runs the test on a tokio runtime with a
/// pool to it, and drops it when the test passes (a failed test's database is kept, its
/// name printed). See [`testing::TestDatabase`].
pub use jobs_macros::test;
pub use migrate::{MIGRATIONS_TABLE, MIGRATOR, migrate};
pub use pooler::behind_transaction_pooler;
pub use runtime::{RUNTIME_CONNECTIONS, RunCounts, Runtime, run};

/// The sqlx this library is built on (0.9), re-exported: a pool made with `jobs::sqlx`
/// is the pool [`run`] and [`Job::enqueue`] take, whatever sqlx version the rest of the
/// application uses.
///
/// ```no_run
/// use jobs::sqlx::postgres::PgPoolOptions;
///
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = PgPoolOptions::new()
///     .max_connections(20)
///     .connect("postgres://app@localhost/app")
///     .await?;
/// jobs::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub use sqlx;

/// The README's code blocks, compiled and run as doctests; never documented.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

/// Not public API: used by the code that `#[derive(Job)]` and `#[jobs::handler]`
/// generate. May change in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::outcome::{HandlerResult, OutputSlot};
    pub use crate::registry::{HandlerFuture, HandlerInfo, HandlerInput, KindInfo, dispatch};
    pub use inventory;

    /// The key of a periodic kind's one live job.
    pub const PERIODIC_KEY: &str = crate::sql::PERIODIC_KEY;

    /// The claim statement (from the floors in `$5`, seconds since the epoch; none is
    /// the start of each range), for tests that read its plan.
    pub const CLAIM_SQL: &str = crate::sql::CLAIM;

    /// The claim over several kinds whose limits add up to more than it takes.
    pub const CLAIM_SPLIT_SQL: &str = crate::sql::CLAIM_SPLIT;

    /// Every SQL statement the crate runs, by name, for tests that check them all.
    pub fn statements() -> Vec<(&'static str, &'static str)> {
        crate::sql::all()
    }

    /// Joins the parts of a key over several fields.
    pub fn join_key_parts(parts: &[Option<String>]) -> Option<String> {
        crate::job::join_key_parts(parts)
    }
}
