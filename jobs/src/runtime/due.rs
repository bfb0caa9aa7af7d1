//! Which kinds an idle runtime asks the next-due query for (`sql::NEXT_DUE`), and the
//! earliest next-due moment it knows from the answers.
//!
//! The query makes one index probe per kind and priority: over the 58 kinds of the
//! benchmark's binary, 0.5 to 0.6 ms of the database's time, against 0.15 ms for the
//! claim before it. An idle runtime asks after every claim that came back short, so
//! each notification cost every replica that query, and four replicas of every kind
//! spent two thirds of the database's time at a light load on it (W10, BENCHMARKS.md).
//!
//! So the query asks for every kind with room at most every [`EVERY_KIND_EVERY`] (and
//! after any wake-up but a notification's), and in between only for the kinds that
//! can have a new scheduled job the runtime would not otherwise see: those the
//! wake-ups since the last query named (an enqueue notifies its kind, and the runtime
//! names the kinds of the jobs it makes claimable itself: a retry, a snooze, a re-run,
//! a rescue, a periodic job), the busy ones (their last claim took jobs), and those
//! that had no room when every kind was last asked for. The earliest moment an answer
//! gave stands until the next answer for every kind: a narrower answer can only bring
//! it forward. What it misses meanwhile is a delayed job that another runtime made
//! (a retry, a snooze: that runtime claims it itself), or that an enqueue sent without
//! a notification (one per kind every few milliseconds) whose transaction the claims
//! and this query did not see at work: such a job is seen at the next query for every
//! kind, within [`EVERY_KIND_EVERY`] of a wake-up, or at the poll. A query that fails
//! (no connection, a cut session) teaches nothing: the next one asks for every kind.
//! A moment that has passed wakes the runtime for every kind (`Woke::Any`), and the
//! query after that claim asks for every kind again, so a job that another runtime
//! took meanwhile costs one claim, not a loop.

use std::collections::HashSet;
use std::time::{Duration, Instant};

/// How long an answer for every kind stands before the next query asks for every kind
/// again (while the runtime is woken more often than this).
const EVERY_KIND_EVERY: Duration = Duration::from_millis(100);

/// What the idle runtime knows of when its next scheduled job is due.
#[derive(Default)]
pub(super) struct NextDue {
    /// When the query last asked for every kind with room.
    every_kind: Option<Instant>,
    /// The earliest next-due moment the answers since then gave.
    known: Option<Instant>,
    /// The kinds those answers covered: a kind that had no room then (paused, or its
    /// slots taken) is asked for once it has.
    covered: HashSet<&'static str>,
    /// The kinds the claims since the last query asked for because a wake-up named them.
    named: HashSet<&'static str>,
}

impl NextDue {
    /// The kinds the next query asks for, of those with room (`with_room`), and
    /// whether that is every one of them.
    pub(super) fn kinds(
        &self,
        with_room: impl IntoIterator<Item = &'static str>,
        quiet: impl Fn(&str) -> bool,
    ) -> (Vec<&'static str>, bool) {
        let every = self
            .every_kind
            .is_none_or(|asked| asked.elapsed() >= EVERY_KIND_EVERY);
        let kinds = with_room
            .into_iter()
            .filter(|kind| {
                every || self.named.contains(kind) || !quiet(kind) || !self.covered.contains(kind)
            })
            .collect();
        (kinds, every)
    }

    /// Notes the answer to a query for `kinds` (`every`: every kind with room) that the
    /// next of their jobs is `due` from now, and returns how long from now the earliest
    /// one known is.
    ///
    /// A job due already (one that became due after the last claim looked: the query
    /// names its kinds, and the runtime claims them at once) is not kept: the claim
    /// takes it, or another runtime's did, and a moment kept from it would wake the
    /// runtime for every kind at each query after.
    pub(super) fn answered(
        &mut self,
        kinds: &[&'static str],
        every: bool,
        due: Option<Duration>,
    ) -> Option<Duration> {
        let now = Instant::now();
        let at = due.filter(|d| !d.is_zero()).map(|d| now + d);
        self.named.clear();
        if every {
            self.every_kind = Some(now);
            self.known = at;
            self.covered.clear();
        } else {
            self.known = self.known.into_iter().chain(at).min();
        }
        self.covered.extend(kinds);
        let known = self.known.map(|at| at.saturating_duration_since(now));
        due.into_iter().chain(known).min()
    }

    /// Notes that a claim asks for `kind` because a wake-up named it, if `named`;
    /// returns `named`.
    pub(super) fn named_if(&mut self, named: bool, kind: &'static str) -> bool {
        if named {
            self.named.insert(kind);
        }
        named
    }

    /// Makes the next query ask for every kind (a wake-up by the poll, a job due, a
    /// writer that may have committed any kind's jobs; a query that failed).
    pub(super) fn forget(&mut self) {
        self.every_kind = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [&str; 3] = ["a", "b", "c"];

    fn quiet_but_a(kind: &str) -> bool {
        kind != "a"
    }

    #[test]
    fn asks_for_every_kind_first_then_for_the_named_and_busy_ones() {
        let mut due = NextDue::default();
        assert_eq!(due.kinds(KINDS, quiet_but_a), (KINDS.to_vec(), true));
        due.answered(&KINDS, true, None);
        assert_eq!(due.kinds(KINDS, quiet_but_a), (vec!["a"], false));
        assert!(due.named_if(true, "c"));
        assert!(!due.named_if(false, "b"));
        assert_eq!(due.kinds(KINDS, quiet_but_a), (vec!["a", "c"], false));
        // An answer clears the names; forgetting asks for every kind again.
        due.answered(&["a", "c"], false, None);
        assert_eq!(due.kinds(KINDS, quiet_but_a), (vec!["a"], false));
        due.forget();
        assert_eq!(due.kinds(KINDS, quiet_but_a), (KINDS.to_vec(), true));
    }

    #[test]
    fn asks_for_every_kind_again_once_the_last_such_answer_is_old() {
        let mut due = NextDue::default();
        due.answered(&KINDS, true, None);
        due.every_kind = Some(Instant::now() - EVERY_KIND_EVERY);
        assert_eq!(due.kinds(KINDS, quiet_but_a), (KINDS.to_vec(), true));
    }

    #[test]
    fn asks_for_a_kind_that_had_no_room_when_every_kind_was_asked_for() {
        let mut due = NextDue::default();
        due.answered(&["a", "b"], true, None);
        assert_eq!(due.kinds(KINDS, quiet_but_a), (vec!["a", "c"], false));
        due.answered(&["a", "c"], false, None);
        assert_eq!(due.kinds(KINDS, quiet_but_a), (vec!["a"], false));
    }

    #[test]
    fn a_narrower_answer_only_brings_the_moment_forward() {
        let (minute, second) = (Duration::from_secs(60), Duration::from_secs(1));
        let mut due = NextDue::default();
        assert!(due.answered(&KINDS, true, Some(minute)).unwrap() > minute - second);
        // Nothing due of the kinds asked, or later: the minute stands.
        assert!(due.answered(&KINDS, false, None).unwrap() > minute - second);
        assert!(due.answered(&KINDS, false, Some(2 * minute)).unwrap() <= minute);
        // Sooner: it comes forward, and stays.
        assert!(due.answered(&KINDS, false, Some(second)).unwrap() <= second);
        assert!(due.answered(&KINDS, false, None).unwrap() <= second);
        // An answer for every kind replaces it.
        assert!(due.answered(&KINDS, true, None).is_none());
    }

    #[test]
    fn a_job_due_already_is_answered_but_not_kept() {
        let mut due = NextDue::default();
        due.answered(&KINDS, true, None);
        assert_eq!(
            due.answered(&KINDS, false, Some(Duration::ZERO)),
            Some(Duration::ZERO)
        );
        assert_eq!(due.answered(&KINDS, false, None), None);
    }
}
