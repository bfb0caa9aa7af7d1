//! The heartbeat: renews the leases of running handlers, and tells a handler when its
//! claim is lost.
//!
//! It runs on a thread of its own, with a single-threaded tokio runtime and a
//! connection of its own, so that handlers which block the application's worker
//! threads (a CPU loop, blocking I/O) cannot stop their own renewals, nor anyone
//! else's.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::watch;
use uuid::Uuid;

use super::Flight;
use super::backoff::Backoff;
use crate::enqueue::millis;
use crate::sql;

/// What the heartbeat thread needs: the claims to renew and how to reach the database.
pub(super) struct Beat {
    pub flights: Arc<Mutex<HashMap<Uuid, Flight>>>,
    pub connect: PgConnectOptions,
    /// The application pool's `search_path`, where its connect hooks set one.
    pub search_path: Option<String>,
    /// The shortest lease of the runtime's kinds: renewals come three times per lease.
    pub shortest: Duration,
    /// Turns true when the runtime has stopped.
    pub stop: watch::Receiver<bool>,
    /// Whether leases can be renewed now: the heartbeat has a connection and its last
    /// renewal answered. The producer claims, and executors start handlers, only then.
    pub renewing: watch::Sender<bool>,
    /// Why they cannot, in the server's words.
    pub why_not: Arc<Mutex<Option<String>>>,
    /// The runtime's pool: when the server refuses the renewals a connection of their
    /// own, they take one of its idle connections instead.
    pub fallback: sqlx::PgPool,
}

impl Beat {
    /// Records whether renewals work, and why not.
    fn renewals(&self, result: Result<(), &sqlx::Error>) {
        let ok = result.is_ok();
        *self.why_not.lock().expect("lock poisoned") =
            result.err().map(crate::error::server_message);
        self.renewing
            .send_if_modified(|was| std::mem::replace(was, ok) != ok);
    }
}

/// Starts the heartbeat thread. It ends when `beat.stop` turns true (or its sender is
/// dropped).
pub(super) fn spawn(beat: Beat) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("jobs-heartbeat".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the heartbeat's runtime; leases will not be renewed");
                    return;
                }
            };
            let mut stop = beat.stop.clone();
            runtime.block_on(async move {
                tokio::select! {
                    () = run(&beat) => {}
                    _ = stop.wait_for(|s| *s) => {}
                }
            });
        })
}

/// A connection for the renewals: one of their own, or, when the server refuses it
/// (its connection limit), an idle one taken out of the runtime's pool. The renewals
/// never lose a connection to the runtime's other statements: a producer that cannot
/// renew claims nothing and lets go of its connection. (A taken connection's I/O is
/// driven by the application's runtime, like the pool's: until it breaks, renewals
/// then share the application's threads.)
async fn connect(beat: &Beat) -> Result<PgConnection, sqlx::Error> {
    match connect_own(beat).await {
        Ok(conn) => Ok(conn),
        Err(e) => match beat.fallback.try_acquire() {
            Some(conn) => {
                tracing::warn!(
                    error = %crate::error::server_message(&e),
                    "the renewals take a connection of the runtime's pool: the server refused them one of their own"
                );
                Ok(conn.detach())
            }
            None => Err(e),
        },
    }
}

/// A connection of the renewals' own, with the application pool's `search_path`.
async fn connect_own(beat: &Beat) -> Result<PgConnection, sqlx::Error> {
    let mut conn = beat.connect.connect().await?;
    if let Some(path) = &beat.search_path {
        crate::pooler::query("SELECT set_config('search_path', $1, false)")
            .bind(path)
            .execute(&mut conn)
            .await?;
    }
    Ok(conn)
}

/// Renews every held claim in one statement, three times per (shortest) lease: from the
/// claim until its outcome is written, in every lease mode.
async fn run(beat: &Beat) {
    let shortest = beat.shortest;
    let tick = (shortest / 3).max(Duration::from_millis(20));
    let mut conn: Option<PgConnection> = None;
    let mut reconnect = Backoff::new(Duration::from_millis(50), tick);
    let mut reconnect_at = Instant::now();
    let mut first = true;
    loop {
        if !std::mem::take(&mut first) {
            tokio::time::sleep(tick).await;
        }
        // The connection is opened at start, and again as soon as it is lost, whether
        // or not a claim is held: claims wait for it.
        if conn.is_none() && Instant::now() >= reconnect_at {
            match connect(beat).await {
                Ok(c) => {
                    conn = Some(c);
                    reconnect = Backoff::new(Duration::from_millis(50), tick);
                    beat.renewals(Ok(()));
                }
                Err(e) => {
                    reconnect_at = Instant::now() + reconnect.next();
                    beat.renewals(Err(&e));
                }
            }
        }
        let mut ids = Vec::new();
        let mut tokens: Vec<Uuid> = Vec::new();
        let mut leases = Vec::new();
        {
            let flights = beat.flights.lock().expect("lock poisoned");
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
        let renewal = async {
            let Some(c) = conn.as_mut() else {
                return Err(sqlx::Error::Protocol(
                    "no connection for the renewals yet".to_owned(),
                ));
            };
            crate::pooler::alone!(
                c,
                crate::pooler::query_as(sql::RENEW)
                    .persistent(false) // planned for its batch: see `sql::COMPLETE_DELETE`
                    .bind(&ids)
                    .bind(&tokens)
                    .bind(&leases),
                fetch_all
            )
            .await
        };
        let result: Result<Vec<(Uuid, bool, bool, bool)>, sqlx::Error> =
            match tokio::time::timeout(shortest / 2, renewal).await {
                Ok(result) => result,
                Err(_) => Err(sqlx::Error::Protocol(format!(
                    "the renewal did not answer within {:?}",
                    shortest / 2
                ))),
            };
        beat.renewals(result.as_ref().map(drop));
        if result.is_err() {
            // It may be broken, or mid-statement after a timeout: start afresh.
            if let Some(c) = conn.take() {
                let _ = tokio::time::timeout(Duration::from_millis(100), c.close()).await;
            }
        }
        let flights = &mut *beat.flights.lock().expect("lock poisoned");
        match result {
            Ok(rows) => {
                for (token, renewed, held, cancelled) in rows {
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
                    } else if cancelled {
                        // The notification may have been lost: the renewal tells.
                        super::cancel_flight(flight);
                    } else if !flight.ctx.finished.load(Ordering::Acquire)
                        && !flight.ctx.completed.load(Ordering::Acquire)
                        && !flight.ctx.fenced.load(Ordering::Acquire)
                    {
                        // (A finished claim found gone was just completed, or its
                        // outcome will be refused and reported by whoever writes it.)
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
                tracing::warn!(error = %crate::error::server_message(&e), "cannot renew job leases");
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
