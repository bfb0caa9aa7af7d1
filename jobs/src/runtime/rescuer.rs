//! The rescuer: returns claims whose lease expired (their runtime died or stalled). And,
//! in a task of its own, the retention prune.

use std::sync::Arc;
use std::time::Duration;

use super::Shared;
use crate::admin::Retained;
use crate::sql;

/// However slow rescues are, one runs at least this often.
const SPACED_AT_MOST: Duration = Duration::from_secs(30);

/// Rescues at most this many claims per statement.
const BATCH: i32 = 1_000;

/// How often rows past their retention are pruned when there is no backlog of them.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// How soon the prune goes on when its last round found a full batch.
const PRUNE_BACKLOG_EVERY: Duration = Duration::from_secs(1);

/// Looks for expired claims every `every`, or, while a rescue is slow, no more often
/// than every 50 times its last duration (up to 30 s). A rescue reads `jobs_running`, whose dead
/// entries a held xmin horizon keeps (every claim of the meantime left one): at 1,000
/// jobs/s for ten minutes a rescue walked 1.2 million of them, and once a second it
/// took CPU the claims needed. Spaced out, it costs at most 2 % of a connection's time,
/// and takeover waits that much longer only while the horizon is held.
pub(super) async fn run(shared: Arc<Shared>, every: Duration) {
    let mut took = Duration::ZERO;
    loop {
        tokio::time::sleep(every.max((took * 50).min(SPACED_AT_MOST))).await;
        let started = std::time::Instant::now();
        let rows: Result<Vec<(i64, String, String)>, sqlx::Error> = super::answer_within(
            shared.answer_within,
            "the rescue",
            crate::pooler::alone!(
                &shared.db,
                crate::pooler::query_as(sql::RESCUE)
                    .persistent(false) // planned for each run: see `sql::RESCUE`
                    .bind(BATCH),
                fetch_all
            ),
        )
        .await;
        // A failed rescue says nothing about how long one takes.
        took = if rows.is_ok() {
            started.elapsed()
        } else {
            Duration::ZERO
        };
        match rows {
            Ok(rows) if rows.is_empty() => {}
            Ok(rows) => {
                for (id, kind, state) in &rows {
                    tracing::info!(job.id = id, job.kind = %kind, new_state = %state, "took back an expired claim");
                    // A dead runtime's share of a limited kind is free again: claim it
                    // now rather than at the poll (`global`).
                    if let Some((&kind, _)) = shared.handlers.get_key_value(kind.as_str()) {
                        shared.ended_run(kind);
                        if state == "pending" {
                            shared.wake.name([kind]);
                        }
                    }
                }
            }
            Err(e) => {
                let error = super::connections::why(&shared, &e).await;
                tracing::warn!(%error, "cannot look for expired claims; retrying");
            }
        }
    }
}

/// Deletes done rows older than their kind's `retain` and, with
/// [`Runtime::retain_failed`](crate::Runtime::retain_failed), failed rows older than
/// that, for the kinds this runtime handles. Each round deletes at most one batch per
/// kind and state, so a large backlog is worked off a batch a second, never in one long
/// loop. Replicas pruning at once take disjoint rows (`SKIP LOCKED`).
pub(super) async fn prune(shared: Arc<Shared>, retain_failed: Option<Duration>) {
    loop {
        if let Err(e) = crate::pooler::alone!(
            &shared.db,
            crate::pooler::query(crate::sql::THROUGHPUT_PRUNE),
            execute
        )
        .await
        {
            tracing::debug!(error = %crate::error::server_message(&e), "cannot prune the throughput history");
        }
        let mut backlog = false;
        for info in shared.handlers.values() {
            if let Some(retain) = info.config.retain {
                backlog |= prune_one(&shared, info.kind, retain, Retained::Done).await;
            }
            if let Some(retain) = retain_failed {
                backlog |= prune_one(&shared, info.kind, retain, Retained::Failed).await;
                backlog |= prune_one(&shared, info.kind, retain, Retained::Cancelled).await;
            }
        }
        tokio::time::sleep(if backlog {
            PRUNE_BACKLOG_EVERY
        } else {
            PRUNE_EVERY
        })
        .await;
    }
}

/// One bounded batch; returns whether it was full (more may be waiting).
async fn prune_one(shared: &Shared, kind: &str, retain: Duration, which: Retained) -> bool {
    let batch = i64::from(BATCH);
    let result = crate::admin::prune_batch(&shared.db, which, kind, retain, batch).await;
    match result {
        Ok(n) => n >= batch as u64,
        Err(e) => {
            let error = match &e {
                crate::Error::Database(db) => super::connections::why(shared, db).await,
                other => other.to_string(),
            };
            tracing::warn!(%error, job.kind = kind, rows = ?which, "cannot prune old jobs");
            false
        }
    }
}
