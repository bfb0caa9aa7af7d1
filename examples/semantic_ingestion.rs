//! Semantic ingestion: one claim per dirty set, the lease covering the remote round.
//!
//! Before: every replica scanned for dirty sets and ingested each one, so N replicas
//! paid for N model calls per change and raced on the result. Here marking a set dirty
//! enqueues a `semantic.ingest` job keyed by the set id, in the same transaction as the
//! change. Replicas claim disjoint sets; the handler's slow remote round (a sleep stands
//! in for the model call) runs under a heartbeat lease shorter than the call, renewed
//! while it runs; the result is written through `ctx.fenced_tx()`, so it commits together
//! with the job's completion or not at all. A change that arrives while its set is being
//! ingested marks the running job for exactly one more run. A replica that loses its
//! claim mid-call (simulated here by expiring the claim in SQL) has its late result
//! refused, and the set is ingested by the claim that took over. Before the remote
//! round, each change is embedded once: the handler stores the last embedded revision
//! as the job's checkpoint (`ctx.checkpoint`), and the claim that takes over resumes
//! after it (`ctx.last_checkpoint`) instead of embedding everything again.
//!
//! ```sh
//! cargo run --example semantic_ingestion
//! ```

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use jobs::{Enqueued, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use support::{BoxError, Replica, tally, wait_until};
use uuid::Uuid;

/// The kinds this example runs.
pub const KINDS: [&str; 1] = ["semantic.ingest"];

/// How long the remote (model) round takes: longer than the lease.
pub const REMOTE_ROUND: Duration = Duration::from_millis(1500);

/// The sets of the demo.
pub const SETS: [i64; 6] = [1, 2, 3, 4, 5, 6];
/// The set that receives more changes while it is being ingested.
pub const BUSY_SET: i64 = 2;
/// The set whose first claim is lost in the middle of the remote round.
pub const STALLED_SET: i64 = 3;

/// Ingests one set. The lease (500ms) is shorter than the remote round (1.5s): the
/// runtime renews it every third of a lease while the handler runs. A lost lease does
/// not cancel the handler, so the demo can show its late result being refused.
#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "semantic.ingest",
    key = "set_id",
    lease = "500ms",
    cancel_on_lease_loss = false,
    backoff = "100ms",
    max_attempts = 10
)]
pub struct IngestSet {
    /// The dirty set.
    pub set_id: i64,
}

#[jobs::handler]
async fn ingest_set(job: IngestSet, ctx: JobContext) -> Result<(), JobError> {
    let pool = ctx.pool();
    let replica = support::replica_name(pool).await?;
    // A snapshot of the set: what this round ingests. A change committed after this
    // read has marked the job for another run.
    let (revision, texts): (i64, Vec<String>) = sqlx::query_as(
        "SELECT s.revision, ARRAY(SELECT text FROM si_changes c WHERE c.set_id = s.set_id ORDER BY revision) \
         FROM si_sets s WHERE s.set_id = $1",
    )
    .bind(job.set_id)
    .fetch_one(pool)
    .await?;

    // Embed each change of the snapshot once, resuming after the last revision an
    // earlier attempt embedded (its checkpoint survives a lost claim), or after what an
    // earlier run ingested.
    let ingested: i64 =
        sqlx::query_scalar("SELECT ingested_revision FROM si_sets WHERE set_id = $1")
            .bind(job.set_id)
            .fetch_one(pool)
            .await?;
    let embedded: i64 = ctx.last_checkpoint().await?.unwrap_or(0).max(ingested);
    let changes: Vec<i64> = sqlx::query_scalar(
        "SELECT revision FROM si_changes WHERE set_id = $1 AND revision > $2 AND revision <= $3 \
         ORDER BY revision",
    )
    .bind(job.set_id)
    .bind(embedded)
    .bind(revision)
    .fetch_all(pool)
    .await?;
    for change in changes {
        sqlx::query(
            "INSERT INTO si_embeddings AS e (set_id, revision, attempt, replica) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (set_id, revision) DO UPDATE SET times = e.times + 1",
        )
        .bind(job.set_id)
        .bind(change)
        .bind(i32::try_from(ctx.attempt()).unwrap_or(i32::MAX))
        .bind(&replica)
        .execute(pool)
        .await?;
        ctx.checkpoint(&change).await?;
    }

    let call: i64 = sqlx::query_scalar(
        "INSERT INTO si_calls (set_id, attempt, token, replica, revision, lease_at_start) \
         VALUES ($1, $2, $3, $4, $5, (SELECT claimed_until FROM jobs WHERE id = $6 AND claimed_by = $3)) \
         RETURNING id",
    )
    .bind(job.set_id)
    .bind(i32::try_from(ctx.attempt()).unwrap_or(i32::MAX))
    .bind(ctx.claim_token())
    .bind(&replica)
    .bind(revision)
    .bind(ctx.id())
    .fetch_one(pool)
    .await?;

    let summary = remote_round(pool, job.set_id, ctx.attempt(), &texts).await?;

    // Where the lease stands now: a call longer than the lease only gets here with its
    // claim intact because the runtime renewed it.
    sqlx::query(
        "UPDATE si_calls SET lease_at_end = (SELECT claimed_until FROM jobs WHERE id = $2 AND claimed_by = $3) \
         WHERE id = $1",
    )
    .bind(call)
    .bind(ctx.id())
    .bind(ctx.claim_token())
    .execute(pool)
    .await?;

    let mut tx = match ctx.fenced_tx().await {
        Ok(tx) => tx,
        Err(e) => {
            if e.is_lease_lost() {
                // Recorded outside the fence: the refusal itself is what the demo shows.
                sqlx::query("UPDATE si_calls SET outcome = 'refused: lease lost' WHERE id = $1")
                    .bind(call)
                    .execute(pool)
                    .await?;
            }
            return Err(e);
        }
    };
    sqlx::query(
        "UPDATE si_sets SET ingested_revision = $2, summary = $3, ingested_by = $4 \
         WHERE set_id = $1 AND ingested_revision <= $2",
    )
    .bind(job.set_id)
    .bind(revision)
    .bind(&summary)
    .bind(&replica)
    .execute(&mut *tx)
    .await?;
    sqlx::query("UPDATE si_calls SET outcome = 'committed' WHERE id = $1")
        .bind(call)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// Stands in for the model call: takes [`REMOTE_ROUND`], and then, if the demo holds
/// this set's answer back (a row in `si_gates` for the set and this attempt), waits
/// until it lets it go. The gate lets the demo act while a call is surely in flight,
/// without betting on how long anything takes.
async fn remote_round(
    pool: &PgPool,
    set_id: i64,
    attempt: u32,
    texts: &[String],
) -> Result<String, sqlx::Error> {
    tokio::time::sleep(REMOTE_ROUND).await;
    loop {
        let held: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM si_gates WHERE set_id = $1 AND attempt = $2)",
        )
        .bind(set_id)
        .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
        .fetch_one(pool)
        .await?;
        if !held {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(format!("{} change(s): {}", texts.len(), texts.join(" / ")))
}

/// Creates the example's tables if missing and removes what an earlier run left.
pub async fn setup(pool: &PgPool) -> Result<(), BoxError> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS si_sets (
             set_id            bigint PRIMARY KEY,
             revision          bigint NOT NULL DEFAULT 0,
             ingested_revision bigint NOT NULL DEFAULT 0,
             summary           text,
             ingested_by       text
         );
         CREATE TABLE IF NOT EXISTS si_changes (
             set_id   bigint NOT NULL,
             revision bigint NOT NULL,
             text     text NOT NULL,
             PRIMARY KEY (set_id, revision)
         );
         -- One row per remote round started: who ran it, on which revision, how it ended.
         CREATE TABLE IF NOT EXISTS si_calls (
             id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             set_id         bigint NOT NULL,
             attempt        int NOT NULL,
             token          uuid NOT NULL,
             replica        text NOT NULL,
             revision       bigint NOT NULL,
             lease_at_start timestamptz,
             lease_at_end   timestamptz,
             outcome        text
         );
         CREATE TABLE IF NOT EXISTS si_gates (
             set_id  bigint NOT NULL,
             attempt int NOT NULL,
             PRIMARY KEY (set_id, attempt)
         );
         -- One row per change embedded: which attempt of which replica embedded it.
         CREATE TABLE IF NOT EXISTS si_embeddings (
             set_id   bigint NOT NULL,
             revision bigint NOT NULL,
             attempt  int NOT NULL,
             replica  text NOT NULL,
             -- How many times it was embedded: once, if every attempt resumed.
             times    int NOT NULL DEFAULT 1,
             PRIMARY KEY (set_id, revision)
         );
         TRUNCATE si_sets, si_changes, si_calls, si_gates, si_embeddings;",
    )
    .execute(pool)
    .await?;
    support::clean_kinds(pool, &KINDS).await?;
    Ok(())
}

/// The application changes a set: the change and the ingestion trigger commit together.
pub async fn change_set(pool: &PgPool, set_id: i64, text: &str) -> Result<Enqueued, BoxError> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "WITH s AS (
             INSERT INTO si_sets AS s (set_id, revision) VALUES ($1, 1)
             ON CONFLICT (set_id) DO UPDATE SET revision = s.revision + 1
             RETURNING revision
         )
         INSERT INTO si_changes (set_id, revision, text) SELECT $1, revision, $2 FROM s",
    )
    .bind(set_id)
    .bind(text)
    .execute(&mut *tx)
    .await?;
    let enqueued = IngestSet { set_id }.enqueue(&mut *tx).await?;
    tx.commit().await?;
    Ok(enqueued)
}

/// One remote round, as `si_calls` recorded it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Call {
    /// The set.
    pub set_id: i64,
    /// The job's attempt.
    pub attempt: i32,
    /// The replica that ran it.
    pub replica: String,
    /// The set's revision the round ingested.
    pub revision: i64,
    /// How far the lease moved during the round, in ms; `None` if the claim was gone.
    pub lease_moved_ms: Option<f64>,
    /// `committed`, `refused: lease lost`, or `None` if it failed otherwise.
    pub outcome: Option<String>,
}

/// What the demo did.
#[derive(Debug)]
pub struct Report {
    /// Outcomes of the changes made before the runtimes started.
    pub initial: (usize, usize, usize),
    /// Outcomes of the changes to [`BUSY_SET`] while it was being ingested.
    pub during_run: (usize, usize, usize),
    /// Every remote round, in order.
    pub calls: Vec<Call>,
    /// Every change embedded: set, revision, the attempt that first embedded it, and
    /// how many times it was embedded.
    pub embeddings: Vec<(i64, i64, i32, i32)>,
}

/// Runs the whole scenario against `pool`'s database with two replicas.
pub async fn demo(pool: &PgPool) -> Result<Report, BoxError> {
    setup(pool).await?;

    println!("1. sets 1..6 change, some twice, before any runtime runs");
    let mut initial = Vec::new();
    for set_id in SETS {
        for n in 0..=(set_id % 2) {
            initial.push(change_set(pool, set_id, &format!("set {set_id} edit {n}")).await?);
        }
    }
    let initial = tally(&initial);
    println!(
        "   {} changes: {} jobs inserted, {} coalesced into them",
        initial.0 + initial.1 + initial.2,
        initial.0,
        initial.1
    );
    // Hold the answers of set 2's first round and set 3's first attempt (see remote_round).
    sqlx::query("INSERT INTO si_gates (set_id, attempt) VALUES ($1, 1), ($2, 1)")
        .bind(BUSY_SET)
        .bind(STALLED_SET)
        .execute(pool)
        .await?;

    println!(
        "2. replica-a and replica-b start; lease 500ms, remote round {REMOTE_ROUND:?}, 3 jobs at a time each"
    );
    let a = Replica::start(pool, "replica-a", &KINDS, |r| r.concurrency(3)).await?;
    let b = Replica::start(pool, "replica-b", &KINDS, |r| r.concurrency(3)).await?;

    let started = |set_id: i64, attempt: i32| async move {
        sqlx::query_scalar::<_, Option<Uuid>>(
            "SELECT token FROM si_calls WHERE set_id = $1 AND attempt = $2",
        )
        .bind(set_id)
        .bind(attempt)
        .fetch_optional(pool)
        .await
        .map(Option::flatten)
    };

    println!("3. set {BUSY_SET} changes twice more while its remote round is in flight");
    wait_until("set 2's first round started", || async {
        started(BUSY_SET, 1).await.map(|t| t.is_some())
    })
    .await?;
    let mut during = Vec::new();
    for n in 0..2 {
        during.push(change_set(pool, BUSY_SET, &format!("set {BUSY_SET} late edit {n}")).await?);
    }
    let during_run = tally(&during);
    println!(
        "   2 changes: {} marked the running job for a re-run (one more run, not two)",
        during_run.2
    );
    sqlx::query("DELETE FROM si_gates WHERE set_id = $1")
        .bind(BUSY_SET)
        .execute(pool)
        .await?;

    println!(
        "4. set {STALLED_SET}: its replica stalls mid-call (its claim is expired in SQL) and another claim takes over"
    );
    wait_until("set 3's first round started", || async {
        started(STALLED_SET, 1).await.map(|t| t.is_some())
    })
    .await?;
    let token = started(STALLED_SET, 1).await?.ok_or("no claim token")?;
    let expired = sqlx::query(
        "UPDATE jobs SET claimed_until = now() - interval '1 second' \
         WHERE claimed_by = $1 AND state = 'running'",
    )
    .bind(token)
    .execute(pool)
    .await?
    .rows_affected();
    println!(
        "   expired {expired} claim; the heartbeat finds it lost, the rescuer returns the job"
    );
    wait_until("set 3 taken over by a second claim", || async {
        started(STALLED_SET, 2).await.map(|t| t.is_some())
    })
    .await?;
    sqlx::query("DELETE FROM si_gates WHERE set_id = $1")
        .bind(STALLED_SET)
        .execute(pool)
        .await?;
    println!("   the first claim's round now returns, late");

    wait_until("every set ingested at its latest revision", || async {
        let behind: i64 =
            sqlx::query_scalar("SELECT count(*) FROM si_sets WHERE ingested_revision < revision")
                .fetch_one(pool)
                .await?;
        let live = support::live_jobs(pool, &KINDS).await?;
        Ok(behind == 0 && live == 0)
    })
    .await?;
    a.stop().await?;
    b.stop().await?;

    let calls: Vec<Call> = sqlx::query_as(
        "SELECT set_id, attempt, replica, revision, \
                (extract(epoch FROM lease_at_end - lease_at_start) * 1000)::float8 AS lease_moved_ms, \
                outcome \
         FROM si_calls ORDER BY set_id, id",
    )
    .fetch_all(pool)
    .await?;
    let embeddings: Vec<(i64, i64, i32, i32)> = sqlx::query_as(
        "SELECT set_id, revision, attempt, times FROM si_embeddings ORDER BY set_id, revision",
    )
    .fetch_all(pool)
    .await?;
    let report = Report {
        initial,
        during_run,
        calls,
        embeddings,
    };
    println!("remote rounds (a re-run counts its attempts from 1 again):");
    for c in &report.calls {
        println!(
            "   set {} attempt {} on {}: revision {}, lease moved {}, {}",
            c.set_id,
            c.attempt,
            c.replica,
            c.revision,
            c.lease_moved_ms
                .map_or("- (claim gone)".to_owned(), |ms| format!("{ms:.0}ms")),
            c.outcome.as_deref().unwrap_or("failed")
        );
    }
    let resumed: Vec<i64> = report
        .embeddings
        .iter()
        .filter(|(set, _, _, _)| *set == STALLED_SET)
        .map(|(_, revision, _, _)| *revision)
        .collect();
    println!(
        "   set {STALLED_SET}'s changes {resumed:?} were embedded once, by its first attempt: the takeover resumed after its checkpoint"
    );
    let sets: Vec<(i64, i64, String, String)> = sqlx::query_as(
        "SELECT set_id, ingested_revision, ingested_by, summary FROM si_sets ORDER BY set_id",
    )
    .fetch_all(pool)
    .await?;
    println!("ingested:");
    for (set_id, revision, by, summary) in sets {
        println!("   set {set_id} at revision {revision} by {by}: {summary}");
    }
    Ok(report)
}

#[cfg_attr(test, allow(dead_code))]
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let pool = support::connect().await?;
    demo(&pool).await?;
    println!("done");
    Ok(())
}
