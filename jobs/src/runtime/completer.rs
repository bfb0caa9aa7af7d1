//! The completer: writes successful outcomes, many claims per statement.

use std::collections::HashSet;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use std::sync::Arc;

use tokio::sync::{Notify, mpsc};
use uuid::Uuid;

use crate::context::Inner;
use crate::enqueue::millis;
use crate::runtime::backoff::Backoff;
use crate::sql;

/// One successful claim to complete.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Completion {
    pub id: i64,
    pub token: Uuid,
    /// The kind keeps done rows (`retain`).
    pub keep: bool,
    /// The kind's period, for periodic kinds.
    pub every_ms: Option<i64>,
}

impl Completion {
    pub(crate) fn of(job: &Inner) -> Self {
        Completion {
            id: job.id,
            token: job.token,
            keep: job.config.retain.is_some(),
            every_ms: job.config.every.map(millis),
        }
    }
}

/// Completes one claim on `conn` (inside the caller's transaction, if any). Returns
/// whether the claim was still current.
pub(crate) async fn complete_one(
    conn: &mut PgConnection,
    job: &Inner,
) -> Result<bool, sqlx::Error> {
    Ok(!complete_batch(conn, &[Completion::of(job)])
        .await?
        .is_empty())
}

/// Completes claims: one `DELETE` for kinds without history, then one `UPDATE` for the
/// rest (kept, periodic, marked for a re-run) and for any the delete skipped because a
/// re-run mark arrived. Returns the ids of the claims that were still current.
pub(crate) async fn complete_batch(
    conn: &mut PgConnection,
    batch: &[Completion],
) -> Result<HashSet<i64>, sqlx::Error> {
    let mut done = HashSet::with_capacity(batch.len());
    let delete: Vec<&Completion> = batch
        .iter()
        .filter(|c| !c.keep && c.every_ms.is_none())
        .collect();
    if !delete.is_empty() {
        let ids: Vec<i64> = delete.iter().map(|c| c.id).collect();
        let tokens: Vec<Uuid> = delete.iter().map(|c| c.token).collect();
        let deleted: Vec<(i64,)> = sqlx::query_as(sql::COMPLETE_DELETE)
            .bind(&ids)
            .bind(&tokens)
            .fetch_all(&mut *conn)
            .await?;
        done.extend(deleted.into_iter().map(|(id,)| id));
    }
    let rest: Vec<&Completion> = batch.iter().filter(|c| !done.contains(&c.id)).collect();
    if !rest.is_empty() {
        let ids: Vec<i64> = rest.iter().map(|c| c.id).collect();
        let tokens: Vec<Uuid> = rest.iter().map(|c| c.token).collect();
        let every: Vec<Option<i64>> = rest.iter().map(|c| c.every_ms).collect();
        let kept: Vec<(i64,)> = sqlx::query_as(sql::COMPLETE_KEEP)
            .bind(&ids)
            .bind(&tokens)
            .bind(&every)
            .fetch_all(&mut *conn)
            .await?;
        done.extend(kept.into_iter().map(|(id,)| id));
    }
    Ok(done)
}

/// How long the completer keeps its connection with nothing to write.
const HOLD: Duration = Duration::from_millis(100);

/// Writes completions as they come, batching whatever has queued up while the previous
/// batch was being written. A database error is retried with backoff: a completion is
/// never dropped while the runtime lives (and if it is lost with the process, the job
/// runs again after its lease, which is what at-least-once allows).
///
/// A completion that sends its job back to pending (a re-run mark) wakes this
/// runtime's producer (`wake`), so the re-run does not wait for the next poll.
pub(crate) async fn run(
    pool: PgPool,
    mut rx: mpsc::UnboundedReceiver<Completion>,
    wake: Arc<Notify>,
) {
    const MAX_BATCH: usize = 2_000;
    let mut batch = Vec::with_capacity(256);
    // Held across batches while completions keep coming (a pool connection is pinged
    // on every acquire), given back to the pool after a quiet moment.
    let mut conn: Option<PoolConnection<Postgres>> = None;
    loop {
        let received = match tokio::time::timeout(HOLD, rx.recv_many(&mut batch, MAX_BATCH)).await {
            Ok(n) => n,
            Err(_) => {
                conn = None;
                rx.recv_many(&mut batch, MAX_BATCH).await
            }
        };
        if received == 0 {
            break; // every sender is gone: the runtime has stopped
        }
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        loop {
            let result = async {
                let c = match &mut conn {
                    Some(c) => c,
                    None => conn.insert(pool.acquire().await?),
                };
                complete_batch(c, &batch).await
            }
            .await;
            match result {
                Ok(done) => {
                    if batch.iter().any(|c| c.keep || c.every_ms.is_some())
                        || done.len() < batch.len()
                    {
                        wake.notify_one();
                    }
                    for c in batch.iter().filter(|c| !done.contains(&c.id)) {
                        tracing::warn!(
                            job.id = c.id,
                            "completion refused: the claim had expired and was taken over; the job will run again"
                        );
                    }
                    break;
                }
                Err(e) => {
                    conn = None; // it may be broken: take a fresh one
                    let wait = backoff.next();
                    tracing::warn!(error = %e, retry_in = ?wait, jobs = batch.len(), "cannot write job completions; retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
        batch.clear();
    }
}
