//! Periodic kinds: the producer makes sure each has its one live job.

use std::time::{Duration, Instant};

use super::Shared;
use crate::enqueue::millis;
use crate::registry::HandlerInfo;
use crate::sql;

/// The periodic kinds of a runtime, and when they were last armed.
pub(super) struct Periodic {
    kinds: Vec<&'static HandlerInfo>,
    every: Duration,
    armed_at: Option<Instant>,
}

impl Periodic {
    pub(super) fn new(shared: &Shared) -> Self {
        let kinds: Vec<&'static HandlerInfo> = shared
            .handlers
            .values()
            .copied()
            .filter(|h| h.config.is_periodic())
            .collect();
        let every = kinds
            .iter()
            .map(|h| h.config.every.unwrap_or(Duration::from_secs(60)))
            .min()
            .unwrap_or(Duration::MAX)
            .clamp(Duration::from_secs(1), Duration::from_secs(60));
        Periodic {
            kinds,
            every,
            armed_at: None,
        }
    }

    /// Arms the periodic kinds once their shortest period (1 to 60 s) has passed since
    /// they were last armed; again at the next call if the database did not answer.
    pub(super) async fn tend(&mut self, shared: &Shared) {
        if !self.kinds.is_empty()
            && self.armed_at.is_none_or(|t| t.elapsed() >= self.every)
            && arm_periodic(shared, &self.kinds).await
        {
            self.armed_at = Some(Instant::now());
        }
    }
}

/// Makes sure each periodic kind has its one live job. Returns false on a database error.
async fn arm_periodic(shared: &Shared, periodic: &[&'static HandlerInfo]) -> bool {
    // Cron kinds are armed at their next fire time, computed from the database's clock.
    let mut db_now_us = None;
    if periodic.iter().any(|h| h.config.cron.is_some()) {
        match crate::pooler::alone!(
            &shared.db,
            crate::pooler::query_scalar::<_, i64>(sql::DB_NOW),
            fetch_one
        )
        .await
        {
            Ok(now) => db_now_us = Some(now),
            Err(e) => {
                tracing::warn!(error = %crate::error::server_message(&e), "cannot read the database's clock to arm cron kinds");
                return false;
            }
        }
    }
    for info in periodic {
        let (period_ms, due_ms) = match (info.config.every, db_now_us) {
            (Some(every), _) => (millis(every), 0),
            (None, Some(now)) => match info.config.next_run_ms(now) {
                Some(due) => (0, due),
                None => continue, // the schedule never fires again
            },
            (None, None) => continue,
        };
        let payload = match (info.periodic_payload)() {
            Some(Ok(payload)) => payload,
            Some(Err(e)) => {
                tracing::error!(job.kind = info.kind, error = %e, "cannot serialize the periodic job");
                continue;
            }
            None => continue,
        };
        let result = crate::pooler::alone!(
            &shared.db,
            crate::pooler::query(sql::ARM_PERIODIC)
                .bind(info.kind)
                .bind(payload)
                .bind(i32::try_from(info.config.max_attempts).unwrap_or(i32::MAX))
                .bind(sql::PERIODIC_KEY)
                .bind(period_ms)
                .bind(due_ms)
                .bind(info.config.priority),
            execute
        )
        .await;
        match result {
            Ok(r) if r.rows_affected() > 0 => {
                tracing::debug!(job.kind = info.kind, "armed periodic job");
                shared.wake.name([info.kind]);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(job.kind = info.kind, error = %crate::error::server_message(&e), "cannot arm periodic job");
                return false;
            }
        }
    }
    true
}
