//! The completer: writes successful outcomes, many claims per statement.
//!
//! A claim stays in the runtime's flights (and so keeps its lease renewed) until its
//! completion is written or refused. The statements skip rows that another transaction
//! has locked: such a completion waits in the completer for the next round, and never
//! holds up the others.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};

use tokio::sync::{Notify, mpsc};
use uuid::Uuid;

use super::Flight;
use crate::context::Inner;
use crate::runtime::backoff::Backoff;
use crate::sql;

/// One successful claim to complete.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Completion {
    pub id: i64,
    pub token: Uuid,
    /// The kind keeps done rows (`retain`).
    pub keep: bool,
    /// The kind's period, for periodic kinds.
    pub every_ms: Option<i64>,
    /// The kind, if it has a global concurrency limit: once the completion is written,
    /// its share is free ([`super::global::Freed`]).
    pub limited: Option<&'static str>,
}

impl Completion {
    pub(crate) fn of(job: &Inner) -> Self {
        Completion {
            id: job.id,
            token: job.token,
            keep: job.config.retain.is_some(),
            every_ms: job.next_run_ms(),
            limited: None,
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
    if !rest.is_empty() {
        let ids: Vec<i64> = rest.iter().map(|c| c.id).collect();
        let tokens: Vec<Uuid> = rest.iter().map(|c| c.token).collect();
        let every: Vec<Option<i64>> = rest.iter().map(|c| c.every_ms).collect();
        let keep: Vec<bool> = rest.iter().map(|c| c.keep).collect();
        let kept: Vec<(i64, bool, bool)> = crate::pooler::query_as(sql::COMPLETE_KEEP)
            .persistent(false) // planned for its batch: see `sql::COMPLETE_DELETE`
            .bind(&ids)
            .bind(&tokens)
            .bind(&every)
            .bind(&keep)
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
    }
    Ok(written)
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
    wake: Arc<Notify>,
    answer_within: Duration,
    throughput: Arc<super::throughput::Throughput>,
    freed: Arc<super::global::Freed>,
    /// The round being written.
    batch: Vec<Completion>,
    /// Completions whose row was locked, tried again with the next round.
    waiting: Vec<Completion>,
    /// Held across batches while completions keep coming (a pool connection is pinged
    /// on every acquire), given back to the pool after a quiet moment.
    conn: Option<PoolConnection<Postgres>>,
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
/// pending (a re-run mark) wakes this runtime's producer (`wake`).
pub(crate) async fn run(
    db: PgPool,
    rx: mpsc::Receiver<Completion>,
    flights: Arc<Mutex<HashMap<Uuid, Flight>>>,
    wake: Arc<Notify>,
    answer_within: Duration,
    throughput: Arc<super::throughput::Throughput>,
    freed: Arc<super::global::Freed>,
) {
    let mut completer = Completer {
        db,
        rx,
        flights,
        wake,
        answer_within,
        throughput,
        freed,
        batch: Vec::with_capacity(256),
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
            let c = super::held(conn, db).await?;
            throughput.flush(c).await
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
            let (db, conn, batch) = (&self.db, &mut self.conn, &self.batch);
            let write = async {
                let c = super::held(conn, db).await?;
                complete_alone(c, batch).await
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
        // A re-armed, re-run or refused job may be claimable now; a completion that only
        // waits for a locked row is not news.
        if written.again
            || self.batch.iter().any(|c| c.keep || c.every_ms.is_some())
            || written.done.len() + written.locked.len() < self.batch.len()
        {
            self.wake.notify_one();
        }
        let mut flights = self.flights.lock().expect("lock poisoned");
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
