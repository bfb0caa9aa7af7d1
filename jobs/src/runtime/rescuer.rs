//! The rescuer: returns claims whose lease expired (their runtime died or stalled).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Shared;
use crate::sql;

/// Rescues at most this many claims per statement.
const BATCH: i32 = 1_000;

/// How often done rows past their kind's retention are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

pub(super) async fn run(shared: Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pruned_at: Option<Instant> = None;
    loop {
        tick.tick().await;
        if pruned_at.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
            pruned_at = Some(Instant::now());
            prune(&shared).await;
        }
        let rows: Result<Vec<(i64, String, String)>, sqlx::Error> = sqlx::query_as(sql::RESCUE)
            .bind(BATCH)
            .fetch_all(&shared.pool)
            .await;
        match rows {
            Ok(rows) if rows.is_empty() => {}
            Ok(rows) => {
                for (id, kind, state) in &rows {
                    tracing::info!(job.id = id, job.kind = %kind, new_state = %state, "took back an expired claim");
                }
                shared.wake.notify_one();
            }
            Err(e) => tracing::debug!(error = %e, "cannot look for expired claims"),
        }
    }
}

/// Deletes done rows older than their kind's `retain`, in bounded batches, for the kinds
/// this runtime handles. Replicas pruning at once take disjoint rows (`SKIP LOCKED`).
async fn prune(shared: &Shared) {
    for info in shared.handlers.values() {
        let Some(retain) = info.config.retain else {
            continue;
        };
        if let Err(e) =
            crate::admin::prune(&shared.pool, Some(info.kind), retain, i64::from(BATCH)).await
        {
            tracing::debug!(error = %e, job.kind = info.kind, "cannot prune done jobs");
        }
    }
}
