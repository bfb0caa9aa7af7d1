//! The executor: runs one claimed job (timeout, panic capture, lease loss, shutdown)
//! and writes its outcome.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio::sync::{Mutex, watch};
use tracing::Instrument;
use uuid::Uuid;

use super::backoff::Backoff;
use super::completer::{self, Completion};
use super::{Flight, Shared, observe};
use crate::context::{Inner, JobContext, JobErrorKind, TxSlot};
use crate::enqueue::millis;
use crate::history::FailureKind;
use crate::registry::{HandlerInfo, HandlerInput};
use crate::sql;

/// A job as the claim returned it.
pub(crate) struct Claimed {
    pub id: i64,
    pub attempt: u32,
    pub max_attempts: u32,
    pub token: Uuid,
    pub payload: String,
    /// The enqueuer's trace context, which the run's span continues (`crate::trace`).
    pub trace: Option<String>,
    /// When the claim's statement was sent: its lease runs from a moment after it.
    pub claimed_at: Instant,
    /// For a kind with a rate, how long after `claimed_at` it may start at the latest
    /// (`global::start_margin`, logged with the claim's starts).
    pub start_within: Option<Duration>,
    /// The database's clock at the claim, in microseconds since the epoch (for the next
    /// fire time of a cron kind).
    pub db_claimed_us: Option<i64>,
}

/// How one run of a handler ended.
enum Outcome {
    Succeeded,
    Retry(FailureKind, String),
    Permanent(FailureKind, String),
    Snooze(Duration),
    LeaseLost,
    /// An operator cancelled the job: its row is `cancelled` already, nothing to write.
    Cancelled,
    /// Shutdown grace elapsed: the job is handed back.
    Stopped,
}

impl Outcome {
    /// What a handler's error comes to.
    fn of(error: &JobErrorKind) -> Self {
        match error {
            JobErrorKind::Retry(m) => Outcome::Retry(FailureKind::Error, m.clone()),
            JobErrorKind::Permanent(m) => Outcome::Permanent(FailureKind::Permanent, m.clone()),
            JobErrorKind::Payload(m) => Outcome::Permanent(FailureKind::Payload, m.clone()),
            JobErrorKind::Snooze(d) => Outcome::Snooze(*d),
            JobErrorKind::LeaseLost => Outcome::LeaseLost,
            JobErrorKind::Cancel(m) => Outcome::Permanent(FailureKind::Cancelled, m.clone()),
        }
    }

    /// What the run came to, as recorded on the span and in the metrics.
    fn label(&self, job: &Claimed) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Permanent(FailureKind::Cancelled, _) => "cancelled",
            Outcome::Retry(..) if job.attempt < job.max_attempts => "retried",
            Outcome::Retry(..) | Outcome::Permanent(..) => "failed",
            Outcome::Snooze(_) => "snoozed",
            Outcome::LeaseLost => "lease_lost",
            Outcome::Cancelled => "cancelled",
            Outcome::Stopped => "handed_back",
        }
    }
}

impl Claimed {
    /// The state a handler's context and the runtime share for this claim.
    fn context(
        &self,
        handler: &'static HandlerInfo,
        pool: &sqlx::PgPool,
        lost: watch::Receiver<bool>,
    ) -> Arc<Inner> {
        Arc::new(Inner {
            id: self.id,
            kind: handler.kind,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            token: self.token,
            config: handler.config,
            pool: pool.clone(),
            lost,
            fence_open: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            fence_dropped: AtomicBool::new(false),
            completed: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            cancelled: AtomicBool::new(false),
            db_clock: self.db_claimed_us.map(|us| (us, self.claimed_at)),
            tx: handler
                .config
                .is_transaction()
                .then(|| Mutex::new(TxSlot::Unopened)),
            renewed: std::sync::Mutex::new(self.claimed_at),
            output: std::sync::Mutex::new(None),
        })
    }
}

pub(crate) async fn execute(shared: Arc<Shared>, handler: &'static HandlerInfo, job: Claimed) {
    // With OpenTelemetry's semantic conventions for messaging: a consumer's span that
    // processes one message (the job) of a destination (its kind).
    let span = tracing::info_span!(
        "job",
        job.id = job.id,
        job.kind = handler.kind,
        job.attempt = job.attempt,
        job.outcome = tracing::field::Empty,
        otel.name = format!("process {}", handler.kind),
        otel.kind = "consumer",
        messaging.system = "jobs",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = handler.kind,
        messaging.message.id = job.id,
    );
    crate::trace::continue_in(&span, job.trace.as_deref(), job.attempt);
    let kind = handler.kind;
    let completer_writes = run(shared.clone(), handler, job).instrument(span).await;
    if !completer_writes {
        shared.ended_run(kind);
    }
    shared.give_slot(kind);
}

/// Runs a claim to its end; returns whether its outcome went to the completer (which
/// writes it later), rather than written here.
async fn run(shared: Arc<Shared>, handler: &'static HandlerInfo, mut job: Claimed) -> bool {
    let (lost_tx, lost_rx) = watch::channel(false);
    let inner = job.context(handler, &shared.pool, lost_rx);
    // The claim is renewed from here until its outcome is written (by this executor,
    // or by the completer for a success), in every lease mode.
    shared.flights.lock().expect("lock poisoned").insert(
        job.token,
        Flight {
            ctx: inner.clone(),
            lost: lost_tx,
        },
    );
    let ctx = JobContext {
        inner: inner.clone(),
    };

    // A claim taken ahead of a free slot waits here for one, its lease renewed
    // meanwhile. If shutdown begins first, or no slot frees within `SLOT_WAIT_MAX`, it
    // is handed back unstarted (its attempt not counted); if its lease is lost
    // meanwhile it never starts.
    let slot = slot(&shared, handler.kind, &inner)
        .await
        .and_then(|slot| in_time(&job).map(|()| slot));
    let _slot = match slot {
        Ok(slot) => slot,
        Err(outcome) => {
            inner.finished.store(true, Ordering::Release);
            let label = outcome.label(&job);
            tracing::Span::current().record("job.outcome", label);
            observe::finished(&shared.counts, handler.kind, label, None);
            if let Some(now) = inner.db_now_us() {
                shared.throughput.record(handler.kind, now, label, None);
            }
            tracing::debug!(outcome = label, "claim ended before its handler started");
            return finish(&shared, &inner, outcome).await;
        }
    };

    let started = Instant::now();
    let payload = std::mem::take(&mut job.payload);
    let mut outcome = run_handler(&shared, handler, payload, ctx.clone()).await;
    inner.finished.store(true, Ordering::Release);
    outcome = settle(&inner, outcome).await;
    let label = outcome.label(&job);
    tracing::Span::current().record("job.outcome", label);
    if let (Some(log), Outcome::Retry(kind, message) | Outcome::Permanent(kind, message)) =
        (&shared.failures, &outcome)
    {
        let at = inner
            .db_now_us()
            .and_then(chrono::DateTime::from_timestamp_micros)
            .unwrap_or_default();
        log.lock().expect("lock poisoned").push((
            job.id,
            handler.kind,
            crate::AttemptError {
                attempt: job.attempt,
                at,
                kind: *kind,
                message: message.clone(),
                runtime: Some(shared.runtime_id),
            },
        ));
    }
    let took = started.elapsed();
    observe::finished(&shared.counts, handler.kind, label, Some(took));
    if let Some(now) = inner.db_now_us() {
        shared
            .throughput
            .record(handler.kind, now, label, Some(took));
    }
    match &outcome {
        Outcome::Succeeded => tracing::debug!("job succeeded"),
        // The id and kind on the event itself, not only on the span: a subscriber that
        // shows no spans (or only this level) still says which job failed.
        Outcome::Retry(kind, e) | Outcome::Permanent(kind, e) => {
            tracing::warn!(job.id = job.id, job.kind = handler.kind, error = %e, failure = %kind, "job failed")
        }
        Outcome::LeaseLost => tracing::warn!(
            job.id = job.id,
            job.kind = handler.kind,
            "job's lease was lost: another runtime may run it; nothing written"
        ),
        Outcome::Cancelled => tracing::info!("job cancelled by an operator; handler dropped"),
        Outcome::Snooze(d) => tracing::debug!(delay = ?d, "job snoozed"),
        Outcome::Stopped => tracing::info!("job handed back at shutdown"),
    }

    // A failed, snoozed or re-run-marked job may be claimable again at once: claim it
    // without waiting for the next poll.
    let may_be_due = matches!(
        outcome,
        Outcome::Retry(..) | Outcome::Permanent(..) | Outcome::Snooze(_)
    );
    let completer_writes = finish(&shared, &inner, outcome).await;
    if may_be_due {
        shared.wake.name([handler.kind]);
    }
    completer_writes
}

/// How long a claim waits for a slot before it goes back unstarted. A claim taken
/// ahead waits about `AHEAD_FOR` (50 ms) when the kind's jobs keep their pace; one that
/// waits a second sits behind handlers that stopped finishing (longer jobs than the
/// rate promised, or a handler that hangs), and another runtime may have free slots:
/// it is handed back (`RELEASE`, no attempt spent) rather than kept, leased and renewed,
/// for as long as those handlers take.
const SLOT_WAIT_MAX: Duration = Duration::from_secs(1);

/// The permits a running handler holds: one of the runtime's slots, and one of its
/// kind's when the kind has a concurrency of its own.
type Slot = (
    Option<tokio::sync::OwnedSemaphorePermit>,
    tokio::sync::OwnedSemaphorePermit,
);

/// Waits for a free slot for a claim of `kind`, or for a reason not to run it:
/// shutdown, a lost lease, or no slot within `SLOT_WAIT_MAX`.
async fn slot(shared: &Shared, kind: &str, job: &Inner) -> Result<Slot, Outcome> {
    let mut stopping = shared.stopping.clone();
    let mut hard_stop = shared.hard_stop.clone();
    let mut lost = job.lost.clone();
    let acquire = async {
        // The kind's permit first: a claim holding a runtime slot never waits for its
        // kind's, so that other kinds' claims are not kept from running.
        let own = match shared.kind_slots.get(kind) {
            Some(s) => Some(s.clone().acquire_owned().await),
            None => None,
        };
        let any = shared.slots.clone().acquire_owned().await;
        // No handler starts on a claim whose lease cannot be renewed.
        let _ = shared.renewing.clone().wait_for(|ok| *ok).await;
        (own, any)
    };
    tokio::select! {
        biased;
        _ = stopping.wait_for(|stop| *stop) => Err(Outcome::Stopped),
        _ = hard_stop.wait_for(|stop| *stop) => Err(Outcome::Stopped),
        _ = lost.wait_for(|lost| *lost) => Err(if job.cancelled.load(Ordering::Acquire) {
            Outcome::Cancelled
        } else {
            Outcome::LeaseLost
        }),
        (own, any) = acquire => match (own.transpose(), any) {
            (Ok(own), Ok(any)) => Ok((own, any)),
            // The semaphores are never closed.
            _ => Err(Outcome::Stopped),
        },
        () = tokio::time::sleep(SLOT_WAIT_MAX) => Err(Outcome::Stopped),
    }
}

/// Whether a claim may start now: one of a kind with a rate only within the margin its
/// claim logged ([`super::global::start_margin`]); a later one goes back unstarted, its
/// attempt not spent, so that the rate holds at the handlers' starts.
fn in_time(job: &Claimed) -> Result<(), Outcome> {
    match job.start_within {
        Some(margin) if job.claimed_at.elapsed() >= margin => {
            tracing::debug!(
                job.id = job.id,
                margin_ms = margin.as_millis() as u64,
                "not started within the rate's margin of its claim: handed back"
            );
            Err(Outcome::Stopped)
        }
        _ => Ok(()),
    }
}

/// Ends a transaction-mode run. On success with an open transaction: lock the job's
/// row in that transaction, check the claim is still this run's, complete the job and
/// commit, all in one transaction, so the handler's writes and the completion commit
/// together or not at all. Otherwise the transaction rolls back, and the outcome is
/// written like any other (fenced by the claim's token).
async fn commit_transaction(job: &Inner, outcome: Outcome) -> Outcome {
    let slot = job.tx.as_ref().expect("transaction mode");
    let tx = match std::mem::replace(&mut *slot.lock().await, TxSlot::Closed) {
        TxSlot::Open(tx) => tx,
        // The handler wrote nothing: the completer completes it like any other.
        TxSlot::Unopened | TxSlot::Closed => return outcome,
    };
    if !matches!(outcome, Outcome::Succeeded) {
        drop(tx); // rolls back the handler's writes
        return outcome;
    }
    let mut tx = tx;
    let result: Result<bool, sqlx::Error> = async {
        let locked: Option<(i64,)> = crate::pooler::query_as(sql::FENCE)
            .bind(job.id)
            .bind(job.token)
            .fetch_optional(&mut *tx)
            .await?;
        if locked.is_none() || !completer::complete_one(&mut tx, job).await? {
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }
    .await;
    match result {
        Ok(true) => {
            job.completed.store(true, Ordering::Release);
            Outcome::Succeeded
        }
        Ok(false) => {
            tracing::warn!(
                "the claim was lost before the job's transaction committed; its writes were rolled back"
            );
            Outcome::LeaseLost
        }
        // The transaction rolled back (or, if the commit's answer was lost, may have
        // committed: then the failure written next is refused by its token).
        Err(e) => Outcome::Retry(
            FailureKind::Error,
            format!("cannot commit the job's transaction: {e}"),
        ),
    }
}

async fn run_handler(
    shared: &Shared,
    handler: &'static HandlerInfo,
    payload: String,
    ctx: JobContext,
) -> Outcome {
    let cancel_on_loss = ctx.inner.config.cancel_on_lease_loss;
    let timeout = ctx.inner.config.timeout;
    let future = (handler.call)(HandlerInput {
        payload,
        ctx: ctx.clone(),
    });
    let mut guarded = std::pin::pin!(AssertUnwindSafe(future).catch_unwind());
    // Each time the handler resumes, its lease's deadline is checked first: a process
    // frozen past it (SIGSTOP, a paused VM) drops the handler at its next await, even
    // before the heartbeat's thread has run again.
    let inner = ctx.inner.clone();
    let checked = std::future::poll_fn(move |cx| {
        if cancel_on_loss && inner.past_deadline() {
            return std::task::Poll::Ready(None);
        }
        guarded.as_mut().poll(cx).map(Some)
    });
    let timed = async {
        match timeout {
            Some(limit) => tokio::time::timeout(limit, checked).await.ok(),
            None => Some(checked.await),
        }
    };
    let mut hard_stop = shared.hard_stop.clone();
    tokio::select! {
        result = timed => match result {
            None => Outcome::Retry(FailureKind::Timeout, format!(
                "timed out after {:?}",
                timeout.unwrap_or_default()
            )),
            Some(None) => Outcome::LeaseLost,
            Some(Some(Ok(Ok(())))) => Outcome::Succeeded,
            Some(Some(Ok(Err(e)))) => Outcome::of(&e.kind),
            Some(Some(Err(panic))) => Outcome::Retry(
                FailureKind::Panic,
                format!("handler panicked: {}", panic_message(&*panic)),
            ),
        },
        outcome = stop_signal(&ctx, cancel_on_loss) => outcome,
        _ = hard_stop.wait_for(|stop| *stop) => Outcome::Stopped,
    }
}

/// What a run that ended with `outcome` comes to once its transaction is settled: in
/// transaction mode the handler's transaction commits with the completion (or rolls
/// back); otherwise a success after a fenced transaction dropped without `commit()` is
/// a failed attempt (its writes were rolled back).
async fn settle(job: &Inner, outcome: Outcome) -> Outcome {
    if job.config.is_transaction() {
        return commit_transaction(job, outcome).await;
    }
    if matches!(outcome, Outcome::Succeeded)
        && job.fence_dropped.load(Ordering::Acquire)
        && !job.completed.load(Ordering::Acquire)
    {
        return Outcome::Retry(
            FailureKind::Error,
            "the handler returned Ok(()) after a fenced transaction of this run ended without \
             commit(): its writes were rolled back, so the job is not complete"
                .to_owned(),
        );
    }
    outcome
}

/// Resolves when the handler is to be dropped: the job was cancelled by an operator,
/// or its lease was lost and the kind cancels on lease loss. A lost lease without
/// cancelling keeps waiting, for a cancel that may still come.
async fn stop_signal(ctx: &JobContext, cancel_on_loss: bool) -> Outcome {
    let mut lost = ctx.inner.lost.clone();
    loop {
        if *lost.borrow_and_update() {
            if ctx.inner.cancelled.load(Ordering::Acquire) {
                return Outcome::Cancelled;
            }
            if cancel_on_loss {
                return Outcome::LeaseLost;
            }
        }
        if lost.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

pub(super) fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

/// Writes the outcome of a claim, fenced by its token, and lets go of the claim's
/// flight once it is written. A success goes to the completer, which lets go of the
/// flight itself once the completion is written, so the lease is renewed until then. A
/// database error is retried until the lease has surely run out (after that the write
/// would be refused anyway, and the rescuer returns the job). Returns whether the
/// outcome went to the completer.
async fn finish(shared: &Shared, job: &Inner, outcome: Outcome) -> bool {
    let forget = || {
        shared
            .flights
            .lock()
            .expect("lock poisoned")
            .remove(&job.token);
    };
    if job.completed.load(Ordering::Acquire) {
        forget(); // completed together with the handler's writes
        return false;
    }
    if let Outcome::Succeeded = outcome {
        let mut completion = Completion {
            limited: shared.shares(job.kind).then_some(job.kind),
            ..Completion::of(job)
        };
        if completion.limited.is_some() && !completion.keep && completion.every_ms.is_none() {
            completion.hand_off = shared.hand_off(job.kind, job.config.lease_length());
        }
        if shared.completions.send(completion).await.is_err() {
            tracing::error!("completer stopped; the job will run again after its lease");
            forget();
            return false;
        }
        return true;
    }
    if let Outcome::LeaseLost | Outcome::Cancelled = outcome {
        forget();
        return false;
    }
    let lease = job.config.lease_length();
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
    loop {
        let result = super::answer_within(
            shared.answer_within,
            "the job's outcome",
            write_outcome(&shared.db, job, &outcome),
        )
        .await;
        match result {
            Ok(true) => break,
            Ok(false) => {
                tracing::warn!(
                    "outcome refused: the claim is gone (it expired, or an operator cancelled the job)"
                );
                break;
            }
            Err(e) => {
                if Instant::now() >= *job.renewed.lock().expect("lock poisoned") + lease {
                    tracing::warn!(error = %crate::error::server_message(&e), "cannot write the job's outcome and its lease has run out; it will be rescued");
                    break;
                }
                let wait = backoff.after(&e);
                tracing::warn!(error = %crate::error::server_message(&e), retry_in = ?wait, "cannot write the job's outcome; retrying");
                tokio::time::sleep(wait).await;
            }
        }
    }
    forget();
    false
}

/// Writes a failure, snooze or hand-back. Returns whether the claim was still current.
async fn write_outcome(
    pool: &sqlx::PgPool,
    job: &Inner,
    outcome: &Outcome,
) -> Result<bool, sqlx::Error> {
    let rows = match outcome {
        Outcome::Retry(kind, message) | Outcome::Permanent(kind, message) => {
            let permanent = matches!(outcome, Outcome::Permanent(..));
            // `last_error` says what kind of failure it was: "permanent: ...",
            // "cancelled: ...", "timed out after ...", "handler panicked: ...", or the
            // handler's own message.
            let message = match (permanent, kind) {
                (true, FailureKind::Cancelled) => format!("cancelled: {message}"),
                (true, _) => format!("permanent: {message}"),
                (false, _) => message.clone(),
            };
            crate::pooler::alone!(
                pool,
                crate::pooler::query(sql::FAIL)
                    .bind(job.id)
                    .bind(job.token)
                    .bind(message)
                    .bind(permanent)
                    .bind(millis(job.config.backoff_after(job.attempt)))
                    .bind(job.next_run_ms())
                    .bind(kind.as_str()),
                execute
            )
            .await?
        }
        Outcome::Snooze(delay) => release(pool, job, millis(*delay)).await?,
        Outcome::Stopped => release(pool, job, 0).await?,
        Outcome::Succeeded | Outcome::LeaseLost | Outcome::Cancelled => return Ok(true),
    };
    Ok(rows.rows_affected() > 0)
}

async fn release(
    pool: &sqlx::PgPool,
    job: &Inner,
    delay_ms: i64,
) -> Result<sqlx::postgres::PgQueryResult, sqlx::Error> {
    crate::pooler::alone!(
        pool,
        crate::pooler::query(sql::RELEASE)
            .bind(job.id)
            .bind(job.token)
            .bind(delay_ms),
        execute
    )
    .await
}

/// Runs the handler of the claimed job `id` once, inline, with no runtime around it
/// (`jobs::testing::perform`): the job's claim is real, so fenced transactions,
/// transaction mode and checkpoints work as under a runtime, but nothing renews its
/// lease. The outcome is written as a runtime writes it. Returns the handler's own
/// result, or the failure the runtime records instead (a timeout, a panic's message
/// after the panic is written and resumed, a fenced transaction dropped, a claim lost
/// before the completion).
pub(crate) async fn perform_inline(
    pool: &sqlx::PgPool,
    handler: &'static HandlerInfo,
    claimed: Claimed,
) -> Result<(), crate::JobError> {
    use crate::JobError;

    let (_lost_tx, lost_rx) = watch::channel(false);
    let inner = claimed.context(handler, pool, lost_rx);
    let ctx = JobContext {
        inner: inner.clone(),
    };
    let future = (handler.call)(HandlerInput {
        payload: claimed.payload,
        ctx,
    });
    let guarded = AssertUnwindSafe(future).catch_unwind();
    let timeout = handler.config.timeout;
    let ran = match timeout {
        Some(limit) => tokio::time::timeout(limit, guarded).await.ok(),
        None => Some(guarded.await),
    };
    inner.finished.store(true, Ordering::Release);
    let mut panicked = None;
    let (mut outcome, mut result) = match ran {
        None => {
            let message = format!("timed out after {:?}", timeout.unwrap_or_default());
            (
                Outcome::Retry(FailureKind::Timeout, message.clone()),
                Err(JobError::retry(message)),
            )
        }
        Some(Ok(Ok(()))) => (Outcome::Succeeded, Ok(())),
        Some(Ok(Err(e))) => (Outcome::of(&e.kind), Err(e)),
        Some(Err(panic)) => {
            let message = format!("handler panicked: {}", panic_message(&*panic));
            panicked = Some(panic);
            (
                Outcome::Retry(FailureKind::Panic, message.clone()),
                Err(JobError::retry(message)),
            )
        }
    };
    outcome = settle(&inner, outcome).await;
    if !inner.completed.load(Ordering::Acquire) {
        let written = match &outcome {
            Outcome::Succeeded => {
                let mut conn = pool.acquire().await?;
                let batch = [completer::Completion::of(&inner)];
                !completer::complete_alone(&mut conn, &batch)
                    .await?
                    .done
                    .is_empty()
            }
            other => write_outcome(pool, &inner, other).await?,
        };
        if !written && !matches!(outcome, Outcome::LeaseLost) {
            outcome = Outcome::LeaseLost;
        }
    }
    if let Some(panic) = panicked {
        std::panic::resume_unwind(panic);
    }
    match (&outcome, &result) {
        (Outcome::Succeeded, _) | (_, Err(_)) => {}
        (Outcome::LeaseLost, Ok(())) => result = Err(JobError::lease_lost()),
        (Outcome::Retry(_, m) | Outcome::Permanent(_, m), Ok(())) => {
            result = Err(JobError::retry(m))
        }
        (Outcome::Snooze(_) | Outcome::Stopped | Outcome::Cancelled, Ok(())) => {}
    }
    result
}
