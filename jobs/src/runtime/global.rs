//! Limits across every runtime: a kind's global concurrency and rate.
//!
//! A kind with a limit (`#[job(global_concurrency = N)]`, `#[job(rate = "N/1m")]`, or
//! an operator's value in `jobs_limits`, which wins) runs at most N jobs at once, or
//! starts at most N in any window of the rate's length, across every runtime on the
//! database. The producer leaves such kinds out of its ordinary claims and claims them
//! here, in a transaction of their own: the kind's advisory lock ([`sql::LIMIT_LOCK`]),
//! then a claim that counts the kind's running jobs in a snapshot taken after the lock
//! and takes no more than the rest of the limit ([`sql::CLAIM_LIMITED`]). A kind the
//! limit held to less than it asked for waits for a share to free, with the poll
//! interval as the backstop ([`Freed`]): the runtime that ends a job of the kind claims
//! the share itself first, and tells the others (a `NOTIFY` on the kind) only when it
//! cannot take all that is free. Told at every end, every runtime waiting at the limit
//! claimed at once, one after the other under the lock, and all but one found the
//! limit reached: W8 ran at half its limit.
//!
//! A kind whose one limit is its global concurrency for the kind as a whole hands a
//! share on without the lock: the completer completes a job of it and claims the
//! kind's next job in one statement ([`sql::HAND_OFF`]), and passes what it claimed to
//! the producer ([`Freed::hand`]). Only what a hand-off could not take (the kind ran
//! out of due jobs, or runs above a lowered limit, or is paused) goes the way above.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Postgres;
use sqlx::pool::PoolConnection;
use tokio::sync::Notify;

use super::Shared;
use super::claim::ClaimRow;
use crate::Rate;
use crate::enqueue::millis;
use crate::registry::HandlerInfo;
use crate::sql;

/// A kind's limits across every runtime: its global concurrency, its rate, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limit {
    pub(super) concurrency: Option<u32>,
    pub(super) rate: Option<Rate>,
    /// The payload fields each limit holds per value of (the attribute's only).
    pub(super) partition: Option<&'static [&'static str]>,
}

/// How late after its claim's statement a job of a kind with `rate` may start: a
/// hundredth of the window, from 50 ms to 1 s, plus twice `trip`, the runtime's recent
/// claim round trip ([`Trip`]), at most [`MAX_START_MARGIN`]. An executor hands back,
/// unstarted, a claim of such a kind that it could not start within this of the
/// claim's statement (`executor::run`), and the claim logs it with its starts
/// (`jobs_starts.margin_ms`): the claims count every start whose claim, plus its
/// margin, falls in the window before them ([`sql::CLAIM_LIMITED`]), so no window of
/// the rate's length holds more handler starts than the rate, however late within its
/// margin each handler began.
///
/// The hundredth costs the rate its share of the window: four runtime processes at
/// 1,000/s ran 945 starts/s (997 counted at the claims before). With 20 ms they ran 873
/// and 912: on a busy machine more starts came later than that, and went back. The
/// round trip is for a distant database: with the hundredth alone, a runtime whose
/// claim (its statement and its commit) took longer than 50 ms handed back every job of
/// a rated kind, at every claim, and never ran one.
pub(super) fn start_margin(rate: Rate, trip: Duration) -> Duration {
    ((rate.per / 100).clamp(Duration::from_millis(50), Duration::from_secs(1)) + trip * 2)
        .min(MAX_START_MARGIN)
}

/// The most a start margin may be: the claims read the rate's log this much before
/// their window (`max_start_margin_ms!` in `sql.rs`). A runtime whose claims take half
/// of it hands its jobs back.
pub(super) const MAX_START_MARGIN: Duration = Duration::from_secs(10);

/// [`start_margin`] in ms, for the rate's log.
fn margin_ms(rate: Rate, trip: Duration) -> i32 {
    i32::try_from(millis(start_margin(rate, trip))).unwrap_or(i32::MAX)
}

/// The runtime's recent round trip of a claim of kinds with a limit: from its
/// statement's send to its commit's answer. The longest one seen, less an eighth at
/// each claim after it, so that a slow moment widens the margins at once and they
/// narrow again over a few dozen claims.
#[derive(Default)]
pub(crate) struct Trip(AtomicU64);

impl Trip {
    /// The current round trip.
    pub(super) fn get(&self) -> Duration {
        Duration::from_micros(self.0.load(Ordering::Relaxed))
    }

    /// A claim took `took`.
    fn record(&self, took: Duration) {
        let took = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        // One claim at a time records (the producer's), so a load and a store do.
        let was = self.0.load(Ordering::Relaxed);
        self.0.store(took.max(was - was / 8), Ordering::Relaxed);
    }
}

/// The kinds with a limit, and each one's: the operator's values where set, else the
/// kind's attributes.
pub(super) type Limits = HashMap<&'static str, Limit>;

/// A row of `jobs_limits`: kind, concurrency, rate's starts and window (ms).
pub(super) type Set = (String, Option<i32>, Option<i32>, Option<i64>);

/// The limits of `handlers`' kinds, given the operator's values (`jobs_limits`).
pub(super) fn effective(
    handlers: &std::collections::BTreeMap<&'static str, &'static HandlerInfo>,
    set: &[Set],
) -> Limits {
    handlers
        .values()
        .filter_map(|h| {
            let row = set.iter().find(|(kind, ..)| kind == h.kind);
            let concurrency = row
                .and_then(|(_, n, ..)| *n)
                .and_then(|n| u32::try_from(n).ok())
                .or(h.config.global_concurrency)
                .map(|n| n.max(1));
            let rate = match row {
                Some((_, _, Some(starts), Some(ms))) => Some(Rate {
                    starts: u32::try_from(*starts).unwrap_or(1).max(1),
                    per: Duration::from_millis(u64::try_from(*ms).unwrap_or(1).max(1)),
                }),
                _ => h.config.rate,
            };
            // The partition splits every limit of the kind, an operator's too.
            let limit = Limit {
                concurrency,
                rate,
                partition: h.config.partition,
            };
            (concurrency.is_some() || rate.is_some()).then_some((h.kind, limit))
        })
        .collect()
}

/// What a claim of kinds with a limit came to: the rows it took, the kinds the limit
/// held to less than they asked for, and those that took all they asked for with
/// shares left over.
pub(super) struct Taken {
    pub(super) rows: Vec<ClaimRow>,
    /// Each kind cut, with how long until its rate has room again when the rate cut it
    /// (None: its concurrency did, and a job's end frees a share).
    pub(super) cut: Vec<(String, Option<Duration>)>,
    pub(super) spare: Vec<String>,
    /// The kinds that took less than their limits allowed while a due job of theirs
    /// was held by another transaction.
    pub(super) held: Vec<String>,
    /// The partitioned kinds whose walk ended among rows of partitions it filled: to
    /// claim again at once ([`sql::CLAIM_PARTITIONED`]).
    pub(super) more: Vec<String>,
}

impl From<Vec<LimitedRow>> for Taken {
    fn from(rows: Vec<LimitedRow>) -> Self {
        let mut taken = Taken {
            rows: Vec::with_capacity(rows.len()),
            cut: Vec::new(),
            spare: Vec::new(),
            held: Vec::new(),
            more: Vec::new(),
        };
        for row in rows {
            match row {
                LimitedRow::Job(row) => taken.rows.push(row),
                LimitedRow::Cut(kind, wait) => taken.cut.push((kind, wait)),
                LimitedRow::Spare(kind) => taken.spare.push(kind),
                LimitedRow::Held(kind) => taken.held.push(kind),
                LimitedRow::More(kind) => taken.more.push(kind),
            }
        }
        taken
    }
}

/// One row of [`sql::CLAIM_LIMITED`]: a claimed job, or a kind's mark.
enum LimitedRow {
    Job(ClaimRow),
    Cut(String, Option<Duration>),
    Spare(String),
    Held(String),
    More(String),
}

impl sqlx::FromRow<'_, sqlx::postgres::PgRow> for LimitedRow {
    fn from_row(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        match row.try_get::<Option<&str>, _>("mark")? {
            Some("cut") => {
                let wait: Option<f64> = row.try_get("wait")?;
                let wait = wait.map(|s| Duration::from_secs_f64(s.clamp(0.0, 86_400.0)));
                return Ok(LimitedRow::Cut(row.try_get("kind")?, wait));
            }
            Some("held") => return Ok(LimitedRow::Held(row.try_get("kind")?)),
            Some("more") => return Ok(LimitedRow::More(row.try_get("kind")?)),
            Some(_) => return Ok(LimitedRow::Spare(row.try_get("kind")?)),
            None => {}
        }
        Ok(LimitedRow::Job(ClaimRow::job(row)?))
    }
}

/// Claims up to `free` jobs of each kind of `asks` (with its limit), in one transaction
/// on `conn`: the kinds' locks, then the claims ([`sql::CLAIM_LIMITED`] for the kinds
/// whose limits hold for the kind as a whole, [`sql::CLAIM_PARTITIONED`] for each kind
/// whose limits hold per partition). A lock not granted within
/// [`sql::LIMIT_LOCK_WAIT`] is an error that [`lock_not_granted`] recognizes.
pub(super) async fn claim(
    shared: &Shared,
    conn: &mut PoolConnection<Postgres>,
    asks: &[(&'static HandlerInfo, usize, Limit)],
) -> Result<Taken, sqlx::Error> {
    let all: Vec<&str> = asks.iter().map(|(h, _, _)| h.kind).collect();
    let (split, whole): (Vec<_>, Vec<_>) = asks
        .iter()
        .copied()
        .partition(|(_, _, l)| l.partition.is_some());
    // READ COMMITTED whatever the role's default: at REPEATABLE READ the claim would
    // count in the snapshot of the transaction's first statement, taken before the
    // lock was granted, and two claimers could both count the same free share.
    let mut tx =
        sqlx::Connection::begin_with(&mut **conn, "BEGIN ISOLATION LEVEL READ COMMITTED").await?;
    crate::pooler::query(sql::LIMIT_LOCK)
        .bind(&all)
        .bind(sql::LIMIT_LOCK_CLASS)
        .bind(sql::LIMIT_LOCK_WAIT)
        .execute(&mut *tx)
        .await?;
    // The claims' statements start after this: their rows' leases and their starts
    // (the rate's log) count from their `statement_timestamp()`, so the lock's wait
    // spends neither the lease's local deadline nor the rate's margin to start. Stamped
    // before the lock, a claim that waited 50 ms for a busy lock handed back every job
    // of a kind with a rate of a window up to 5 s, unstarted: two runtimes contending
    // for a kind claimed and handed back in turn.
    let sent = std::time::Instant::now();
    let trip = shared.claim_trip.get();
    let mut rows = if whole.is_empty() {
        Vec::new()
    } else {
        claim_whole(&mut tx, shared, &whole, trip).await?
    };
    for (h, free, limit) in split {
        let fields: Vec<&str> = limit.partition.unwrap_or_default().to_vec();
        let per_partition = limit
            .concurrency
            .map_or(i32::MAX, |n| i32::try_from(n).unwrap_or(i32::MAX));
        let taken: Vec<LimitedRow> = crate::pooler::query_as(sql::CLAIM_PARTITIONED)
            .bind(h.kind)
            .bind(i32::try_from(free).unwrap_or(i32::MAX))
            .bind(millis(h.config.lease_length()))
            .bind(per_partition)
            .bind(shared.runtime_id)
            .bind(&fields)
            .bind(
                limit
                    .rate
                    .map(|r| i32::try_from(r.starts).unwrap_or(i32::MAX)),
            )
            .bind(limit.rate.map(|r| millis(r.per).max(1)))
            .bind(limit.rate.map(|r| margin_ms(r, trip)))
            .fetch_all(&mut *tx)
            .await?;
        rows.extend(taken);
    }
    tx.commit().await?;
    shared.claim_trip.record(sent.elapsed());
    let mut taken = Taken::from(rows);
    ClaimRow::sent_at(&mut taken.rows, sent);
    within_margins(&mut taken.rows, asks, trip);
    Ok(taken)
}

/// Gives each of `rows` of a kind with a rate the margin its claim logged.
fn within_margins(
    rows: &mut [ClaimRow],
    asks: &[(&'static HandlerInfo, usize, Limit)],
    trip: Duration,
) {
    for row in rows {
        let rate = asks
            .iter()
            .find(|(h, ..)| h.kind == row.kind)
            .and_then(|a| a.2.rate);
        row.start_within = rate.map(|r| start_margin(r, trip));
    }
}

/// [`sql::CLAIM_LIMITED`] for `asks`, in `tx`.
async fn claim_whole(
    tx: &mut sqlx::PgConnection,
    shared: &Shared,
    asks: &[(&'static HandlerInfo, usize, Limit)],
    trip: Duration,
) -> Result<Vec<LimitedRow>, sqlx::Error> {
    let kinds: Vec<&str> = asks.iter().map(|(h, _, _)| h.kind).collect();
    let frees: Vec<i32> = asks
        .iter()
        .map(|(_, free, _)| i32::try_from(*free).unwrap_or(i32::MAX))
        .collect();
    let leases: Vec<i64> = asks
        .iter()
        .map(|(h, _, _)| millis(h.config.lease_length()))
        .collect();
    let concurrency: Vec<Option<i32>> = asks
        .iter()
        .map(|(_, _, l)| l.concurrency.map(|n| i32::try_from(n).unwrap_or(i32::MAX)))
        .collect();
    let rate_starts: Vec<Option<i32>> = asks
        .iter()
        .map(|(_, _, l)| l.rate.map(|r| i32::try_from(r.starts).unwrap_or(i32::MAX)))
        .collect();
    let rate_ms: Vec<Option<i64>> = asks
        .iter()
        .map(|(_, _, l)| l.rate.map(|r| millis(r.per).max(1)))
        .collect();
    let margins: Vec<Option<i32>> = asks
        .iter()
        .map(|(_, _, l)| l.rate.map(|r| margin_ms(r, trip)))
        .collect();
    crate::pooler::query_as(sql::CLAIM_LIMITED)
        .bind(&kinds)
        .bind(&frees)
        .bind(&leases)
        .bind(&concurrency)
        .bind(shared.runtime_id)
        .bind(&rate_starts)
        .bind(&rate_ms)
        .bind(&margins)
        .fetch_all(&mut *tx)
        .await
}

/// Whether `e` says a kind's lock was not granted within [`sql::LIMIT_LOCK_WAIT`]
/// (`lock_not_available`): another runtime's claim of the kind holds it.
pub(super) fn lock_not_granted(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
}

/// Shares of kinds with a limit that have freed: those this runtime's producer claims
/// first, and those the other runtimes are told of.
pub(crate) struct Freed {
    /// Kinds of which a job ended here since the producer last looked.
    here: Mutex<HashSet<&'static str>>,
    /// Kinds with shares free that this runtime does not take, to announce.
    others: Mutex<HashSet<&'static str>>,
    /// The kinds of this runtime that other live runtimes claim, as the last presence
    /// round read them (`sql::RUNTIME_SEEN`); `None` until one has: every kind.
    pub(super) claimed_elsewhere: Mutex<Option<HashSet<String>>>,
    /// The producer's wake-up.
    pub(super) wake: Arc<super::Wake>,
    /// The announcer's.
    signal: Notify,
    /// Jobs that completions claimed for the shares they freed ([`sql::HAND_OFF`]),
    /// for the producer to start; `None` once it has stopped.
    handed: Mutex<Option<Vec<ClaimRow>>>,
    /// The producer's wake-up for those.
    pub(super) handed_signal: Notify,
}

impl Freed {
    pub(super) fn new(wake: Arc<super::Wake>) -> Self {
        Freed {
            here: Mutex::default(),
            others: Mutex::default(),
            claimed_elsewhere: Mutex::default(),
            wake,
            signal: Notify::new(),
            handed: Mutex::new(Some(Vec::new())),
            handed_signal: Notify::new(),
        }
    }

    /// A job of `kind`, a kind with a limit, has stopped running here (its outcome is
    /// written): the producer claims the share.
    pub(crate) fn mark(&self, kind: &'static str) {
        self.here.lock().expect("lock poisoned").insert(kind);
        self.wake.signal();
    }

    /// The kinds [`mark`](Self::mark)ed since the last call.
    pub(super) fn take_here(&self) -> HashSet<&'static str> {
        std::mem::take(&mut *self.here.lock().expect("lock poisoned"))
    }

    /// Jobs a completion claimed for the shares it freed: the producer starts them.
    /// Once it has stopped, gives them back for the caller to return to the table.
    pub(super) fn hand(&self, jobs: Vec<ClaimRow>) -> Result<(), Vec<ClaimRow>> {
        if jobs.is_empty() {
            return Ok(());
        }
        match &mut *self.handed.lock().expect("lock poisoned") {
            Some(handed) => handed.extend(jobs),
            None => return Err(jobs),
        }
        self.handed_signal.notify_one();
        Ok(())
    }

    /// The jobs [`hand`](Self::hand)ed on since the last call; with `last`, the
    /// producer is stopping, and later ones go back to the table.
    pub(super) fn take_handed(&self, last: bool) -> Vec<ClaimRow> {
        let mut handed = self.handed.lock().expect("lock poisoned");
        if last {
            handed.take().unwrap_or_default()
        } else {
            handed.as_mut().map(std::mem::take).unwrap_or_default()
        }
    }

    /// A share of `kind` is free and this runtime does not take it: tell the others.
    pub(super) fn tell(&self, kind: &'static str) {
        self.others.lock().expect("lock poisoned").insert(kind);
        self.signal.notify_one();
    }
}

/// Tells every other runtime of the shares [`Freed::tell`] collects, by a `NOTIFY` on
/// each kind ([`sql::NOTIFY_FREED`]) that another live runtime claims, as the last
/// presence round saw them (a runtime that started since hears of free shares at its
/// next poll until the round after its start, a few seconds). Behind a transaction
/// pooler no runtime listens: the others see the share free at their next poll.
pub(super) async fn announce(shared: Arc<Shared>) {
    loop {
        shared.freed.signal.notified().await;
        let mut kinds: Vec<&'static str> = shared
            .freed
            .others
            .lock()
            .expect("lock poisoned")
            .drain()
            .collect();
        if let Some(claimed_elsewhere) = &*shared
            .freed
            .claimed_elsewhere
            .lock()
            .expect("lock poisoned")
        {
            kinds.retain(|kind| claimed_elsewhere.contains(*kind));
        }
        if kinds.is_empty() || crate::pooler::behind() {
            continue;
        }
        let sent = super::answer_within(
            shared.answer_within,
            "the notification of a free share",
            crate::pooler::query(sql::NOTIFY_FREED)
                .bind(&kinds)
                .execute(&shared.db),
        )
        .await;
        if let Err(e) = sent {
            tracing::debug!(error = %crate::error::server_message(&e), "cannot notify the other runtimes of a free share; they poll");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_START_MARGIN, Trip, start_margin};
    use crate::Rate;
    use std::time::Duration;

    /// Every statement that reads the rate's log reads as far back as the largest
    /// margin a runtime may log.
    #[test]
    fn the_largest_margin_is_one_figure() {
        let bound = format!("+ {}) * interval", MAX_START_MARGIN.as_millis());
        for (name, sql) in [
            ("CLAIM_LIMITED", crate::sql::CLAIM_LIMITED),
            ("CLAIM_PARTITIONED", crate::sql::CLAIM_PARTITIONED),
            ("WHY_SHARES", crate::why::WHY_SHARES),
        ] {
            assert!(sql.contains(&bound), "{name} reads back otherwise");
        }
    }

    #[test]
    fn the_margin_grows_with_the_round_trip_up_to_its_bound() {
        let ms = Duration::from_millis;
        let rate = |per| Rate { starts: 10, per };
        assert_eq!(start_margin(rate(ms(500)), ms(0)), ms(50));
        assert_eq!(start_margin(rate(ms(10_000)), ms(0)), ms(100));
        assert_eq!(start_margin(rate(ms(500)), ms(80)), ms(210));
        assert_eq!(start_margin(rate(ms(500)), ms(60_000)), MAX_START_MARGIN);
    }

    #[test]
    fn a_slow_claim_widens_the_trip_at_once_and_it_narrows_by_eighths() {
        let trip = Trip::default();
        trip.record(Duration::from_millis(2));
        assert_eq!(trip.get(), Duration::from_millis(2));
        trip.record(Duration::from_millis(160));
        assert_eq!(trip.get(), Duration::from_millis(160));
        trip.record(Duration::from_millis(1));
        assert_eq!(trip.get(), Duration::from_millis(140));
        for _ in 0..60 {
            trip.record(Duration::from_millis(1));
        }
        assert!(trip.get() < Duration::from_millis(2), "{:?}", trip.get());
    }
}
