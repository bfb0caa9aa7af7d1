//! Where each claim's scans start: one floor per (kind, priority), moved by what each
//! claim reports, and the probe that finds what was left behind them anyway.
//!
//! A claim's scan of a (kind, priority) range starts at its floor instead of the start
//! of the range, so that the dead entries of the jobs claimed before are not walked
//! again (`sql::CLAIM_FLOOR_LAG` says why that matters under a held horizon). A floor
//! may only pass run-afters no pending row can still have. After each claim it moves
//! to the latest run-after taken, less the lag, and each claim reports what that would
//! miss:
//!
//! - `held_back`: the scan passed rows that another transaction held locked: the floor
//!   stays at the first of them;
//! - `writers`: the transactions in progress at the claim's snapshot that hold a write
//!   or row lock on the table (or have ended since): each may commit a pending row the
//!   claim could not see, written no earlier than the time its xid was assigned. The
//!   claims' snapshots (`xmax`, and the claim's `now()`) date each xid: it was assigned
//!   after the latest earlier claim whose `xmax` it reaches. The claims after pass them
//!   back; the first one whose snapshot sees a writer completed reports that writer's
//!   time (`since`), and the probe beside the claims looks behind the floors from there
//!   (the claims do not wait for that walk: a writer of a minute under load leaves a
//!   minute of claimed jobs' entries to walk), lowering a floor to what it finds. A
//!   writer that runs for minutes holds no floor back meanwhile: its rows cannot be
//!   seen until it ends. One that ends while the runtime is idle (just after a claim
//!   passed a row it held, say) is seen ended by the next-due query, and the runtime
//!   claims again shortly, as if a writer were at work (`Floors::ended`). An
//!   application's transaction that commits late re-stamps the rows it made pending
//!   (migration 13): they are found by the claims at once, and the look behind finds
//!   nothing of them;
//! - `waiting`: a statement on the table waits for a lock (an enqueue waiting for its
//!   key's lock): it has no xid yet, and its run-after dates from before the wait, so
//!   the floors stay below the wait's start while it lasts.
//!
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::sql;

/// How many earlier claims' snapshots are kept to date a writer's xid, one per
/// `SNAPSHOT_EVERY` at most (so at least the last 40 s of them). A writer older than
/// all of them is dated to the start of time: claims then read from the start of their
/// ranges until it ends.
const SNAPSHOTS_KEPT: usize = 4_096;

/// The least time between two snapshots kept.
const SNAPSHOT_EVERY: Duration = Duration::from_millis(10);

/// One claimed row's report on the floors, as the claim returned it.
pub(super) struct Report {
    pub kind: &'static str,
    pub priority: i16,
    /// The row's run-after, seconds since the epoch (database clock).
    pub run_after: f64,
    /// The first row the scan of this (kind, priority) passed while it was locked.
    pub held_back: Option<f64>,
}

/// What every row of one claim reports alike: the claim's `now()` (seconds since the
/// epoch), its snapshot's `xmax`, the writers in progress at that snapshot, when the
/// longest wait for a lock among the statements on `jobs` began, and the `since` the
/// claim applied to its scans.
pub(super) struct Snapshot {
    pub at: f64,
    pub xmax: i64,
    pub writers: Vec<i64>,
    pub waiting: Option<f64>,
    pub since: Option<f64>,
}

/// The floors of a runtime's kinds, and the state of the probe behind them.
#[derive(Default)]
pub(super) struct Floors {
    /// Where the next claim of each (kind, priority) starts, seconds since the epoch.
    at: HashMap<(&'static str, i16), f64>,
    /// Earlier claims' `(xmax, now)`, oldest first.
    snapshots: VecDeque<(i64, f64)>,
    /// The writers the last claim reported, each with the time its rows may date from,
    /// less the lag, and whether an idle runtime has seen it ended since that claim
    /// ([`Self::ended`]).
    writers: HashMap<i64, (f64, bool)>,
    /// From when the next probe looks behind the floors: the earliest time a writer
    /// that ended since the last probe may have written from.
    owed: Option<f64>,
    last_probe: Option<Instant>,
    probe_took: Duration,
}

impl Floors {
    /// The floors of `kind`'s ten priorities, in priority order (the start of the range,
    /// negative infinity, where none is set).
    pub(super) fn of(&self, kind: &'static str) -> impl Iterator<Item = f64> + '_ {
        (0..=crate::MAX_PRIORITY).map(move |priority| {
            self.at
                .get(&(kind, priority))
                .copied()
                .unwrap_or(f64::NEG_INFINITY)
        })
    }

    /// The floors of `kind`'s ten priorities for the probe: NULL (nothing behind) where
    /// none is set.
    pub(super) fn set_of(&self, kind: &'static str) -> impl Iterator<Item = Option<f64>> + '_ {
        (0..=crate::MAX_PRIORITY).map(move |priority| self.at.get(&(kind, priority)).copied())
    }

    /// The writers to pass to the next claim (xids, and their times).
    pub(super) fn writers(&self) -> (Vec<i64>, Vec<f64>) {
        self.writers.iter().map(|(x, (t, _))| (*x, *t)).unzip()
    }

    /// Moves the floors after a claim that took `rows`.
    pub(super) fn after_claim(&mut self, snapshot: &Snapshot, rows: &[Report]) {
        let lag = sql::CLAIM_FLOOR_LAG.as_secs_f64();
        // A writer has ended: look behind the floors from its time. The claim did where
        // that is near (a floor at most `sql::LOOK_BACK_IN_CLAIMS` past it: so do the floors,
        // before the rows it took move them up); the probe beside the claims does the
        // rest, which the claims do not wait for.
        if let Some(since) = snapshot.since {
            let mut far = false;
            for floor in self.at.values_mut() {
                if since >= *floor - sql::LOOK_BACK_IN_CLAIMS {
                    *floor = floor.min(since);
                } else {
                    far = true;
                }
            }
            if far {
                self.owe(since);
            }
        }
        // Date the writers first seen, before this claim's own snapshot is kept; none is
        // seen ended since this claim yet.
        let known = std::mem::take(&mut self.writers);
        self.writers = snapshot
            .writers
            .iter()
            .map(|x| {
                let since = known.get(x).map_or_else(|| self.dated(*x) - lag, |w| w.0);
                (*x, (since, false))
            })
            .collect();
        self.keep_snapshot(snapshot);
        let cap = snapshot.waiting.unwrap_or(f64::INFINITY);
        // Per range: the latest row taken, or the first row passed while locked (the
        // same on every row of that range).
        let mut reached: HashMap<(&'static str, i16), f64> = HashMap::new();
        for row in rows {
            let to = row.held_back.unwrap_or(row.run_after);
            reached
                .entry((row.kind, row.priority))
                .and_modify(|r| *r = r.max(to))
                .or_insert(to);
        }
        for (range, to) in reached {
            // The claim scanned this range from its floor: every row it counted lies at
            // or past it, so this never passes a row it held back.
            let floor = self.at.entry(range).or_insert(f64::NEG_INFINITY);
            *floor = floor.max(to.min(cap) - lag);
        }
    }

    /// Whether any of the writers `xids`, which an idle runtime's next-due query saw
    /// ended (`sql::NEXT_DUE`), is one the last claim reported and not yet seen ended:
    /// the runtime then claims again soon, and that claim, given the writers, looks
    /// behind the floors from their time as any claim that sees one end. Each counts
    /// once: if no claim follows (every kind without a limit paused), the runtime does
    /// not keep waking for it.
    pub(super) fn ended(&mut self, xids: &[i64]) -> bool {
        let mut new = false;
        for x in xids {
            if let Some((_, seen)) = self.writers.get_mut(x) {
                new |= !std::mem::replace(seen, true);
            }
        }
        new
    }

    /// Owes a look behind the floors from `since` (a writer that has ended may have
    /// committed rows there), to the next probe.
    pub(super) fn owe(&mut self, since: f64) {
        self.owed = Some(self.owed.map_or(since, |owed| owed.min(since)));
    }

    /// The look behind the floors owed, if any, handed to a probe: from when, for every
    /// kind. A probe that fails owes it again ([`Self::owe`]).
    pub(super) fn take_owed(&mut self) -> Option<f64> {
        self.owed.take()
    }

    /// Lowers the floor of `(kind, priority)` to `run_after`, where the probe found a
    /// claimable row behind it.
    pub(super) fn lower(&mut self, kind: &'static str, priority: i16, run_after: f64) {
        if let Some(floor) = self.at.get_mut(&(kind, priority))
            && run_after < *floor
        {
            tracing::debug!(
                job.kind = kind,
                priority,
                "a claimable job behind the floor: claiming from it"
            );
            *floor = run_after;
        }
    }

    /// The time of the latest earlier claim whose snapshot's `xmax` xid `x` reaches:
    /// `x` was assigned after it. Negative infinity if none is known.
    fn dated(&self, x: i64) -> f64 {
        self.snapshots
            .iter()
            .rev()
            .find(|(xmax, _)| *xmax <= x)
            .map_or(f64::NEG_INFINITY, |(_, at)| *at)
    }

    /// Keeps this claim's snapshot, at most one per `SNAPSHOT_EVERY`: a writer is then
    /// dated up to that much early, which only keeps a floor lower.
    fn keep_snapshot(&mut self, snapshot: &Snapshot) {
        if self
            .snapshots
            .back()
            .is_some_and(|(_, at)| snapshot.at - at < SNAPSHOT_EVERY.as_secs_f64())
        {
            return;
        }
        if self.snapshots.len() >= SNAPSHOTS_KEPT {
            self.snapshots.pop_front();
        }
        self.snapshots.push_back((snapshot.xmax, snapshot.at));
    }

    /// Whether the probe is due: at least once per poll interval, and no more often
    /// than every 1,000 times its last duration (but at least every 30 s, so that one
    /// slow probe cannot put the next far off). Counted from the start of the last one.
    ///
    /// Under a held horizon the probe walks every dead entry behind the floors (up to
    /// 250 ms past a million) and takes a core for that long; at 1 % of the time the
    /// 5 s windows that held one had the pickup's worst p95 (`bench horizon`,
    /// BENCHMARKS.md). A probe under 1 ms (clean conditions: 0.1 ms) runs every poll
    /// interval.
    pub(super) fn probe_due(&self, poll: Duration) -> bool {
        self.last_probe.is_none_or(|at| {
            at.elapsed() >= poll.max((self.probe_took * 1_000).min(Duration::from_secs(30)))
        })
    }

    /// A probe starts now.
    pub(super) fn probe_started(&mut self) {
        self.last_probe = Some(Instant::now());
    }

    /// A probe took `took`.
    pub(super) fn probe_ended(&mut self, took: Duration) {
        self.probe_took = took;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(run_after: f64, held_back: Option<f64>) -> Report {
        Report {
            kind: "k",
            priority: 0,
            run_after,
            held_back,
        }
    }

    fn snap(at: f64, xmax: i64, writers: &[i64], since: Option<f64>) -> Snapshot {
        Snapshot {
            at,
            xmax,
            writers: writers.to_vec(),
            waiting: None,
            since,
        }
    }

    fn floor(f: &Floors) -> f64 {
        f.of("k").next().unwrap()
    }

    #[test]
    fn a_floor_follows_the_latest_row_taken_less_the_lag() {
        let mut f = Floors::default();
        f.after_claim(
            &snap(10.0, 100, &[], None),
            &[row(5.0, None), row(7.0, None)],
        );
        assert!((floor(&f) - 6.9).abs() < 1e-9);
        // Never back down by itself.
        f.after_claim(&snap(11.0, 101, &[], None), &[row(6.0, None)]);
        assert!((floor(&f) - 6.9).abs() < 1e-9);
    }

    #[test]
    fn a_row_passed_while_locked_holds_the_floor() {
        let mut f = Floors::default();
        f.after_claim(
            &snap(10.0, 100, &[], None),
            &[row(9.0, Some(2.0)), row(8.0, Some(2.0))],
        );
        assert!((floor(&f) - 1.9).abs() < 1e-9);
    }

    #[test]
    fn a_writer_is_dated_by_earlier_snapshots_and_looked_back_to_when_it_ends() {
        let mut f = Floors::default();
        f.after_claim(&snap(1.0, 100, &[], None), &[row(0.5, None)]);
        // Xid 105 was assigned after the claim at 1.0 (xmax 100): its rows' run-afters
        // may be as early as 1.0, however late it commits. The floors go on meanwhile.
        f.after_claim(&snap(2.0, 110, &[105], None), &[row(1.5, None)]);
        assert!((floor(&f) - 1.4).abs() < 1e-9, "{}", floor(&f));
        assert_eq!(f.writers(), (vec![105], vec![0.9]));
        assert_eq!(f.take_owed(), None);
        // The claim that saw it completed scanned from 0.9, within a second of the
        // floor: so do the floors, and the rows it took move them up again.
        f.after_claim(&snap(3.0, 120, &[], Some(0.9)), &[row(1.2, None)]);
        assert!((floor(&f) - 1.1).abs() < 1e-9, "{}", floor(&f));
        assert_eq!(f.take_owed(), None);
        assert_eq!(f.writers(), (vec![], vec![]));
    }

    #[test]
    fn a_long_writers_end_is_looked_behind_by_the_probe() {
        let mut f = Floors::default();
        f.after_claim(&snap(1.0, 100, &[], None), &[row(0.5, None)]);
        f.after_claim(&snap(2.0, 110, &[105], None), &[row(1.5, None)]);
        // A minute of claims while it runs.
        f.after_claim(&snap(62.0, 900, &[105], None), &[row(61.5, None)]);
        // It ends: the floors stay, and the probe owes a look from its time.
        f.after_claim(&snap(63.0, 910, &[], Some(0.9)), &[row(62.5, None)]);
        assert!((floor(&f) - 62.4).abs() < 1e-9, "{}", floor(&f));
        // Two ends before the probe: it looks from the earlier.
        f.owe(1.5);
        assert_eq!(f.take_owed(), Some(0.9));
        assert_eq!(f.take_owed(), None);
    }

    #[test]
    fn a_writer_seen_ended_between_claims_counts_once_until_the_next_claim() {
        let mut f = Floors::default();
        f.after_claim(&snap(1.0, 100, &[], None), &[row(0.5, None)]);
        f.after_claim(&snap(2.0, 110, &[105, 107], None), &[row(1.5, None)]);
        // Not reported by the claim.
        assert!(!f.ended(&[99]));
        assert!(f.ended(&[105]));
        assert!(!f.ended(&[105]), "once only");
        assert!(f.ended(&[105, 107]));
        // Kept for the next claim, which looks behind from their time.
        assert_eq!(f.writers().0.len(), 2);
        assert_eq!(f.take_owed(), None);
        // A claim that still sees 107 in progress: it may end again.
        f.after_claim(&snap(3.0, 120, &[107], Some(0.9)), &[row(2.5, None)]);
        assert!(f.ended(&[107]));
    }

    #[test]
    fn a_writer_older_than_every_snapshot_kept_is_dated_to_the_start() {
        let mut f = Floors::default();
        f.after_claim(&snap(1.0, 100, &[50], None), &[row(0.5, None)]);
        assert_eq!(f.writers().1, vec![f64::NEG_INFINITY]);
    }

    #[test]
    fn snapshots_are_thinned_and_date_a_writer_no_later_than_its_xid() {
        let mut f = Floors::default();
        for i in 0..10 {
            // A claim every 6 ms: every other one is kept.
            f.after_claim(
                &snap(f64::from(i) * 0.006, 100 + i64::from(i), &[], None),
                &[],
            );
        }
        assert_eq!(f.snapshots.len(), 5);
        assert_eq!(f.dated(99), f64::NEG_INFINITY);
        // Xid 105 was assigned after the claim with xmax 105 (kept? no: 104 was), so
        // it is dated to 104's time.
        assert!((f.dated(105) - 0.024).abs() < 1e-9, "{}", f.dated(105));
    }
}
