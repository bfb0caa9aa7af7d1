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
/// (its connection limit), one of the runtime's pool: an idle one, or the next one
/// given back within `wait` (the pool queues its waiters fairly, and pings the
/// connection before handing it over). The renewals never lose a connection to the
/// runtime's other statements: a producer that cannot renew claims nothing and lets
/// go of its connection. (A taken connection's I/O is driven by the application's
/// runtime, like the pool's: until it breaks, renewals then share the application's
/// threads.)
async fn connect(beat: &Beat, wait: Duration) -> Result<PgConnection, sqlx::Error> {
    // A peer that takes the connection and never answers (a frozen server, a balancer
    // in front of a dead one) would otherwise hold the renewals here for good.
    let within = beat.shortest.max(Duration::from_secs(2));
    let e = match tokio::time::timeout(within, connect_own(beat)).await {
        Ok(Ok(conn)) => return Ok(conn),
        Ok(Err(e)) => e,
        Err(_) => sqlx::Error::Protocol(format!(
            "the renewals' connection did not open within {within:?}"
        )),
    };
    match tokio::time::timeout(wait, beat.fallback.acquire()).await {
        Ok(Ok(conn)) => {
            tracing::warn!(
                error = %crate::error::server_message(&e),
                "the renewals take a connection of the runtime's pool: the server refused them one of their own"
            );
            Ok(conn.detach())
        }
        Ok(Err(_)) | Err(_) => Err(e),
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
/// claim until its outcome is written, in every lease mode. A renewal that fails is
/// tried again on a fresh connection within [`Link::retry_cap`], not a third of a lease
/// later: a lease outlives only two missed renewals. Beside it, [`watch`] tells each
/// handler whose lease may have ended, connection or not.
async fn run(beat: &Beat) {
    tokio::join!(renew(beat), watch(beat));
}

async fn renew(beat: &Beat) {
    let tick = (beat.shortest / 3).max(Duration::from_millis(20));
    let mut link = Link::new(tick);
    loop {
        link.keep(beat).await;
        let batch = Batch::of(&beat.flights);
        if link.conn.is_some() && !batch.ids.is_empty() {
            let sent_at = Instant::now();
            let result = link.renew(&batch, beat.shortest / 2).await;
            beat.renewals(result.as_ref().map(drop));
            match result {
                Ok(rows) => renewed(
                    &mut beat.flights.lock().expect("lock poisoned"),
                    rows,
                    sent_at,
                ),
                Err(e) => {
                    tracing::warn!(error = %crate::error::server_message(&e), "cannot renew job leases")
                }
            }
        }
        tokio::time::sleep(link.next_in()).await;
    }
}

/// Tells each running handler whose lease may have ended ([`Inner::lease_deadline`]:
/// no renewal that answered was sent for nearly a lease) that it is lost, at that
/// moment, on this process's monotonic clock. It needs no connection: a runtime cut
/// off from the database tells its handlers before the database can give their jobs
/// to another claim. It wakes at the earliest deadline, and at least four times per
/// (shortest) lease to see new claims and renewals.
///
/// [`Inner::lease_deadline`]: crate::context::Inner::lease_deadline
async fn watch(beat: &Beat) {
    let most = (beat.shortest / 4).max(Duration::from_millis(5));
    loop {
        let next = expire(&beat.flights.lock().expect("lock poisoned"));
        let cap = Instant::now() + most;
        tokio::time::sleep_until(next.map_or(cap, |at| at.min(cap)).into()).await;
    }
}

/// Tells the handlers past their deadline that their lease is lost; returns the
/// earliest deadline of the others.
fn expire(flights: &HashMap<Uuid, Flight>) -> Option<Instant> {
    let now = Instant::now();
    let mut next: Option<Instant> = None;
    for flight in flights.values() {
        if *flight.lost.borrow()
            || flight.ctx.finished.load(Ordering::Acquire)
            || flight.ctx.completed.load(Ordering::Acquire)
        {
            continue;
        }
        let deadline = flight.ctx.lease_deadline();
        if deadline <= now {
            tracing::warn!(
                job.id = flight.ctx.id,
                job.kind = flight.ctx.kind,
                "lease presumed lost: no renewal answered for a lease; the job may run elsewhere"
            );
            let _ = flight.lost.send(true);
        } else {
            next = Some(next.map_or(deadline, |n| n.min(deadline)));
        }
    }
    next
}

/// The renewals' connection, and when to try again to open one.
struct Link {
    conn: Option<PgConnection>,
    tick: Duration,
    /// Since the last renewal that answered (or the start): how long to wait before
    /// the next attempt to connect.
    reconnect: Backoff,
    reconnect_at: Instant,
}

impl Link {
    fn new(tick: Duration) -> Self {
        Link {
            conn: None,
            tick,
            reconnect: Self::backoff(tick),
            reconnect_at: Instant::now(),
        }
    }

    /// From 50 ms up to [`Link::retry_cap`].
    fn backoff(tick: Duration) -> Backoff {
        Backoff::new(Duration::from_millis(50), Self::retry_cap(tick))
    }

    /// The longest wait between two attempts to connect: a quarter of a tick, so that
    /// a connection freed a moment before a lease would lapse is still taken in time.
    fn retry_cap(tick: Duration) -> Duration {
        (tick / 4).max(Duration::from_millis(50))
    }

    /// How long to sleep: a tick while connected, else until the next attempt.
    fn next_in(&self) -> Duration {
        if self.conn.is_some() {
            self.tick
        } else {
            self.reconnect_at.saturating_duration_since(Instant::now())
        }
    }

    /// Opens the connection at start, and again as soon as it is lost, whether or not
    /// a claim is held: claims wait for it.
    async fn keep(&mut self, beat: &Beat) {
        if self.conn.is_some() || Instant::now() < self.reconnect_at {
            return;
        }
        match connect(beat, Self::retry_cap(self.tick)).await {
            Ok(c) => {
                self.conn = Some(c);
                beat.renewals(Ok(()));
            }
            Err(e) => {
                self.reconnect_at = Instant::now() + self.reconnect.next();
                beat.renewals(Err(&e));
            }
        }
    }

    /// One renewal of `batch`. One that hangs (a silently dead connection, a table
    /// lock) past `limit` counts as failed, so that handlers hear of a lease that may be
    /// gone; after a failure the connection is closed and opened afresh after the
    /// backoff (which a renewal that answers resets).
    async fn renew(&mut self, batch: &Batch, limit: Duration) -> Result<Vec<Renewal>, sqlx::Error> {
        let renewal = async {
            let Some(c) = self.conn.as_mut() else {
                return Err(sqlx::Error::Protocol(
                    "no connection for the renewals yet".to_owned(),
                ));
            };
            crate::pooler::alone!(
                c,
                crate::pooler::query_as(sql::RENEW)
                    .persistent(false) // planned for its batch: see `sql::COMPLETE_DELETE`
                    .bind(&batch.ids)
                    .bind(&batch.tokens)
                    .bind(&batch.leases),
                fetch_all
            )
            .await
        };
        let result = match tokio::time::timeout(limit, renewal).await {
            Ok(result) => result,
            Err(_) => Err(sqlx::Error::Protocol(format!(
                "the renewal did not answer within {limit:?}"
            ))),
        };
        if result.is_ok() {
            self.reconnect = Self::backoff(self.tick);
        } else {
            // It may be broken, or mid-statement after a timeout: start afresh.
            if let Some(c) = self.conn.take() {
                let _ = tokio::time::timeout(Duration::from_millis(100), c.close()).await;
            }
            self.reconnect_at = Instant::now() + self.reconnect.next();
        }
        result
    }
}

/// A renewal's answer for one claim: its token, whether it was renewed, whether its
/// row was locked by another transaction, and whether the job was cancelled.
type Renewal = (Uuid, bool, bool, bool);

/// The claims to renew: those not known to be lost. A row locked by a fenced
/// transaction (or anyone else) is skipped by the renewal itself; it never waits.
struct Batch {
    ids: Vec<i64>,
    tokens: Vec<Uuid>,
    leases: Vec<i64>,
}

impl Batch {
    fn of(flights: &Mutex<HashMap<Uuid, Flight>>) -> Self {
        let flights = flights.lock().expect("lock poisoned");
        let mut batch = Batch {
            ids: Vec::new(),
            tokens: Vec::new(),
            leases: Vec::new(),
        };
        for (token, flight) in flights.iter() {
            if *flight.lost.borrow() {
                continue;
            }
            batch.ids.push(flight.ctx.id);
            batch.tokens.push(*token);
            batch.leases.push(millis(flight.ctx.config.lease_length()));
        }
        batch
    }
}

/// Records a renewal's answers: a claim renewed, left for the next beat (its row is
/// locked), cancelled, or found gone.
fn renewed(flights: &mut HashMap<Uuid, Flight>, rows: Vec<Renewal>, sent_at: Instant) {
    for (token, renewed, held, cancelled) in rows {
        let Some(flight) = flights.get_mut(&token) else {
            continue; // finished meanwhile
        };
        if renewed {
            let mut at = flight.ctx.renewed.lock().expect("lock poisoned");
            *at = (*at).max(sent_at);
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
            // (A finished claim found gone was just completed, or its outcome will be
            // refused and reported by whoever writes it.)
            tracing::warn!(
                job.id = flight.ctx.id,
                job.kind = flight.ctx.kind,
                "lease lost: the claim expired or was taken over"
            );
            let _ = flight.lost.send(true);
        }
    }
}
