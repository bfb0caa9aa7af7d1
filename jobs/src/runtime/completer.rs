//! The completer: writes successful outcomes, many claims per statement.
//!
//! A claim stays in the runtime's flights (and so keeps its lease renewed) until its
//! completion is written or refused. The statements skip rows that another transaction
//! has locked: such a completion waits in the completer for the next round, and never
//! holds up the others.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::{PgConnection, PgPool};

use tokio::sync::mpsc;
use uuid::Uuid;

use super::claim::ClaimRow;
use super::global::Freed;
use super::{Flight, HeldConn};
use crate::context::Inner;
use crate::runtime::backoff::Backoff;
use crate::sql;

/// One successful claim to complete.
#[derive(Debug, Clone)]
pub(crate) struct Completion {
    pub id: i64,
    pub token: Uuid,
    /// The job's kind: the producer's wake-up names it when the completion may have
    /// made the job claimable again.
    pub kind: &'static str,
    /// The kind keeps done rows (`retain`).
    pub keep: bool,
    /// The kind's period, for periodic kinds.
    pub every_ms: Option<i64>,
    /// The kind, if it has a global concurrency limit: once the completion is written,
    /// its share is free ([`super::global::Freed`]).
    pub limited: Option<&'static str>,
    /// With `limited`, when the completion hands its share on to the kind's next job in
    /// the statement that writes it ([`sql::HAND_OFF`]).
    pub hand_off: Option<HandOff>,
    /// The handler's output, as JSON, for a kind that keeps done rows.
    pub output: Option<String>,
}

/// What a completion needs to hand its kind's share on ([`sql::HAND_OFF`]): the
/// kind's global concurrency and its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandOff {
    pub limit: i32,
    pub lease_ms: i64,
}

impl Completion {
    pub(crate) fn of(job: &Inner) -> Self {
        Completion {
            id: job.id,
            token: job.token,
            kind: job.kind,
            keep: job.config.retain.is_some(),
            every_ms: job.next_run_ms(),
            limited: None,
            hand_off: None,
            output: job.output.lock().expect("lock poisoned").clone(),
        }
    }
}

/// What a round of completions came to.
#[derive(Debug, Default)]
pub(crate) struct Written {
    /// Claims completed.
    pub done: HashSet<i64>,
    /// Claims still current whose row another transaction holds: try again.
    pub locked: HashSet<i64>,
    /// Whether a job of a kind without history went back to pending (a re-run mark):
    /// it may be claimable now.
    pub again: bool,
}

/// Completes one claim on `conn` (inside the caller's transaction, which holds the
/// row's lock). Returns whether the claim was still current.
pub(crate) async fn complete_one(
    conn: &mut PgConnection,
    job: &Inner,
) -> Result<bool, sqlx::Error> {
    Ok(!complete_batch(conn, &[Completion::of(job)])
        .await?
        .done
        .is_empty())
}

/// [`complete_batch`] on a connection outside any transaction: behind a transaction
/// pooler, its two statements share one transaction of their own (see `crate::pooler`).
pub(crate) async fn complete_alone(
    conn: &mut PgConnection,
    batch: &[Completion],
) -> Result<Written, sqlx::Error> {
    if !crate::pooler::behind() {
        return complete_batch(conn, batch).await;
    }
    use sqlx::Connection;
    let mut tx = conn.begin().await?;
    let written = complete_batch(&mut tx, batch).await?;
    tx.commit().await?;
    Ok(written)
}

/// Completes claims: one `DELETE` for kinds without history, then one `UPDATE` for the
/// rest (kept, periodic, marked for a re-run) and for any the delete skipped (a re-run
/// mark arrived, or the row was locked). Locked rows are skipped, so this never waits
/// for another transaction. Runs on `conn` as it is: in the caller's transaction, or
/// each statement on its own ([`complete_alone`] behind a pooler).
pub(crate) async fn complete_batch(
    conn: &mut PgConnection,
    batch: &[Completion],
) -> Result<Written, sqlx::Error> {
    let mut written = Written::default();
    let delete: Vec<&Completion> = batch
        .iter()
        .filter(|c| !c.keep && c.every_ms.is_none())
        .collect();
    if !delete.is_empty() {
        let ids: Vec<i64> = delete.iter().map(|c| c.id).collect();
        let tokens: Vec<Uuid> = delete.iter().map(|c| c.token).collect();
        let deleted: Vec<(i64,)> = crate::pooler::query_as(sql::COMPLETE_DELETE)
            .persistent(false) // planned for its batch: see `sql::COMPLETE_DELETE`
            .bind(&ids)
            .bind(&tokens)
            .fetch_all(&mut *conn)
            .await?;
        written.done.extend(deleted.into_iter().map(|(id,)| id));
    }
    let rest: Vec<&Completion> = batch
        .iter()
        .filter(|c| !written.done.contains(&c.id))
        .collect();
    for part in chunks_by(&rest, OUTPUT_BYTES_PER_STATEMENT, |c| {
        c.output.as_ref().map_or(0, String::len)
    }) {
        keep_batch(conn, part, &delete, &mut written).await?;
    }
    Ok(written)
}

/// The most bytes of outputs one [`sql::COMPLETE_KEEP`] carries. Its outputs travel as
/// one array, one value, and PostgreSQL refuses a value over 1 GB: a round of a
/// thousand completions near [`crate::MAX_OUTPUT_BYTES`] failed as one, every job's
/// completion of it with the others', at every retry.
const OUTPUT_BYTES_PER_STATEMENT: usize = 64 << 20;

/// `items` in order, cut into runs whose `size` adds up to at most `budget` (an item
/// larger than that alone in its run).
fn chunks_by<T>(items: &[T], budget: usize, size: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        let n = size(item);
        if i > start && bytes + n > budget {
            chunks.push(&items[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += n;
    }
    if start < items.len() {
        chunks.push(&items[start..]);
    }
    chunks
}

/// [`sql::COMPLETE_KEEP`] for `rest`, recorded in `written`; `delete`, the claims the
/// delete was tried for.
async fn keep_batch(
    conn: &mut PgConnection,
    rest: &[&Completion],
    delete: &[&Completion],
    written: &mut Written,
) -> Result<(), sqlx::Error> {
    let ids: Vec<i64> = rest.iter().map(|c| c.id).collect();
    let tokens: Vec<Uuid> = rest.iter().map(|c| c.token).collect();
    let every: Vec<Option<i64>> = rest.iter().map(|c| c.every_ms).collect();
    let keep: Vec<bool> = rest.iter().map(|c| c.keep).collect();
    // No array when no claim has an output (unnest pads it with NULLs).
    let outputs: Vec<Option<&str>> = if rest.iter().any(|c| c.output.is_some()) {
        rest.iter().map(|c| c.output.as_deref()).collect()
    } else {
        Vec::new()
    };
    let kept: Vec<(i64, bool, bool)> = crate::pooler::query_as(sql::COMPLETE_KEEP)
        .persistent(false) // planned for its batch: see `sql::COMPLETE_DELETE`
        .bind(&ids)
        .bind(&tokens)
        .bind(&every)
        .bind(&keep)
        .bind(&outputs)
        .fetch_all(&mut *conn)
        .await?;
    for (id, done, held) in kept {
        if done {
            // Of a kind without history, only a re-run mark completes here.
            written.again |= delete.iter().any(|c| c.id == id);
            written.done.insert(id);
        } else if held {
            written.locked.insert(id);
        }
    }
    Ok(())
}

/// One row of [`sql::HAND_OFF`]: a job claimed for a freed share, or a claim completed.
enum HandOffRow {
    Job(ClaimRow),
    Ended(i64),
}

impl sqlx::FromRow<'_, sqlx::postgres::PgRow> for HandOffRow {
    fn from_row(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        if row.try_get("ended")? {
            return Ok(HandOffRow::Ended(row.try_get("id")?));
        }
        Ok(HandOffRow::Job(ClaimRow::job(row)?))
    }
}

/// What a round's hand-offs came to: the claims completed, and the kinds that handed
/// on fewer shares than they freed (their producer claims the rest the ordinary way).
#[derive(Default)]
struct HandedOn {
    done: HashSet<i64>,
    short: HashSet<&'static str>,
}

/// Completes the claims of `batch` that hand their share on, and their kinds' next jobs
/// in the same statement ([`sql::HAND_OFF`]), claimed for `runtime`; those jobs go to
/// the producer, or back to the table if it has stopped ([`Freed::hand`]).
async fn hand_off(
    conn: &mut HeldConn,
    batch: &[Completion],
    runtime: Uuid,
    freed: &Freed,
) -> Result<HandedOn, sqlx::Error> {
    let hand: Vec<(&'static str, &Completion, HandOff)> = batch
        .iter()
        .filter_map(|c| Some((c.limited?, c, c.hand_off?)))
        .collect();
    let mut kinds: Vec<&'static str> = Vec::new();
    let (mut limits, mut leases) = (Vec::new(), Vec::new());
    for &(kind, _, h) in &hand {
        if !kinds.contains(&kind) {
            kinds.push(kind);
            limits.push(h.limit);
            leases.push(h.lease_ms);
        }
    }
    let query = if let [(kind, c, h)] = hand[..] {
        crate::pooler::query(sql::HAND_OFF_ONE)
            .bind(kind)
            .bind(h.limit)
            .bind(h.lease_ms)
            .bind(c.id)
            .bind(c.token)
    } else {
        let ids: Vec<i64> = hand.iter().map(|(_, c, _)| c.id).collect();
        let tokens: Vec<Uuid> = hand.iter().map(|(_, c, _)| c.token).collect();
        crate::pooler::query(sql::HAND_OFF)
            .bind(&kinds)
            .bind(&limits)
            .bind(&leases)
            .bind(ids)
            .bind(tokens)
    };
    let sent = std::time::Instant::now();
    let rows = conn.fetch(query.bind(runtime)).await?;
    let mut on = HandedOn::default();
    let mut claimed = Vec::new();
    for row in &rows {
        match sqlx::FromRow::from_row(row)? {
            HandOffRow::Ended(id) => {
                on.done.insert(id);
            }
            HandOffRow::Job(job) => claimed.push(job),
        }
    }
    ClaimRow::sent_at(&mut claimed, sent);
    for kind in kinds {
        let ended = hand
            .iter()
            .filter(|(k, c, _)| *k == kind && on.done.contains(&c.id))
            .count();
        let took = claimed.iter().filter(|r| r.kind == kind).count();
        if took < ended {
            on.short.insert(kind);
        }
    }
    if let Err(stopped) = freed.hand(claimed) {
        for job in stopped {
            let back = crate::pooler::query(sql::RELEASE)
                .bind(job.id)
                .bind(job.claimed_by)
                .bind(0_i64)
                .execute(&mut *conn.conn)
                .await;
            if let Err(e) = back {
                tracing::warn!(job.id = job.id, error = %crate::error::server_message(&e), "cannot hand back a job claimed as the runtime stopped; it runs again after its lease");
            }
        }
    }
    Ok(on)
}

/// The most completions written in one round, and how many may wait for the next one
/// (the channel's bound). At 40,000 jobs/s a round of one millisecond's commit carries
/// about 40; while a commit waits on a slow disk (a WAL flush of 100 ms or more), the
/// next round carries all that finished meanwhile.
pub(crate) const MAX_BATCH: usize = 2_000;

/// How long the completer keeps its connection with nothing to write.
const HOLD: Duration = Duration::from_millis(100);

/// How soon a completion whose row was locked is tried again.
const LOCKED_RETRY: Duration = Duration::from_millis(50);

/// How often a busy completer adds the counted throughput to `jobs_throughput`.
const THROUGHPUT_EVERY: Duration = Duration::from_secs(5);

/// The completer's state between rounds.
struct Completer {
    db: PgPool,
    rx: mpsc::Receiver<Completion>,
    flights: Arc<Mutex<HashMap<Uuid, Flight>>>,
    answer_within: Duration,
    throughput: Arc<super::throughput::Throughput>,
    freed: Arc<Freed>,
    /// The runtime's id, which the jobs claimed by hand-offs are claimed for.
    runtime_id: Uuid,
    /// The round being written.
    batch: Vec<Completion>,
    /// The round's completions written by hand-offs, and the kinds that handed on
    /// fewer shares than they freed.
    handed: (Vec<Completion>, HashSet<&'static str>),
    /// Completions whose row was locked, tried again with the next round.
    waiting: Vec<Completion>,
    /// Held across batches while completions keep coming (a pool connection is pinged
    /// on every acquire), given back to the pool after a quiet moment.
    conn: Option<HeldConn>,
    /// Every sender is gone: the runtime has stopped.
    closed: bool,
    flushed: std::time::Instant,
    /// Write the throughput after this round's completions.
    flush_after: bool,
}

/// Writes completions as they come, batching whatever has queued up while the previous
/// batch was being written. A database error is retried with backoff: a completion is
/// never dropped while the runtime lives (and if it is lost with the process, the job
/// runs again after its lease, which is what at-least-once allows). The channel is
/// bounded ([`MAX_BATCH`]): executors wait when that many wait for the completer.
///
/// Each claim's flight is removed once its completion is written or refused, so the
/// heartbeat renews the claim until then. A completion that sends its job back to
/// pending (a re-run mark) wakes this runtime's producer.
pub(crate) async fn run(
    db: PgPool,
    rx: mpsc::Receiver<Completion>,
    flights: Arc<Mutex<HashMap<Uuid, Flight>>>,
    answer_within: Duration,
    throughput: Arc<super::throughput::Throughput>,
    freed: Arc<Freed>,
    runtime_id: Uuid,
) {
    let mut completer = Completer {
        db,
        rx,
        flights,
        answer_within,
        throughput,
        freed,
        runtime_id,
        batch: Vec::with_capacity(256),
        handed: Default::default(),
        waiting: Vec::new(),
        conn: None,
        closed: false,
        flushed: std::time::Instant::now(),
        flush_after: false,
    };
    loop {
        if std::mem::take(&mut completer.flush_after) {
            completer.flush_throughput().await;
        }
        completer.gather().await;
        completer.throughput_due().await;
        if completer.batch.is_empty() {
            if completer.closed {
                break;
            }
            continue;
        }
        if !completer.write().await {
            return;
        }
    }
}

impl Completer {
    /// Adds the throughput counted so far to `jobs_throughput`, on the completer's
    /// connection; what cannot be written now is kept for the next time.
    async fn flush_throughput(&mut self) {
        let (db, conn, throughput) = (&self.db, &mut self.conn, &self.throughput);
        let write = async {
            let c = HeldConn::get(conn, db).await?;
            throughput.flush(&mut c.conn).await
        };
        if let Err(e) =
            super::answer_within(self.answer_within, "the throughput history", write).await
        {
            self.conn = None;
            tracing::debug!(error = %crate::error::server_message(&e), "cannot write the throughput history; keeping it for later");
        }
        self.flushed = std::time::Instant::now();
    }

    /// Waits for completions (and, while some wait for a locked row, a moment at most);
    /// after a quiet moment writes the throughput and lets go of the connection.
    async fn gather(&mut self) {
        let wait = if self.waiting.is_empty() {
            HOLD
        } else {
            LOCKED_RETRY
        };
        if !self.closed {
            match tokio::time::timeout(wait, self.rx.recv_many(&mut self.batch, MAX_BATCH)).await {
                Ok(0) => self.closed = true,
                Ok(_) => {}
                Err(_) if self.waiting.is_empty() => {
                    self.flush_throughput().await;
                    self.conn = None;
                    if self.rx.recv_many(&mut self.batch, MAX_BATCH).await == 0 {
                        self.closed = true;
                    }
                }
                Err(_) => {}
            }
        } else if !self.waiting.is_empty() {
            tokio::time::sleep(wait).await;
        }
        self.batch.append(&mut self.waiting);
    }

    /// The throughput goes after the completions, never ahead of them: every few
    /// seconds while busy, and at the end.
    async fn throughput_due(&mut self) {
        if (self.batch.is_empty() && self.closed) || self.flushed.elapsed() >= THROUGHPUT_EVERY {
            if self.batch.is_empty() {
                self.flush_throughput().await;
            } else {
                self.flush_after = true;
            }
        }
    }

    /// Writes the round, retrying with backoff until it is written. Returns false if
    /// the runtime's pool has closed (the runtime stopped first).
    async fn write(&mut self) -> bool {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        loop {
            let (db, conn, batch) = (&self.db, &mut self.conn, &mut self.batch);
            let (freed, runtime, handed) = (&self.freed, self.runtime_id, &mut self.handed);
            let write = async {
                let c = HeldConn::get(conn, db).await?;
                if batch.iter().any(|c| c.hand_off.is_some()) {
                    // Written once: a retry of the rest does not write these again.
                    let on = hand_off(c, batch, runtime, freed).await?;
                    handed.1.extend(on.short);
                    let (done, rest): (Vec<Completion>, _) =
                        batch.drain(..).partition(|c| on.done.contains(&c.id));
                    handed.0.extend(done);
                    *batch = rest;
                }
                complete_alone(&mut c.conn, batch).await
            };
            // If it did not answer, it may still have committed: the retry then finds
            // those claims gone and counts them as refused, which changes nothing.
            match super::answer_within(self.answer_within, "the completion", write).await {
                Ok(written) => {
                    self.settle(&written);
                    return true;
                }
                Err(sqlx::Error::PoolClosed) => {
                    tracing::warn!(
                        jobs = self.batch.len(),
                        "the runtime stopped before these completions were written; their jobs will run again after their lease"
                    );
                    return false;
                }
                Err(e) => {
                    self.conn = None; // it may be broken: take a fresh one
                    let wait = backoff.after(&e);
                    tracing::warn!(error = %crate::error::server_message(&e), retry_in = ?wait, jobs = self.batch.len(), "cannot write job completions; retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// A written round: its flights end (the heartbeat stops renewing them), except
    /// those whose row another transaction holds, which wait for the next round.
    fn settle(&mut self, written: &Written) {
        // A re-armed, re-run or refused job may be claimable now, of a kind of the round
        // (all of them are named: the test is per round); a completion that only waits
        // for a locked row is not news.
        if written.again
            || self.batch.iter().any(|c| c.keep || c.every_ms.is_some())
            || written.done.len() + written.locked.len() < self.batch.len()
        {
            self.freed.wake.name(self.batch.iter().map(|c| c.kind));
        }
        let mut flights = self.flights.lock().expect("lock poisoned");
        let (handed, short) = &mut self.handed;
        for c in handed.drain(..) {
            flights.remove(&c.token);
            if let Some(kind) = c.limited.filter(|kind| short.contains(kind)) {
                self.freed.mark(kind);
            }
        }
        short.clear();
        for c in self.batch.drain(..) {
            if written.locked.contains(&c.id) {
                // Another transaction holds the row: its lease is still renewed (the
                // flight stays); try again shortly.
                self.waiting.push(c);
                continue;
            }
            flights.remove(&c.token);
            if let Some(kind) = c.limited {
                self.freed.mark(kind);
            }
            if !written.done.contains(&c.id) {
                tracing::warn!(
                    job.id = c.id,
                    "completion refused: the claim is gone (it expired and was taken over, and the job will run again; or an operator cancelled the job)"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::chunks_by;

    #[test]
    fn outputs_are_cut_into_statements_within_the_budget_in_order() {
        let sizes = [40, 30, 0, 50, 120, 10, 10, 100];
        let chunks = chunks_by(&sizes, 100, |n| *n);
        assert_eq!(
            chunks,
            [
                &[40, 30, 0][..],
                &[50][..],
                &[120][..],
                &[10, 10][..],
                &[100][..]
            ]
        );
        assert_eq!(chunks.concat(), sizes, "each once, in order");
        for chunk in &chunks {
            assert!(chunk.len() == 1 || chunk.iter().sum::<usize>() <= 100);
        }
        assert!(chunks_by(&[] as &[usize], 100, |n| *n).is_empty());
        assert_eq!(chunks_by(&[0, 0, 0], 0, |n| *n), [&[0, 0, 0][..]]);
    }
}
