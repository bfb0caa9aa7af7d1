//! One claim: what it asks for ([`Ask`]), the rows it returns ([`ClaimRow`]), and the
//! start of each in claim order.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinSet;
use uuid::Uuid;

use super::executor::{self, Claimed};
use super::floors::{Floors, Snapshot};
use super::{Shared, observe};
use crate::enqueue::millis;
use crate::registry::HandlerInfo;
use crate::sql;

/// One row of a claim ([`sql::CLAIM`]).
pub(super) struct ClaimRow {
    pub(super) id: i64,
    pub(super) kind: String,
    pub(super) attempts: i32,
    pub(super) max_attempts: i32,
    pub(super) claimed_by: Uuid,
    pub(super) payload: String,
    pub(super) waited: Option<f64>,
    pub(super) run_after: Option<f64>,
    pub(super) priority: i16,
    /// The enqueuer's trace context (`crate::trace`).
    pub(super) trace: Option<String>,
    pub(super) held_back: Option<f64>,
    /// When the statement that claimed it was sent ([`ClaimRow::sent_at`]; until
    /// then, when it was read): its lease runs from a moment after it.
    pub(super) sent: Instant,
    /// For a kind with a rate, how long after `sent` it may start at the latest
    /// (`global::start_margin`): later, it goes back unstarted.
    pub(super) start_within: Option<std::time::Duration>,
}

/// Where a claim's columns are in its rows, found once per claim: looked up by name in
/// every row, ten columns a row, they were most of the time the runtime spent reading
/// a claim's answer.
pub(super) struct Columns {
    job: [usize; 10],
    held_back: Option<usize>,
}

impl Columns {
    /// The places of a claim's columns in `row` (every row of an answer has the same).
    pub(super) fn of(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::{Column, Row};
        let at = |name: &str| row.try_column(name).map(Column::ordinal);
        let names = [
            "id",
            "kind",
            "attempts",
            "max_attempts",
            "claimed_by",
            "payload",
            "waited",
            "run_after",
            "priority",
            "trace",
        ];
        let mut job = [0; 10];
        for (place, name) in job.iter_mut().zip(names) {
            *place = at(name)?;
        }
        Ok(Columns {
            job,
            held_back: at("held_back").ok(),
        })
    }
}

impl ClaimRow {
    /// The job's own columns of a claim's row (the CTE `claimed` of every claim), without
    /// the floors'.
    pub(super) fn job(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        Self::at(row, &Columns::of(row)?)
    }

    /// [`job`](Self::job), with the places of the columns known, and the row's
    /// `held_back` if it has one.
    fn at(row: &sqlx::postgres::PgRow, columns: &Columns) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        let [
            id,
            kind,
            attempts,
            max_attempts,
            claimed_by,
            payload,
            waited,
            run_after,
            priority,
            trace,
        ] = columns.job;
        Ok(ClaimRow {
            id: row.try_get(id)?,
            kind: row.try_get(kind)?,
            attempts: row.try_get(attempts)?,
            max_attempts: row.try_get(max_attempts)?,
            claimed_by: row.try_get(claimed_by)?,
            payload: row.try_get(payload)?,
            waited: row.try_get(waited)?,
            run_after: row.try_get(run_after)?,
            priority: row.try_get(priority)?,
            trace: row.try_get(trace)?,
            held_back: columns
                .held_back
                .map(|i| row.try_get(i))
                .transpose()?
                .flatten(),
            sent: Instant::now(),
            start_within: None,
        })
    }

    /// Records that the statement that claimed `rows` was sent at `at`.
    pub(super) fn sent_at(rows: &mut [ClaimRow], at: Instant) {
        for row in rows {
            row.sent = at;
        }
    }
}

/// What a claim returned: the rows it took, and its report on the floors (every row of
/// [`sql::CLAIM`] carries it; a claim that took nothing returns it alone, on a row
/// whose id is NULL).
pub(super) struct Taken {
    pub(super) rows: Vec<ClaimRow>,
    pub(super) snapshot: Option<Snapshot>,
    /// For a split claim, the kinds (their places in the ask, from 1) of which its
    /// unlocked pass found a job due: the others had none ([`sql::CLAIM_SPLIT`]).
    pub(super) found: Option<Vec<i64>>,
}

impl Taken {
    fn read(rows: &[sqlx::postgres::PgRow]) -> Result<Taken, sqlx::Error> {
        use sqlx::Row;
        let (snapshot, found) = match rows.first() {
            Some(first) => (
                Some(Snapshot {
                    at: first.try_get("at")?,
                    xmax: first.try_get("xmax")?,
                    writers: first.try_get("writers")?,
                    waiting: first.try_get("waiting")?,
                    since: first.try_get("since")?,
                }),
                first.try_get("found")?,
            ),
            None => (None, None),
        };
        let mut taken = Vec::with_capacity(rows.len());
        let Some(columns) = rows.first().map(Columns::of).transpose()? else {
            return Ok(Taken {
                rows: taken,
                snapshot,
                found,
            });
        };
        for row in rows {
            if row.try_get::<Option<i64>, _>(columns.job[0])?.is_some() {
                taken.push(ClaimRow::at(row, &columns)?);
            }
        }
        Ok(Taken {
            rows: taken,
            snapshot,
            found,
        })
    }
}

/// What one claim asks for: the kinds with free capacity, each kind's limit, lease and
/// floors, the total, and the statement that fits.
pub(super) struct Ask {
    pub(super) kinds: Vec<&'static str>,
    pub(super) limits: Vec<i32>,
    pub(super) leases: Vec<i64>,
    pub(super) floors: Vec<f64>,
    pub(super) writers: (Vec<i64>, Vec<f64>),
    pub(super) want: usize,
    pub(super) statement: &'static str,
}

impl Ask {
    /// The claim of every kind with free capacity, from its floors, listed from the
    /// `first`-th (modulo their number: the order in which kinds take a turn). None if
    /// no kind has room.
    pub(super) fn new(
        total_free: usize,
        per_kind: &[(&'static HandlerInfo, usize)],
        floors: &Floors,
        first: usize,
        seen: &Seen,
    ) -> Option<Ask> {
        let mut ask = Ask {
            kinds: Vec::new(),
            limits: Vec::new(),
            leases: Vec::new(),
            floors: Vec::new(),
            writers: floors.writers(),
            want: 0,
            statement: "",
        };
        let skip = first % per_kind.len().max(1);
        let rotated = per_kind[skip..].iter().chain(&per_kind[..skip]);
        let mut frees = Vec::new();
        for (info, free) in rotated.filter(|(_, free)| *free > 0) {
            ask.kinds.push(info.kind);
            // The statement takes at most `sql::CLAIM_MAX_PER_KIND` of a kind.
            frees.push((*free).min(sql::CLAIM_MAX_PER_KIND));
            ask.leases.push(millis(info.config.lease_length()));
            ask.floors.extend(floors.of(info.kind));
        }
        if ask.kinds.is_empty() {
            return None;
        }
        ask.want = frees.iter().sum::<usize>().min(total_free);
        let limits = if frees.iter().sum::<usize>() <= ask.want {
            // Each kind may take all it has room for: the plain claim.
            ask.statement = sql::CLAIM;
            frees
        } else if (seen.one_priority(&ask.kinds) || seen.split_short) && ask.want >= ask.kinds.len()
        {
            // Every kind's last claim took jobs of one priority, the same for all: no
            // kind's jobs are more urgent than another's, so equal shares, worked out
            // here, give what the split claim would, at the plain claim's cost (the
            // split's `top` pass and window cost W2 over ten busy kinds a fifth of its
            // claims' time). If a kind's next jobs are more urgent, this claim's rows
            // show it and the next claim is split. A quiet kind asked (a notification or
            // the probe named it) has no priority known: the claim is split, so that
            // its jobs take their turn by priority. After a split claim that came back
            // short, the shares are equal too: the split shares by what it reads
            // without locks, so a kind whose urgent jobs another transaction holds took
            // the whole claim and locked none of it, and the other kinds' jobs waited
            // for as long as those rows were held.
            ask.statement = sql::CLAIM;
            fair_shares(&frees, ask.want)
        } else {
            // The claim that shares the total among the kinds by priority, then by
            // turns. Each busy kind may read its share twice over: the split claim
            // reads each kind's first jobs up to its limit before it shares them out,
            // and ten busy kinds each allowed the whole claim read ten times what it
            // took (W2 over ten busy kinds: 14,000 jobs/s). A kind that takes its whole
            // limit counts as full (`filled`), so the next claim follows at once. Quiet
            // kinds asked (named by a notification or the probe) do not dilute the
            // busy kinds' share: counted in, claims that asked for every kind of the
            // bench took 14 jobs of each of ten busy kinds, in claims as slow as full
            // ones.
            ask.statement = sql::CLAIM_SPLIT;
            let busy = ask.kinds.iter().filter(|k| !seen.is_quiet(k)).count();
            let share = (2 * total_free).div_ceil(busy.max(1)).max(1);
            frees.into_iter().map(|free| free.min(share)).collect()
        };
        ask.limits = limits
            .into_iter()
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX))
            .collect();
        Some(ask)
    }

    /// Whether more may be waiting: the claim took all it asked for, or all it asked of
    /// some kind (a kind's limit, `sql::CLAIM_MAX_PER_KIND` at most, may be less than
    /// the total).
    pub(super) fn filled(&self, rows: &[ClaimRow]) -> bool {
        if rows.len() >= self.want {
            return true;
        }
        let mut taken: HashMap<&str, usize> = HashMap::new();
        for row in rows {
            *taken.entry(row.kind.as_str()).or_default() += 1;
        }
        self.kinds.iter().zip(&self.limits).any(|(kind, limit)| {
            taken.get(kind).copied().unwrap_or(0) >= usize::try_from(*limit).unwrap_or(0)
        })
    }

    /// Runs the claim on the producer's connection, planned by index
    /// ([`super::HeldConn`]).
    pub(super) async fn fetch(
        &self,
        shared: &Shared,
        held: &mut super::HeldConn,
    ) -> Result<Taken, sqlx::Error> {
        let query = crate::pooler::query(self.statement)
            .bind(&self.kinds)
            .bind(&self.limits)
            .bind(&self.leases)
            .bind(i32::try_from(self.want).unwrap_or(i32::MAX))
            .bind(&self.floors)
            .bind(shared.runtime_id)
            .bind(&self.writers.0)
            .bind(&self.writers.1);
        let sent = Instant::now();
        let rows = held.fetch(query).await?;
        let mut taken = Taken::read(&rows)?;
        ClaimRow::sent_at(&mut taken.rows, sent);
        Ok(taken)
    }
}

/// What the producer knows of each kind from its last claims.
#[derive(Default)]
pub(super) struct Seen {
    /// The quiet kinds: their last claim took nothing.
    pub(super) quiet: HashSet<&'static str>,
    /// The one priority of the jobs a kind's last claim took, for a kind whose last
    /// claim took jobs of a single priority.
    pub(super) priority: HashMap<&'static str, i16>,
    /// Whether the last claim was split and took less than it asked for.
    pub(super) split_short: bool,
}

impl Seen {
    pub(super) fn is_quiet(&self, kind: &str) -> bool {
        self.quiet.contains(kind)
    }

    /// Whether the last claim of every one of `kinds` took jobs of a single priority,
    /// the same for all (a quiet kind's is not known).
    fn one_priority(&self, kinds: &[&'static str]) -> bool {
        let mut priorities = kinds.iter().map(|k| self.priority.get(k).copied());
        let first = priorities.next().flatten();
        first.is_some() && priorities.all(|p| p == first)
    }

    /// Notes what a claim took: a kind that took jobs is busy,
    /// with their priority if they share one; one that took none though a kind with a
    /// job due had its turn is quiet: the claim had room for more (`short`), or took a
    /// second job of some kind (a job of every kind precedes the second of any, at the
    /// same priority). A claim that ran out of room within the first turn leaves the
    /// others as they were, but for the kinds a split claim's unlocked pass found no
    /// job due of (`found`): those are quiet whatever the turns. Without that, a runtime
    /// of many kinds starting on ten busy ones (a claim of ten, a job of each) asked
    /// every kind again in split claims until its claims grew past the first turn.
    pub(super) fn note(
        &mut self,
        ask: &Ask,
        rows: &[ClaimRow],
        filled: bool,
        found: Option<&[i64]>,
    ) {
        let (kinds, short) = (&ask.kinds, rows.len() < ask.want);
        self.split_short = short && !filled && ask.statement == sql::CLAIM_SPLIT;
        let mut taken: HashMap<&str, (usize, Option<i16>)> = HashMap::new();
        for row in rows {
            let (n, priority) = taken
                .entry(row.kind.as_str())
                .or_insert((0, Some(row.priority)));
            *n += 1;
            if *priority != Some(row.priority) {
                *priority = None;
            }
        }
        let had_turn = short || taken.values().any(|(n, _)| *n >= 2);
        let none_due = |place: usize| {
            found.is_some_and(|found| !found.contains(&i64::try_from(place + 1).unwrap_or(0)))
        };
        for (place, kind) in kinds.iter().enumerate() {
            if let Some((_, priority)) = taken.get(kind) {
                self.quiet.remove(kind);
                match priority {
                    Some(p) => self.priority.insert(kind, *p),
                    None => self.priority.remove(kind),
                };
            } else if had_turn || none_due(place) {
                self.quiet.insert(kind);
                self.priority.remove(kind);
            }
        }
    }
}

/// `want` shared among kinds that have room for `frees`: equal shares, a kind with
/// less room taking what it has and leaving the rest to the others; what does not
/// divide evenly goes to the first kinds.
fn fair_shares(frees: &[usize], want: usize) -> Vec<usize> {
    let mut shares = vec![0; frees.len()];
    let mut open: Vec<usize> = (0..frees.len()).collect();
    let mut left = want;
    while !open.is_empty() && left > 0 {
        let each = left / open.len();
        let small: Vec<usize> = open.iter().copied().filter(|&i| frees[i] <= each).collect();
        if small.is_empty() {
            let extra = left - each * open.len();
            for (n, &i) in open.iter().enumerate() {
                shares[i] = each + usize::from(n < extra);
            }
            break;
        }
        for &i in &small {
            shares[i] = frees[i];
            left -= frees[i];
        }
        open.retain(|i| !small.contains(i));
    }
    shares
}

/// A claim's rows in the order they start (the update returns them by id): the most
/// urgent priority first; within it the kinds take turns in the order of `kinds` (each
/// kind's n-th job, by run-after and id, before any kind's n+1-th), as the claim shared
/// them.
pub(super) fn claim_order(rows: Vec<ClaimRow>, kinds: &[&'static str]) -> Vec<ClaimRow> {
    // Each row's kind's place in `kinds`, looked up once: looked up in each comparison
    // of the sort, it was a twentieth of a busy runtime's time with ten kinds (`memcmp`).
    // The sorts move indices, not rows.
    let place: Vec<usize> = rows
        .iter()
        .map(|r| {
            kinds
                .iter()
                .position(|k| *k == r.kind)
                .unwrap_or(usize::MAX)
        })
        .collect();
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&rows[a], &rows[b]);
        (place[a], x.priority).cmp(&(place[b], y.priority)).then(
            (x.run_after, x.id)
                .partial_cmp(&(y.run_after, y.id))
                .unwrap_or(std::cmp::Ordering::Equal),
        )
    });
    // Each row's turn: how many of its kind and priority come before it.
    let mut keyed: Vec<(i16, usize, usize)> = Vec::with_capacity(rows.len());
    for (i, &r) in order.iter().enumerate() {
        let same = i > 0 && {
            let p = order[i - 1];
            (&rows[p].kind, rows[p].priority) == (&rows[r].kind, rows[r].priority)
        };
        let turn = if same { keyed[i - 1].1 + 1 } else { 0 };
        keyed.push((rows[r].priority, turn, r));
    }
    // Stable: within a turn, kinds keep their order.
    keyed.sort_by_key(|&(priority, turn, _)| (priority, turn));
    let mut rows: Vec<Option<ClaimRow>> = rows.into_iter().map(Some).collect();
    keyed
        .into_iter()
        .map(|(_, _, r)| rows[r].take().expect("each row once"))
        .collect()
}

/// Takes a slot for each of `rows` (of a kind with a handler, as every claimed row is):
/// from here the free capacity counts them, started or not.
pub(super) fn take_slots(shared: &Shared, rows: &[ClaimRow]) {
    for row in rows {
        if let Some(handler) = shared.handlers.get(row.kind.as_str()) {
            shared.take_slot(handler.kind);
        }
    }
}

/// Starts the executor of a claimed job, its slot taken ([`take_slots`]).
pub(super) fn start(shared: &Arc<Shared>, row: ClaimRow, executors: &mut JoinSet<()>) {
    let Some(&handler) = shared.handlers.get(row.kind.as_str()) else {
        // Cannot happen: the claim names only kinds with a handler.
        tracing::error!(job.id = row.id, job.kind = %row.kind, "claimed a job of a kind with no handler");
        return;
    };
    observe::claimed(handler.kind, row.waited.unwrap_or(0.0));
    // The database's clock at the claim: the job's run-after plus how long it waited.
    let db_claimed_us = match (row.run_after, row.waited) {
        (Some(run_after), Some(waited)) => Some(((run_after + waited) * 1e6) as i64),
        _ => None,
    };
    let claimed = Claimed {
        id: row.id,
        attempt: u32::try_from(row.attempts).unwrap_or(0),
        max_attempts: u32::try_from(row.max_attempts).unwrap_or(1),
        token: row.claimed_by,
        payload: row.payload,
        trace: row.trace,
        claimed_at: row.sent,
        start_within: row.start_within,
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

#[cfg(test)]
mod tests {
    use super::{Ask, ClaimRow, Seen, claim_order, fair_shares};
    use crate::sql;

    fn row(id: i64, kind: &str, priority: i16, run_after: f64) -> ClaimRow {
        ClaimRow {
            id,
            kind: kind.to_owned(),
            attempts: 1,
            max_attempts: 1,
            claimed_by: uuid::Uuid::nil(),
            payload: String::new(),
            waited: None,
            run_after: Some(run_after),
            priority,
            trace: None,
            held_back: None,
            start_within: None,
            sent: std::time::Instant::now(),
        }
    }

    #[test]
    fn claimed_rows_start_by_priority_then_in_turns_of_the_kinds() {
        let rows = vec![
            row(1, "a", 0, 2.0),
            row(2, "a", 0, 1.0),
            row(3, "b", 0, 1.0),
            row(4, "a", 1, 0.0),
            row(5, "b", 0, 3.0),
            row(6, "c", 0, 0.5),
        ];
        let ids: Vec<i64> = claim_order(rows, &["b", "a"])
            .iter()
            .map(|r| r.id)
            .collect();
        // Priority 0 in turns (b, a, then the kind not named), then priority 1.
        assert_eq!(ids, vec![3, 2, 6, 5, 1, 4]);
    }

    #[test]
    fn fair_shares_split_evenly_and_pass_on_what_a_kind_has_no_room_for() {
        assert_eq!(fair_shares(&[500, 500, 500], 300), vec![100, 100, 100]);
        assert_eq!(fair_shares(&[500, 500, 500], 301), vec![101, 100, 100]);
        assert_eq!(fair_shares(&[10, 500, 500], 300), vec![10, 145, 145]);
        assert_eq!(fair_shares(&[10, 20, 500], 300), vec![10, 20, 270]);
        assert_eq!(fair_shares(&[1, 1, 1], 2), vec![1, 1, 0]);
    }

    /// A claim of two over five kinds took a job of `a` and one of `c`: all it asked
    /// for, within the first turn, so the turns say nothing of the others. A split
    /// claim whose unlocked pass found jobs of `a`, `c` and `e` makes `b` and `d`
    /// quiet, and leaves `e` (cut before its turn) as it was; the plain claim, which
    /// reports nothing, leaves all three.
    #[test]
    fn kinds_a_split_claim_found_nothing_of_are_quiet_within_the_first_turn() {
        let kinds = vec!["a", "b", "c", "d", "e"];
        for (statement, found, quiet) in [
            (sql::CLAIM_SPLIT, Some(&[1_i64, 3, 5][..]), vec!["b", "d"]),
            (sql::CLAIM, None, vec![]),
        ] {
            let ask = Ask {
                kinds: kinds.clone(),
                limits: vec![2; 5],
                leases: vec![60_000; 5],
                floors: Vec::new(),
                writers: (Vec::new(), Vec::new()),
                want: 2,
                statement,
            };
            let mut seen = Seen::default();
            let rows = [row(1, "a", 0, 1.0), row(2, "c", 0, 1.0)];
            seen.note(&ask, &rows, true, found);
            let mut got: Vec<&str> = seen.quiet.iter().copied().collect();
            got.sort_unstable();
            let what = if found.is_some() { "split" } else { "plain" };
            assert_eq!(got, quiet, "quiet after the {what} claim");
            assert_eq!(seen.priority.get("a"), Some(&0), "a is busy at priority 0");
        }
    }
}
