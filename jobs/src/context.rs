//! What a handler sees: [`JobContext`] and the [`JobError`] it returns.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use tokio::sync::{Mutex, MutexGuard, watch};
use uuid::Uuid;

use crate::job::JobConfig;
use crate::runtime::completer;

/// The running job's identity, its claim, and the database, handed to every handler.
///
/// Cheap to clone. In the default (heartbeat) lease mode, write results through
/// [`fenced_tx`](Self::fenced_tx) so that a late result from a lost claim is refused; in
/// transaction mode (`lease = "transaction"`), write through [`tx`](Self::tx).
///
/// ```
/// use jobs::sqlx;
/// use jobs::{Job, JobContext, JobError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Job, Serialize, Deserialize)]
/// #[job(kind = "thumbnail.make", key = "image_id", max_attempts = 5)]
/// struct MakeThumbnail {
///     image_id: i64,
/// }
///
/// #[jobs::handler]
/// async fn make_thumbnail(job: MakeThumbnail, ctx: JobContext) -> Result<(), JobError> {
///     tracing::info!(job = ctx.id(), attempt = ctx.attempt(), of = ctx.max_attempts(), "thumbnail");
///     // Reads go through the application's pool.
///     let path: String = sqlx::query_scalar("SELECT path FROM images WHERE id = $1")
///         .bind(job.image_id)
///         .fetch_one(ctx.pool())
///         .await?;
///     // ... the slow work; the runtime renews the lease meanwhile ...
///     if ctx.is_lease_lost() {
///         // Another runtime may run the job now: write nothing.
///         return Err(JobError::lease_lost());
///     }
///     let mut tx = ctx.fenced_tx().await?;
///     sqlx::query("UPDATE images SET thumbnail = $2 WHERE id = $1")
///         .bind(job.image_id)
///         .bind(format!("{path}.thumb"))
///         .execute(&mut *tx)
///         .await?;
///     tx.commit().await?;
///     Ok(())
/// }
/// ```
#[derive(Clone)]
pub struct JobContext {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub id: i64,
    pub kind: &'static str,
    pub attempt: u32,
    pub max_attempts: u32,
    pub token: Uuid,
    pub config: JobConfig,
    pub pool: PgPool,
    pub lost: watch::Receiver<bool>,
    /// A fenced transaction of this claim is open (one at a time).
    pub fence_open: AtomicBool,
    /// A fenced transaction holds the row lock: a failed renewal is not a lost lease.
    pub fenced: AtomicBool,
    /// A fenced transaction was dropped without `commit()` or `rollback()`: its writes
    /// were rolled back, so the run cannot count as a success.
    pub fence_dropped: AtomicBool,
    /// A fenced transaction committed the completion: the runtime writes nothing more.
    pub completed: AtomicBool,
    /// The handler has returned: its outcome is being written. A claim found gone then
    /// is the outcome's business (written, or refused and reported), not a lost lease.
    pub finished: AtomicBool,
    /// An operator cancelled the job (`jobs::admin::cancel`): the runtime drops the
    /// handler. Set before `lost` is signalled.
    pub cancelled: AtomicBool,
    /// The database's clock at the claim (microseconds since the epoch), and when that
    /// was on this process's monotonic clock: the database's time now, estimated.
    pub db_clock: Option<(i64, std::time::Instant)>,
    /// Transaction mode: the handler's transaction, opened at its first use.
    pub tx: Option<Mutex<TxSlot>>,
    /// When the last renewal of this claim that answered was sent (at first, the
    /// claim's statement), on this process's monotonic clock: the database's
    /// `claimed_until` is at least a lease after it ([`Inner::lease_deadline`]).
    pub renewed: std::sync::Mutex<std::time::Instant>,
    /// The handler's output, as JSON, for a kind that keeps done rows: written by the
    /// completion (`crate::outcome`).
    pub output: std::sync::Mutex<Option<String>>,
}

impl Inner {
    /// The moment, on this process's monotonic clock, from which the database may give
    /// this job to another claim, less a margin for telling the handler: a lease after
    /// the last renewal that answered was sent ([`Inner::renewed`]), less a tenth of
    /// the lease (at most a second). Measured without the database, so a runtime cut
    /// off from it still tells its handlers in time (SPEC invariant 13).
    pub(crate) fn lease_deadline(&self) -> std::time::Instant {
        let lease = self.config.lease_length();
        let margin = (lease / 10).min(std::time::Duration::from_secs(1));
        *self.renewed.lock().expect("lock poisoned") + (lease - margin)
    }

    /// Whether the handler is past [`Inner::lease_deadline`] while it still runs.
    pub(crate) fn past_deadline(&self) -> bool {
        !self.finished.load(Ordering::Acquire)
            && !self.completed.load(Ordering::Acquire)
            && std::time::Instant::now() >= self.lease_deadline()
    }

    /// How long after now (on the database's clock, estimated from the claim's time)
    /// the kind's next run is due: its period, or the time to its next cron fire.
    pub(crate) fn next_run_ms(&self) -> Option<i64> {
        if self.config.every.is_some() {
            return self.config.next_run_ms(0);
        }
        self.config.next_run_ms(self.db_now_us()?)
    }

    /// The database's clock now, in microseconds since the epoch, estimated from the
    /// claim's time and this process's monotonic clock since.
    pub(crate) fn db_now_us(&self) -> Option<i64> {
        let (at_claim, claimed) = self.db_clock?;
        let elapsed = i64::try_from(claimed.elapsed().as_micros()).unwrap_or(i64::MAX);
        Some(at_claim.saturating_add(elapsed))
    }
}

/// The handler's transaction in transaction mode.
pub(crate) enum TxSlot {
    /// The handler has not asked for it yet.
    Unopened,
    /// Open: the handler's writes so far.
    Open(Transaction<'static, Postgres>),
    /// The handler has returned; the runtime took the transaction.
    Closed,
}

impl fmt::Debug for JobContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("id", &self.inner.id)
            .field("kind", &self.inner.kind)
            .field("attempt", &self.inner.attempt)
            .field("token", &self.inner.token)
            .finish_non_exhaustive()
    }
}

impl JobContext {
    /// The job's id (the `id` column).
    pub fn id(&self) -> i64 {
        self.inner.id
    }

    /// The job's kind.
    pub fn kind(&self) -> &'static str {
        self.inner.kind
    }

    /// Which attempt this is, counting from 1.
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// The kind's maximum attempts.
    pub fn max_attempts(&self) -> u32 {
        self.inner.max_attempts
    }

    /// The current claim's token (the `claimed_by` column).
    pub fn claim_token(&self) -> Uuid {
        self.inner.token
    }

    /// The job's earlier failed attempts, oldest first (the last 20): what each came
    /// to, when, which runtime ran it, and its error. Empty if none failed. The history
    /// stays with the row: a job an operator retried, or whose attempt budget a
    /// coalesced trigger renewed, keeps its earlier entries (their attempt numbers
    /// start again with the budget). One query on [`pool`](Self::pool).
    ///
    /// ```no_run
    /// # async fn f(ctx: jobs::JobContext) -> Result<(), jobs::JobError> {
    /// if let Some(last) = ctx.previous_errors().await?.last() {
    ///     tracing::info!(attempt = last.attempt, kind = %last.kind, "retrying after: {}", last.message);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn previous_errors(&self) -> Result<Vec<crate::AttemptError>, JobError> {
        let row = crate::pooler::alone!(
            &self.inner.pool,
            crate::pooler::query(crate::history::HISTORY).bind(self.inner.id),
            fetch_optional
        )
        .await?;
        Ok(match row {
            Some(row) => crate::history::from_row(&row)?,
            None => Vec::new(),
        })
    }

    /// Stores `value` as the job's progress, for a later attempt to resume from
    /// ([`last_checkpoint`](Self::last_checkpoint)); each call replaces the last.
    ///
    /// Fenced like every write of a claim: if the claim is no longer this run's (the
    /// lease was lost, or the job completed), nothing is written and this returns a
    /// lease-lost error. It commits on its own, at once, on [`pool`](Self::pool): store
    /// a checkpoint after the work it records has committed. With a fenced transaction
    /// open it returns an error (the transaction holds the job's row, and completes the
    /// job anyway). In transaction mode it commits apart from the handler's transaction,
    /// which may still roll back: there, checkpoint only work done outside it. The
    /// checkpoint is cleared when the job goes back to pending as a new request: a
    /// re-run after success, a periodic re-arm, or a trigger coalesced into the pending
    /// job; a retry and an operator's retry keep it.
    ///
    /// ```no_run
    /// # use jobs::{Job, JobContext, JobError};
    /// # #[derive(Job, serde::Serialize, serde::Deserialize)]
    /// # #[job(kind = "feed.import", key = "feed_id")]
    /// # struct ImportFeed { feed_id: i64 }
    /// # async fn items(_feed: i64) -> Vec<u64> { vec![] }
    /// # async fn import(_item: u64) -> Result<(), std::io::Error> { Ok(()) }
    /// #[jobs::handler]
    /// async fn import_feed(job: ImportFeed, ctx: JobContext) -> Result<(), JobError> {
    ///     // Where the last attempt got to, if it got anywhere.
    ///     let done: u64 = ctx.last_checkpoint().await?.unwrap_or(0);
    ///     for item in items(job.feed_id).await.into_iter().filter(|i| *i > done) {
    ///         import(item).await?;
    ///         ctx.checkpoint(&item).await?;
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub async fn checkpoint<T: serde::Serialize + ?Sized>(
        &self,
        value: &T,
    ) -> Result<(), JobError> {
        if self.inner.fence_open.load(Ordering::Acquire) {
            return Err(JobError::permanent(
                "checkpoint() while a fenced transaction of the job is open: the transaction holds the job's row and completes the job",
            ));
        }
        if self.inner.completed.load(Ordering::Acquire) {
            return Err(JobError::lease_lost());
        }
        let json = serde_json::to_string(value)
            .map_err(|e| JobError::permanent(format!("the checkpoint does not serialize: {e}")))?;
        let stored: Option<i64> = crate::pooler::alone!(
            &self.inner.pool,
            crate::pooler::query_scalar(crate::sql::CHECKPOINT)
                .bind(self.inner.id)
                .bind(self.inner.token)
                .bind(json),
            fetch_optional
        )
        .await?;
        stored.map(drop).ok_or_else(JobError::lease_lost)
    }

    /// The last checkpoint stored for this job ([`checkpoint`](Self::checkpoint)), by
    /// this attempt or an earlier one; `None` if there is none. A stored value that does
    /// not deserialize into `T` (its type changed) is a permanent error naming serde's
    /// complaint. One query on [`pool`](Self::pool).
    pub async fn last_checkpoint<T: serde::de::DeserializeOwned>(
        &self,
    ) -> Result<Option<T>, JobError> {
        let stored: Option<Option<sqlx::types::Json<Box<serde_json::value::RawValue>>>> =
            crate::pooler::alone!(
                &self.inner.pool,
                crate::pooler::query_scalar(crate::sql::LAST_CHECKPOINT).bind(self.inner.id),
                fetch_optional
            )
            .await?;
        match stored.flatten() {
            None => Ok(None),
            Some(raw) => serde_json::from_str(raw.get()).map(Some).map_err(|e| {
                JobError::permanent(format!(
                    "the checkpoint of job {} does not deserialize: {e}",
                    self.inner.id
                ))
            }),
        }
    }

    /// Whether an operator cancelled the job ([`jobs::admin::cancel`](crate::admin::cancel)).
    /// The runtime drops the handler's future at its next await point once it learns
    /// of the cancel (at once by notification, or at the next lease renewal); a handler
    /// that polls this in a long loop without awaiting can stop sooner.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::Acquire)
    }

    /// The pool the runtime claims from.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// Whether the claim is known or presumed lost: another runtime took the job over,
    /// or its lease may have ended, because no renewal answered for (nearly) a lease.
    /// The latter is measured on this process's monotonic clock from when the last
    /// renewal that answered was sent, so it turns true before the database could
    /// give the job to another claim, whether or not the runtime can reach the
    /// database. A handler that keeps running past this must not write results except
    /// through [`fenced_tx`](Self::fenced_tx), which will refuse them.
    pub fn is_lease_lost(&self) -> bool {
        *self.inner.lost.borrow() || self.inner.past_deadline()
    }

    /// Resolves when the claim is lost; never resolves while it is held.
    pub async fn lease_lost(&self) {
        let mut rx = self.inner.lost.clone();
        if rx.wait_for(|lost| *lost).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Opens a transaction that has verified and locked this claim.
    ///
    /// Write the job's results through it (`&mut *tx` is a `PgConnection`), then call
    /// [`FencedTx::commit`]: the results and the job's completion commit together, or
    /// neither does. If the claim is no longer this handler's (the lease expired and the
    /// job was taken over, or it was completed already), this returns a lease-lost error
    /// and nothing is written. Keep the transaction short: while it is open it holds the
    /// job's row lock, and the runtime does not renew the lease.
    ///
    /// Dropped without [`FencedTx::commit`], the transaction rolls back, and the run
    /// cannot complete the job: a handler that then returns `Ok(())` is recorded as a
    /// failed attempt (its writes were lost) and the job is retried. Call
    /// [`FencedTx::rollback`] to roll back on purpose.
    ///
    /// In transaction mode this returns a permanent error: use [`tx`](Self::tx) there.
    ///
    /// ```no_run
    /// use jobs::sqlx;
    /// # use jobs::{Job, JobContext, JobError};
    /// # #[derive(Job, serde::Serialize, serde::Deserialize)]
    /// # #[job(kind = "score.compute", key = "user_id")]
    /// # struct ComputeScore { user_id: i64 }
    /// # async fn compute(_user_id: i64) -> Result<i64, std::io::Error> { Ok(0) }
    /// #[jobs::handler]
    /// async fn compute_score(job: ComputeScore, ctx: JobContext) -> Result<(), JobError> {
    ///     let score = compute(job.user_id).await?; // outside the transaction
    ///     let mut tx = ctx.fenced_tx().await?; // a lease-lost error if the claim is gone
    ///     sqlx::query("UPDATE users SET score = $2 WHERE id = $1")
    ///         .bind(job.user_id)
    ///         .bind(score)
    ///         .execute(&mut *tx)
    ///         .await?;
    ///     tx.commit().await?; // the score and the job's completion, or neither
    ///     Ok(())
    /// }
    /// ```
    pub async fn fenced_tx(&self) -> Result<FencedTx, JobError> {
        if self.inner.tx.is_some() {
            return Err(JobError::permanent(
                "fenced_tx() is for kinds with a heartbeat lease; in transaction mode use ctx.tx()",
            ));
        }
        if self.inner.completed.load(Ordering::Acquire) {
            return Err(JobError::lease_lost());
        }
        if self.inner.fence_open.swap(true, Ordering::AcqRel) {
            return Err(JobError::permanent(
                "a fenced transaction of this job is already open",
            ));
        }
        let guard = FenceFlag(self.clone());
        let mut tx = self.inner.pool.begin().await?;
        // Until the row is locked the heartbeat keeps renewing the claim (the lock may
        // take a while: an application's transaction can hold the row).
        let locked: Option<(i64,)> = crate::pooler::query_as(crate::sql::FENCE)
            .bind(self.inner.id)
            .bind(self.inner.token)
            .fetch_optional(&mut *tx)
            .await?;
        if locked.is_none() {
            return Err(JobError::lease_lost());
        }
        self.inner.fenced.store(true, Ordering::Release);
        Ok(FencedTx {
            tx: Some(tx),
            flag: guard,
        })
    }

    /// The handler's transaction, in transaction mode (`lease = "transaction"`).
    ///
    /// Opened at the first call; every later call returns the same transaction.
    /// Everything written through it commits together with the job's completion when
    /// the handler returns `Ok(())`: the runtime then locks the job's row in this
    /// transaction, checks that the claim is still this run's, completes the job and
    /// commits. If the claim is gone, or the handler fails, the transaction rolls back.
    /// The row is not locked while the handler works, so enqueues of the job's key never
    /// wait for it. Lock the guard, use it, and let it go before the handler returns.
    ///
    /// With a heartbeat lease this returns a permanent error: use
    /// [`fenced_tx`](Self::fenced_tx) there.
    ///
    /// ```no_run
    /// use jobs::sqlx;
    /// # use jobs::{Job, JobContext, JobError};
    /// # #[derive(Job, serde::Serialize, serde::Deserialize)]
    /// # #[job(kind = "order.close", key = "order_id", lease = "transaction")]
    /// # struct CloseOrder { order_id: i64 }
    /// #[jobs::handler]
    /// async fn close_order(job: CloseOrder, ctx: JobContext) -> Result<(), JobError> {
    ///     let mut tx = ctx.tx().await?;
    ///     sqlx::query("UPDATE orders SET closed = true WHERE id = $1")
    ///         .bind(job.order_id)
    ///         .execute(&mut *tx)
    ///         .await?;
    ///     sqlx::query("INSERT INTO order_events (order_id, event) VALUES ($1, 'closed')")
    ///         .bind(job.order_id)
    ///         .execute(&mut *tx)
    ///         .await?;
    ///     // Returning Ok(()) commits both writes with the job's completion; an error
    ///     // (or a lost claim) rolls them back.
    ///     Ok(())
    /// }
    /// ```
    pub async fn tx(&self) -> Result<TxGuard<'_>, JobError> {
        let Some(slot) = &self.inner.tx else {
            return Err(JobError::permanent(
                "tx() is for kinds with lease = \"transaction\"; with a heartbeat lease use ctx.fenced_tx()",
            ));
        };
        let mut guard = slot.lock().await;
        match &*guard {
            TxSlot::Open(_) => {}
            TxSlot::Unopened => *guard = TxSlot::Open(self.inner.pool.begin().await?),
            TxSlot::Closed => {
                return Err(JobError::permanent(
                    "the job's transaction is over: the handler has returned",
                ));
            }
        }
        Ok(TxGuard { guard })
    }
}

/// Clears the "fenced transaction open" flag when the transaction ends.
struct FenceFlag(JobContext);

impl Drop for FenceFlag {
    fn drop(&mut self) {
        self.0.inner.fenced.store(false, Ordering::Release);
        self.0.inner.fence_open.store(false, Ordering::Release);
    }
}

/// A transaction that holds this job's claim; see [`JobContext::fenced_tx`].
///
/// It dereferences to a [`PgConnection`]: run statements on `&mut *tx`. Dropped without
/// [`commit`](Self::commit), it rolls back, and the run cannot complete the job.
///
/// ```no_run
/// use jobs::sqlx;
/// # use jobs::{Job, JobContext, JobError};
/// # #[derive(Job, serde::Serialize, serde::Deserialize)]
/// # #[job(kind = "feed.import", key = "feed_id")]
/// # struct ImportFeed { feed_id: i64, items: Vec<String> }
/// #[jobs::handler]
/// async fn import_feed(job: ImportFeed, ctx: JobContext) -> Result<(), JobError> {
///     let mut tx = ctx.fenced_tx().await?;
///     let open: bool = sqlx::query_scalar("SELECT open FROM feeds WHERE id = $1")
///         .bind(job.feed_id)
///         .fetch_one(&mut *tx)
///         .await?;
///     if !open {
///         // Nothing to write: roll back on purpose and say why.
///         tx.rollback().await?;
///         return Err(JobError::permanent("the feed is closed"));
///     }
///     for item in &job.items {
///         sqlx::query("INSERT INTO feed_items (feed_id, item) VALUES ($1, $2)")
///             .bind(job.feed_id)
///             .bind(item)
///             .execute(&mut *tx)
///             .await?;
///     }
///     tx.commit().await?;
///     Ok(())
/// }
/// ```
pub struct FencedTx {
    tx: Option<Transaction<'static, Postgres>>,
    flag: FenceFlag,
}

impl fmt::Debug for FencedTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedTx")
            .field("job", &self.flag.0)
            .finish()
    }
}

impl FencedTx {
    /// Completes the job inside the transaction and commits both.
    ///
    /// Fails with a lease-lost error (and writes nothing) if the claim is gone.
    pub async fn commit(mut self) -> Result<(), JobError> {
        let ctx = self.flag.0.clone();
        let mut tx = self
            .tx
            .take()
            .expect("a FencedTx holds its transaction until commit");
        let result = async {
            if !completer::complete_one(&mut tx, &ctx.inner).await? {
                return Err(JobError::lease_lost());
            }
            tx.commit().await?;
            Ok(())
        }
        .await;
        match &result {
            Ok(()) => ctx.inner.completed.store(true, Ordering::Release),
            // Nothing was written: a handler that returns Ok(()) anyway does not
            // complete the job.
            Err(_) => ctx.inner.fence_dropped.store(true, Ordering::Release),
        }
        result
    }

    /// Rolls the transaction back; the job stays claimed by this handler.
    pub async fn rollback(mut self) -> Result<(), JobError> {
        if let Some(tx) = self.tx.take() {
            tx.rollback().await?;
        }
        Ok(())
    }
}

impl Drop for FencedTx {
    fn drop(&mut self) {
        // Still holding the transaction: neither committed nor rolled back on purpose.
        if self.tx.is_some() {
            self.flag
                .0
                .inner
                .fence_dropped
                .store(true, Ordering::Release);
        }
    }
}

impl Deref for FencedTx {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        self.tx
            .as_deref()
            .expect("a FencedTx holds its transaction until commit")
    }
}

impl DerefMut for FencedTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.tx
            .as_deref_mut()
            .expect("a FencedTx holds its transaction until commit")
    }
}

/// The handler's transaction in transaction mode; see [`JobContext::tx`].
pub struct TxGuard<'a> {
    guard: MutexGuard<'a, TxSlot>,
}

impl fmt::Debug for TxGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TxGuard")
    }
}

impl Deref for TxGuard<'_> {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match &*self.guard {
            TxSlot::Open(tx) => tx,
            _ => unreachable!("a TxGuard is made only over an open transaction"),
        }
    }
}

impl DerefMut for TxGuard<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match &mut *self.guard {
            TxSlot::Open(tx) => tx,
            _ => unreachable!("a TxGuard is made only over an open transaction"),
        }
    }
}

/// How a handler says that its attempt did not succeed.
///
/// Any error type converts into a retryable failure, so `?` works in handlers:
/// the job is retried after a backoff until it runs out of attempts. The constructors
/// say something else: fail for good, snooze, or report a lost lease.
///
/// ```
/// use std::time::Duration;
///
/// use jobs::{Job, JobContext, JobError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Job, Serialize, Deserialize)]
/// #[job(kind = "webhook.deliver", backoff = "5s")]
/// struct Deliver {
///     url: String,
/// }
///
/// # fn in_maintenance() -> bool { false }
/// # async fn post(_url: &str) -> Result<(), std::io::Error> { Ok(()) }
/// #[jobs::handler]
/// async fn deliver(job: Deliver, ctx: JobContext) -> Result<(), JobError> {
///     if !job.url.starts_with("https://") {
///         // Retrying will not help: the job becomes `failed` now.
///         return Err(JobError::permanent(format!("not an https URL: {}", job.url)));
///     }
///     if in_maintenance() {
///         // Not a failure: run again in ten minutes, same attempt count.
///         return Err(JobError::snooze(Duration::from_secs(600)));
///     }
///     post(&job.url).await?; // an error here is retried after a backoff
///     if ctx.is_lease_lost() {
///         return Err(JobError::lease_lost());
///     }
///     Ok(())
/// }
///
/// let retried = JobError::from(std::io::Error::other("connection reset"));
/// assert!(!retried.is_permanent());
/// assert_eq!(retried.to_string(), "connection reset");
/// assert!(JobError::permanent("bad input").is_permanent());
/// assert!(JobError::lease_lost().is_lease_lost());
/// ```
pub struct JobError {
    pub(crate) kind: JobErrorKind,
}

#[derive(Debug)]
pub(crate) enum JobErrorKind {
    Retry(String),
    Permanent(String),
    /// The payload does not deserialize: permanent, recorded as its own kind of failure.
    Payload(String),
    Snooze(Duration),
    LeaseLost,
    /// The handler cancelled its job: `cancelled`, not retried.
    Cancel(String),
}

impl JobError {
    /// A failure to retry after a backoff (what `?` gives).
    pub fn retry(message: impl fmt::Display) -> Self {
        JobError {
            kind: JobErrorKind::Retry(message.to_string()),
        }
    }

    /// A failure not worth retrying: the job becomes `failed` at once.
    pub fn permanent(message: impl fmt::Display) -> Self {
        JobError {
            kind: JobErrorKind::Permanent(message.to_string()),
        }
    }

    /// The job is not to be done at all: it becomes `cancelled` at once, not retried,
    /// with `reason` as its last error and in its attempt history, and is kept like a
    /// failed job. As with a permanent failure, a trigger that arrived while it ran (a
    /// re-run mark) still runs; a periodic kind's job waits for its next period.
    pub fn cancel(reason: impl fmt::Display) -> Self {
        JobError {
            kind: JobErrorKind::Cancel(reason.to_string()),
        }
    }

    /// Whether this is [`JobError::cancel`].
    pub fn is_cancel(&self) -> bool {
        matches!(self.kind, JobErrorKind::Cancel(_))
    }

    /// Not a failure: run the job again after `delay`, without spending an attempt.
    pub fn snooze(delay: Duration) -> Self {
        JobError {
            kind: JobErrorKind::Snooze(delay),
        }
    }

    /// The claim was lost; the runtime writes nothing for this attempt.
    pub fn lease_lost() -> Self {
        JobError {
            kind: JobErrorKind::LeaseLost,
        }
    }

    /// Whether this reports a lost claim.
    pub fn is_lease_lost(&self) -> bool {
        matches!(self.kind, JobErrorKind::LeaseLost)
    }

    /// Whether this fails the job for good.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self.kind,
            JobErrorKind::Permanent(_) | JobErrorKind::Payload(_)
        )
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            JobErrorKind::Retry(m) => f.write_str(m),
            JobErrorKind::Permanent(m) | JobErrorKind::Payload(m) => {
                write!(f, "permanent failure: {m}")
            }
            JobErrorKind::Snooze(d) => write!(f, "snoozed for {d:?}"),
            JobErrorKind::LeaseLost => f.write_str("the job's lease was lost"),
            JobErrorKind::Cancel(m) => write!(f, "cancelled: {m}"),
        }
    }
}

impl fmt::Debug for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("JobError").field(&self.kind).finish()
    }
}

impl<E> From<E> for JobError
where
    E: std::error::Error + Send + Sync + 'static,
{
    fn from(error: E) -> Self {
        // The message with its chain of sources: "outer: inner: root".
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(s) = source {
            let text = s.to_string();
            if !message.ends_with(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = s.source();
        }
        JobError::retry(message)
    }
}
