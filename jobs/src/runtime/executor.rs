//! The executor: runs one claimed job (timeout, panic capture, lease loss, shutdown)
//! and writes its outcome.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use sqlx::{Postgres, Transaction};
use tokio::sync::{Mutex, watch};
use tracing::Instrument;
use uuid::Uuid;

use super::backoff::Backoff;
use super::completer::{self, Completion};
use super::{Flight, Shared, observe};
use crate::context::{Inner, JobContext, JobErrorKind};
use crate::enqueue::millis;
use crate::registry::{HandlerInfo, HandlerInput};
use crate::sql;

/// A job as the claim returned it.
pub(crate) struct Claimed {
    pub id: i64,
    pub attempt: u32,
    pub max_attempts: u32,
    pub token: Uuid,
    pub payload: String,
    pub claimed_at: Instant,
}

/// How one run of a handler ended.
enum Outcome {
    Succeeded,
    Retry(String),
    Permanent(String),
    Snooze(Duration),
    LeaseLost,
    /// Shutdown grace elapsed: the job is handed back.
    Stopped,
}

impl Outcome {
    /// What the run came to, as recorded on the span and in the metrics.
    fn label(&self, job: &Claimed) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Retry(_) if job.attempt < job.max_attempts => "retried",
            Outcome::Retry(_) | Outcome::Permanent(_) => "failed",
            Outcome::Snooze(_) => "snoozed",
            Outcome::LeaseLost => "lease_lost",
            Outcome::Stopped => "handed_back",
        }
    }
}

pub(crate) async fn execute(
    shared: Arc<Shared>,
    handler: &'static HandlerInfo,
    job: Claimed,
    tx: Option<Transaction<'static, Postgres>>,
) {
    let span = tracing::info_span!(
        "job",
        job.id = job.id,
        job.kind = handler.kind,
        job.attempt = job.attempt,
        job.outcome = tracing::field::Empty,
    );
    let kind = handler.kind;
    run(shared.clone(), handler, job, tx).instrument(span).await;
    shared.give_slot(kind);
}

async fn run(
    shared: Arc<Shared>,
    handler: &'static HandlerInfo,
    mut job: Claimed,
    tx: Option<Transaction<'static, Postgres>>,
) {
    let transaction_mode = tx.is_some();
    let (lost_tx, lost_rx) = watch::channel(false);
    let inner = Arc::new(Inner {
        id: job.id,
        kind: handler.kind,
        attempt: job.attempt,
        max_attempts: job.max_attempts,
        token: job.token,
        config: handler.config,
        pool: shared.pool.clone(),
        lost: lost_rx,
        fenced: AtomicBool::new(false),
        completed: AtomicBool::new(false),
        tx: tx.map(|tx| Mutex::new(Some(tx))),
    });
    if let (false, Some(lease)) = (transaction_mode, handler.config.heartbeat_lease()) {
        shared.flights.lock().expect("lock poisoned").insert(
            job.token,
            Flight {
                ctx: inner.clone(),
                lost: lost_tx,
                lease,
                last_renewed: job.claimed_at,
            },
        );
    }
    let ctx = JobContext {
        inner: inner.clone(),
    };

    let started = Instant::now();
    let payload = std::mem::take(&mut job.payload);
    let outcome = run_handler(&shared, handler, payload, ctx.clone(), transaction_mode).await;
    let label = outcome.label(&job);
    tracing::Span::current().record("job.outcome", label);
    observe::finished(&shared.counts, handler.kind, label, started.elapsed());
    match &outcome {
        Outcome::Succeeded => tracing::debug!("job succeeded"),
        Outcome::Retry(e) | Outcome::Permanent(e) => tracing::warn!(error = %e, "job failed"),
        Outcome::LeaseLost => {
            tracing::warn!("job's lease was lost: another runtime may run it; nothing written")
        }
        Outcome::Snooze(d) => tracing::debug!(delay = ?d, "job snoozed"),
        Outcome::Stopped => tracing::info!("job handed back at shutdown"),
    }

    // A failed, snoozed or re-run-marked job may be claimable again at once: claim it
    // without waiting for the next poll.
    let may_be_due = matches!(
        outcome,
        Outcome::Retry(_) | Outcome::Permanent(_) | Outcome::Snooze(_)
    );
    if transaction_mode {
        finish_in_transaction(&inner, outcome).await;
    } else {
        finish(&shared, &inner, job.claimed_at, outcome).await;
        shared
            .flights
            .lock()
            .expect("lock poisoned")
            .remove(&job.token);
    }
    if may_be_due {
        shared.wake.notify_one();
    }
}

async fn run_handler(
    shared: &Shared,
    handler: &'static HandlerInfo,
    payload: String,
    ctx: JobContext,
    transaction_mode: bool,
) -> Outcome {
    let cancel_on_loss = ctx.inner.config.cancel_on_lease_loss && !transaction_mode;
    let timeout = ctx.inner.config.timeout;
    let future = (handler.call)(HandlerInput {
        payload,
        ctx: ctx.clone(),
    });
    let guarded = AssertUnwindSafe(future).catch_unwind();
    let timed = async {
        match timeout {
            Some(limit) => tokio::time::timeout(limit, guarded).await.ok(),
            None => Some(guarded.await),
        }
    };
    let mut hard_stop = shared.hard_stop.clone();
    tokio::select! {
        result = timed => match result {
            None => Outcome::Retry(format!(
                "timed out after {:?}",
                timeout.unwrap_or_default()
            )),
            Some(Ok(Ok(()))) => Outcome::Succeeded,
            Some(Ok(Err(e))) => match e.kind {
                JobErrorKind::Retry(m) => Outcome::Retry(m),
                JobErrorKind::Permanent(m) => Outcome::Permanent(m),
                JobErrorKind::Snooze(d) => Outcome::Snooze(d),
                JobErrorKind::LeaseLost => Outcome::LeaseLost,
            },
            Some(Err(panic)) => Outcome::Retry(format!("handler panicked: {}", panic_message(&*panic))),
        },
        _ = ctx.lease_lost(), if cancel_on_loss => Outcome::LeaseLost,
        _ = hard_stop.wait_for(|stop| *stop) => Outcome::Stopped,
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

/// Writes the outcome of a heartbeat-lease claim, fenced by its token. A database error
/// is retried until the lease has surely run out (after that the write would be refused
/// anyway, and the rescuer returns the job).
async fn finish(shared: &Shared, job: &Inner, claimed_at: Instant, outcome: Outcome) {
    if job.completed.load(Ordering::Acquire) {
        return; // a fenced transaction completed it together with the handler's writes
    }
    if let Outcome::Succeeded = outcome {
        if shared.completions.send(Completion::of(job)).is_err() {
            tracing::error!("completer stopped; the job will run again after its lease");
        }
        return;
    }
    if let Outcome::LeaseLost = outcome {
        return;
    }
    let lease = job.config.heartbeat_lease().unwrap_or_default();
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
    loop {
        let result = write_outcome(&shared.pool, job, &outcome).await;
        match result {
            Ok(true) => return,
            Ok(false) => {
                tracing::warn!("outcome refused: the claim had already expired");
                return;
            }
            Err(e) => {
                let last_renewed = shared
                    .flights
                    .lock()
                    .expect("lock poisoned")
                    .get(&job.token)
                    .map_or(claimed_at, |f| f.last_renewed);
                if last_renewed.elapsed() > lease {
                    tracing::warn!(error = %e, "cannot write the job's outcome and its lease has run out; it will be rescued");
                    return;
                }
                let wait = backoff.next();
                tracing::warn!(error = %e, retry_in = ?wait, "cannot write the job's outcome; retrying");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Writes a failure, snooze or hand-back. Returns whether the claim was still current.
async fn write_outcome<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    job: &Inner,
    outcome: &Outcome,
) -> Result<bool, sqlx::Error> {
    let rows = match outcome {
        Outcome::Retry(message) | Outcome::Permanent(message) => {
            let permanent = matches!(outcome, Outcome::Permanent(_));
            sqlx::query(sql::FAIL)
                .bind(job.id)
                .bind(job.token)
                .bind(message)
                .bind(permanent)
                .bind(millis(job.config.backoff_after(job.attempt)))
                .execute(executor)
                .await?
        }
        Outcome::Snooze(delay) => release(executor, job, millis(*delay)).await?,
        Outcome::Stopped => release(executor, job, 0).await?,
        Outcome::Succeeded | Outcome::LeaseLost => return Ok(true),
    };
    Ok(rows.rows_affected() > 0)
}

async fn release<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    job: &Inner,
    delay_ms: i64,
) -> Result<sqlx::postgres::PgQueryResult, sqlx::Error> {
    sqlx::query(sql::RELEASE)
        .bind(job.id)
        .bind(job.token)
        .bind(delay_ms)
        .execute(executor)
        .await
}

/// Ends a transaction-mode claim: completion and the handler's writes commit together;
/// on failure the handler's writes are rolled back to the savepoint taken after the
/// claim, and the failure is recorded in the same transaction. If anything here fails,
/// the whole transaction rolls back and the job is claimable again at once.
async fn finish_in_transaction(job: &Inner, outcome: Outcome) {
    let slot = job.tx.as_ref().expect("transaction mode");
    let Some(mut tx) = slot.lock().await.take() else {
        return;
    };
    if let Outcome::Stopped = outcome {
        drop(tx); // rolls back: claimable at once
        return;
    }
    let result: Result<(), sqlx::Error> = async {
        match outcome {
            Outcome::Succeeded => {
                if !completer::complete_one(&mut tx, job).await? {
                    tracing::error!("transaction-mode claim vanished before completion");
                    return Ok(());
                }
            }
            other => {
                sqlx::query("ROLLBACK TO SAVEPOINT jobs_handler")
                    .execute(&mut *tx)
                    .await?;
                write_outcome(&mut *tx, job, &other).await?;
            }
        }
        tx.commit().await
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(error = %e, "cannot commit the job's transaction; it rolled back and the job is claimable again");
    }
}
