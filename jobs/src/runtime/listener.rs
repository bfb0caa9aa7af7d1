//! The listener: turns `NOTIFY jobs, '<kind>'` into a wake-up of the producer.
//!
//! A hint only: notifications sent while the connection is down are lost, so every
//! (re)connection wakes the producer to catch up, and the producer polls regardless.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sqlx::postgres::PgListener;

use super::Shared;
use super::backoff::Backoff;

/// The channel every enqueue notifies, with the job's kind as payload.
pub(crate) const CHANNEL: &str = "jobs";

/// The channel `jobs::admin::pause` and `resume` notify: the producer reads the paused
/// kinds again.
pub(crate) const PAUSE_CHANNEL: &str = "jobs_paused";

/// The channel `jobs::admin::cancel` notifies with the id of a running job it
/// cancelled: the runtime holding it drops its handler.
pub(crate) const CANCEL_CHANNEL: &str = "jobs_cancel";

pub(super) async fn run(shared: Arc<Shared>) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        let mut listener = match connect(&shared).await {
            Ok(listener) => listener,
            Err(e) => {
                let wait = backoff.next();
                let error = super::connections::why(&shared, &e).await;
                tracing::warn!(%error, retry_in = ?wait, "cannot listen for job notifications; polling meanwhile");
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        // Notifications may have been missed: catch up, paused kinds included, and
        // every kind (a quiet one is otherwise asked for only when named).
        shared.paused_changed.store(true, Ordering::Release);
        catch_up(&shared);
        shared.reconnected.notify_one();
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    if notification.channel() == CANCEL_CHANNEL {
                        if let Ok(id) = notification.payload().parse::<i64>() {
                            let flights = shared.flights.lock().expect("lock poisoned");
                            for flight in flights.values().filter(|f| f.ctx.id == id) {
                                super::cancel_flight(flight);
                            }
                        }
                    } else if notification.channel() == PAUSE_CHANNEL {
                        shared.paused_changed.store(true, Ordering::Release);
                        shared.wake.signal();
                    } else if let Some((&kind, _)) =
                        shared.handlers.get_key_value(notification.payload())
                    {
                        shared.wake.name([kind]);
                    }
                }
                Ok(None) => {
                    // The connection was lost; the next call reconnects and listens
                    // again. What was sent meanwhile is lost: catch up now.
                    tracing::debug!("notification connection lost; reconnecting");
                    catch_up(&shared);
                }
                Err(e) => {
                    tracing::warn!(error = %crate::error::server_message(&e), "notification connection failed; reconnecting");
                    break;
                }
            }
        }
    }
}

/// Wakes the producer to claim every kind: notifications may have been missed.
fn catch_up(shared: &Shared) {
    shared.wake.name(shared.handlers.keys().copied());
}

async fn connect(shared: &Shared) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(&shared.db).await?;
    listener
        .listen_all([CHANNEL, PAUSE_CHANNEL, CANCEL_CHANNEL])
        .await?;
    Ok(listener)
}
