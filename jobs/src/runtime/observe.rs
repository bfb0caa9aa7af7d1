//! What the runtime tells the outside: outcome counts (for `jobs::testing`), and, with
//! the `metrics` feature, metrics through the `metrics` facade. The library installs no
//! recorder: without one (or without the feature) every call here costs nothing but an
//! atomic increment.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `jobs_claimed_total` | counter | `kind` |
//! | `jobs_finished_total` | counter | `kind`, `outcome` (succeeded, retried, failed, snoozed, lease_lost, cancelled, handed_back) |
//! | `jobs_handler_duration_seconds` | histogram | `kind` |
//! | `jobs_queue_wait_seconds` | histogram: claim time minus run-after, database clock | `kind` |
//! | `jobs_lag_seconds` | gauge: age of the oldest claimable job, every 10 s | `kind` |
//! | `jobs_depth` | gauge: claimable jobs, counted up to 100,000, every 10 s | `kind` |

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How the runs of one runtime ended.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub succeeded: AtomicU64,
    pub retried: AtomicU64,
    pub failed: AtomicU64,
    pub snoozed: AtomicU64,
    pub lease_lost: AtomicU64,
    pub cancelled: AtomicU64,
    pub handed_back: AtomicU64,
}

pub(crate) fn claimed(kind: &'static str, waited_seconds: f64) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("jobs_claimed_total", "kind" => kind).increment(1);
        metrics::histogram!("jobs_queue_wait_seconds", "kind" => kind).record(waited_seconds);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, waited_seconds);
}

pub(crate) fn finished(
    counts: &Counts,
    kind: &'static str,
    outcome: &'static str,
    took: Option<Duration>,
) {
    let counter = match outcome {
        "succeeded" => &counts.succeeded,
        "retried" => &counts.retried,
        "failed" => &counts.failed,
        "snoozed" => &counts.snoozed,
        "lease_lost" => &counts.lease_lost,
        "cancelled" => &counts.cancelled,
        _ => &counts.handed_back,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("jobs_finished_total", "kind" => kind, "outcome" => outcome).increment(1);
        // A claim that ended before its handler started has no duration to report.
        if let Some(took) = took {
            metrics::histogram!("jobs_handler_duration_seconds", "kind" => kind)
                .record(took.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, took);
}

/// Publishes lag and depth of the runtime's kinds every 10 seconds.
#[cfg(feature = "metrics")]
pub(super) async fn run(shared: std::sync::Arc<super::Shared>) {
    let kinds: Vec<&'static str> = shared.handlers.keys().copied().collect();
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let rows: Result<Vec<(String, i64, Option<f64>)>, sqlx::Error> = crate::pooler::alone!(
            &shared.db,
            crate::pooler::query_as(crate::sql::LAG_DEPTH).bind(&kinds),
            fetch_all
        )
        .await;
        match rows {
            Ok(rows) => {
                for (kind, depth, lag) in rows {
                    metrics::gauge!("jobs_depth", "kind" => kind.clone()).set(depth as f64);
                    metrics::gauge!("jobs_lag_seconds", "kind" => kind).set(lag.unwrap_or(0.0));
                }
            }
            Err(e) => {
                tracing::debug!(error = %crate::error::server_message(&e), "cannot read queue lag and depth")
            }
        }
    }
}
