//! The heartbeat: renews the leases of running handlers, and tells a handler when its
//! claim is lost.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::Shared;
use crate::enqueue::millis;
use crate::sql;

/// Renews every held claim in one statement, three times per (shortest) lease: from the
/// claim until its outcome is written, in every lease mode.
pub(super) async fn run(shared: Arc<Shared>) {
    let shortest = shared
        .handlers
        .values()
        .map(|h| h.config.lease_length())
        .min();
    let Some(shortest) = shortest else {
        return; // no kinds: nothing is ever claimed
    };
    let tick = (shortest / 3).max(Duration::from_millis(20));
    loop {
        tokio::time::sleep(tick).await;
        let mut ids = Vec::new();
        let mut tokens: Vec<Uuid> = Vec::new();
        let mut leases = Vec::new();
        {
            let flights = shared.flights.lock().expect("lock poisoned");
            for (token, flight) in flights.iter() {
                // A row locked by a fenced transaction (or anyone else) is skipped by
                // the renewal itself; it never waits for the lock.
                if *flight.lost.borrow() {
                    continue;
                }
                ids.push(flight.ctx.id);
                tokens.push(*token);
                leases.push(millis(flight.lease));
            }
        }
        if ids.is_empty() {
            continue;
        }
        let sent_at = Instant::now();
        // A renewal that hangs (a silently dead connection, a table lock) counts as a
        // failed one, so that handlers hear of a lease that may be gone.
        let renewal = sqlx::query_as(sql::RENEW)
            .bind(&ids)
            .bind(&tokens)
            .bind(&leases)
            .fetch_all(&shared.db);
        let result: Result<Vec<(Uuid, bool, bool)>, sqlx::Error> =
            match tokio::time::timeout(shortest / 2, renewal).await {
                Ok(result) => result,
                Err(_) => Err(sqlx::Error::Protocol(format!(
                    "the renewal did not answer within {:?}",
                    shortest / 2
                ))),
            };
        let flights = &mut *shared.flights.lock().expect("lock poisoned");
        match result {
            Ok(rows) => {
                for (token, renewed, held) in rows {
                    let Some(flight) = flights.get_mut(&token) else {
                        continue; // finished meanwhile
                    };
                    if renewed {
                        flight.last_renewed = sent_at;
                    } else if held {
                        // Its row is locked by another transaction: try again next beat.
                        tracing::debug!(
                            job.id = flight.ctx.id,
                            "lease not renewed: the job's row is locked"
                        );
                    } else if !flight.ctx.completed.load(Ordering::Acquire)
                        && !flight.ctx.fenced.load(Ordering::Acquire)
                    {
                        tracing::warn!(
                            job.id = flight.ctx.id,
                            job.kind = flight.ctx.kind,
                            "lease lost: the claim expired or was taken over"
                        );
                        let _ = flight.lost.send(true);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot renew job leases");
                // Without a renewal for a whole lease, the claim may be gone: say so,
                // measured on this process's monotonic clock (a duration, not a time).
                for flight in flights.values_mut() {
                    if flight.last_renewed.elapsed() >= flight.lease && !*flight.lost.borrow() {
                        tracing::warn!(
                            job.id = flight.ctx.id,
                            job.kind = flight.ctx.kind,
                            "lease presumed lost: not renewed for a whole lease"
                        );
                        let _ = flight.lost.send(true);
                    }
                }
            }
        }
    }
}
