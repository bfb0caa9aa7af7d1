//! Session provision and delete: one job per (session, kind), claimed from any replica.
//!
//! Before: each replica kept an in-process queue of sessions to provision or delete,
//! refilled at boot by a fan-out over every session; a restart lost the queue and two
//! replicas booting at once did the work twice. Here a trigger is a keyed job written in
//! the same transaction as the request (`session.provision` and `session.delete`, key =
//! the session id), so repeated triggers and every replica's boot fan-out coalesce into
//! one live job per (session, kind), which any replica may run.
//!
//! A delete that races a provision of the same session must end "deleted". The delete
//! request writes a tombstone in its own transaction; the provision handler locks the
//! session row and checks the tombstone inside its fenced transaction, and "deleted" is
//! never overwritten. Two replicas run in this process, each a `jobs::Runtime` over its
//! own pool.
//!
//! ```sh
//! cargo run --example session_lifecycle
//! ```

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use jobs::{EnqueueBatch, Enqueued, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgExecutor, PgPool};
use support::{BoxError, Replica, tally, wait_until};
use uuid::Uuid;

/// The kinds this example runs.
pub const KINDS: [&str; 2] = ["session.provision", "session.delete"];

/// How long booting a session's sandbox takes (the slow, non-database part of a
/// provision).
const SANDBOX_BOOT: Duration = Duration::from_millis(300);

/// Provisions one session: boots its sandbox, then records it as provisioned.
#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "session.provision",
    key = "session_id",
    lease = "10s",
    backoff = "100ms",
    max_attempts = 10
)]
pub struct SessionProvision {
    /// The session.
    pub session_id: Uuid,
}

/// Deletes one session: tears its sandbox down and records it as deleted.
#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "session.delete",
    key = "session_id",
    lease = "10s",
    backoff = "100ms",
    max_attempts = 10
)]
pub struct SessionDelete {
    /// The session.
    pub session_id: Uuid,
}

#[jobs::handler]
async fn provision_session(job: SessionProvision, ctx: JobContext) -> Result<(), JobError> {
    let replica = support::replica_name(ctx.pool()).await?;
    event(ctx.pool(), job.session_id, "provision started", &replica).await?;
    // Outside the database and slow. Idempotent: the sandbox is named after the
    // session, so a second attempt (after a lost lease, say) finds the first one's.
    tokio::time::sleep(SANDBOX_BOOT).await;

    let mut tx = ctx.fenced_tx().await?;
    // Lock the session row first: a delete writes the same row, so the two serialize
    // here. Then the tombstone check sees every delete request committed before it.
    let state: Option<String> =
        sqlx::query_scalar("SELECT state FROM sl_sessions WHERE session_id = $1 FOR UPDATE")
            .bind(job.session_id)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(state) = state else {
        return Err(JobError::permanent(format!(
            "no session {}: nothing to provision",
            job.session_id
        )));
    };
    let tombstoned: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM sl_tombstones WHERE session_id = $1)")
            .bind(job.session_id)
            .fetch_one(&mut *tx)
            .await?;
    if tombstoned || state == "deleted" {
        // Deleted meanwhile: tear down the sandbox just booted and record nothing but
        // the refusal. Committing completes the job: there is nothing left to retry.
        event(
            &mut *tx,
            job.session_id,
            "provision refused: session deleted",
            &replica,
        )
        .await?;
        return tx.commit().await;
    }
    sqlx::query(
        "UPDATE sl_sessions SET state = 'provisioned', provisioned_by = $2, \
         provision_runs = provision_runs + 1 WHERE session_id = $1",
    )
    .bind(job.session_id)
    .bind(&replica)
    .execute(&mut *tx)
    .await?;
    event(&mut *tx, job.session_id, "provisioned", &replica).await?;
    tx.commit().await
}

#[jobs::handler]
async fn delete_session(job: SessionDelete, ctx: JobContext) -> Result<(), JobError> {
    let replica = support::replica_name(ctx.pool()).await?;
    // Tearing the sandbox down is idempotent too; then the record, fenced. The row lock
    // orders this against a provision of the same session (see above).
    let mut tx = ctx.fenced_tx().await?;
    let before: Option<String> =
        sqlx::query_scalar("SELECT state FROM sl_sessions WHERE session_id = $1 FOR UPDATE")
            .bind(job.session_id)
            .fetch_optional(&mut *tx)
            .await?;
    let what = match before.as_deref() {
        Some("deleted") => "delete: already deleted",
        _ => "deleted",
    };
    sqlx::query(
        "INSERT INTO sl_sessions AS s (session_id, label, state, delete_runs) \
         VALUES ($1, '?', 'deleted', 1) \
         ON CONFLICT (session_id) DO UPDATE SET state = 'deleted', delete_runs = s.delete_runs + 1",
    )
    .bind(job.session_id)
    .execute(&mut *tx)
    .await?;
    event(&mut *tx, job.session_id, what, &replica).await?;
    tx.commit().await
}

async fn event<'e, E: PgExecutor<'e>>(
    executor: E,
    session_id: Uuid,
    what: &str,
    replica: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO sl_events (session_id, what, replica) VALUES ($1, $2, $3)")
        .bind(session_id)
        .bind(what)
        .bind(replica)
        .execute(executor)
        .await?;
    Ok(())
}

/// Creates the example's tables if missing and removes what an earlier run left: its
/// rows and its jobs.
pub async fn setup(pool: &PgPool) -> Result<(), BoxError> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS sl_sessions (
             session_id     uuid PRIMARY KEY,
             label          text NOT NULL,
             state          text NOT NULL CHECK (state IN ('requested', 'provisioned', 'deleted')),
             provisioned_by text,
             provision_runs int NOT NULL DEFAULT 0,
             delete_runs    int NOT NULL DEFAULT 0
         );
         CREATE TABLE IF NOT EXISTS sl_tombstones (
             session_id   uuid PRIMARY KEY,
             requested_at timestamptz NOT NULL DEFAULT now()
         );
         CREATE TABLE IF NOT EXISTS sl_events (
             id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             session_id uuid NOT NULL,
             what       text NOT NULL,
             replica    text NOT NULL
         );
         TRUNCATE sl_sessions, sl_tombstones, sl_events;",
    )
    .execute(pool)
    .await?;
    support::clean_kinds(pool, &KINDS).await?;
    Ok(())
}

/// The application creates a session and asks for its provision, in one transaction.
pub async fn create_session(pool: &PgPool, label: &str) -> Result<(Uuid, Enqueued), BoxError> {
    let session_id = Uuid::new_v4();
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO sl_sessions (session_id, label, state) VALUES ($1, $2, 'requested')")
        .bind(session_id)
        .bind(label)
        .execute(&mut *tx)
        .await?;
    let enqueued = SessionProvision { session_id }.enqueue(&mut *tx).await?;
    tx.commit().await?;
    Ok((session_id, enqueued))
}

/// The application asks for a session's deletion: the tombstone and the job commit
/// together, so a provision that runs after this sees the tombstone.
pub async fn request_delete(pool: &PgPool, session_id: Uuid) -> Result<Enqueued, BoxError> {
    let mut tx = pool.begin().await?;
    tombstone(&mut tx, session_id).await?;
    let enqueued = SessionDelete { session_id }.enqueue(&mut *tx).await?;
    tx.commit().await?;
    Ok(enqueued)
}

async fn tombstone(conn: &mut PgConnection, session_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO sl_tombstones (session_id) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(session_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// What a replica does at boot: (re-)trigger every unfinished provision and delete.
/// Every replica may do it at once: the triggers coalesce into the live jobs.
pub async fn boot_fan_out(pool: &PgPool) -> Result<Vec<Enqueued>, BoxError> {
    let rows: Vec<(Uuid, bool)> = sqlx::query_as(
        "SELECT s.session_id, t.session_id IS NOT NULL FROM sl_sessions s \
         LEFT JOIN sl_tombstones t USING (session_id) \
         WHERE s.state = 'requested' OR (t.session_id IS NOT NULL AND s.state <> 'deleted') \
         ORDER BY s.session_id",
    )
    .fetch_all(pool)
    .await?;
    let mut batch = EnqueueBatch::new();
    for (session_id, tombstoned) in rows {
        if tombstoned {
            batch.push(&SessionDelete { session_id })?;
        } else {
            batch.push(&SessionProvision { session_id })?;
        }
    }
    Ok(batch.enqueue(pool).await?)
}

/// One session at the end of the demo.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SessionRow {
    /// The session's name in the demo, `s1` to `s6`.
    pub label: String,
    /// `requested`, `provisioned` or `deleted`.
    pub state: String,
    /// The replica whose provision committed, if one did.
    pub provisioned_by: Option<String>,
    /// Provisions committed.
    pub provision_runs: i32,
    /// Delete runs committed.
    pub delete_runs: i32,
}

/// What the demo did.
#[derive(Debug)]
pub struct Report {
    /// Enqueue outcomes of the six triggers before the runtimes started, and of the
    /// two replicas' boot fan-outs: (inserted, coalesced, re-run marked).
    pub boot: (usize, usize, usize),
    /// Outcomes of six delete triggers for `s1` from both replicas at once.
    pub repeated_delete: (usize, usize, usize),
    /// Every session at the end, by label.
    pub sessions: Vec<SessionRow>,
}

/// Runs the whole scenario against `pool`'s database with two replicas.
pub async fn demo(pool: &PgPool) -> Result<Report, BoxError> {
    setup(pool).await?;
    let a_pool = support::replica_pool(pool, "replica-a").await?;
    let b_pool = support::replica_pool(pool, "replica-b").await?;

    println!("1. the application creates sessions s1..s4 (replica-a), before any runtime runs");
    let mut triggers = Vec::new();
    let mut ids = Vec::new();
    for label in ["s1", "s2", "s3", "s4"] {
        let (id, enqueued) = create_session(&a_pool, label).await?;
        ids.push(id);
        triggers.push(enqueued);
    }
    println!("   both replicas boot and fan out over the unfinished sessions");
    triggers.extend(boot_fan_out(&a_pool).await?);
    triggers.extend(boot_fan_out(&b_pool).await?);
    let boot = tally(&triggers);
    println!(
        "   {} triggers: {} inserted, {} coalesced: one job per (session, kind)",
        triggers.len(),
        boot.0,
        boot.1
    );
    a_pool.close().await;
    b_pool.close().await;

    println!("2. replica-a and replica-b start their runtimes");
    let a = Replica::start(pool, "replica-a", &KINDS, |r| r.concurrency(2)).await?;
    let b = Replica::start(pool, "replica-b", &KINDS, |r| r.concurrency(2)).await?;
    wait_until("s1..s4 provisioned", || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM sl_sessions WHERE label IN ('s1','s2','s3','s4') AND state = 'provisioned'",
        )
        .fetch_one(pool)
        .await
        .map(|n| n == 4)
    })
    .await?;
    println!("   s1..s4 provisioned");

    println!("3. delete s1, three times from each replica at once");
    let s1 = ids[0];
    let (from_a, from_b) = tokio::join!(
        async {
            let mut out = Vec::new();
            for _ in 0..3 {
                out.push(request_delete(&a.pool, s1).await?);
            }
            Ok::<_, BoxError>(out)
        },
        async {
            let mut out = Vec::new();
            for _ in 0..3 {
                out.push(request_delete(&b.pool, s1).await?);
            }
            Ok::<_, BoxError>(out)
        }
    );
    let mut deletes = from_a?;
    deletes.extend(from_b?);
    let repeated_delete = tally(&deletes);
    println!(
        "   6 triggers: {} inserted, {} coalesced into the pending job, {} marked a running job for one more run",
        repeated_delete.0, repeated_delete.1, repeated_delete.2
    );

    println!("4. s5: a delete races its provision (requested while the sandbox boots)");
    let (s5, _) = create_session(&b.pool, "s5").await?;
    wait_until("s5's provision started", || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM sl_events WHERE session_id = $1 AND what = 'provision started')",
        )
        .bind(s5)
        .fetch_one(pool)
        .await
    })
    .await?;
    request_delete(&a.pool, s5).await?;
    println!("   s5's sandbox is booting; its delete is requested on replica-a meanwhile");

    println!("5. s6: deleted at once, then a stale provision trigger arrives");
    let s6 = Uuid::new_v4();
    {
        let mut tx = a.pool.begin().await?;
        sqlx::query(
            "INSERT INTO sl_sessions (session_id, label, state) VALUES ($1, 's6', 'requested')",
        )
        .bind(s6)
        .execute(&mut *tx)
        .await?;
        tombstone(&mut tx, s6).await?;
        SessionDelete { session_id: s6 }.enqueue(&mut *tx).await?;
        tx.commit().await?;
    }
    SessionProvision { session_id: s6 }.enqueue(&b.pool).await?;

    wait_until("every session job finished", || async {
        support::live_jobs(pool, &KINDS).await.map(|n| n == 0)
    })
    .await?;
    a.stop().await?;
    b.stop().await?;

    let sessions: Vec<SessionRow> = sqlx::query_as(
        "SELECT label, state, provisioned_by, provision_runs, delete_runs FROM sl_sessions ORDER BY label",
    )
    .fetch_all(pool)
    .await?;
    let events: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT s.label, e.what, e.replica FROM sl_events e JOIN sl_sessions s USING (session_id) \
         WHERE s.session_id IN ($1, $2) ORDER BY e.id",
    )
    .bind(s5)
    .bind(s6)
    .fetch_all(pool)
    .await?;
    println!("   what happened to s5 and s6, in order:");
    for (label, what, replica) in &events {
        println!("     {label}: {what} ({replica})");
    }
    let report = Report {
        boot,
        repeated_delete,
        sessions,
    };
    println!("final state:");
    for s in &report.sessions {
        println!(
            "   {}: {:<11} provisions committed {}, deletes run {}, provisioned by {}",
            s.label,
            s.state,
            s.provision_runs,
            s.delete_runs,
            s.provisioned_by.as_deref().unwrap_or("-")
        );
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
