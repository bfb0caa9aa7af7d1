//! The producer: claims jobs up to free capacity and starts an executor for each.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::Postgres;
use sqlx::pool::PoolConnection;
use tokio::sync::watch;
use tokio::task::JoinSet;
use uuid::Uuid;

use super::backoff::Backoff;
use super::executor::{self, Claimed};
use super::{Shared, observe};
use crate::enqueue::millis;
use crate::registry::HandlerInfo;
use crate::sql;

/// How long a busy runtime with work waiting lets slots free up before it claims, so
/// that claims come in batches.
const BATCH_WINDOW: Duration = Duration::from_millis(2);

/// How soon after a wake-up an idle runtime claims once more: twice the window in which
/// a producer sends at most one notification per kind (`enqueue::NOTIFY_EVERY`).
const FOLLOW_UP: Duration = Duration::from_millis(10);

/// How much longer than the time since the last claim was sent the next-due query looks
/// back for jobs that became due after that claim's `now()` (`sql::NEXT_DUE`): the
/// query's own way to the server.
const NEXT_DUE_MARGIN: Duration = Duration::from_millis(2);

/// How much work a kind claims ahead of its free slots: what its handlers finish in this
/// long at their recent rate. Short jobs come in claims of hundreds however low the
/// concurrency; a kind whose jobs take longer than this claims nothing ahead, so that
/// claims never wait long in one runtime while another has free slots.
const AHEAD_FOR: Duration = Duration::from_millis(50);

/// At most this many claims held ahead of free slots, over all kinds. A claim is sent
/// once half of what the runtime may hold has started, so a fast kind at concurrency 10
/// comes in claims of about 500 (the raw ceiling's best batch, `bench/ceiling.sh`): with
/// 500 ahead, claims of 250 drained W2 about a tenth slower (BENCHMARKS.md).
const MAX_AHEAD: usize = 1_000;

/// How often the rates behind the claim-ahead are measured.
const RATE_EVERY: Duration = Duration::from_millis(100);

type ClaimRow = (
    i64,
    String,
    i32,
    i32,
    Uuid,
    String,
    Option<f64>,
    Option<f64>,
    i16,
);

/// The running executors. Owned by the runtime, not by the producer: if the producer
/// panics, the runtime still lets them finish and hands their jobs back.
pub(super) type Executors = Arc<tokio::sync::Mutex<JoinSet<()>>>;

/// Claims until `stop` turns true.
pub(super) async fn run(
    shared: Arc<Shared>,
    executors: Executors,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
    let mut poll = tokio::time::interval(shared.poll_interval);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let periodic: Vec<&'static HandlerInfo> = shared
        .handlers
        .values()
        .copied()
        .filter(|h| h.config.is_periodic())
        .collect();
    let arm_every = periodic
        .iter()
        .map(|h| h.config.every.unwrap_or(Duration::from_secs(60)))
        .min()
        .unwrap_or(Duration::MAX)
        .clamp(Duration::from_secs(1), Duration::from_secs(60));
    let mut armed_at: Option<Instant> = None;
    // Whether the last claim filled what it asked for, so more may be waiting.
    let mut more = true;
    // The connection claims go through, held across rounds: a pool connection is
    // pinged on every acquire, which would double the claim's round trips.
    let mut conn: Option<PoolConnection<Postgres>> = None;
    // Whether this round already waited for slots to free (it waits once, then claims).
    let mut batch_window_used = false;
    // Whether the last wake-up was a signal: then one more claim follows shortly.
    let mut follow_up = false;
    // When the last claim was sent: jobs that became due after it are looked for.
    let mut claim_sent = Instant::now();
    let mut rates = Rates::new(&shared);
    let mut floors = Floors::default();
    let mut paused = Paused::default();
    // The full claim in flight, if any (`full_claim`).
    let mut full: Option<tokio::task::JoinHandle<FullAnswer>> = None;
    let full_done = Arc::new(tokio::sync::Notify::new());

    loop {
        if *stop.borrow() {
            break;
        }
        while executors.lock().await.try_join_next().is_some() {}

        if !periodic.is_empty()
            && armed_at.is_none_or(|t| t.elapsed() >= arm_every)
            && arm_periodic(&shared, &periodic).await
        {
            armed_at = Some(Instant::now());
        }

        // Paused kinds: read once per poll interval, and at once when a pause or resume
        // notifies.
        if shared
            .paused_changed
            .swap(false, std::sync::atomic::Ordering::AcqRel)
            || paused
                .read_at
                .is_none_or(|at| at.elapsed() >= shared.poll_interval)
        {
            paused.read(&shared, &mut conn).await;
        }
        rates.measure(&shared);
        let (total_free, mut per_kind) = shared.free(&rates.ahead, rates.total);
        for (info, free) in &mut per_kind {
            if paused.kinds.contains(info.kind) {
                *free = 0;
            }
        }
        if full
            .as_ref()
            .is_some_and(tokio::task::JoinHandle::is_finished)
        {
            let answer = full.take().expect("checked").await;
            more |= settle_full(answer, &mut floors);
            continue;
        }
        // A full claim is due: it starts beside the claims from the floors.
        if full.is_none()
            && floors.full_due(shared.poll_interval)
            && let Some(ask) = Ask::new(total_free, &per_kind, None)
        {
            floors.last_full = Some(Instant::now());
            full = Some(tokio::spawn(full_claim(
                shared.clone(),
                ask,
                executors.clone(),
                full_done.clone(),
            )));
        }
        if total_free == 0 || per_kind.iter().all(|(_, n)| *n == 0) {
            // While a kind is paused, look again within a poll interval even if no
            // slot frees meanwhile.
            tokio::select! {
                _ = shared.slot_freed.notified() => {}
                () = sleep_if(!paused.kinds.is_empty(), shared.poll_interval) => {}
                _ = shared.wake.notified(), if !paused.kinds.is_empty() => {}
                _ = stop.changed() => {}
            }
            continue;
        }
        if !more {
            // Idle: sleep until a notification, the next poll, or the moment the next
            // scheduled job (a retry, a snooze, a delayed enqueue) becomes due; and,
            // right after a wake-up, claim once more a moment later: producers send one
            // notification per kind every few milliseconds, so jobs committed just after
            // the notified one may have sent none.
            let window = claim_sent.elapsed() + NEXT_DUE_MARGIN;
            let due = next_due(&shared, &mut conn, &per_kind, window).await;
            if due == Some(Duration::ZERO) {
                // A job became due after the last claim looked: claim it now.
                more = true;
                continue;
            }
            let signalled = tokio::select! {
                _ = shared.wake.notified() => true,
                _ = poll.tick() => false,
                () = sleep_until_due(due) => false,
                () = sleep_if(follow_up, FOLLOW_UP) => false,
                _ = full_done.notified(), if full.is_some() => false,
                _ = stop.changed() => false,
            };
            follow_up = signalled;
            more = true;
            continue;
        }

        // Work is waiting but some capacity is taken: give running handlers a moment to
        // free the rest, so that one claim fetches a full batch instead of a job or two
        // (W2 in BENCHMARKS.md: at concurrency 100, claims of about 50 drained 33k
        // jobs/s, full claims 44k). Short handlers free their slots within the window;
        // long ones cost at most the window per claim. With claims held ahead, the
        // claim tops them up once half are gone, before the handlers run dry.
        let capacity = shared.concurrency + rates.total;
        let target = if rates.total > 0 {
            capacity / 2
        } else {
            shared.concurrency
        };
        if total_free < target && !batch_window_used {
            batch_window_used = true;
            let _ = tokio::time::timeout(BATCH_WINDOW, async {
                while shared.total_free(rates.total) < target {
                    shared.slot_freed.notified().await;
                }
            })
            .await;
            continue;
        }
        batch_window_used = false;

        let mut running = executors.lock().await;
        claim_sent = Instant::now();
        let round = claim(
            &shared,
            &mut conn,
            total_free,
            &per_kind,
            &mut floors,
            &mut running,
        );
        let claimed = super::answer_within(shared.answer_within, "the claim", round).await;
        drop(running);
        match claimed {
            Ok(filled) => {
                more = filled;
                backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
                if !filled {
                    // Idle next: let the executors just started (each waiting in this
                    // worker's next-task slot) begin their handlers before the next-due
                    // query is written, which would otherwise go first.
                    tokio::task::yield_now().await;
                }
            }
            Err(e) => {
                conn = None; // it may be broken: take a fresh one next time
                let wait = backoff.after(&e);
                tracing::warn!(error = %e, retry_in = ?wait, "cannot claim jobs; retrying");
                // The listener's reconnection (the database is back) ends the wait.
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shared.reconnected.notified() => {}
                    _ = stop.changed() => {}
                }
            }
        }
    }
    // A full claim still in flight: wait until it has started what it took, so that
    // those jobs are handed back now (shutdown has begun) rather than left to their
    // leases.
    if let Some(handle) = full.take() {
        settle_full(handle.await, &mut floors);
    }
}

/// The kinds an operator has paused (`jobs::admin::pause`), as last read.
#[derive(Default)]
struct Paused {
    kinds: std::collections::HashSet<String>,
    read_at: Option<Instant>,
}

impl Paused {
    /// Reads the paused kinds again; keeps the last reading if the database does not
    /// answer (the claim that follows reports the outage).
    async fn read(&mut self, shared: &Shared, conn: &mut Option<PoolConnection<Postgres>>) {
        let query = async {
            let c = match conn {
                Some(c) => c,
                None => conn.insert(shared.db.acquire().await?),
            };
            crate::pooler::alone!(
                &mut **c,
                crate::pooler::query_scalar::<_, String>(sql::PAUSED_KINDS),
                fetch_all
            )
            .await
        };
        self.read_at = Some(Instant::now());
        match super::answer_within(shared.answer_within, "the paused kinds", query).await {
            Ok(kinds) => {
                let kinds: std::collections::HashSet<String> = kinds.into_iter().collect();
                for kind in kinds.difference(&self.kinds) {
                    tracing::info!(job.kind = %kind, "kind paused: not claiming it");
                }
                for kind in self.kinds.difference(&kinds) {
                    tracing::info!(job.kind = %kind, "kind resumed");
                }
                self.kinds = kinds;
            }
            Err(e) => {
                *conn = None;
                tracing::debug!(error = %e, "cannot read the paused kinds");
            }
        }
    }
}

/// Where each kind's next claim starts (see `sql::CLAIM_FLOOR_LAG`), and when the last
/// full claim, from the start of the kinds' ranges, ran.
#[derive(Default)]
struct Floors {
    /// The latest run-after claimed per kind and priority, in seconds since the epoch
    /// (database clock).
    latest: HashMap<(&'static str, i16), f64>,
    last_full: Option<Instant>,
    full_took: Duration,
}

impl Floors {
    /// Whether a full claim is due (it starts beside the claims from the floors): at
    /// least once per poll interval, and no more often than every 1,000 times the last
    /// full claim's duration (but at least every 30 s, so that one slow full claim
    /// cannot put the next far off). Counted from the start of the last one.
    ///
    /// Under a held horizon a full claim walks every dead entry (up to 250 ms past a
    /// million) and takes a core for that long; at 1 % of the time (every 100 times its
    /// duration) one ran every 5 to 20 s, and the 5 s windows that held one had the
    /// pickup's worst p95 (`bench horizon`, BENCHMARKS.md). A full claim under 1 ms (an
    /// idle queue in clean conditions: 0.1 ms) still runs every poll interval. Its
    /// duration also counts the rows it takes: in a busy drain a full claim of 500 jobs
    /// takes about 8 ms, and the next comes 8 s later, so a job left behind the floor
    /// waits that long there too (at most 30 s, as under a held horizon).
    fn full_due(&self, poll: Duration) -> bool {
        self.last_full.is_none_or(|at| {
            at.elapsed() >= poll.max((self.full_took * 1_000).min(Duration::from_secs(30)))
        })
    }

    /// The floors of `kind`'s ten priorities, in priority order.
    fn floors(&self, kind: &'static str) -> impl Iterator<Item = f64> + '_ {
        (0..=crate::MAX_PRIORITY).map(move |priority| {
            self.latest
                .get(&(kind, priority))
                .map_or(f64::NEG_INFINITY, |latest| {
                    latest - sql::CLAIM_FLOOR_LAG.as_secs_f64()
                })
        })
    }
}

/// Each kind's recent rate of ended claims, and what it may claim ahead of its free
/// slots accordingly (`AHEAD_FOR` of work, `MAX_AHEAD` in all).
struct Rates {
    at: Instant,
    ended: HashMap<&'static str, u64>,
    /// Claims ended per second, smoothed over the last few measurements.
    rate: HashMap<&'static str, f64>,
    ahead: HashMap<&'static str, usize>,
    /// The sum of `ahead`.
    total: usize,
}

impl Rates {
    fn new(shared: &Shared) -> Self {
        Rates {
            at: Instant::now(),
            ended: shared.ended(),
            rate: HashMap::new(),
            ahead: HashMap::new(),
            total: 0,
        }
    }

    /// Measures the rates again if `RATE_EVERY` has passed.
    fn measure(&mut self, shared: &Shared) {
        let elapsed = self.at.elapsed();
        if elapsed < RATE_EVERY {
            return;
        }
        let ended = shared.ended();
        let mut wanted = Vec::new();
        for (kind, n) in &ended {
            let done = n - self.ended.get(kind).copied().unwrap_or(0);
            let now = done as f64 / elapsed.as_secs_f64();
            let rate = self.rate.entry(kind).or_insert(now);
            *rate = (*rate + now) / 2.0;
            wanted.push((*kind, (*rate * AHEAD_FOR.as_secs_f64()) as usize));
        }
        // Over the cap, every kind's share shrinks in proportion.
        let sum: usize = wanted.iter().map(|(_, n)| n).sum();
        self.ahead = wanted
            .into_iter()
            .map(|(kind, n)| {
                let n = if sum > MAX_AHEAD {
                    n * MAX_AHEAD / sum
                } else {
                    n
                };
                (kind, n)
            })
            .collect();
        self.total = self.ahead.values().sum();
        self.at = Instant::now();
        self.ended = ended;
    }
}

/// How long until the next job of the kinds with free capacity becomes due, on the
/// database clock; `None` if none is scheduled or the database does not answer (then
/// the poll covers it).
async fn next_due(
    shared: &Shared,
    conn: &mut Option<PoolConnection<Postgres>>,
    per_kind: &[(&'static HandlerInfo, usize)],
    window: Duration,
) -> Option<Duration> {
    let kinds: Vec<&str> = per_kind
        .iter()
        .filter(|(_, free)| *free > 0)
        .map(|(info, _)| info.kind)
        .collect();
    let query = async {
        let c = match conn {
            Some(c) => c,
            None => conn.insert(shared.db.acquire().await?),
        };
        crate::pooler::alone!(
            &mut **c,
            crate::pooler::query_scalar::<_, Option<f64>>(sql::NEXT_DUE)
                .bind(&kinds)
                .bind(window.as_secs_f64()),
            fetch_one
        )
        .await
    };
    match super::answer_within(shared.answer_within, "the next due time", query).await {
        Ok(seconds) => seconds.map(|s| Duration::from_secs_f64(s.clamp(0.0, 86_400.0))),
        Err(e) => {
            *conn = None;
            tracing::debug!(error = %e, "cannot read when the next job is due; polling");
            None
        }
    }
}

/// Resolves after `wait` if `on`; never otherwise.
async fn sleep_if(on: bool, wait: Duration) {
    if on {
        tokio::time::sleep(wait).await;
    } else {
        std::future::pending::<()>().await;
    }
}

/// Resolves when a job that was `due` from now becomes claimable; never when `due` is
/// `None`. The claim that follows reaches the server after `due` has passed on its
/// clock (the wait starts after the answer arrived); one that came a moment early
/// finds the job again in the next `sql::NEXT_DUE` and waits the rest.
async fn sleep_until_due(due: Option<Duration>) {
    match due {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// What one claim asks for: the kinds with free capacity, each kind's limit and lease,
/// the floors (none for a full claim), the total, and the statement that fits.
struct Ask {
    kinds: Vec<&'static str>,
    limits: Vec<i32>,
    leases: Vec<i64>,
    from: Vec<f64>,
    want: usize,
    statement: &'static str,
}

impl Ask {
    /// The claim of every kind with free capacity; from the floors, or from the start
    /// of each kind's range (`floors` None: a full claim). None if no kind has room.
    fn new(
        total_free: usize,
        per_kind: &[(&'static HandlerInfo, usize)],
        floors: Option<&Floors>,
    ) -> Option<Ask> {
        let mut ask = Ask {
            kinds: Vec::new(),
            limits: Vec::new(),
            leases: Vec::new(),
            from: Vec::new(),
            want: 0,
            statement: "",
        };
        let mut asked = 0usize;
        for (info, free) in per_kind {
            if *free > 0 {
                // The statement takes at most `sql::CLAIM_MAX_PER_KIND` of a kind: a
                // limit above it would never be filled, and a claim that is not filled
                // says the queue is empty (the runtime would then wait for the poll).
                let free = (*free).min(sql::CLAIM_MAX_PER_KIND);
                ask.kinds.push(info.kind);
                ask.limits.push(i32::try_from(free).unwrap_or(i32::MAX));
                ask.leases.push(millis(info.config.lease_length()));
                if let Some(floors) = floors {
                    ask.from.extend(floors.floors(info.kind));
                }
                asked = asked.saturating_add(free);
            }
        }
        if ask.kinds.is_empty() {
            return None;
        }
        ask.want = asked.min(total_free);
        // The kinds' limits add up to more than the claim takes (several kinds, each
        // allowed all the free slots): the claim that shares the limit among them.
        ask.statement = match (asked > ask.want, floors.is_none()) {
            (true, true) => sql::CLAIM_SPLIT,
            (true, false) => sql::CLAIM_SPLIT_FROM,
            (false, true) => sql::CLAIM,
            (false, false) => sql::CLAIM_FROM,
        };
        Some(ask)
    }

    /// Runs the claim on `conn`.
    async fn fetch(
        &self,
        shared: &Shared,
        conn: &mut PoolConnection<Postgres>,
    ) -> Result<Vec<ClaimRow>, sqlx::Error> {
        crate::pooler::alone!(
            &mut **conn,
            crate::pooler::query_as(self.statement)
                .bind(&self.kinds)
                .bind(&self.limits)
                .bind(&self.leases)
                .bind(i32::try_from(self.want).unwrap_or(i32::MAX))
                .bind(&self.from)
                .bind(shared.runtime_id),
            fetch_all
        )
        .await
    }
}

/// One round of claims from the floors: every kind with free capacity in one
/// statement, whatever its lease mode, so that kinds take turns by `run_after`.
/// Returns whether any kind may have more claimable jobs.
async fn claim(
    shared: &Arc<Shared>,
    conn: &mut Option<PoolConnection<Postgres>>,
    total_free: usize,
    per_kind: &[(&'static HandlerInfo, usize)],
    floors: &mut Floors,
    executors: &mut JoinSet<()>,
) -> Result<bool, sqlx::Error> {
    let Some(ask) = Ask::new(total_free, per_kind, Some(floors)) else {
        return Ok(false);
    };
    let claimer = match conn {
        Some(c) => c,
        None => conn.insert(shared.db.acquire().await?),
    };
    let rows = ask.fetch(shared, claimer).await?;
    let more = rows.len() >= ask.want;
    for row in rows {
        start(shared, row, Some(&mut *floors), executors);
    }
    Ok(more)
}

/// A full claim's answer: whether it filled its ask (or its error), and how long it
/// took.
type FullAnswer = (Result<bool, sqlx::Error>, Duration);

/// A full claim, from the start of each kind's range, on a connection of its own. It
/// runs beside the claims from the floors, never in front of them: while the xmin
/// horizon is held it walks every dead entry left since the horizon (200 ms at a
/// million, `bench horizon`), and pickups waited behind it. Concurrent claims take
/// disjoint rows (`SKIP LOCKED`); together they may hold up to twice the free capacity
/// for a moment, and what has no slot waits for one as a claim taken ahead does. It
/// starts what it took itself, the moment the answer arrives, whatever the producer is
/// waiting for meanwhile: a claimed job's lease runs from the claim, and its renewals
/// from its start. (Its jobs do not move the floors; the producer's claims do.) Its
/// connection goes back to the runtime's pool after each (at most one per poll
/// interval).
async fn full_claim(
    shared: Arc<Shared>,
    ask: Ask,
    executors: Executors,
    done: Arc<tokio::sync::Notify>,
) -> FullAnswer {
    let begun = Instant::now();
    let query = async {
        let mut conn = shared.db.acquire().await?;
        ask.fetch(&shared, &mut conn).await
    };
    let rows = super::answer_within(shared.answer_within, "the full claim", query).await;
    let took = begun.elapsed();
    let filled = match rows {
        Ok(rows) => {
            let filled = rows.len() >= ask.want;
            let mut running = executors.lock().await;
            for row in rows {
                start(&shared, row, None, &mut running);
            }
            Ok(filled)
        }
        Err(e) => Err(e),
    };
    done.notify_one();
    (filled, took)
}

/// Reads a finished full claim's answer. Returns whether it filled its ask.
fn settle_full(answer: Result<FullAnswer, tokio::task::JoinError>, floors: &mut Floors) -> bool {
    match answer {
        Ok((filled, took)) => {
            floors.full_took = took;
            filled.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot claim from the start of the ranges; retrying");
                false
            })
        }
        Err(e) => {
            tracing::error!(error = %e, "the full claim's task ended without an answer");
            false
        }
    }
}

/// Starts the executor of a claimed job, and, given the floors, moves its kind's floor
/// up to the job's run-after.
fn start(
    shared: &Arc<Shared>,
    (id, kind, attempts, max_attempts, token, payload, waited, run_after, priority): ClaimRow,
    floors: Option<&mut Floors>,
    executors: &mut JoinSet<()>,
) {
    let Some(&handler) = shared.handlers.get(kind.as_str()) else {
        // Cannot happen: the claim names only kinds with a handler.
        tracing::error!(job.id = id, job.kind = %kind, "claimed a job of a kind with no handler");
        return;
    };
    if let (Some(run_after), Some(floors)) = (run_after, floors) {
        let latest = floors
            .latest
            .entry((handler.kind, priority))
            .or_insert(run_after);
        *latest = latest.max(run_after);
    }
    shared.take_slot(handler.kind);
    observe::claimed(handler.kind, waited.unwrap_or(0.0));
    // The database's clock at the claim: the job's run-after plus how long it waited.
    let db_claimed_us = match (run_after, waited) {
        (Some(run_after), Some(waited)) => Some(((run_after + waited) * 1e6) as i64),
        _ => None,
    };
    let claimed = Claimed {
        id,
        attempt: u32::try_from(attempts).unwrap_or(0),
        max_attempts: u32::try_from(max_attempts).unwrap_or(1),
        token,
        payload,
        claimed_at: Instant::now(),
        db_claimed_us,
    };
    // Boxed: the executor's future is about 1.8 KB, and a task's future is moved and
    // its stage rewritten several times between its spawn and its end (`memmove` was 9 %
    // of the runtime's samples in W2, about half of it in the spawn); the box moves as a
    // pointer.
    executors.spawn(Box::pin(executor::execute(
        shared.clone(),
        handler,
        claimed,
    )));
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
                tracing::warn!(error = %e, "cannot read the database's clock to arm cron kinds");
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
                shared.wake.notify_one();
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(job.kind = info.kind, error = %e, "cannot arm periodic job");
                return false;
            }
        }
    }
    true
}
