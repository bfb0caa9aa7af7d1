//! Not-yet-ingested items: a watermark per (session, subsystem), advanced by one replay
//! job per key.
//!
//! Before: a new item was written to three subsystems (search, memory, analytics) by
//! three independent writes; when one failed, nothing recorded it and the item was
//! never ingested there. Here an item is appended to its (session, subsystem) stream,
//! and in the same transaction a `replay.ingest` job is enqueued with the multi-field
//! key `[session_id, subsystem]`: one live job per stream, whatever the number of
//! appends. The job processes the items past the stream's watermark in order, a bounded
//! batch per run, and advances the watermark in the same fenced transaction as the
//! processing and the job's completion: they commit together or not at all, so nothing
//! past the watermark is processed twice. A failure part-way rolls its batch back, is
//! recorded in the job's `last_error`, and the retry starts again from the watermark.
//!
//! ```sh
//! cargo run --example replay_watermark
//! ```

#[path = "support/mod.rs"]
mod support;

use jobs::{Enqueued, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use support::{BoxError, Replica, tally, wait_until};
use uuid::Uuid;

/// The kinds this example runs.
pub const KINDS: [&str; 1] = ["replay.ingest"];

/// The subsystems every item goes to.
pub const SUBSYSTEMS: [&str; 3] = ["search", "memory", "analytics"];

/// Items processed per run, at most.
pub const BATCH: i64 = 3;

/// Items appended to every stream before the runtimes start.
pub const INITIAL_ITEMS: i64 = 5;

/// The stream item whose first processing fails, and where: the 4th item of session
/// A's `search` stream, in the second batch.
pub const FAULT_SEQ: i64 = 4;

/// Replays one stream: the items of a session for one subsystem past its watermark.
#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "replay.ingest",
    key = ["session_id", "subsystem"],
    backoff = "200ms",
    max_attempts = 5
)]
pub struct Replay {
    /// The session.
    pub session_id: Uuid,
    /// The subsystem: `search`, `memory` or `analytics`.
    pub subsystem: String,
}

#[jobs::handler]
async fn replay(job: Replay, ctx: JobContext) -> Result<(), JobError> {
    let pool = ctx.pool();
    let replica = support::replica_name(pool).await?;
    // The previous attempt's failure, if this is a retry: the job row keeps it.
    let previous_error = jobs::admin::get(pool, ctx.id())
        .await?
        .and_then(|row| row.last_error);
    // A fault injected for this stream (the demo's stand-in for a subsystem outage).
    let fault: Option<i64> =
        sqlx::query_scalar("SELECT seq FROM rw_faults WHERE session_id = $1 AND subsystem = $2")
            .bind(job.session_id)
            .bind(&job.subsystem)
            .fetch_optional(pool)
            .await?;

    let mut tx = ctx.fenced_tx().await?;
    let (through, last): (i64, i64) = sqlx::query_as(
        "SELECT through_seq, last_seq FROM rw_streams WHERE session_id = $1 AND subsystem = $2",
    )
    .bind(job.session_id)
    .bind(&job.subsystem)
    .fetch_one(&mut *tx)
    .await?;
    let items: Vec<(i64, String)> = sqlx::query_as(
        "SELECT seq, body FROM rw_items WHERE session_id = $1 AND subsystem = $2 AND seq > $3 \
         ORDER BY seq LIMIT $4",
    )
    .bind(job.session_id)
    .bind(&job.subsystem)
    .bind(through)
    .bind(BATCH)
    .fetch_all(&mut *tx)
    .await?;
    let run_note = format!(
        "attempt {} from watermark {through}{}",
        ctx.attempt(),
        previous_error
            .as_deref()
            .map(|e| format!(", after: {e}"))
            .unwrap_or_default()
    );

    let mut advanced = through;
    for (seq, body) in &items {
        if fault == Some(*seq) {
            // The subsystem rejects the item: roll back this batch's processing, clear
            // the fault (it was transient), record the run, and fail the attempt.
            tx.rollback().await?;
            sqlx::query("DELETE FROM rw_faults WHERE session_id = $1 AND subsystem = $2")
                .bind(job.session_id)
                .bind(&job.subsystem)
                .execute(pool)
                .await?;
            let message = format!("{} rejected item {seq}: injected failure", job.subsystem);
            log(
                pool,
                &job,
                &replica,
                &format!("{run_note}: failed at item {seq}"),
            )
            .await?;
            return Err(JobError::retry(message));
        }
        // Processing: the subsystem's own write, here a row in rw_processed.
        sqlx::query(
            "INSERT INTO rw_processed (session_id, subsystem, seq, body, replica) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(job.session_id)
        .bind(&job.subsystem)
        .bind(seq)
        .bind(body)
        .bind(&replica)
        .execute(&mut *tx)
        .await?;
        advanced = *seq;
    }
    sqlx::query("UPDATE rw_streams SET through_seq = $3 WHERE session_id = $1 AND subsystem = $2")
        .bind(job.session_id)
        .bind(&job.subsystem)
        .bind(advanced)
        .execute(&mut *tx)
        .await?;
    if advanced < last {
        // More items wait past this batch: trigger the stream again. The job is running,
        // so this marks it for a re-run when the commit below completes it.
        Replay {
            session_id: job.session_id,
            subsystem: job.subsystem.clone(),
        }
        .enqueue(&mut *tx)
        .await?;
    }
    log(
        &mut *tx,
        &job,
        &replica,
        &format!(
            "{run_note}: processed {} item(s), watermark {advanced}",
            items.len()
        ),
    )
    .await?;
    tx.commit().await
}

async fn log<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    job: &Replay,
    replica: &str,
    note: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO rw_log (session_id, subsystem, replica, note) VALUES ($1, $2, $3, $4)",
    )
    .bind(job.session_id)
    .bind(&job.subsystem)
    .bind(replica)
    .bind(note)
    .execute(executor)
    .await?;
    Ok(())
}

/// Creates the example's tables if missing and removes what an earlier run left.
pub async fn setup(pool: &PgPool) -> Result<(), BoxError> {
    sqlx::raw_sql(
        "-- One row per (session, subsystem): the last item's number and the watermark,
         -- the last item processed. Appends lock the row to number their item, so items
         -- of a stream commit in the order of their numbers and the watermark never
         -- passes one that has not committed yet.
         CREATE TABLE IF NOT EXISTS rw_streams (
             session_id  uuid NOT NULL,
             subsystem   text NOT NULL,
             last_seq    bigint NOT NULL DEFAULT 0,
             through_seq bigint NOT NULL DEFAULT 0,
             PRIMARY KEY (session_id, subsystem)
         );
         CREATE TABLE IF NOT EXISTS rw_items (
             session_id uuid NOT NULL,
             subsystem  text NOT NULL,
             seq        bigint NOT NULL,
             body       text NOT NULL,
             PRIMARY KEY (session_id, subsystem, seq)
         );
         -- What the subsystems received, in order. No unique constraint on purpose: a
         -- duplicate would show up here.
         CREATE TABLE IF NOT EXISTS rw_processed (
             id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             session_id uuid NOT NULL,
             subsystem  text NOT NULL,
             seq        bigint NOT NULL,
             body       text NOT NULL,
             replica    text NOT NULL
         );
         CREATE TABLE IF NOT EXISTS rw_faults (
             session_id uuid NOT NULL,
             subsystem  text NOT NULL,
             seq        bigint NOT NULL,
             PRIMARY KEY (session_id, subsystem)
         );
         CREATE TABLE IF NOT EXISTS rw_log (
             id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             session_id uuid NOT NULL,
             subsystem  text NOT NULL,
             replica    text NOT NULL,
             note       text NOT NULL
         );
         TRUNCATE rw_streams, rw_items, rw_processed, rw_faults, rw_log;",
    )
    .execute(pool)
    .await?;
    support::clean_kinds(pool, &KINDS).await?;
    Ok(())
}

/// The application appends an item to a stream: the item, its number and the replay
/// trigger commit together.
pub async fn append(
    pool: &PgPool,
    session_id: Uuid,
    subsystem: &str,
    body: &str,
) -> Result<Enqueued, BoxError> {
    let mut tx = pool.begin().await?;
    let seq: i64 = sqlx::query_scalar(
        "INSERT INTO rw_streams AS s (session_id, subsystem, last_seq) VALUES ($1, $2, 1)
         ON CONFLICT (session_id, subsystem) DO UPDATE SET last_seq = s.last_seq + 1
         RETURNING last_seq",
    )
    .bind(session_id)
    .bind(subsystem)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query("INSERT INTO rw_items (session_id, subsystem, seq, body) VALUES ($1, $2, $3, $4)")
        .bind(session_id)
        .bind(subsystem)
        .bind(seq)
        .bind(body)
        .execute(&mut *tx)
        .await?;
    let enqueued = Replay {
        session_id,
        subsystem: subsystem.to_owned(),
    }
    .enqueue(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(enqueued)
}

/// One stream at the end of the demo.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StreamReport {
    /// `A` or `B`.
    pub session: String,
    /// The subsystem.
    pub subsystem: String,
    /// The last item's number.
    pub last_seq: i64,
    /// The watermark.
    pub through_seq: i64,
    /// Rows the subsystem received.
    pub processed: i64,
    /// Distinct items among them.
    pub distinct_items: i64,
    /// Whether they arrived in item order.
    pub in_order: bool,
}

/// What the demo did.
#[derive(Debug)]
pub struct Report {
    /// Session `A`'s id (the one with the injected failure).
    pub session_a: Uuid,
    /// Session `B`'s id.
    pub session_b: Uuid,
    /// Outcomes of the appends before the runtimes started.
    pub initial: (usize, usize, usize),
    /// Every stream at the end.
    pub streams: Vec<StreamReport>,
}

/// Runs the whole scenario against `pool`'s database with two replicas.
pub async fn demo(pool: &PgPool) -> Result<Report, BoxError> {
    setup(pool).await?;
    let session_a = Uuid::new_v4();
    let session_b = Uuid::new_v4();
    let sessions = [("A", session_a), ("B", session_b)];

    println!(
        "1. sessions A and B get {INITIAL_ITEMS} items in each of {SUBSYSTEMS:?}, before any runtime runs"
    );
    let mut initial = Vec::new();
    for n in 1..=INITIAL_ITEMS {
        for (name, session) in sessions {
            for subsystem in SUBSYSTEMS {
                initial.push(
                    append(pool, session, subsystem, &format!("{name}-{subsystem}-{n}")).await?,
                );
            }
        }
    }
    let initial = tally(&initial);
    println!(
        "   {} appends: {} replay jobs (one per stream), {} coalesced into them",
        initial.0 + initial.1 + initial.2,
        initial.0,
        initial.1
    );
    sqlx::query("INSERT INTO rw_faults (session_id, subsystem, seq) VALUES ($1, 'search', $2)")
        .bind(session_a)
        .bind(FAULT_SEQ)
        .execute(pool)
        .await?;
    println!("   injected: A's search subsystem will reject item {FAULT_SEQ} once");

    println!("2. replica-a and replica-b start; {BATCH} items per run");
    let a = Replica::start(pool, "replica-a", &KINDS, |r| r.concurrency(2)).await?;
    let b = Replica::start(pool, "replica-b", &KINDS, |r| r.concurrency(2)).await?;

    println!("3. two more items for B's memory stream, from both replicas, while replays run");
    append(&a.pool, session_b, "memory", "B-memory-6").await?;
    append(&b.pool, session_b, "memory", "B-memory-7").await?;

    wait_until("every watermark at its stream's last item", || async {
        let behind: i64 =
            sqlx::query_scalar("SELECT count(*) FROM rw_streams WHERE through_seq < last_seq")
                .fetch_one(pool)
                .await?;
        let live = support::live_jobs(pool, &KINDS).await?;
        Ok(behind == 0 && live == 0)
    })
    .await?;
    a.stop().await?;
    b.stop().await?;

    let log: Vec<(String, String)> = sqlx::query_as(
        "SELECT replica, note FROM rw_log WHERE session_id = $1 AND subsystem = 'search' ORDER BY id",
    )
    .bind(session_a)
    .fetch_all(pool)
    .await?;
    println!("4. the runs of A's search stream:");
    for (replica, note) in &log {
        println!("   {replica}: {note}");
    }
    let streams: Vec<StreamReport> = sqlx::query_as(
        "SELECT CASE s.session_id WHEN $1 THEN 'A' ELSE 'B' END AS session, s.subsystem,
                s.last_seq, s.through_seq,
                count(p.id) AS processed,
                count(DISTINCT p.seq) AS distinct_items,
                coalesce(array_agg(p.seq ORDER BY p.id) FILTER (WHERE p.id IS NOT NULL)
                         = array_agg(p.seq ORDER BY p.seq) FILTER (WHERE p.id IS NOT NULL), true) AS in_order
         FROM rw_streams s
         LEFT JOIN rw_processed p USING (session_id, subsystem)
         GROUP BY s.session_id, s.subsystem, s.last_seq, s.through_seq
         ORDER BY 1, 2",
    )
    .bind(session_a)
    .fetch_all(pool)
    .await?;
    let report = Report {
        session_a,
        session_b,
        initial,
        streams,
    };
    report.print();
    Ok(report)
}

impl Report {
    fn print(&self) {
        println!(
            "5. every stream (A = {}, B = {}; {} replay jobs were enqueued for {} appends up front):",
            self.session_a,
            self.session_b,
            self.initial.0,
            self.initial.0 + self.initial.1 + self.initial.2
        );
        for s in &self.streams {
            println!(
                "   {} {:<9}: {} items, watermark {}, {} processed ({} distinct, {})",
                s.session,
                s.subsystem,
                s.last_seq,
                s.through_seq,
                s.processed,
                s.distinct_items,
                if s.in_order {
                    "in order"
                } else {
                    "OUT OF ORDER"
                }
            );
        }
    }
}

#[cfg_attr(test, allow(dead_code))]
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let pool = support::connect().await?;
    demo(&pool).await?;
    println!("done");
    Ok(())
}
