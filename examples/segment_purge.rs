//! Segment store purge and registry purge: periodic jobs in transaction mode.
//!
//! Before: every replica ran its own purge loop, each claiming a bounded batch of
//! expired rows with `FOR UPDATE SKIP LOCKED`. The semantics were right; the code was
//! copied per store and every replica woke up for it. Here each purge is a periodic kind
//! (`every = "1s"` in the demo), so one live job per purge exists across all replicas,
//! and runs in transaction mode (`lease = "transaction"`): the batch's deletes and the
//! job's completion are one transaction, exactly once; a crash rolls both back.
//!
//! One run deletes one bounded batch (100 rows). When the batch was full, more rows may
//! be waiting, so the run enqueues a `purge.continue` job for its store in the same
//! transaction; that job deletes the next batch and, while batches stay full, enqueues
//! itself again, which marks it for a re-run when it completes: it runs again at once,
//! one committed batch at a time, until a batch comes back short. (A snooze would not
//! do: in transaction mode a snooze rolls the handler's writes back. See
//! `docs/consumers.md`.)
//!
//! A trigger logs every deleted row with the deleting transaction, so the demo can show
//! that three replicas never deleted a row twice and never more than 100 per step.
//!
//! ```sh
//! cargo run --example segment_purge
//! ```

#[path = "support/mod.rs"]
mod support;

use jobs::{Job, JobContext, JobError, KeyPart};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use support::{BoxError, Replica, wait_until};

/// The kinds this example runs.
pub const KINDS: [&str; 3] = ["segment_store.purge", "registry.purge", "purge.continue"];

/// Rows deleted per step, at most.
pub const BATCH: i64 = 100;

/// Expired segments the demo creates, and live ones that must stay.
pub const EXPIRED_SEGMENTS: i64 = 1050;
/// Segments that have not expired.
pub const LIVE_SEGMENTS: i64 = 200;
/// Registry entries not seen for over an hour, and fresh ones that must stay.
pub const STALE_ENTRIES: i64 = 230;
/// Registry entries seen recently.
pub const FRESH_ENTRIES: i64 = 20;

/// What a purge deletes. The code of a step is shared; only the statement differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Store {
    /// Segments past their `expires_at`.
    Segments,
    /// Registry entries not seen for an hour.
    Registry,
}

impl Store {
    /// The store's name, also the key of its `purge.continue` job.
    pub fn name(self) -> &'static str {
        match self {
            Store::Segments => "segments",
            Store::Registry => "registry",
        }
    }

    /// Deletes at most `$1` purgeable rows. The locking select is a materialized CTE,
    /// so it runs once and locks exactly the rows it returns; `SKIP LOCKED` passes over
    /// rows another purge has locked, so concurrent purges take disjoint batches.
    fn delete_batch(self) -> &'static str {
        match self {
            Store::Segments => {
                "WITH batch AS MATERIALIZED (
                     SELECT id FROM sp_segments WHERE expires_at < now()
                     ORDER BY expires_at, id LIMIT $1 FOR UPDATE SKIP LOCKED
                 )
                 DELETE FROM sp_segments s USING batch b WHERE s.id = b.id"
            }
            Store::Registry => {
                "WITH batch AS MATERIALIZED (
                     SELECT name FROM sp_registry WHERE last_seen < now() - interval '1 hour'
                     ORDER BY last_seen, name LIMIT $1 FOR UPDATE SKIP LOCKED
                 )
                 DELETE FROM sp_registry r USING batch b WHERE r.name = b.name"
            }
        }
    }
}

/// A store as a job key: `purge.continue` has one live job per store.
impl KeyPart for Store {
    fn key_part(&self) -> Option<String> {
        Some(self.name().to_owned())
    }
}

/// The periodic purge of the segment store: one live job across all replicas.
#[derive(Job, Serialize, Deserialize, Default)]
#[job(
    kind = "segment_store.purge",
    every = "1s",
    lease = "transaction",
    backoff = "100ms"
)]
pub struct SegmentStorePurge {}

/// The periodic purge of the registry.
#[derive(Job, Serialize, Deserialize, Default)]
#[job(
    kind = "registry.purge",
    every = "1s",
    lease = "transaction",
    backoff = "100ms"
)]
pub struct RegistryPurge {}

/// The next batch of a purge whose last batch was full: one live job per store.
#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "purge.continue",
    key = "store",
    lease = "transaction",
    backoff = "100ms"
)]
pub struct PurgeContinue {
    /// The store to keep purging.
    pub store: Store,
}

#[jobs::handler]
async fn purge_segment_store(_job: SegmentStorePurge, ctx: JobContext) -> Result<(), JobError> {
    purge_step(&ctx, Store::Segments).await
}

#[jobs::handler]
async fn purge_registry(_job: RegistryPurge, ctx: JobContext) -> Result<(), JobError> {
    purge_step(&ctx, Store::Registry).await
}

#[jobs::handler]
async fn purge_continue(job: PurgeContinue, ctx: JobContext) -> Result<(), JobError> {
    purge_step(&ctx, job.store).await
}

/// One bounded batch, in the claim's own transaction: the deletes, the step's record
/// and, if the batch was full, the trigger of the next step commit with the job's
/// completion, or none of them does.
async fn purge_step(ctx: &JobContext, store: Store) -> Result<(), JobError> {
    let mut tx = ctx.tx().await?;
    let deleted = sqlx::query(store.delete_batch())
        .bind(BATCH)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let full = i64::try_from(deleted).is_ok_and(|n| n >= BATCH);
    sqlx::query(
        "INSERT INTO sp_steps (store, kind, deleted, full_batch, replica, xid) \
         VALUES ($1, $2, $3, $4, current_setting('application_name'), txid_current())",
    )
    .bind(store.name())
    .bind(ctx.kind())
    .bind(i64::try_from(deleted).unwrap_or(i64::MAX))
    .bind(full)
    .execute(&mut *tx)
    .await?;
    if full {
        // Pending: coalesces. Running (this very job, or the other purger's): marks it
        // to run once more when its claim ends. Either way, one more step follows.
        PurgeContinue { store }.enqueue(&mut *tx).await?;
    }
    Ok(())
}

/// Creates the example's tables and the delete-logging triggers if missing, and
/// removes what an earlier run left.
pub async fn setup(pool: &PgPool) -> Result<(), BoxError> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS sp_segments (
             id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             expires_at timestamptz NOT NULL
         );
         CREATE TABLE IF NOT EXISTS sp_registry (
             name      text PRIMARY KEY,
             last_seen timestamptz NOT NULL
         );
         -- Every deleted row, by whichever code deleted it, with its transaction.
         CREATE TABLE IF NOT EXISTS sp_purge_log (
             store   text NOT NULL,
             row_key text NOT NULL,
             replica text NOT NULL,
             xid     bigint NOT NULL
         );
         -- Every purge step that committed.
         CREATE TABLE IF NOT EXISTS sp_steps (
             id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             store      text NOT NULL,
             kind       text NOT NULL,
             deleted    bigint NOT NULL,
             full_batch boolean NOT NULL,
             replica    text NOT NULL,
             xid        bigint NOT NULL
         );
         CREATE OR REPLACE FUNCTION sp_log_delete() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO sp_purge_log (store, row_key, replica, xid)
             VALUES (TG_ARGV[0],
                     to_jsonb(OLD) ->> TG_ARGV[1],
                     current_setting('application_name'), txid_current());
             RETURN OLD;
         END $$;
         CREATE OR REPLACE TRIGGER sp_segments_log AFTER DELETE ON sp_segments
             FOR EACH ROW EXECUTE FUNCTION sp_log_delete('segments', 'id');
         CREATE OR REPLACE TRIGGER sp_registry_log AFTER DELETE ON sp_registry
             FOR EACH ROW EXECUTE FUNCTION sp_log_delete('registry', 'name');
         TRUNCATE sp_segments, sp_registry, sp_purge_log, sp_steps;",
    )
    .execute(pool)
    .await?;
    support::clean_kinds(pool, &KINDS).await?;
    Ok(())
}

/// Fills the stores: expired and live segments, stale and fresh registry entries.
pub async fn seed(pool: &PgPool) -> Result<(), BoxError> {
    sqlx::query(
        "INSERT INTO sp_segments (expires_at)
         SELECT now() - interval '1 minute' - n * interval '1 millisecond' FROM generate_series(1, $1) n
         UNION ALL
         SELECT now() + interval '1 day' FROM generate_series(1, $2)",
    )
    .bind(EXPIRED_SEGMENTS)
    .bind(LIVE_SEGMENTS)
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO sp_registry (name, last_seen)
         SELECT 'stale-' || n, now() - interval '2 hours' FROM generate_series(1, $1) n
         UNION ALL
         SELECT 'fresh-' || n, now() FROM generate_series(1, $2) n",
    )
    .bind(STALE_ENTRIES)
    .bind(FRESH_ENTRIES)
    .execute(pool)
    .await?;
    Ok(())
}

/// What happened to one store.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StoreReport {
    /// `segments` or `registry`.
    pub store: String,
    /// Rows deleted (trigger log).
    pub deleted: i64,
    /// Rows deleted more than once: must be 0.
    pub deleted_twice: i64,
    /// Transactions that deleted rows.
    pub batches: i64,
    /// The most rows one transaction deleted.
    pub largest_batch: i64,
    /// Rows left in the store.
    pub left: i64,
    /// Deleted rows per replica, e.g. `replica-a: 400, replica-b: 300`.
    pub by_replica: String,
}

/// Runs the whole scenario against `pool`'s database with three replicas.
pub async fn demo(pool: &PgPool) -> Result<Vec<StoreReport>, BoxError> {
    setup(pool).await?;
    seed(pool).await?;
    println!(
        "1. {EXPIRED_SEGMENTS} expired and {LIVE_SEGMENTS} live segments, \
         {STALE_ENTRIES} stale and {FRESH_ENTRIES} fresh registry entries"
    );

    println!("2. three replicas start; each arms the periodic purges, one live job per purge");
    let mut replicas = Vec::new();
    for name in ["replica-a", "replica-b", "replica-c"] {
        // Transaction mode holds a connection per running job: two of the pool's four.
        replicas.push(Replica::start(pool, name, &KINDS, |r| r.concurrency(2)).await?);
    }
    wait_until("expired rows purged and no continuation left", || async {
        let (expired, stale, live): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM sp_segments WHERE expires_at < now()),
                    (SELECT count(*) FROM sp_registry WHERE last_seen < now() - interval '1 hour'),
                    (SELECT count(*) FROM jobs WHERE kind = 'purge.continue' AND state IN ('pending', 'running'))",
        )
        .fetch_one(pool)
        .await?;
        Ok(expired == 0 && stale == 0 && live == 0)
    })
    .await?;
    for replica in replicas {
        replica.stop().await?;
    }

    let steps: Vec<(String, String, String, i64)> =
        sqlx::query_as("SELECT store, kind, replica, deleted FROM sp_steps ORDER BY id")
            .fetch_all(pool)
            .await?;
    println!("3. the steps, in commit order (store, kind, replica, rows):");
    for (store, kind, replica, deleted) in &steps {
        println!("   {store:<9} {kind:<20} {replica}  {deleted}");
    }
    let report: Vec<StoreReport> = sqlx::query_as(
        "WITH per_row AS (
             SELECT store, row_key, count(*) AS times FROM sp_purge_log GROUP BY store, row_key
         ), per_xid AS (
             SELECT store, xid, count(*) AS n FROM sp_purge_log GROUP BY store, xid
         ), per_replica AS (
             SELECT store, string_agg(replica || ': ' || n, ', ' ORDER BY replica) AS by_replica
             FROM (SELECT store, replica, count(*) AS n FROM sp_purge_log GROUP BY store, replica) r
             GROUP BY store
         )
         SELECT s.store,
                (SELECT count(*) FROM sp_purge_log l WHERE l.store = s.store) AS deleted,
                (SELECT count(*) FROM per_row r WHERE r.store = s.store AND r.times > 1) AS deleted_twice,
                (SELECT count(*) FROM per_xid x WHERE x.store = s.store) AS batches,
                (SELECT coalesce(max(n), 0) FROM per_xid x WHERE x.store = s.store) AS largest_batch,
                CASE s.store WHEN 'segments' THEN (SELECT count(*) FROM sp_segments)
                             ELSE (SELECT count(*) FROM sp_registry) END AS left,
                coalesce((SELECT by_replica FROM per_replica p WHERE p.store = s.store), '-') AS by_replica
         FROM (VALUES ('segments'), ('registry')) AS s(store)
         ORDER BY s.store DESC",
    )
    .fetch_all(pool)
    .await?;
    println!("4. per store:");
    for r in &report {
        println!(
            "   {}: {} rows deleted in {} transactions of at most {} rows, {} deleted twice, {} left ({})",
            r.store, r.deleted, r.batches, r.largest_batch, r.deleted_twice, r.left, r.by_replica
        );
    }
    let armed: i64 = support::live_jobs(pool, &KINDS[..2]).await?;
    println!("   the periodic purges stay armed for their next period: {armed} live jobs");
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
