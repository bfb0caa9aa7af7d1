//! One claim: what it asks for ([`Ask`]), the rows it returns ([`ClaimRow`]), and the
//! start of each in claim order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use sqlx::Postgres;
use sqlx::pool::PoolConnection;
use tokio::task::JoinSet;
use uuid::Uuid;

use super::executor::{self, Claimed};
use super::floors::Floors;
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
    pub(super) held_back: Option<f64>,
    pub(super) at: Option<f64>,
    pub(super) xmax: Option<i64>,
    pub(super) writers: Option<Vec<i64>>,
    pub(super) waiting: Option<f64>,
    pub(super) since: Option<f64>,
}

impl sqlx::FromRow<'_, sqlx::postgres::PgRow> for ClaimRow {
    fn from_row(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        Ok(ClaimRow {
            id: row.try_get("id")?,
            kind: row.try_get("kind")?,
            attempts: row.try_get("attempts")?,
            max_attempts: row.try_get("max_attempts")?,
            claimed_by: row.try_get("claimed_by")?,
            payload: row.try_get("payload")?,
            waited: row.try_get("waited")?,
            run_after: row.try_get("run_after")?,
            priority: row.try_get("priority")?,
            held_back: row.try_get("held_back")?,
            at: row.try_get("at")?,
            xmax: row.try_get("xmax")?,
            writers: row.try_get("writers")?,
            waiting: row.try_get("waiting")?,
            since: row.try_get("since")?,
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
        let mut asked = 0usize;
        let skip = first % per_kind.len().max(1);
        let rotated = per_kind[skip..].iter().chain(&per_kind[..skip]);
        let with_room = per_kind.iter().filter(|(_, free)| *free > 0).count();
        // Each kind's share, twice over: the split claim reads each kind's first jobs
        // up to its limit before it shares them out, and ten busy kinds each allowed the
        // whole claim read ten times what it took (W2 over ten busy kinds: 14,000
        // jobs/s). A kind that takes its whole limit counts as full (`filled`), so the
        // next claim follows at once.
        let share = (2 * total_free).div_ceil(with_room.max(1)).max(1);
        for (info, free) in rotated.filter(|(_, free)| *free > 0) {
            // The statement takes at most `sql::CLAIM_MAX_PER_KIND` of a kind.
            let free = (*free).min(sql::CLAIM_MAX_PER_KIND).min(share);
            ask.kinds.push(info.kind);
            ask.limits.push(i32::try_from(free).unwrap_or(i32::MAX));
            ask.leases.push(millis(info.config.lease_length()));
            ask.floors.extend(floors.of(info.kind));
            asked = asked.saturating_add(free);
        }
        if ask.kinds.is_empty() {
            return None;
        }
        ask.want = asked.min(total_free);
        // The kinds' limits add up to more than the claim takes (several kinds, each
        // allowed all the free slots): the claim that shares the limit among them.
        ask.statement = if asked > ask.want {
            sql::CLAIM_SPLIT
        } else {
            sql::CLAIM
        };
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

    /// Runs the claim on `conn`.
    pub(super) async fn fetch(
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
                .bind(&self.floors)
                .bind(shared.runtime_id)
                .bind(&self.writers.0)
                .bind(&self.writers.1),
            fetch_all
        )
        .await
    }
}

/// A claim's rows in the order they start (the update returns them by id): the most
/// urgent priority first; within it the kinds take turns in the order of `kinds` (each
/// kind's n-th job, by run-after and id, before any kind's n+1-th), as the claim shared
/// them.
pub(super) fn claim_order(mut rows: Vec<ClaimRow>, kinds: &[&'static str]) -> Vec<ClaimRow> {
    let position = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap_or(usize::MAX);
    rows.sort_by(|a, b| {
        (position(&a.kind), a.priority)
            .cmp(&(position(&b.kind), b.priority))
            .then(
                (a.run_after, a.id)
                    .partial_cmp(&(b.run_after, b.id))
                    .unwrap_or(std::cmp::Ordering::Equal),
            )
    });
    let mut turn = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let same = i > 0 && (&rows[i - 1].kind, rows[i - 1].priority) == (&row.kind, row.priority);
        turn.push(if same { turn[i - 1] + 1 } else { 0 });
    }
    let mut keyed: Vec<(i16, usize, ClaimRow)> = rows
        .into_iter()
        .zip(turn)
        .map(|(row, turn)| (row.priority, turn, row))
        .collect();
    // Stable: within a turn, kinds keep their order.
    keyed.sort_by_key(|(priority, turn, _)| (*priority, *turn));
    keyed.into_iter().map(|(_, _, row)| row).collect()
}

/// Starts the executor of a claimed job.
pub(super) fn start(shared: &Arc<Shared>, row: ClaimRow, executors: &mut JoinSet<()>) {
    let Some(&handler) = shared.handlers.get(row.kind.as_str()) else {
        // Cannot happen: the claim names only kinds with a handler.
        tracing::error!(job.id = row.id, job.kind = %row.kind, "claimed a job of a kind with no handler");
        return;
    };
    shared.take_slot(handler.kind);
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
