//! The producer: claims jobs up to free capacity and starts an executor for each.
//!
//! # The claim path
//!
//! One loop, one claim in flight. Each turn it first tends to what runs beside the
//! claims (ended executors, periodic kinds, paused kinds, the rates behind the claims
//! ahead, the floor probe), then takes one step:
//!
//! 1. **No room**: every slot, and every claim allowed ahead of a slot, is held: wait
//!    for a claim to end.
//! 2. **Limited kinds**: a kind with a limit across runtimes (a global concurrency, a
//!    rate) that has room and is not quiet, or that a notification named, is claimed at
//!    once in a transaction of its own (`super::global`), without the wait for a batch
//!    (the limit bounds what it takes); a kind whose limit holds per partition claims
//!    ahead and waits for a batch as in step 4. A kind its limit cut waits aside
//!    (`at_limit`) until a notification names it (one of its jobs ended: the runtime
//!    that ends one claims the share first, and tells the others only of what it
//!    leaves), or its rate's window has room, or a poll interval has passed; a kind
//!    whose claim passed a due job another transaction held, `WRITERS_POLL` (the
//!    rollback that frees the row notifies no one). The other steps never ask for such
//!    a kind. A kind whose one limit is its global concurrency mostly skips this step:
//!    the completion of each of its jobs claims the next one in the same statement
//!    (`sql::HAND_OFF`, in the completer), and the producer starts what it is handed at
//!    its next turn, or at once while it waits.
//! 3. **Idle**: the last claim took less than it asked for, so nothing more is waiting.
//!    Ask the database when the next scheduled job of these kinds is due
//!    ([`sql::NEXT_DUE`]: of every kind at most every 100 ms, in between of the kinds
//!    named since and the busy ones, `super::due`), then sleep until that moment, a
//!    notification (an enqueue somewhere, `listener`), the poll interval, or the probe's
//!    answer; and just after a notification, claim once more a moment later, since
//!    producers send one notification per kind every few milliseconds. While another
//!    transaction holds a write or row lock on the job table, or once one that the last
//!    claim saw has ended, sleep `WRITERS_POLL` at most: it may commit a job (or free a
//!    locked one) without a notification. A wake-up names its kinds (a notification's,
//!    or those of jobs made claimable inside the runtime: a snooze, a retry, a re-run, a
//!    rescue, a periodic job; `super::Wake`), and its claim and the one that follows ask
//!    for them; the poll and a job due, for every kind; any other wake-up, for every
//!    kind but the quiet ones with a limit (each such claim is a transaction). A job
//!    that became due after the last claim looked (the next-due query names its kinds)
//!    is claimed at once, asking for its kinds.
//! 4. **Gather**: work is waiting but some capacity is taken: give running handlers a
//!    moment (`BATCH_WINDOW`) to free more, so that the claim fetches a batch instead of
//!    a job or two.
//! 5. **Claim**: one statement for the kinds with room ([`sql::CLAIM`]). When their
//!    limits add up to more than the free capacity, the claim is shared among them: in
//!    the runtime, in equal shares, while every kind's last claim took jobs of one
//!    priority, the same for all, or after a split claim that came back short;
//!    otherwise by [`sql::CLAIM_SPLIT`], the most urgent priority first, then by turns. A quiet kind
//!    (its last claim found nothing) is asked for only when a notification names it, or
//!    the probe (below) finds one of its jobs due. The floors move
//!    ([`super::floors`]); the claim was full if it took all it asked for, or all it
//!    asked of some kind; and its rows take their slots at once (the next turn's
//!    capacity counts them) and start in claim order, each in an executor that waits
//!    for a slot (`super::claim`): while the next claim is in flight, which goes out
//!    first, or else before the next step waits for anything. The database then claims
//!    while the runtime starts what it took (a drain of short jobs waited a fifth of its
//!    time for the starts, and the runtime's turn, between one claim and the next). A
//!    claim that took less than it asked for starts its rows at once: the runtime idles
//!    next.
//!
//! Before any of these, while the heartbeat cannot renew leases (no connection, or its
//! renewals fail), the producer claims nothing, and says why every few seconds.
//!
//! A kind claims ahead of its free slots what its handlers finish in `AHEAD_FOR` (or in
//! two claims' time, when claims take longer) at their recent rate (`super::ahead`), at
//! most `MAX_AHEAD` over all kinds, so that short jobs
//! come in claims of hundreds at any concurrency. A claim held ahead is leased and
//! renewed like a running one; one that finds no slot within a second goes back.
//!
//! Each scan of a (kind, priority) range starts at its floor rather than at the start
//! of the range, and each claim says how far its floors may move (`super::floors`).
//! A probe beside the claims, on a connection of the runtime's pool ([`sql::PROBE`]),
//! asks what the claims do not: what is left behind the floors anyway (it lowers the
//! floor to it), from the start of each range every poll interval, and at once from
//! the time of a long transaction that a claim saw end; and, every `QUIET_EVERY` while
//! the claims are busy, whether a quiet kind has a job due (the next claim asks for
//! that kind).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};
use tokio::task::{JoinHandle, JoinSet};

use super::ahead::Rates;
use super::backoff::Backoff;
use super::claim::{Ask, ClaimRow, Seen, Taken, claim_order, start, take_slots};
use super::due::NextDue;
use super::floors::{Floors, Report, Snapshot};
use super::paused::Paused;
use super::periodic::Periodic;
use super::{HeldConn, Shared};
use crate::registry::HandlerInfo;
use crate::sql;

/// How long a busy runtime with work waiting lets slots free up before it claims, so
/// that claims come in batches.
const BATCH_WINDOW: Duration = Duration::from_millis(2);

/// How soon after a wake-up an idle runtime claims once more the kinds it named: twice
/// the window in which a producer sends at most one notification per kind
/// (`enqueue::NOTIFY_EVERY`). Counted for each kind from the last wake-up that named
/// it: other kinds' wake-ups meanwhile do not put it off (each used to start the wait
/// again for its own kinds only, and a stream of them every few milliseconds left a
/// job enqueued without a notification to the quiet kinds' probe, or to the poll).
const FOLLOW_UP: Duration = Duration::from_millis(10);

/// How much longer than the time since the last claim was sent the next-due query looks
/// back for jobs that became due after that claim's `now()` (`sql::NEXT_DUE`): the
/// query's own way to the server.
const NEXT_DUE_MARGIN: Duration = Duration::from_millis(2);

/// How soon an idle runtime looks again while another transaction holds a write or
/// row lock on the job table (`sql::NEXT_DUE`'s `writers`): it may commit a job without
/// a notification (producers send one per kind every few milliseconds, and a rollback
/// that frees a locked row sends none). Its pickup then waits this long at most, as a
/// notified one waits for its claim.
const WRITERS_POLL: Duration = Duration::from_millis(10);

/// How often, while the claims are busy, the probe asks whether a quiet kind (one its
/// last claim found nothing of) has a job due: a busy runtime's claims ask only for the
/// kinds with jobs (a claim that also probed the ten ranges of each idle kind of the
/// application took a third longer), and a job of a quiet kind that came without a
/// notification waits this long, and the probe's time, at most.
const QUIET_EVERY: Duration = Duration::from_millis(50);

/// How often a runtime that cannot renew leases (and so claims nothing) says so.
const RENEWALS_WARN_EVERY: Duration = Duration::from_secs(5);

/// The running executors. Owned by the runtime, not by the producer: if the producer
/// panics, the runtime still lets them finish and hands their jobs back.
pub(super) type Executors = Arc<tokio::sync::Mutex<JoinSet<()>>>;

/// The free capacity: in all, and per kind.
type Capacity = (usize, Vec<(&'static HandlerInfo, usize)>);

/// Claims until `stop` turns true.
pub(super) async fn run(shared: Arc<Shared>, executors: Executors, stop: watch::Receiver<bool>) {
    let mut producer = Producer::new(shared, executors, stop);
    while !*producer.stop.borrow() {
        if !*producer.shared.renewing.borrow() {
            producer.start_claimed().await;
            producer.wait_for_renewals().await;
            continue;
        }
        let freed_here = producer.tend().await;
        let capacity = producer.capacity();
        producer.hand_on(&freed_here, &capacity.1);
        if capacity.0 == 0 || capacity.1.iter().all(|(_, n)| *n == 0) {
            producer.start_claimed().await;
            producer.wait_for_room().await;
            continue;
        }
        let limited = producer.limited_asked(&capacity.1);
        if !limited.is_empty() {
            if !producer.gathered && batched(&limited) && producer.below_target(capacity.0) {
                producer.gather().await;
            } else {
                producer.start_claimed().await;
                producer.claim_limited(&limited, capacity.0).await;
            }
        } else if !producer.more {
            producer.start_claimed().await;
            producer.idle(&capacity.1).await;
        } else if !producer.gathered && producer.below_target(capacity.0) {
            producer.gather().await;
        } else {
            // The rows of the last claim start while this one is in flight.
            producer.claim(&capacity).await;
        }
    }
    producer.start_claimed().await;
    if let Some(probe) = producer.probe.take() {
        probe.abort();
    }
    // Jobs handed on from here on go back to the table; these hand themselves back.
    producer.start_handed(true).await;
}

/// Starts `rows` (their slots taken, in claim order), each in an executor, after
/// reaping the executors that have ended.
async fn start_rows(shared: &Arc<Shared>, executors: &Executors, rows: Vec<ClaimRow>) {
    if rows.is_empty() {
        return;
    }
    let mut running = executors.lock().await;
    while running.try_join_next().is_some() {}
    for row in rows {
        start(shared, row, &mut running);
    }
}

/// The producer's state between turns.
struct Producer {
    shared: Arc<Shared>,
    executors: Executors,
    stop: watch::Receiver<bool>,
    /// The connection claims go through, held across turns ([`HeldConn`]).
    conn: Option<HeldConn>,
    backoff: Backoff,
    poll: tokio::time::Interval,
    periodic: Periodic,
    paused: Paused,
    rates: Rates,
    floors: Floors,
    /// The rows claimed and not started yet (their slots taken, in claim order): they
    /// start while the next claim is in flight, or before any other step.
    claimed: Vec<ClaimRow>,
    /// The floor probe in flight, if any, and its signal when it ends.
    probe: Option<JoinHandle<ProbeAnswer>>,
    probe_done: Arc<Notify>,
    /// Whether the last claim took all it asked for, so more may be waiting.
    more: bool,
    /// Whether this turn already waited for slots to free (it waits once, then claims).
    gathered: bool,
    /// The kinds the wake-ups of the idle runtime named, each with the moment one more
    /// claim of it follows (`FOLLOW_UP` after the last wake-up that named it, whatever
    /// other kinds' wake-ups come meanwhile).
    follow_up: HashMap<&'static str, Instant>,
    /// Which kinds the next-due query asks for, and what its answers said.
    next_due: NextDue,
    /// When the last claim was sent: jobs that became due after it are looked for.
    claim_sent: Instant,
    /// Which kind goes first in a turn of the next claim: each claim the next one, so
    /// that a claim smaller than a turn of every kind favours none.
    first_kind: usize,
    /// The quiet kinds, and the priority of each busy kind's last claim.
    seen: Seen,
    /// When the probe last asked whether a quiet kind has a job due.
    quiet_asked: Instant,
    /// The kinds with a limit that their last claim found at it, or holding a due job
    /// another transaction held, and until when: not claimed again until a notification
    /// names the kind (one of its jobs ended somewhere, or one was enqueued) or that
    /// moment (when its rate's window has room again; a poll interval, for a
    /// concurrency; `WRITERS_POLL` for a held job).
    at_limit: HashMap<&'static str, Instant>,
}

impl Producer {
    fn new(shared: Arc<Shared>, executors: Executors, stop: watch::Receiver<bool>) -> Self {
        let mut poll = tokio::time::interval(shared.poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Producer {
            periodic: Periodic::new(&shared),
            rates: Rates::new(&shared),
            shared,
            executors,
            stop,
            conn: None,
            backoff: claim_backoff(),
            poll,
            paused: Paused::default(),
            floors: Floors::default(),
            claimed: Vec::new(),
            probe: None,
            probe_done: Arc::new(Notify::new()),
            more: true,
            gathered: false,
            follow_up: HashMap::new(),
            next_due: NextDue::default(),
            claim_sent: Instant::now(),
            first_kind: 0,
            seen: Seen::default(),
            quiet_asked: Instant::now(),
            at_limit: HashMap::new(),
        }
    }

    /// What runs beside the claims: ended executors, periodic kinds, paused kinds (read
    /// once per poll interval, and at once when a pause or resume notifies), the rates,
    /// and the floor probe.
    async fn tend(&mut self) -> HashSet<&'static str> {
        if let Ok(mut running) = self.executors.try_lock() {
            while running.try_join_next().is_some() {}
        }
        self.start_handed(false).await;
        self.periodic.tend(&self.shared).await;
        if self
            .shared
            .paused_changed
            .swap(false, std::sync::atomic::Ordering::AcqRel)
            || self
                .paused
                .read_at
                .is_none_or(|at| at.elapsed() >= self.shared.poll_interval)
        {
            self.paused.read(&self.shared, &mut self.conn).await;
        }
        self.rates.measure(&self.shared);
        let freed_here = self.tend_limits();
        if self.probe.as_ref().is_some_and(JoinHandle::is_finished) {
            let answer = self.probe.take().expect("checked").await;
            self.more |= self.settle_probe(answer);
        }
        if self.probe.is_none() {
            self.start_probe();
        }
        freed_here
    }

    /// Lets the kinds found at their limit be claimed again once a notification names
    /// them or their time has come (`at_limit`), and names to the next claim the kinds
    /// with a limit of which a job ended here. Returns those.
    fn tend_limits(&mut self) -> HashSet<&'static str> {
        let here = self.shared.freed.take_here();
        if here.is_empty() && self.at_limit.is_empty() {
            return here;
        }
        let mut notified = self.shared.wake.named();
        notified.extend(here.iter().copied());
        let now = Instant::now();
        self.at_limit.retain(|kind, until| {
            if now >= *until {
                notified.insert(kind);
                return false;
            }
            !notified.contains(kind)
        });
        here
    }

    /// Tells the other runtimes of the shares freed here (`freed_here`) of kinds this
    /// runtime has no room for now (`per_kind`); it claims the others itself.
    fn hand_on(
        &self,
        freed_here: &HashSet<&'static str>,
        per_kind: &[(&'static HandlerInfo, usize)],
    ) {
        for (info, free) in per_kind {
            if *free == 0 && freed_here.contains(info.kind) {
                self.shared.freed.tell(info.kind);
            }
        }
    }

    /// The free capacity, in all and per kind: none for a paused kind or one at its
    /// global limit; a kind whose limit holds for the kind as a whole claims nothing
    /// ahead of its free slots (a job held ahead counts against the limit without
    /// running), nor does a kind with a rate (its jobs must start within a margin of
    /// their claim: `global::start_margin`). One whose limit holds per partition claims
    /// ahead as any kind does: a job held ahead holds up its own partition only.
    fn capacity(&self) -> Capacity {
        let (total, mut per_kind) = self.shared.free(&self.rates.ahead, self.rates.total);
        let limits = self.shared.limits.read().expect("lock poisoned");
        for (info, free) in &mut per_kind {
            if self.paused.holds(info.kind) || self.at_limit.contains_key(info.kind) {
                *free = 0;
            } else if limits
                .get(info.kind)
                .is_some_and(|l| l.partition.is_none() || l.rate.is_some())
            {
                let ahead = self.rates.ahead.get(info.kind).copied().unwrap_or(0);
                *free = free.saturating_sub(ahead);
            }
        }
        (total, per_kind)
    }

    /// Whether less is free than a claim should wait for: half of the capacity when
    /// claims are held ahead (the claim tops them up before the handlers run dry), the
    /// whole concurrency otherwise.
    fn below_target(&self, total_free: usize) -> bool {
        let target = if self.rates.total > 0 {
            (self.shared.concurrency + self.rates.total) / 2
        } else {
            self.shared.concurrency
        };
        total_free < target
    }

    /// The heartbeat cannot renew leases (no connection, or its renewals fail): claims
    /// nothing until it can, and says why every few seconds, in the server's words, with
    /// what the runtime needs.
    async fn wait_for_renewals(&mut self) {
        // The renewals may need it (`heartbeat::connect`).
        self.conn = None;
        let waited = Instant::now();
        let mut renewing = self.shared.renewing.clone();
        loop {
            let ready = tokio::time::timeout(RENEWALS_WARN_EVERY, async {
                tokio::select! {
                    gone = async { renewing.wait_for(|ok| *ok).await.is_err() } => {
                        if gone {
                            // The heartbeat has stopped (its thread ended): it never
                            // renews again; say so every few seconds, never spin.
                            std::future::pending::<()>().await;
                        }
                    }
                    _ = self.stop.changed() => {}
                }
            })
            .await;
            if ready.is_ok() || *self.stop.borrow() {
                return;
            }
            let why = if renewing.has_changed().is_err() {
                Some("the heartbeat's thread has stopped".to_owned())
            } else {
                self.shared.why_not.lock().expect("lock poisoned").clone()
            };
            let server = super::connections::budget(&self.shared).await;
            tracing::warn!(
                error = why.as_deref().unwrap_or("no answer yet"),
                waited = ?waited.elapsed(),
                runtime_connections = super::RUNTIME_CONNECTIONS,
                server = %server,
                "not claiming jobs: the heartbeat cannot renew leases; the runtime needs {} connections of its own besides the application's pool",
                super::RUNTIME_CONNECTIONS
            );
        }
    }

    /// No room: waits for a claim to end (and, while a kind is paused or at its limit,
    /// at most a poll interval or until the limit's time, so that a resume or a free
    /// share is seen even if no slot frees).
    async fn wait_for_room(&mut self) {
        let paused = self.paused.holds_any() || !self.at_limit.is_empty();
        let wait = self.limit_due().unwrap_or(self.shared.poll_interval);
        tokio::select! {
            _ = self.shared.slot_freed.notified() => {}
            () = sleep_if(paused, wait.min(self.shared.poll_interval)) => {}
            _ = self.shared.wake.woken(), if paused => {}
            _ = self.shared.freed.handed_signal.notified() => {}
            _ = self.stop.changed() => {}
        }
    }

    /// How long until the first kind at its limit may be claimed again, if any is.
    fn limit_due(&self) -> Option<Duration> {
        let now = Instant::now();
        self.at_limit
            .values()
            .min()
            .map(|until| until.saturating_duration_since(now))
    }

    /// Idle: sleeps until a notification, the next poll, the moment the next scheduled
    /// job (a retry, a snooze, a delayed enqueue) becomes due, or the probe's answer;
    /// right after a wake-up, until a moment later at most.
    async fn idle(&mut self, per_kind: &[(&'static HandlerInfo, usize)]) {
        let window = self.claim_sent.elapsed() + NEXT_DUE_MARGIN;
        let seen = self.floors.writers().0;
        let with_room = per_kind.iter().filter(|(_, free)| *free > 0);
        let (kinds, every) = self
            .next_due
            .kinds(with_room.map(|(info, _)| info.kind), |k| {
                self.seen.is_quiet(k)
            });
        let (real_due, writers, ended, due_now) =
            match next_due(&self.shared, &mut self.conn, &kinds, &seen, window).await {
                Some((answer, writers, ended, due_now)) => {
                    let due = self.next_due.answered(&kinds, every, answer);
                    (due, writers, ended, due_now)
                }
                None => {
                    // Nothing learned (the poll covers it): the next query asks for
                    // every kind, and no moment is taken from this one.
                    self.next_due.forget();
                    (None, false, Vec::new(), Vec::new())
                }
            };
        // A writer the last claim saw has ended since (it may have freed a row that claim
        // passed while it held it, or committed rows behind the floors), perhaps leaving
        // no other writer to see: claim again as while one writes.
        let writers = self.floors.ended(&ended) || writers;
        let due = if writers {
            Some(real_due.map_or(WRITERS_POLL, |d| d.min(WRITERS_POLL)))
        } else {
            real_due
        };
        self.more = true;
        if !due_now.is_empty() {
            // Jobs became due after the last claim looked (the next-due time is then
            // zero): claim them now, asking for their kinds (no notification may name
            // them).
            for kind in &due_now {
                self.seen.quiet.remove(kind.as_str());
            }
            return;
        }
        let probing = self.probe.is_some();
        // A notification names its kind, for its claim and the follow-up; a poll, or a
        // job due by its time, asks for every kind; any other wake-up (a writer that may
        // have committed, the probe) asks for every kind without a limit, whose claims
        // share one statement, but not for a quiet kind with a limit, whose claim is a
        // transaction of its own (an application of every kind ran one at each such
        // wake-up, every 10 ms while another transaction wrote to the table).
        let limit_due = self.limit_due();
        let writers_only = due.is_some() && due != real_due;
        // Jobs handed on by completions start as they come, without a turn (which would
        // ask for the next-due time again).
        let slept = Instant::now();
        let left = |d: Duration| d.saturating_sub(slept.elapsed());
        let woke = loop {
            tokio::select! {
                _ = self.shared.wake.woken() => break Woke::Named,
                _ = self.poll.tick() => break Woke::Any,
                () = sleep_until_due(due.map(left)) => {
                    break if writers_only { Woke::Unlimited } else { Woke::Any }
                }
                () = sleep_until_due(limit_due.map(left)) => break Woke::Named,
                () = sleep_until_due(self.follow_up.values().min().map(|at| {
                    at.saturating_duration_since(Instant::now())
                })) => break Woke::FollowUp,
                _ = self.probe_done.notified(), if probing => break Woke::Unlimited,
                _ = self.stop.changed() => break Woke::Any,
                _ = self.shared.freed.handed_signal.notified() => {
                    self.start_handed(false).await;
                }
            }
        };
        let now = Instant::now();
        match woke {
            // What the follow-up asks for again.
            Woke::Named => {
                let at = now + FOLLOW_UP;
                let notified = self.shared.wake.named();
                self.follow_up
                    .extend(notified.iter().map(|&kind| (kind, at)));
            }
            Woke::FollowUp => {
                let mut notified = self.shared.wake.named();
                self.follow_up.retain(|&kind, at| {
                    let due = *at <= now;
                    if due {
                        notified.insert(kind);
                    }
                    !due
                });
            }
            Woke::Any => {
                self.seen.quiet.clear();
                self.next_due.forget();
            }
            Woke::Unlimited => {
                self.next_due.forget();
                let limits = self.shared.limits.read().expect("lock poisoned");
                self.seen.quiet.retain(|kind| limits.contains_key(kind));
            }
        }
    }

    /// Work is waiting but some capacity is taken: gives running handlers a moment to
    /// free the rest, so that one claim fetches a full batch instead of a job or two
    /// (W2 in BENCHMARKS.md: at concurrency 100, claims of about 50 drained 33k jobs/s,
    /// full claims 44k). Short handlers free their slots within the window; long ones
    /// cost at most the window per claim.
    async fn gather(&mut self) {
        self.gathered = true;
        let until = tokio::time::Instant::now() + BATCH_WINDOW;
        self.start_claimed().await;
        let shared = &self.shared;
        let total = self.rates.total;
        let _ = tokio::time::timeout_at(until, async {
            while self.below_target(shared.total_free(total)) {
                shared.slot_freed.notified().await;
            }
        })
        .await;
    }

    /// One claim of every kind with room (but the kinds with a global limit, claimed
    /// apart: [`Self::claim_limited`]), and the start of what it took.
    async fn claim(&mut self, (total_free, per_kind): &Capacity) {
        self.gathered = false;
        self.first_kind = self.first_kind.wrapping_add(1);
        let asked = self.asked(per_kind, false);
        let Some(ask) = Ask::new(
            *total_free,
            &asked,
            &self.floors,
            self.first_kind,
            &self.seen,
        ) else {
            self.more = false;
            return;
        };
        self.claim_sent = Instant::now();
        let shared = self.shared.clone();
        let conn = &mut self.conn;
        let fetch = async {
            let held = HeldConn::get(conn, &shared.db).await?;
            ask.fetch(&shared, held).await
        };
        // Polled first, the claim is on its way before the rows start.
        let (answer, ()) = tokio::join!(
            super::answer_within(shared.answer_within, "the claim", fetch),
            start_rows(&shared, &self.executors, std::mem::take(&mut self.claimed)),
        );
        match answer {
            Ok(Taken {
                rows,
                snapshot,
                found,
            }) => {
                self.backoff = claim_backoff();
                if !rows.is_empty() {
                    self.rates.claimed(self.claim_sent.elapsed());
                }
                self.more = ask.filled(&rows);
                self.seen.note(&ask, &rows, self.more, found.as_deref());
                self.hold(rows, snapshot, &ask.kinds);
                if !self.more {
                    // Idle next: start the rows, and let their executors (each waiting
                    // in this worker's next-task slot) begin their handlers before the
                    // next-due query is written, which would otherwise go first.
                    self.start_claimed().await;
                    tokio::task::yield_now().await;
                }
            }
            Err(e) => self.claim_failed(&e).await,
        }
    }

    /// The kinds with a limit that a claim of them would ask for now ([`Self::asked`]),
    /// each with its limit.
    fn limited_asked(
        &mut self,
        per_kind: &[(&'static HandlerInfo, usize)],
    ) -> Vec<(&'static HandlerInfo, usize, super::global::Limit)> {
        let asked = self.asked(per_kind, true);
        let limits = self.shared.limits.read().expect("lock poisoned");
        asked
            .into_iter()
            .filter_map(|(info, free)| Some((info, free, *limits.get(info.kind)?)))
            .collect()
    }

    /// The claim of the kinds with a global limit (`kinds`: each with its free slots and
    /// its limit), at most `total_free` in all, and the start of what it took. It goes
    /// before the other kinds' claim and without their wait for a batch: the limit, not
    /// the batch, bounds what it takes. Notes each kind: at its limit (the limit held
    /// it to less than it asked for), quiet (it had fewer jobs due), or busy (it took
    /// all it asked for: the next turn asks again, if it has room).
    async fn claim_limited(
        &mut self,
        kinds: &[(&'static HandlerInfo, usize, super::global::Limit)],
        total_free: usize,
    ) {
        self.gathered = false;
        let asks = limited_asks(kinds, total_free);
        if asks.is_empty() {
            return;
        }
        self.claim_sent = Instant::now();
        let shared = self.shared.clone();
        let conn = &mut self.conn;
        let fetch = async {
            let held = HeldConn::get(conn, &shared.db).await?;
            super::global::claim(&shared, &mut held.conn, &asks).await
        };
        match super::answer_within(self.shared.answer_within, "the claim", fetch).await {
            Ok(taken) => {
                self.backoff = claim_backoff();
                for kind in &taken.spare {
                    if let Some((&kind, _)) = self.shared.handlers.get_key_value(kind.as_str()) {
                        self.shared.freed.tell(kind);
                    }
                }
                for (info, n, _) in &asks {
                    let took = taken.rows.iter().filter(|r| r.kind == info.kind).count();
                    if let Some((_, wait)) = taken.cut.iter().find(|(k, _)| k == info.kind) {
                        // The rate's window frees at a known time; a share, when a job
                        // ends (a notification), with the poll as the backstop.
                        let until = wait.unwrap_or(self.shared.poll_interval);
                        self.at_limit.insert(info.kind, Instant::now() + until);
                        self.seen.quiet.remove(info.kind);
                    } else if taken.held.iter().any(|k| k == info.kind) {
                        // A job of it is due, its row held by another transaction,
                        // whose end notifies no one: ask again shortly, as while a
                        // writer works.
                        self.at_limit
                            .insert(info.kind, Instant::now() + WRITERS_POLL);
                        self.seen.quiet.remove(info.kind);
                    } else if taken.more.iter().any(|k| k == info.kind) {
                        // Its walk ended among partitions it filled: the next turn
                        // claims it again, passing them by.
                        self.seen.quiet.remove(info.kind);
                    } else if took < *n {
                        self.seen.quiet.insert(info.kind);
                    } else {
                        self.seen.quiet.remove(info.kind);
                    }
                }
                let order: Vec<&'static str> = asks.iter().map(|(info, _, _)| info.kind).collect();
                self.hold(taken.rows, None, &order);
            }
            Err(e) if super::global::lock_not_granted(&e) => {
                // Another runtime's claim holds a kind's lock (and may be stalled):
                // claim the other kinds meanwhile; these wait as at their limit.
                tracing::debug!(error = %crate::error::server_message(&e), "a kind's lock is held elsewhere; claiming it later");
                for (info, _, _) in &asks {
                    self.at_limit
                        .insert(info.kind, Instant::now() + self.shared.poll_interval);
                }
            }
            Err(e) => self.claim_failed(&e).await,
        }
    }

    /// The kinds a claim asks for: every kind with room but the quiet ones, unless a
    /// notification or the probe named one since; of the kinds with a limit across
    /// runtimes (claimed apart) when `limited`, of the others otherwise. An idle runtime
    /// asks for every kind: its claims are few. A notification naming a kind without
    /// room now (paused, at its limit, or its slots taken) is kept for a claim that has
    /// room for it.
    fn asked(
        &mut self,
        per_kind: &[(&'static HandlerInfo, usize)],
        limited: bool,
    ) -> Vec<(&'static HandlerInfo, usize)> {
        let limits = self.shared.limits.read().expect("lock poisoned");
        if limited && limits.is_empty() {
            return Vec::new();
        }
        let mut notified = self.shared.wake.named();
        let (seen, next_due) = (&self.seen, &mut self.next_due);
        per_kind
            .iter()
            .filter(|(info, free)| {
                *free > 0
                    && limits.contains_key(info.kind) == limited
                    && (next_due.named_if(notified.remove(info.kind), info.kind)
                        || !seen.is_quiet(info.kind))
            })
            .copied()
            .collect()
    }

    /// Moves the floors by a claim's report (`snapshot`: none for a claim of kinds with
    /// a limit, which keep no floors) and takes a slot for each claimed row, which
    /// then waits in `claimed`, in claim order (`kinds` in the order they took their
    /// turns), to start.
    fn hold(&mut self, rows: Vec<ClaimRow>, snapshot: Option<Snapshot>, kinds: &[&'static str]) {
        if let Some(snapshot) = snapshot {
            let reports: Vec<Report> = rows
                .iter()
                .filter_map(|r| {
                    let (&kind, _) = self.shared.handlers.get_key_value(r.kind.as_str())?;
                    Some(Report {
                        kind,
                        priority: r.priority,
                        run_after: r.run_after?,
                        held_back: r.held_back,
                    })
                })
                .collect();
            self.floors.after_claim(&snapshot, &reports);
        }
        let rows = claim_order(rows, kinds);
        take_slots(&self.shared, &rows);
        self.claimed.extend(rows);
    }

    /// Starts the jobs that completions claimed for the shares they freed
    /// ([`super::global::Freed::hand`]), after the rows claimed before them; with
    /// `last`, the producer is stopping.
    async fn start_handed(&mut self, last: bool) {
        let rows = self.shared.freed.take_handed(last);
        if !rows.is_empty() {
            self.hold(rows, None, &[]);
            self.start_claimed().await;
        }
    }

    /// Starts the rows claimed and not started yet.
    async fn start_claimed(&mut self) {
        let rows = std::mem::take(&mut self.claimed);
        start_rows(&self.shared, &self.executors, rows).await;
    }

    /// The claim failed: a fresh connection next time, after a backoff that the
    /// listener's reconnection (the database is back) ends early.
    async fn claim_failed(&mut self, e: &sqlx::Error) {
        self.conn = None;
        let wait = self.backoff.after(e);
        let error = super::connections::why(&self.shared, e).await;
        tracing::warn!(%error, retry_in = ?wait, "cannot claim jobs; retrying");
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = self.shared.reconnected.notified() => {}
            _ = self.stop.changed() => {}
        }
    }

    /// Starts the probe beside the claims, on a connection of the runtime's pool, with
    /// the questions due ([`sql::PROBE`]): what is behind the floors, from the start
    /// of each range (at least every poll interval, spaced by its duration) or from
    /// the time of a writer a claim saw end (at once); and, while the claims are busy,
    /// whether a quiet kind has a job due (every `QUIET_EVERY`).
    fn start_probe(&mut self) {
        let mut kinds = Vec::new();
        let (mut from, mut to) = (Vec::new(), Vec::new());
        let any_floor = self
            .shared
            .handlers
            .keys()
            .any(|kind| self.floors.set_of(kind).any(|f| f.is_some()));
        let behind = any_floor && self.floors.probe_due(self.shared.poll_interval);
        let owed = self.floors.take_owed().filter(|_| any_floor);
        if behind || owed.is_some() {
            if behind {
                self.floors.probe_started();
            }
            let start = if behind {
                f64::NEG_INFINITY
            } else {
                owed.unwrap_or(f64::NEG_INFINITY)
            };
            for kind in self.shared.handlers.keys() {
                // A range whose floor is not past the start (or that has no floor yet)
                // has nothing behind it: its upper bound NULL reads nothing, and a
                // kind with no such range is not listed.
                let floors: Vec<Option<f64>> = self
                    .floors
                    .set_of(kind)
                    .map(|f| f.filter(|f| *f > start))
                    .collect();
                if floors.iter().any(Option::is_some) {
                    kinds.push(*kind);
                    from.extend([Some(start); 10]);
                    to.extend(floors);
                }
            }
        }
        if self.more && self.quiet_asked.elapsed() >= QUIET_EVERY {
            self.quiet_asked = Instant::now();
            for kind in &self.seen.quiet {
                kinds.push(*kind);
                from.extend(self.floors.of(kind).map(Some));
                to.extend([Some(f64::INFINITY); 10]);
            }
        }
        if kinds.is_empty() {
            return;
        }
        let shared = self.shared.clone();
        let done = self.probe_done.clone();
        self.probe = Some(tokio::spawn(async move {
            let begun = Instant::now();
            let query = async {
                let mut conn = shared.db.acquire().await?;
                super::plan_by_index(&mut conn).await?;
                crate::pooler::alone!(
                    &mut *conn,
                    crate::pooler::query_as::<_, (String, i16, f64)>(sql::PROBE)
                        .bind(&kinds)
                        .bind(&from)
                        .bind(&to),
                    fetch_all
                )
                .await
            };
            let found = super::answer_within(shared.answer_within, "the probe", query).await;
            done.notify_one();
            (found, begun.elapsed(), behind, owed)
        }));
    }

    /// Reads a finished probe's answer: lowers the floors to what it found behind them,
    /// and names each quiet kind it found a job of to the next claim. Returns whether
    /// it found anything.
    fn settle_probe(&mut self, answer: Result<ProbeAnswer, tokio::task::JoinError>) -> bool {
        let (found, took, behind, owed) = match answer {
            Ok(answer) => answer,
            Err(e) => {
                tracing::error!(error = %e, "the probe's task ended without an answer");
                return false;
            }
        };
        if behind {
            self.floors.probe_ended(took);
        }
        if found.is_err()
            && let Some(since) = owed
        {
            // Owed still: the next probe looks from there.
            self.floors.owe(since);
        }
        match found {
            Ok(found) => {
                let mut notified = self.shared.wake.named();
                for (kind, priority, run_after) in &found {
                    if let Some((&kind, _)) = self.shared.handlers.get_key_value(kind.as_str()) {
                        self.floors.lower(kind, *priority, *run_after);
                        if self.seen.is_quiet(kind) {
                            notified.insert(kind);
                        }
                    }
                }
                !found.is_empty()
            }
            Err(sqlx::Error::PoolTimedOut) => {
                // The claims say why the runtime's pool has no connection.
                tracing::debug!("no connection for the probe beside the claims");
                false
            }
            Err(e) => {
                tracing::warn!(error = %crate::error::server_message(&e), "cannot probe beside the claims; retrying");
                false
            }
        }
    }
}

/// Whether a claim of the kinds with a limit `kinds` waits for a batch, as the other
/// kinds' claims do: when each one's limit holds per partition (its claims are bounded
/// by the free slots and what is held ahead, not by the limit).
fn batched(kinds: &[(&'static HandlerInfo, usize, super::global::Limit)]) -> bool {
    kinds.iter().all(|(_, _, limit)| limit.partition.is_some())
}

/// What ended an idle wait, and so which quiet kinds the next claim asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Woke {
    /// A notification, a job made claimable inside the runtime, or a kind's limit that
    /// may have room again: the kinds named (`super::Wake`).
    Named,
    /// The poll, a job due by its time: every kind.
    Any,
    /// The claim just after a wake-up that named kinds: those kinds. A producer sends
    /// one notification per kind every `enqueue::NOTIFY_EVERY`, so what it enqueued of
    /// a kind without one is of a kind named just before; a job made claimable inside
    /// the runtime names its own kind (`super::Wake`). (This claim asked for every kind
    /// without a limit: a split claim over all of them, 0.7 ms of the database's time
    /// per notification in W3, with the bench's 55 kinds.)
    FollowUp,
    /// Anything else: every kind without a limit.
    Unlimited,
}

/// The probe's answer: what it found (kind, priority, run-after), how long it took,
/// whether it looked behind the floors from the start of each range, and the look
/// behind them it owed (from when), if any.
type ProbeAnswer = (
    Result<Vec<(String, i16, f64)>, sqlx::Error>,
    Duration,
    bool,
    Option<f64>,
);

/// What a claim of the kinds with a limit asks of each (`kinds`: each with its free
/// slots), at most `total_free` in all, in their order: no more than a claim statement
/// takes of one kind (`sql::CLAIM_MAX_PER_KIND`). Asked for more, a kind that took
/// that many would look short (quiet, or `held` by the statement) while more are due.
fn limited_asks<T: Copy, L: Copy>(
    kinds: &[(T, usize, L)],
    total_free: usize,
) -> Vec<(T, usize, L)> {
    let mut left = total_free;
    let mut asks = Vec::new();
    for &(kind, free, limit) in kinds {
        let n = free.min(left).min(sql::CLAIM_MAX_PER_KIND);
        if n > 0 {
            asks.push((kind, n, limit));
            left -= n;
        }
    }
    asks
}

/// The backoff between failed claims.
fn claim_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(100), Duration::from_secs(30))
}

/// How long until the next job of `kinds` becomes due, on the database clock (`None`
/// if none is scheduled), whether another transaction holds a write or row lock on the
/// job table, which of the writers `seen` (xids) have ended, and the kinds of the jobs
/// that became due since the last claim looked (`window`); `None` if the database does
/// not answer.
async fn next_due(
    shared: &Shared,
    conn: &mut Option<HeldConn>,
    kinds: &[&'static str],
    seen: &[i64],
    window: Duration,
) -> Option<(Option<Duration>, bool, Vec<i64>, Vec<String>)> {
    let query = async {
        use sqlx::Row;
        let held = HeldConn::get(conn, &shared.db).await?;
        // Planned by index, as the claims are (`HeldConn`): a plan made on a table
        // vacuumed while empty read the whole table for each kind and priority.
        let rows = held
            .fetch(
                crate::pooler::query(sql::NEXT_DUE)
                    .bind(kinds)
                    .bind(window.as_secs_f64())
                    .bind(seen),
            )
            .await?;
        let row = rows.first().ok_or(sqlx::Error::RowNotFound)?;
        Ok::<_, sqlx::Error>((
            row.try_get::<Option<f64>, _>(0)?,
            row.try_get::<bool, _>(1)?,
            row.try_get::<Vec<i64>, _>(2)?,
            row.try_get::<Vec<String>, _>(3)?,
        ))
    };
    match super::answer_within(shared.answer_within, "the next due time", query).await {
        Ok((seconds, writers, ended, due_now)) => Some((
            seconds.map(|s| Duration::from_secs_f64(s.clamp(0.0, 86_400.0))),
            writers,
            ended,
            due_now,
        )),
        Err(e) => {
            *conn = None;
            tracing::debug!(error = %crate::error::server_message(&e), "cannot read when the next job is due; polling");
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

#[cfg(test)]
mod tests {
    use super::limited_asks;

    #[test]
    fn a_limited_claim_asks_no_kind_for_more_than_a_statement_takes() {
        let kinds = [("a", 1_500, ()), ("b", 0, ()), ("c", 700, ())];
        assert_eq!(
            limited_asks(&kinds, 2_000),
            [("a", 1_000, ()), ("c", 700, ())]
        );
        assert_eq!(limited_asks(&kinds, 800), [("a", 800, ())]);
        assert_eq!(limited_asks(&kinds, 0), []);
    }
}
