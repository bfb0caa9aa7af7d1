//! Operators' view of the job table: list, inspect, retry, cancel, discard, count, prune.
//!
//! Each operation is one statement (prune is a loop of bounded ones), safe to run while
//! runtimes claim and complete jobs: a statement touches only rows in the state it is
//! about, and re-checks that state on the row version it changes, so an operator and a
//! runtime racing for one row never both win. Times are the database clock's.
//!
//! ```no_run
//! # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
//! use jobs::admin::{self, JobState, ListFilter};
//!
//! for job in admin::list(&pool, &ListFilter::new().state(JobState::Failed).limit(20)).await? {
//!     println!("{} {} {:?}", job.id, job.kind, job.last_error);
//!     admin::retry(&pool, job.id).await?;
//! }
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::types::chrono::{DateTime, Utc};
use sqlx::{Acquire, PgExecutor, Postgres, Row};

use crate::error::Error;
pub use crate::why::{Explanation, RuntimeInfo, Wait, explain};

/// Every statement of this module, by name: the tests read them all.
pub(crate) const STATEMENTS: &[(&str, &str)] = &[
    ("LIST_NEWEST", LIST_NEWEST),
    ("LIST_OLDEST", LIST_OLDEST),
    ("GET", GET),
    ("RETRY", RETRY),
    ("CANCEL", CANCEL),
    ("DISCARD", DISCARD),
    ("STATS", STATS),
    ("DONE_KINDS", DONE_KINDS),
    ("PRUNE_BATCH", PRUNE_BATCH),
    ("PRUNE_FAILED_BATCH", PRUNE_FAILED_BATCH),
    ("PRUNE_CANCELLED_BATCH", PRUNE_CANCELLED_BATCH),
    ("PAUSE", PAUSE),
    ("RESUME", RESUME),
    ("PAUSED", PAUSED),
    ("SET_LIMITS", SET_LIMITS),
    ("CLEAR_LIMITS", CLEAR_LIMITS),
    ("LIMITS", LIMITS),
    ("RUNTIMES", RUNTIMES),
    ("THROUGHPUT", THROUGHPUT),
    ("WHY_KIND", crate::why::WHY_KIND),
    ("WHY_SHARES", crate::why::WHY_SHARES),
];

/// The columns of a [`JobRow`], in the order [`JobRow::from_row`] reads them. A claim
/// that ends at `infinity` (the earlier transaction mode's; migration 2 ends those),
/// which chrono cannot hold, is read as NULL plus a flag.
macro_rules! job_columns {
    () => {
        concat!(
            "id, kind, key, state, attempts, max_attempts, run_after, last_error, payload, \
         created_at, finished_at, nullif(claimed_until, 'infinity') AS claimed_until, \
         coalesce(claimed_until = 'infinity', false) AS claim_unbounded, runtime_id, \
         checkpoint, priority, output, ",
            crate::history::history_columns!()
        )
    };
}

/// Lists jobs newest first: `$1` state or NULL, `$2` kind or NULL, `$3` the keyset
/// bound (only ids below it) or NULL, `$4` the page size.
///
/// Index: the primary key, read backwards from `$3`. With a state and a kind the
/// planner can read the partial index of that state instead (`jobs_failed` and
/// `jobs_running` are `(kind, id)`, so their range is already in id order); a cached
/// generic plan falls back to the primary key with a filter.
const LIST_NEWEST: &str = concat!(
    "SELECT ",
    job_columns!(),
    r#"
FROM jobs
WHERE ($1::text IS NULL OR state = $1)
  AND ($2::text IS NULL OR kind = $2)
  AND ($3::bigint IS NULL OR id < $3)
ORDER BY id DESC
LIMIT $4
"#
);

/// Lists jobs oldest first, ids above `$3`; otherwise as [`LIST_NEWEST`].
///
/// Index: the primary key read forwards from `$3` (or a state's partial index, as in
/// [`LIST_NEWEST`]).
const LIST_OLDEST: &str = concat!(
    "SELECT ",
    job_columns!(),
    r#"
FROM jobs
WHERE ($1::text IS NULL OR state = $1)
  AND ($2::text IS NULL OR kind = $2)
  AND ($3::bigint IS NULL OR id > $3)
ORDER BY id
LIMIT $4
"#
);

/// One job by id (`$1`).
///
/// Index: the primary key.
const GET: &str = concat!("SELECT ", job_columns!(), " FROM jobs WHERE id = $1");

/// Retries failed jobs: job `$1`, or every failed job of kind `$2` (the other is NULL).
/// Each becomes pending again, claimable now, attempts reset, `last_error` kept. "Now"
/// is the moment of the update (`clock_timestamp()`), not the transaction's start: an
/// operator's retry inside a longer transaction would otherwise put the job behind the
/// runtimes' floors (`sql::CLAIM_FLOOR_LAG`).
///
/// One key may have one live job, so some failed rows are deleted instead: when the
/// key already has a live (pending or running) job, that job is a newer trigger of the
/// same key and covers the failed one; among several failed jobs of one key with no
/// live job, the newest (highest id, the latest trigger) becomes pending and covers
/// the others. Returns one row per failed job: its id and, when it was merged, the id
/// of the job that covers it. Notifies the runtimes once per kind made pending.
///
/// Index: the primary key (`$1`) or `jobs_failed (kind, id) WHERE state = 'failed'`
/// (`$2`), as a bitmap OR; the failed rows are locked in id order, so two concurrent
/// retries cannot deadlock and a concurrent retry or discard waits and then finds the
/// row gone. `jobs_live_key (kind, key)` finds each key's live job.
const RETRY: &str = r#"
WITH target AS MATERIALIZED (
    SELECT id, kind, key FROM jobs
    WHERE state = 'failed' AND (id = $1 OR kind = $2)
    ORDER BY id
    FOR UPDATE
),
plan AS MATERIALIZED (
    SELECT t.id,
           coalesce(
               (SELECT l.id FROM jobs l
                WHERE l.kind = t.kind AND l.key = t.key AND l.state IN ('pending', 'running')
                LIMIT 1),
               CASE WHEN t.key IS NOT NULL AND t.id <> max(t.id) OVER (PARTITION BY t.kind, t.key)
                    THEN max(t.id) OVER (PARTITION BY t.kind, t.key) END
           ) AS covered_by
    FROM target t
),
merged AS (
    DELETE FROM jobs j USING plan p
    WHERE j.id = p.id AND p.covered_by IS NOT NULL AND j.state = 'failed'
    RETURNING j.id, p.covered_by
),
retried AS (
    UPDATE jobs j SET
        state = 'pending',
        attempts = 0,
        run_after = clock_timestamp(),
        finished_at = NULL,
        rerun_after = NULL,
        claimed_by = NULL,
        claimed_until = NULL
    FROM plan p
    WHERE j.id = p.id AND p.covered_by IS NULL AND j.state = 'failed'
    RETURNING j.id, j.kind
),
notify AS (
    SELECT count(pg_notify('jobs', k.kind)) AS notified
    FROM (SELECT DISTINCT kind FROM retried) k
)
SELECT r.id, NULL::bigint AS covered_by FROM retried r CROSS JOIN notify
UNION ALL
SELECT m.id, m.covered_by FROM merged m
"#;

/// Cancels job `$1` if it is live (pending or running): it becomes `cancelled`, its
/// claim (if any) is gone, so every later fenced write of that claim is refused, and
/// its re-run mark with it. Returns the id and the state it had; for a running job,
/// notifies its runtime (channel `jobs_cancel`, the id as payload), which drops the
/// handler at once (or at its next renewal, which reports the cancel, if the
/// notification is lost), and records the attempt as cancelled in its history.
///
/// Index: the primary key. The row lock is taken first (`FOR UPDATE`, which re-reads a
/// row changed meanwhile): a claim, a completion or a fenced transaction holding the
/// row is waited for, and the state is read after it: a job completed meanwhile is not
/// live, and nothing is cancelled.
const CANCEL: &str = r#"
WITH target AS MATERIALIZED (
    SELECT id, state FROM jobs
    WHERE id = $1 AND state IN ('pending', 'running')
    FOR UPDATE
),
cancelled AS (
    UPDATE jobs j SET
        state = 'cancelled',
        finished_at = now(),
        last_error = 'cancelled by an operator',
        errors = CASE WHEN t.state = 'running' THEN jsonb_path_query_array(
                     j.errors || jsonb_build_object('attempt', j.attempts, 'at', now(),
                         'kind', 'cancelled', 'message', 'cancelled by an operator',
                         'runtime', j.runtime_id),
                     '$[last - 19 to last]')
                 ELSE j.errors END,
        rerun_after = NULL,
        claimed_by = NULL,
        claimed_until = NULL
    FROM target t
    WHERE j.id = t.id
    RETURNING j.id, t.state
)
SELECT c.id, c.state,
       (SELECT count(*) FROM (SELECT pg_notify('jobs_cancel', c.id::text)
                              WHERE c.state = 'running') n) AS notified
FROM cancelled c
"#;

/// Deletes failed job `$1`.
///
/// Index: the primary key.
const DISCARD: &str = "DELETE FROM jobs WHERE id = $1 AND state = 'failed' RETURNING id";

/// Counts per kind and state, and the age of the oldest claimable job, in microseconds,
/// against `now()`.
///
/// Index: one partial index per state, each grouped by its leading `kind` (index-only
/// scans where the visibility map allows): `jobs_claim (kind, run_after, id)` for the
/// pending rows (its `run_after` splits claimable from scheduled and gives the lag),
/// `jobs_running`, `jobs_done`, `jobs_failed` and `jobs_cancelled`. No scan reads another state's rows.
const STATS: &str = r#"
WITH p AS (
    SELECT kind,
           count(*) FILTER (WHERE run_after <= now()) AS ready,
           count(*) FILTER (WHERE run_after > now()) AS scheduled,
           min(run_after) FILTER (WHERE run_after <= now()) AS oldest
    FROM jobs WHERE state = 'pending' GROUP BY kind
),
r AS (SELECT kind, count(*) AS n FROM jobs WHERE state = 'running' GROUP BY kind),
d AS (SELECT kind, count(*) AS n FROM jobs WHERE state = 'done' GROUP BY kind),
f AS (SELECT kind, count(*) AS n FROM jobs WHERE state = 'failed' GROUP BY kind),
x AS (SELECT kind, count(*) AS n FROM jobs WHERE state = 'cancelled' GROUP BY kind),
z AS (SELECT kind, true AS paused FROM jobs_paused)
SELECT kind,
       coalesce(p.ready, 0) AS ready,
       coalesce(p.scheduled, 0) AS scheduled,
       coalesce(r.n, 0) AS running,
       coalesce(d.n, 0) AS done,
       coalesce(f.n, 0) AS failed,
       coalesce(x.n, 0) AS cancelled,
       (extract(epoch FROM now() - p.oldest) * 1000000)::bigint AS lag_us,
       coalesce(z.paused, false) AS paused
FROM p FULL JOIN r USING (kind) FULL JOIN d USING (kind) FULL JOIN f USING (kind)
     FULL JOIN x USING (kind) FULL JOIN z USING (kind)
ORDER BY kind
"#;

/// The kinds that have done rows, one index probe per kind (a loose index scan).
///
/// Index: `jobs_done (kind, finished_at) WHERE state = 'done'`.
const DONE_KINDS: &str = r#"
WITH RECURSIVE k AS (
    (SELECT kind FROM jobs WHERE state = 'done' ORDER BY kind LIMIT 1)
    UNION ALL
    SELECT (SELECT j.kind FROM jobs j WHERE j.state = 'done' AND j.kind > k.kind
            ORDER BY j.kind LIMIT 1)
    FROM k WHERE k.kind IS NOT NULL
)
SELECT kind FROM k WHERE kind IS NOT NULL
"#;

/// Deletes up to `$2` done rows of kind `$1` finished more than `$3` ms ago. Returns
/// nothing; the row count is the command's.
///
/// Index: `jobs_done (kind, finished_at) WHERE state = 'done'`, a range scan from the
/// oldest. `SKIP LOCKED`: concurrent pruners (other operators, the runtimes' retention
/// prune) take disjoint rows and never wait on one another. The runtime's retention
/// prune runs it too, through [`prune`].
const PRUNE_BATCH: &str = r#"
WITH old AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE state = 'done' AND kind = $1
      AND finished_at < now() - $3 * interval '1 millisecond'
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM jobs j USING old WHERE j.id = old.id AND j.state = 'done'
"#;

/// Deletes up to `$2` failed rows of kind `$1` finished more than `$3` ms ago (the
/// runtime's retention for failed rows, `Runtime::retain_failed`).
///
/// Index: `jobs_failed (kind, id) WHERE state = 'failed'`, a range scan from the oldest
/// id (ids rise with time, so the oldest failures come first). `SKIP LOCKED`, as
/// [`PRUNE_BATCH`]; an operator's retry or discard of the same row wins or waits.
/// The retention prune of the finished rows of one state that are ordered by id:
/// [`PRUNE_FAILED_BATCH`] and [`PRUNE_CANCELLED_BATCH`].
macro_rules! prune_by_id {
    ($state:literal) => {
        concat!(
            r#"
WITH old AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE state = '"#,
            $state,
            r#"' AND kind = $1
      AND finished_at < now() - $3 * interval '1 millisecond'
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM jobs j USING old WHERE j.id = old.id AND j.state = '"#,
            $state,
            r#"'
"#
        )
    };
}

const PRUNE_FAILED_BATCH: &str = prune_by_id!("failed");

/// Deletes up to `$2` cancelled rows of kind `$1` finished more than `$3` ms ago, as
/// [`PRUNE_FAILED_BATCH`] does failed ones. Index: `jobs_cancelled (kind, id) WHERE
/// state = 'cancelled'`.
const PRUNE_CANCELLED_BATCH: &str = prune_by_id!("cancelled");

/// The state of a job row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JobState {
    /// Waiting to be claimed, now or from its `run_after` on.
    Pending,
    /// Claimed by a runtime, under a lease.
    Running,
    /// Finished successfully; kept only by kinds that retain history.
    Done,
    /// Out of attempts or failed permanently; kept for operators.
    Failed,
    /// Cancelled by an operator ([`cancel`]) or by its handler
    /// ([`JobError::cancel`](crate::JobError::cancel)); kept like failed rows.
    Cancelled,
}

impl JobState {
    /// Every state, in the order a job goes through them.
    pub const ALL: [JobState; 5] = [
        JobState::Pending,
        JobState::Running,
        JobState::Done,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// The name stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = Error;

    /// Parses a state's stored name (`pending`, `running`, `done`, `failed`,
    /// `cancelled`).
    fn from_str(s: &str) -> Result<Self, Error> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "unknown job state `{s}`: expected pending, running, done, failed or cancelled"
                ))
            })
    }
}

/// One row of the job table, as an operator sees it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct JobRow {
    /// The job's id.
    pub id: i64,
    /// The job's kind.
    pub kind: String,
    /// The key that coalesces its triggers, if it has one.
    pub key: Option<String>,
    /// Where it stands.
    pub state: JobState,
    /// How many times it has been claimed (counted at claim time).
    pub attempts: i32,
    /// How many claims it gets before it fails for good.
    pub max_attempts: i32,
    /// Not claimable before this instant.
    pub run_after: DateTime<Utc>,
    /// The error of its latest failed attempt.
    pub last_error: Option<String>,
    /// The job's serialized value.
    pub payload: serde_json::Value,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it became done or failed.
    pub finished_at: Option<DateTime<Utc>>,
    /// The end of the current claim's lease, while running. A claim without an end in
    /// time (only the earlier transaction mode made them) reads as
    /// [`DateTime::<Utc>::MAX_UTC`].
    pub claimed_until: Option<DateTime<Utc>>,
    /// The runtime that holds the current claim, or held the last one (see
    /// `Runtime`): the id each runtime records in its claims.
    pub runtime: Option<uuid::Uuid>,
    /// The failed attempts, oldest first, the last 20 (see
    /// [`JobContext::previous_errors`](crate::JobContext::previous_errors)).
    pub errors: Vec<crate::AttemptError>,
    /// The last checkpoint a handler stored (see
    /// [`JobContext::checkpoint`](crate::JobContext::checkpoint)), if any.
    pub checkpoint: Option<serde_json::Value>,
    /// What its handler returned, for a kind that keeps done rows (`retain`): the last
    /// completed run's output (`Result<T, JobError>`, `T: Serialize`), stored with its
    /// completion. None for `()`, for a kind that keeps no done rows, and until a run
    /// completes.
    pub output: Option<serde_json::Value>,
    /// Its priority: 0 is claimed first, among the due jobs of its kind.
    pub priority: i16,
}

impl JobRow {
    fn from_row(row: &PgRow) -> Result<JobRow, Error> {
        let state: String = row.try_get("state")?;
        let unbounded: bool = row.try_get("claim_unbounded")?;
        let claimed_until: Option<DateTime<Utc>> = row.try_get("claimed_until")?;
        Ok(JobRow {
            id: row.try_get("id")?,
            kind: row.try_get("kind")?,
            key: row.try_get("key")?,
            state: state.parse()?,
            attempts: row.try_get("attempts")?,
            max_attempts: row.try_get("max_attempts")?,
            run_after: row.try_get("run_after")?,
            last_error: row.try_get("last_error")?,
            payload: row.try_get("payload")?,
            created_at: row.try_get("created_at")?,
            finished_at: row.try_get("finished_at")?,
            claimed_until: if unbounded {
                Some(DateTime::<Utc>::MAX_UTC)
            } else {
                claimed_until
            },
            runtime: row.try_get("runtime_id")?,
            errors: crate::history::from_row(row)?,
            checkpoint: row.try_get("checkpoint")?,
            output: row.try_get("output")?,
            priority: row.try_get("priority")?,
        })
    }
}

/// Which way [`list`] pages through ids.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Order {
    /// Highest id first: the latest jobs.
    #[default]
    NewestFirst,
    /// Lowest id first.
    OldestFirst,
}

/// What [`list`] returns: jobs of a state and/or kind, one page at a time.
///
/// Pages are keyset pages on the id: pass the last id of a page to
/// [`after`](ListFilter::after) for the next one. Rows enqueued or deleted meanwhile
/// never shift a page.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListFilter {
    /// Only jobs in this state.
    pub state: Option<JobState>,
    /// Only jobs of this kind.
    pub kind: Option<String>,
    /// Only jobs past this id in the listing's order (below it newest first, above it
    /// oldest first).
    pub after_id: Option<i64>,
    /// At most this many jobs (100 unless set).
    pub limit: i64,
    /// Newest or oldest first.
    pub order: Order,
}

impl Default for ListFilter {
    fn default() -> Self {
        ListFilter {
            state: None,
            kind: None,
            after_id: None,
            limit: 100,
            order: Order::NewestFirst,
        }
    }
}

impl ListFilter {
    /// Every job, newest first, 100 at most.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only jobs in `state`.
    pub fn state(mut self, state: JobState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only jobs of `kind`.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// The page after the job `id` (the last id of the previous page).
    pub fn after(mut self, id: i64) -> Self {
        self.after_id = Some(id);
        self
    }

    /// At most `limit` jobs (at least 1).
    pub fn limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }

    /// Newest or oldest first.
    pub fn order(mut self, order: Order) -> Self {
        self.order = order;
        self
    }

    /// Lowest ids first.
    pub fn oldest_first(self) -> Self {
        self.order(Order::OldestFirst)
    }
}

/// Lists the jobs that `filter` selects, one page.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// use jobs::admin::{self, JobState, ListFilter};
///
/// // The failed jobs of a kind, 50 at a time, newest first.
/// let mut filter = ListFilter::new().state(JobState::Failed).kind("email.send").limit(50);
/// loop {
///     let page = admin::list(&pool, &filter).await?;
///     for job in &page {
///         println!("{} {:?}", job.id, job.last_error);
///     }
///     match page.last() {
///         Some(last) if page.len() == 50 => filter = filter.after(last.id),
///         _ => break,
///     }
/// }
/// # Ok(()) }
/// ```
pub async fn list<'e, E>(executor: E, filter: &ListFilter) -> Result<Vec<JobRow>, Error>
where
    E: PgExecutor<'e>,
{
    if filter.limit < 1 {
        return Err(Error::InvalidInput(format!(
            "a listing's limit must be at least 1, not {}",
            filter.limit
        )));
    }
    let sql = match filter.order {
        Order::NewestFirst => LIST_NEWEST,
        Order::OldestFirst => LIST_OLDEST,
    };
    let rows = crate::pooler::query(sql)
        .bind(filter.state.map(JobState::as_str))
        .bind(filter.kind.as_deref())
        .bind(filter.after_id)
        .bind(filter.limit)
        .fetch_all(executor)
        .await?;
    rows.iter().map(JobRow::from_row).collect()
}

/// The job `id`, in whatever state, or `None` when no row has that id.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// if let Some(job) = jobs::admin::get(&pool, 42).await? {
///     println!("{} is {}, attempt {}/{}", job.kind, job.state, job.attempts, job.max_attempts);
///     for error in &job.errors {
///         println!("  #{} {}", error.attempt, error.message);
///     }
/// }
/// # Ok(()) }
/// ```
pub async fn get<'e, E>(executor: E, id: i64) -> Result<Option<JobRow>, Error>
where
    E: PgExecutor<'e>,
{
    let row = crate::pooler::query(GET)
        .bind(id)
        .fetch_optional(executor)
        .await?;
    row.as_ref().map(JobRow::from_row).transpose()
}

/// What [`retry`] did with a failed job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retried {
    /// The job is pending again under its id, claimable now, with a fresh attempt
    /// budget. Its `last_error` is kept until it next finishes.
    Pending,
    /// The job's key already had a live (pending or running) job, `live_id`: a trigger
    /// of the same key enqueued after this one failed, which covers it, as an enqueue
    /// of a key with a pending job coalesces into it. The failed row was deleted
    /// (turning it pending would make two live jobs of one key).
    Merged {
        /// The live job of the same key.
        live_id: i64,
    },
}

/// Retries the failed job `id`: see [`Retried`] for the two outcomes.
///
/// [`Error::NotFound`] when no failed job has this id (a pending, running or done job
/// is never touched). In one narrow race, an enqueue of the same key that commits while
/// this statement runs, PostgreSQL refuses the retry with a unique violation on
/// `jobs_live_key` ([`Error::Database`]; see [`is_live_key_conflict`]): run it again and
/// it merges into that new job.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// use jobs::admin::{self, Retried};
///
/// match admin::retry(&pool, 42).await? {
///     Retried::Pending => println!("job 42 is pending again"),
///     Retried::Merged { live_id } => println!("job {live_id} covers job 42"),
///     _ => {}
/// }
/// # Ok(()) }
/// ```
pub async fn retry<'e, E>(executor: E, id: i64) -> Result<Retried, Error>
where
    E: PgExecutor<'e>,
{
    let row: Option<(i64, Option<i64>)> = crate::pooler::query_as(RETRY)
        .bind(id)
        .bind(None::<&str>)
        .fetch_optional(executor)
        .await?;
    match row {
        None => Err(Error::NotFound(id)),
        Some((_, None)) => Ok(Retried::Pending),
        Some((_, Some(live_id))) => Ok(Retried::Merged { live_id }),
    }
}

/// What [`retry_kind`] did with the failed jobs of a kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetriedKind {
    /// Failed jobs that are pending again (see [`Retried::Pending`]).
    pub retried: u64,
    /// Failed jobs deleted because a job of the same key covers them: a live one, or
    /// the newest failed one of the key, retried by this same call (see
    /// [`Retried::Merged`]).
    pub merged: u64,
}

impl RetriedKind {
    /// How many failed jobs are no longer failed.
    pub fn total(&self) -> u64 {
        self.retried + self.merged
    }
}

/// Retries every failed job of `kind`, in one statement: each becomes pending, as with
/// [`retry`], except those a job of the same key covers (see [`RetriedKind::merged`]).
///
/// The race described at [`retry`] fails the whole statement; run it again.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// let done = jobs::admin::retry_kind(&pool, "email.send").await?;
/// println!("{} retried, {} covered by a live job of their key", done.retried, done.merged);
/// # Ok(()) }
/// ```
pub async fn retry_kind<'e, E>(executor: E, kind: &str) -> Result<RetriedKind, Error>
where
    E: PgExecutor<'e>,
{
    let rows: Vec<(i64, Option<i64>)> = crate::pooler::query_as(RETRY)
        .bind(None::<i64>)
        .bind(kind)
        .fetch_all(executor)
        .await?;
    let merged = rows.iter().filter(|(_, covered)| covered.is_some()).count() as u64;
    Ok(RetriedKind {
        retried: rows.len() as u64 - merged,
        merged,
    })
}

/// Whether `error` is the unique violation of `jobs_live_key` that [`retry`] and
/// [`retry_kind`] hit when an enqueue of the same key races them. Running the retry
/// again resolves it.
pub fn is_live_key_conflict(error: &Error) -> bool {
    match error {
        Error::Database(sqlx::Error::Database(db)) => {
            db.is_unique_violation() && db.constraint() == Some("jobs_live_key")
        }
        _ => false,
    }
}

/// What [`cancel`] cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cancelled {
    /// A pending job: no runtime will claim it.
    Pending,
    /// A running job: its claim is gone, so every later write of that claim (a fenced
    /// transaction, its completion, a failure) is refused; its runtime drops the
    /// handler at once when the notification reaches it, and otherwise at its next
    /// lease renewal (within a third of the kind's lease).
    Running,
}

/// Cancels the live (pending or running) job `id`: it becomes
/// [`JobState::Cancelled`], is never claimed again, and frees its key for new jobs.
/// Cancelled rows are kept like failed ones and pruned by the same retention
/// (`Runtime::retain_failed`); a pending re-run mark is dropped with the job.
///
/// [`Error::NotFound`] when no live job has this id (a job that completes at the same
/// instant is not cancelled: the cancel waits for the completion's lock and then finds
/// it done).
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// use jobs::admin::{self, Cancelled};
///
/// match admin::cancel(&pool, 42).await {
///     Ok(Cancelled::Running) => println!("cancelled while running"),
///     Ok(_) => println!("cancelled"),
///     Err(jobs::Error::NotFound(id)) => println!("no live job {id}"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
pub async fn cancel<'e, E>(executor: E, id: i64) -> Result<Cancelled, Error>
where
    E: PgExecutor<'e>,
{
    let row: Option<(i64, String, i64)> = crate::pooler::query_as(CANCEL)
        .bind(id)
        .fetch_optional(executor)
        .await?;
    match row {
        Some((_, state, _)) if state == "running" => Ok(Cancelled::Running),
        Some(_) => Ok(Cancelled::Pending),
        None => Err(Error::NotFound(id)),
    }
}

/// Deletes the failed job `id` and its error.
///
/// [`Error::NotFound`] when no failed job has this id.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// jobs::admin::discard(&pool, 42).await?; // Error::NotFound unless job 42 is failed
/// # Ok(()) }
/// ```
pub async fn discard<'e, E>(executor: E, id: i64) -> Result<(), Error>
where
    E: PgExecutor<'e>,
{
    let row: Option<i64> = crate::pooler::query_scalar(DISCARD)
        .bind(id)
        .fetch_optional(executor)
        .await?;
    row.map(drop).ok_or(Error::NotFound(id))
}

/// The jobs of one kind, counted by state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KindStats {
    /// The kind.
    pub kind: String,
    /// Pending and claimable now (`run_after` has passed).
    pub ready: u64,
    /// Pending, scheduled for later.
    pub scheduled: u64,
    /// Claimed by a runtime.
    pub running: u64,
    /// Done rows kept as history.
    pub done: u64,
    /// Failed rows kept for operators.
    pub failed: u64,
    /// Cancelled rows, kept like failed ones.
    pub cancelled: u64,
    /// How long the oldest claimable job has been waiting since its `run_after`, on
    /// the database clock; `None` when no job is claimable. A lag that keeps growing
    /// means no runtime claims this kind, or they cannot keep up.
    pub lag: Option<Duration>,
    /// Whether the kind is paused ([`pause`]): no runtime claims it.
    pub paused: bool,
}

impl KindStats {
    /// Pending jobs, claimable now or later.
    pub fn pending(&self) -> u64 {
        self.ready + self.scheduled
    }
}

/// Counts per kind (in kind order) of pending (ready and scheduled), running, done and
/// failed jobs, with each kind's lag and whether it is paused. Kinds with no rows are
/// absent unless paused.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// for kind in jobs::admin::stats(&pool).await? {
///     println!(
///         "{}: {} ready, {} failed, lag {:?}{}",
///         kind.kind, kind.ready, kind.failed, kind.lag,
///         if kind.paused { " (paused)" } else { "" },
///     );
/// }
/// # Ok(()) }
/// ```
pub async fn stats<'e, E>(executor: E) -> Result<Vec<KindStats>, Error>
where
    E: PgExecutor<'e>,
{
    type StatsRow = (String, i64, i64, i64, i64, i64, i64, Option<i64>, bool);
    let rows: Vec<StatsRow> = crate::pooler::query_as(STATS).fetch_all(executor).await?;
    Ok(rows
        .into_iter()
        .map(
            |(kind, ready, scheduled, running, done, failed, cancelled, lag_us, paused)| {
                KindStats {
                    kind,
                    ready: count(ready),
                    scheduled: count(scheduled),
                    running: count(running),
                    done: count(done),
                    failed: count(failed),
                    cancelled: count(cancelled),
                    lag: lag_us.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))),
                    paused,
                }
            },
        )
        .collect())
}

/// Deletes the done rows (of `kind`, or of every kind) that finished more than
/// `older_than` ago, `batch` rows per statement until a statement deletes fewer, and
/// returns how many it deleted.
///
/// Bounded batches keep each statement's locks and WAL small; `SKIP LOCKED` lets
/// several pruners (replicas, operators) run at once without waiting on one another,
/// each row deleted by exactly one of them. `conn` is a pool (`&pool`, one connection is
/// taken for the whole prune), a connection or a transaction (then every batch is part
/// of it, and its locks are held until it ends).
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// use std::time::Duration;
///
/// // Done jobs of every kind finished more than a week ago, 1,000 rows per statement.
/// let deleted = jobs::admin::prune(&pool, None, Duration::from_secs(7 * 86_400), 1000).await?;
/// println!("{deleted} done jobs deleted");
/// # Ok(()) }
/// ```
pub async fn prune<'a, A>(
    conn: A,
    kind: Option<&str>,
    older_than: Duration,
    batch: i64,
) -> Result<u64, Error>
where
    A: Acquire<'a, Database = Postgres>,
{
    if batch < 1 {
        return Err(Error::InvalidInput(format!(
            "a prune batch must hold at least 1 row, not {batch}"
        )));
    }
    let mut conn = conn.acquire().await?;
    let kinds: Vec<String> = match kind {
        Some(kind) => vec![kind.to_owned()],
        None => {
            crate::pooler::query_scalar(DONE_KINDS)
                .fetch_all(&mut *conn)
                .await?
        }
    };
    let older_ms = crate::enqueue::millis(older_than);
    let mut deleted = 0;
    for kind in &kinds {
        loop {
            let n = crate::pooler::query(PRUNE_BATCH)
                .bind(kind)
                .bind(batch)
                .bind(older_ms)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            deleted += n;
            if n < batch as u64 {
                break;
            }
        }
    }
    Ok(deleted)
}

/// Which rows a retention prune deletes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Retained {
    /// `done` rows ([`PRUNE_BATCH`]).
    Done,
    /// `failed` rows ([`PRUNE_FAILED_BATCH`]).
    Failed,
    /// `cancelled` rows ([`PRUNE_CANCELLED_BATCH`]).
    Cancelled,
}

/// One bounded batch of the retention prune of `which` rows of `kind` finished more than
/// `older_than` ago; returns how many rows it deleted.
pub(crate) async fn prune_batch(
    pool: &sqlx::PgPool,
    which: Retained,
    kind: &str,
    older_than: Duration,
    batch: i64,
) -> Result<u64, Error> {
    let statement = match which {
        Retained::Done => PRUNE_BATCH,
        Retained::Failed => PRUNE_FAILED_BATCH,
        Retained::Cancelled => PRUNE_CANCELLED_BATCH,
    };
    Ok(crate::pooler::alone!(
        pool,
        crate::pooler::query(statement)
            .bind(kind)
            .bind(batch)
            .bind(crate::enqueue::millis(older_than)),
        execute
    )
    .await?
    .rows_affected())
}

/// A row count from the database, never negative.
pub(crate) fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Pauses `$1` if it is a known kind or `$2` (force) is true, and notifies the runtimes
/// (channel `jobs_paused`) so that they read the paused kinds again at once. Returns
/// whether the kind is known, and how many rows it inserted (0 or 1).
///
/// A kind is known when a registered runtime claims it (`jobs_runtimes.kinds`), a job
/// of any state carries it, or it is paused already. Indexes: the kind-led partial
/// index of each state (`jobs_claim`, `jobs_running`, `jobs_failed`, `jobs_done`,
/// `jobs_cancelled`), one probe each; `jobs_runtimes` is a row per runtime; the primary
/// key of `jobs_paused`.
const PAUSE: &str = r#"
WITH known AS (
    SELECT EXISTS (SELECT 1 FROM jobs_paused WHERE kind = $1)
        OR EXISTS (SELECT 1 FROM jobs_runtimes WHERE $1 = ANY (kinds))
        OR EXISTS (SELECT 1 FROM jobs WHERE kind = $1 AND state = 'pending')
        OR EXISTS (SELECT 1 FROM jobs WHERE kind = $1 AND state = 'running')
        OR EXISTS (SELECT 1 FROM jobs WHERE kind = $1 AND state = 'failed')
        OR EXISTS (SELECT 1 FROM jobs WHERE kind = $1 AND state = 'done')
        OR EXISTS (SELECT 1 FROM jobs WHERE kind = $1 AND state = 'cancelled') AS known
),
i AS (
    INSERT INTO jobs_paused (kind)
    SELECT $1 FROM known WHERE known.known OR $2::boolean
    ON CONFLICT (kind) DO NOTHING
    RETURNING kind
)
SELECT (SELECT known FROM known), count(pg_notify('jobs_paused', i.kind)) FROM i
"#;

/// Resumes `$1`, and notifies the runtimes as [`PAUSE`] does. Index: the primary key of
/// `jobs_paused`.
const RESUME: &str = r#"
WITH d AS (DELETE FROM jobs_paused WHERE kind = $1 RETURNING kind)
SELECT count(pg_notify('jobs_paused', d.kind)) FROM d
"#;

/// The paused kinds and since when, in kind order.
const PAUSED: &str = "SELECT kind, paused_at FROM jobs_paused ORDER BY kind";

/// Pauses a kind: every runtime stops claiming it within its poll interval (one second
/// by default; at once when the notification reaches it); jobs of the kind already
/// claimed run to their end, and enqueues still
/// succeed, so its jobs wait, pending, until [`resume`]. Returns whether the kind was
/// running before (false if it was already paused).
///
/// Only a kind this database knows is paused: one that a registered runtime claims
/// (see [`runtimes`]), that a job of any state carries, or that is paused already.
/// Any other name (a typo, most likely) is an [`Error::InvalidInput`] and nothing is
/// written; [`pause_forced`] pauses it anyway, for a kind whose first runtime or job
/// is still to come.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// let was_running = jobs::admin::pause(&pool, "email.send").await?;
/// // ... the mail server is back ...
/// jobs::admin::resume(&pool, "email.send").await?;
/// # Ok(()) }
/// ```
pub async fn pause<'e, E>(executor: E, kind: &str) -> Result<bool, Error>
where
    E: PgExecutor<'e>,
{
    pause_kind(executor, kind, false).await
}

/// Pauses `kind` as [`pause`] does, whether or not the database knows it yet: a kind
/// that no runtime has declared and no job carries, paused before its first deploy.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// // The kind ships tomorrow; it must not run until the operators say so.
/// jobs::admin::pause_forced(&pool, "ledger.rebuild").await?;
/// # Ok(()) }
/// ```
pub async fn pause_forced<'e, E>(executor: E, kind: &str) -> Result<bool, Error>
where
    E: PgExecutor<'e>,
{
    pause_kind(executor, kind, true).await
}

async fn pause_kind<'e, E>(executor: E, kind: &str, force: bool) -> Result<bool, Error>
where
    E: PgExecutor<'e>,
{
    let (known, inserted): (bool, i64) = crate::pooler::query_as(PAUSE)
        .bind(kind)
        .bind(force)
        .fetch_one(executor)
        .await?;
    if !known && !force {
        return Err(Error::InvalidInput(format!(
            "no kind `{kind}` here: no runtime has declared it and no job carries it \
             (a typo?); pause it anyway with `jobsctl pause --force` or \
             jobs::admin::pause_forced"
        )));
    }
    Ok(inserted > 0)
}

/// Resumes a paused kind: runtimes claim it again, an idle one at once (a notification
/// wakes it), any other within its poll interval. Returns whether the kind was paused.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// if jobs::admin::resume(&pool, "email.send").await? {
///     println!("email.send resumed");
/// }
/// # Ok(()) }
/// ```
pub async fn resume<'e, E>(executor: E, kind: &str) -> Result<bool, Error>
where
    E: PgExecutor<'e>,
{
    notified(executor, RESUME, kind).await
}

/// Runs [`PAUSE`] or [`RESUME`] for `kind`: whether it changed anything (and notified).
async fn notified<'e, E>(executor: E, statement: &'static str, kind: &str) -> Result<bool, Error>
where
    E: PgExecutor<'e>,
{
    let n: i64 = crate::pooler::query_scalar(statement)
        .bind(kind)
        .fetch_one(executor)
        .await?;
    Ok(n > 0)
}

/// The paused kinds, in kind order, each with when it was paused.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// for (kind, since) in jobs::admin::paused(&pool).await? {
///     println!("{kind} paused since {since}");
/// }
/// # Ok(()) }
/// ```
pub async fn paused<'e, E>(executor: E) -> Result<Vec<(String, DateTime<Utc>)>, Error>
where
    E: PgExecutor<'e>,
{
    Ok(crate::pooler::query_as(PAUSED).fetch_all(executor).await?)
}

/// Sets the operator's limits of kind `$1` (`$2` the global concurrency, `$3` starts per
/// `$4` ms the rate), replacing any set before, and notifies the runtimes as [`PAUSE`]
/// does, so that they read the limits again at once. Index: the primary key of
/// `jobs_limits`.
const SET_LIMITS: &str = r#"
WITH i AS (
    INSERT INTO jobs_limits (kind, concurrency, rate_starts, rate_ms) VALUES ($1, $2, $3, $4)
    ON CONFLICT (kind) DO UPDATE SET concurrency = excluded.concurrency,
        rate_starts = excluded.rate_starts, rate_ms = excluded.rate_ms, updated_at = now()
    RETURNING kind
)
SELECT count(pg_notify('jobs_paused', i.kind)) FROM i
"#;

/// Deletes the operator's limits of kind `$1` and notifies the runtimes. Index: the
/// primary key of `jobs_limits`.
const CLEAR_LIMITS: &str = r#"
WITH d AS (DELETE FROM jobs_limits WHERE kind = $1 RETURNING kind)
SELECT count(pg_notify('jobs_paused', d.kind)) FROM d
"#;

/// The operator's limits, in kind order, with each kind's running jobs. Index: the
/// primary key of `jobs_limits`; `jobs_running`, one range per kind.
const LIMITS: &str = r#"
SELECT l.kind, l.concurrency, l.rate_starts, l.rate_ms, l.updated_at,
       (SELECT count(*) FROM jobs j WHERE j.state = 'running' AND j.kind = l.kind) AS running
FROM jobs_limits l
ORDER BY l.kind
"#;

/// Limits of a kind across every runtime on the database, as an operator sets them
/// ([`set_limits`]). A value set here wins over the kind's attribute
/// (`#[job(global_concurrency = 8)]`) until [`clear_limits`].
///
/// ```
/// use std::time::Duration;
/// let limits = jobs::admin::KindLimits::default()
///     .concurrency(4)
///     .rate(100, Duration::from_secs(1));
/// assert_eq!(limits.concurrency, Some(4));
/// assert_eq!(limits.rate.map(|r| r.starts), Some(100));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KindLimits {
    /// At most this many jobs of the kind running at once across every runtime (at
    /// least 1); `None` leaves the attribute's value, if any, in force.
    pub concurrency: Option<u32>,
    /// At most this many starts in any window of this length across every runtime;
    /// `None` leaves the attribute's value, if any, in force.
    pub rate: Option<crate::Rate>,
}

impl KindLimits {
    /// Sets the global concurrency.
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = Some(n);
        self
    }

    /// Sets the rate: at most `starts` in any window of `per`.
    pub fn rate(mut self, starts: u32, per: Duration) -> Self {
        self.rate = Some(crate::Rate { starts, per });
        self
    }
}

/// An operator's limits of one kind ([`limits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KindLimitsRow {
    /// The kind.
    pub kind: String,
    /// The limits set.
    pub limits: KindLimits,
    /// When they were set.
    pub updated_at: DateTime<Utc>,
    /// The jobs of the kind running now, across every runtime.
    pub running: u64,
}

/// Sets the limits of `kind` across every runtime on the database, in place of its
/// attribute's and of any set before: every runtime applies them within its poll
/// interval (one second by default; at once when the notification reaches it). Until
/// then a runtime may start jobs under the old limit: lowering a limit does not stop
/// jobs already running, which finish, and the kind runs at the new limit once enough
/// of them have. A concurrency of 0, or a rate of no starts or over no time, is an
/// [`Error::InvalidInput`] (pause the kind instead, [`pause`]); so are an empty kind, a
/// kind with a NUL character or longer than [`MAX_KIND_BYTES`](crate::MAX_KIND_BYTES),
/// and a rate's window longer than [`MAX_RATE_WINDOW`](crate::MAX_RATE_WINDOW) (30 days).
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// use jobs::admin::KindLimits;
/// // The provider asked us to slow down: at most 2 calls at once, from every replica.
/// jobs::admin::set_limits(&pool, "llm.embed", KindLimits::default().concurrency(2)).await?;
/// # Ok(()) }
/// ```
pub async fn set_limits<'e, E>(executor: E, kind: &str, limits: KindLimits) -> Result<(), Error>
where
    E: PgExecutor<'e>,
{
    crate::limits::check_kind_and_key(kind, None)?;
    let concurrency = match limits.concurrency {
        Some(0) => {
            return Err(Error::InvalidInput(format!(
                "a global concurrency of 0 for kind `{kind}` would never run its jobs: \
                 pause the kind instead (jobs::admin::pause)"
            )));
        }
        Some(n) => Some(i32::try_from(n).unwrap_or(i32::MAX)),
        None => None,
    };
    let rate = match limits.rate {
        Some(r) if r.starts == 0 || r.per.as_millis() == 0 => {
            return Err(Error::InvalidInput(format!(
                "a rate of {} starts per {:?} for kind `{kind}` would never run its jobs \
                 (a window is at least 1 ms): pause the kind instead (jobs::admin::pause)",
                r.starts, r.per
            )));
        }
        Some(r) if r.per > crate::limits::MAX_RATE_WINDOW => {
            return Err(Error::InvalidInput(format!(
                "a rate over {:?} for kind `{kind}` is longer than the 30 days a rate's window \
                 may last (jobs::MAX_RATE_WINDOW)",
                r.per
            )));
        }
        Some(r) => Some((
            i32::try_from(r.starts).unwrap_or(i32::MAX),
            crate::enqueue::millis(r.per),
        )),
        None => None,
    };
    crate::pooler::query_scalar::<_, i64>(SET_LIMITS)
        .bind(kind)
        .bind(concurrency)
        .bind(rate.map(|r| r.0))
        .bind(rate.map(|r| r.1))
        .fetch_one(executor)
        .await?;
    Ok(())
}

/// Clears the limits an operator set for `kind` ([`set_limits`]): the kind's attribute
/// applies again, within the runtimes' poll interval. Returns whether any were set.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// jobs::admin::clear_limits(&pool, "llm.embed").await?;
/// # Ok(()) }
/// ```
pub async fn clear_limits<'e, E>(executor: E, kind: &str) -> Result<bool, Error>
where
    E: PgExecutor<'e>,
{
    notified(executor, CLEAR_LIMITS, kind).await
}

/// The limits operators have set ([`set_limits`]), in kind order, each with the kind's
/// running jobs. A kind limited only by its attribute is not listed: the attribute
/// lives in the binaries that run it.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// for row in jobs::admin::limits(&pool).await? {
///     println!("{}: {} running, limit {:?}", row.kind, row.running, row.limits.concurrency);
/// }
/// # Ok(()) }
/// ```
pub async fn limits<'e, E>(executor: E) -> Result<Vec<KindLimitsRow>, Error>
where
    E: PgExecutor<'e>,
{
    type Row = (
        String,
        Option<i32>,
        Option<i32>,
        Option<i64>,
        DateTime<Utc>,
        i64,
    );
    let rows: Vec<Row> = crate::pooler::query_as(LIMITS).fetch_all(executor).await?;
    Ok(rows
        .into_iter()
        .map(
            |(kind, concurrency, starts, ms, updated_at, running)| KindLimitsRow {
                kind,
                limits: KindLimits {
                    concurrency: concurrency.and_then(|n| u32::try_from(n).ok()),
                    rate: match (starts, ms) {
                        (Some(starts), Some(ms)) => Some(crate::Rate {
                            starts: u32::try_from(starts).unwrap_or(0),
                            per: Duration::from_millis(u64::try_from(ms).unwrap_or(0)),
                        }),
                        _ => None,
                    },
                },
                updated_at,
                running: count(running),
            },
        )
        .collect())
}

/// The runtimes registered, oldest first, each with how many jobs it holds claimed.
/// Index: the primary key of `jobs_runtimes`; per runtime, `jobs_running` (every
/// running row, filtered by `runtime_id`).
const RUNTIMES: &str = r#"
SELECT r.id, r.name, r.host, r.pid, r.version, r.kinds, r.concurrency, r.started_at,
       r.last_seen,
       (SELECT count(*) FROM jobs j WHERE j.state = 'running' AND j.runtime_id = r.id) AS running
FROM jobs_runtimes r
ORDER BY r.started_at, r.id
"#;

/// A runtime at work on this database, as it registered itself.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeRow {
    /// Its id: the one its claims record ([`JobRow::runtime`]).
    pub id: uuid::Uuid,
    /// The name it was given (`Runtime::name`), if any.
    pub name: Option<String>,
    /// The host it runs on.
    pub host: String,
    /// Its process id on that host.
    pub pid: i32,
    /// This library's version in it.
    pub version: String,
    /// The kinds it claims.
    pub kinds: Vec<String>,
    /// How many jobs it runs at once.
    pub concurrency: i32,
    /// When it started, on the database clock.
    pub started_at: DateTime<Utc>,
    /// When it last said it was alive (every 5 seconds), on the database clock. Rows
    /// not seen for 10 minutes are removed.
    pub last_seen: DateTime<Utc>,
    /// How many jobs it holds claimed now (running, or claimed ahead of a free slot).
    pub running: u64,
}

/// The runtimes at work on this database, oldest first.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// for rt in jobs::admin::runtimes(&pool).await? {
///     println!("{} on {} (pid {}): {:?}, {} claimed", rt.id, rt.host, rt.pid, rt.kinds, rt.running);
/// }
/// # Ok(()) }
/// ```
pub async fn runtimes<'e, E>(executor: E) -> Result<Vec<RuntimeRow>, Error>
where
    E: PgExecutor<'e>,
{
    let rows = crate::pooler::query(RUNTIMES).fetch_all(executor).await?;
    rows.iter()
        .map(|row| {
            Ok(RuntimeRow {
                id: row.try_get("id")?,
                name: row.try_get("name")?,
                host: row.try_get("host")?,
                pid: row.try_get("pid")?,
                version: row.try_get("version")?,
                kinds: row.try_get("kinds")?,
                concurrency: row.try_get("concurrency")?,
                started_at: row.try_get("started_at")?,
                last_seen: row.try_get("last_seen")?,
                running: count(row.try_get("running")?),
            })
        })
        .collect()
}

/// The throughput history of the last `$2` ms (database clock), of kind `$1` or of
/// every kind, oldest minute first. Index: the primary key `(kind, minute)` for one
/// kind; the whole table otherwise, which holds a row per kind and minute of at most
/// seven days.
const THROUGHPUT: &str = r#"
SELECT kind, minute, succeeded, failed, retried, cancelled, run_time_buckets
FROM jobs_throughput
WHERE ($1::text IS NULL OR kind = $1)
  AND minute >= date_trunc('minute', now() - $2 * interval '1 millisecond')
ORDER BY minute, kind
"#;

/// One kind's runs in one minute: how they ended and how long they ran.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MinuteStats {
    /// The kind.
    pub kind: String,
    /// The minute, on the database's clock.
    pub minute: DateTime<Utc>,
    /// Runs that completed their job.
    pub succeeded: u64,
    /// Runs that left their job `failed`.
    pub failed: u64,
    /// Failed runs whose job will be retried.
    pub retried: u64,
    /// Runs whose job was cancelled (by an operator while it ran, or by its handler).
    pub cancelled: u64,
    /// Run-time percentiles (50th, 95th, 99th) of the runs that started a handler, each
    /// an upper bound within 19 % of the true value (a histogram of 112 buckets); `None`
    /// without such runs.
    pub run_time: Option<Percentiles>,
}

/// Run-time percentiles of a minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Percentiles {
    /// Half the runs took at most this long.
    pub p50: Duration,
    /// 95 % of the runs took at most this long.
    pub p95: Duration,
    /// 99 % of the runs took at most this long.
    pub p99: Duration,
}

fn percentiles(buckets: &[i64]) -> Option<Percentiles> {
    let total: i64 = buckets.iter().sum();
    if total <= 0 {
        return None;
    }
    let at = |q: f64| {
        let rank = (q * total as f64).ceil().max(1.0) as i64;
        let mut seen = 0;
        for (i, n) in buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return crate::runtime::throughput::bucket_bound(i);
            }
        }
        crate::runtime::throughput::bucket_bound(buckets.len().saturating_sub(1))
    };
    Some(Percentiles {
        p50: at(0.50),
        p95: at(0.95),
        p99: at(0.99),
    })
}

/// The throughput history per kind and minute over the last `window` (of `kind`, or of
/// every kind), oldest minute first: succeeded, failed, retried and cancelled runs and
/// their run-time percentiles. Each runtime adds what its runs came to every few
/// seconds (and when it goes quiet or stops), so the last minute fills in as it goes;
/// minutes without runs have no row. Kept seven days.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// use std::time::Duration;
///
/// for minute in jobs::admin::history(&pool, Some("email.send"), Duration::from_secs(3600)).await? {
///     println!("{} {} ok, {} failed", minute.minute, minute.succeeded, minute.failed);
/// }
/// # Ok(()) }
/// ```
pub async fn history<'e, E>(
    executor: E,
    kind: Option<&str>,
    window: Duration,
) -> Result<Vec<MinuteStats>, Error>
where
    E: PgExecutor<'e>,
{
    type Row = (String, DateTime<Utc>, i64, i64, i64, i64, Vec<i64>);
    let rows: Vec<Row> = crate::pooler::query_as(THROUGHPUT)
        .bind(kind)
        .bind(crate::enqueue::millis(window))
        .fetch_all(executor)
        .await?;
    Ok(rows
        .into_iter()
        .map(
            |(kind, minute, succeeded, failed, retried, cancelled, buckets)| MinuteStats {
                kind,
                minute,
                succeeded: count(succeeded),
                failed: count(failed),
                retried: count(retried),
                cancelled: count(cancelled),
                run_time: percentiles(&buckets),
            },
        )
        .collect())
}
