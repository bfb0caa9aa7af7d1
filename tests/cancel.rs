//! Cancel: pending and running jobs, by an operator or by their own handler.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Running, runtime, wait_until};
use jobs::admin::{Cancelled, JobState};
use jobs::{EnqueueOutcome, FailureKind, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

async fn state(pool: &PgPool, id: i64) -> JobState {
    jobs::admin::get(pool, id).await.unwrap().unwrap().state
}

async fn wait_running(pool: &PgPool, id: i64) {
    wait_until(&format!("job {id} running"), || async {
        state(pool, id).await == JobState::Running
    })
    .await;
}

/// Handlers of `cx.hang` dropped before they returned, by the job's `n` (the tests of
/// this file may share one process: each counts its own job's).
static DROPPED: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];
/// Handlers of `cx.hang` that started, by the job's `n`.
static STARTED: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

struct CountDrop(usize);
impl Drop for CountDrop {
    fn drop(&mut self) {
        DROPPED[self.0].fetch_add(1, Ordering::SeqCst);
    }
}

/// Hangs until dropped, and keeps going on a lost lease: only a cancel stops it.
#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "cx.hang",
    key = "n",
    lease = "1500ms",
    cancel_on_lease_loss = false
)]
struct Hang {
    n: i64,
}

#[jobs::handler]
async fn hang(job: Hang, _ctx: JobContext) -> Result<(), JobError> {
    let n = usize::try_from(job.n).expect("a small n");
    STARTED[n].fetch_add(1, Ordering::SeqCst);
    let _guard = CountDrop(n);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    std::mem::forget(_guard);
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_pending_job_is_cancelled_and_frees_its_key(pool: PgPool) {
    let id = Hang { n: 1 }
        .enqueue_in(&pool, Duration::from_secs(3600))
        .await
        .unwrap()
        .id;
    assert_eq!(
        jobs::admin::cancel(&pool, id).await.unwrap(),
        Cancelled::Pending
    );
    let row = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(row.state, JobState::Cancelled);
    assert!(row.finished_at.is_some());
    assert!(row.errors.is_empty(), "no attempt was running");
    // Not live: the key takes a new job, and a second cancel finds nothing.
    let again = Hang { n: 1 }.enqueue(&pool).await.unwrap();
    assert_eq!(again.outcome, EnqueueOutcome::Inserted);
    assert_ne!(again.id, id);
    assert!(matches!(
        jobs::admin::cancel(&pool, id).await,
        Err(jobs::Error::NotFound(_))
    ));
    let stats = jobs::admin::stats(&pool).await.unwrap();
    assert_eq!((stats[0].cancelled, stats[0].ready), (1, 1));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_running_job_is_cancelled_and_its_handler_dropped(pool: PgPool) {
    let id = Hang { n: 2 }.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["cx.hang"]));
    wait_running(&pool, id).await;
    wait_until("the handler started", || async {
        STARTED[2].load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(
        jobs::admin::cancel(&pool, id).await.unwrap(),
        Cancelled::Running
    );
    wait_until("the handler dropped", || async {
        DROPPED[2].load(Ordering::SeqCst) == 1
    })
    .await;
    rt.stop().await;
    let row = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(row.state, JobState::Cancelled);
    assert_eq!(row.claimed_until, None);
    let last = row.errors.last().expect("the running attempt is recorded");
    assert_eq!((last.attempt, last.kind), (1, FailureKind::Cancelled));
    assert_eq!(STARTED[2].load(Ordering::SeqCst), 1, "never run again");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_cancel_whose_notification_is_lost_is_learnt_at_the_next_renewal(pool: PgPool) {
    let id = Hang { n: 3 }.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["cx.hang"]));
    wait_running(&pool, id).await;
    wait_until("the handler started", || async {
        STARTED[3].load(Ordering::SeqCst) == 1
    })
    .await;
    // What the cancel writes, without its notification.
    sqlx::query(
        "UPDATE jobs SET state = 'cancelled', finished_at = now(), claimed_by = NULL, claimed_until = NULL WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    wait_until("the handler dropped", || async {
        DROPPED[3].load(Ordering::SeqCst) == 1
    })
    .await;
    rt.stop().await;
    assert_eq!(state(&pool, id).await, JobState::Cancelled);
}

/// Waits (inline, under `jobs::testing::perform`, where nothing drops it) until its
/// job is cancelled, then tries to write.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "cx.late", retain = "1h")]
struct Late {}

#[jobs::handler]
async fn late(_job: Late, ctx: JobContext) -> Result<(), JobError> {
    wait_until("the cancel", || async {
        sqlx::query_scalar::<_, String>("SELECT state FROM jobs WHERE id = $1")
            .bind(ctx.id())
            .fetch_one(ctx.pool())
            .await
            .unwrap()
            == "cancelled"
    })
    .await;
    assert!(ctx.checkpoint(&1).await.unwrap_err().is_lease_lost());
    let tx = ctx.fenced_tx().await;
    assert!(tx.unwrap_err().is_lease_lost());
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn every_later_write_of_a_cancelled_claim_is_refused(pool: PgPool) {
    let performing = {
        let pool = pool.clone();
        tokio::spawn(async move { jobs::testing::perform(&pool, &Late {}).await.is_ok() })
    };
    let id = loop {
        let id: Option<i64> =
            sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'cx.late' AND state = 'running'")
                .fetch_optional(&pool)
                .await
                .unwrap();
        if let Some(id) = id {
            break id;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        jobs::admin::cancel(&pool, id).await.unwrap(),
        Cancelled::Running
    );
    // The handler returned Ok(()) after its refused writes: the completion is refused
    // too, and the job stays cancelled.
    assert!(!performing.await.unwrap(), "reported as a lost claim");
    let row = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(row.state, JobState::Cancelled);
    assert_eq!(row.checkpoint, None);
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "cx.own", key = "n", max_attempts = 5)]
struct Own {
    n: i64,
}

#[jobs::handler]
async fn own(job: Own, _ctx: JobContext) -> Result<(), JobError> {
    Err(JobError::cancel(format!("account {} was closed", job.n)))
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_handler_cancels_its_own_job(pool: PgPool) {
    let id = Own { n: 9 }.enqueue(&pool).await.unwrap().id;
    let counts = jobs::testing::drain(&pool).await.unwrap();
    assert_eq!((counts.cancelled, counts.failed, counts.retried), (1, 0, 0));
    let row = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(row.state, JobState::Cancelled);
    assert_eq!(row.attempts, 1, "not retried");
    assert_eq!(
        row.last_error.as_deref(),
        Some("cancelled: account 9 was closed")
    );
    assert_eq!(row.errors[0].kind, FailureKind::Cancelled);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn cancelled_rows_are_pruned_with_the_failed_ones(pool: PgPool) {
    let old = Own { n: 1 }.enqueue(&pool).await.unwrap().id;
    let recent = Own { n: 2 }.enqueue(&pool).await.unwrap().id;
    for id in [old, recent] {
        jobs::admin::cancel(&pool, id).await.unwrap();
    }
    sqlx::query("UPDATE jobs SET finished_at = now() - interval '2 days' WHERE id = $1")
        .bind(old)
        .execute(&pool)
        .await
        .unwrap();
    let rt = Running::start(runtime(&pool, &["cx.own"]).retain_failed(Duration::from_secs(86_400)));
    wait_until("the old cancelled row pruned", || async {
        jobs::admin::get(&pool, old).await.unwrap().is_none()
    })
    .await;
    rt.stop().await;
    assert_eq!(state(&pool, recent).await, JobState::Cancelled);
}

/// Writes its result in a fenced transaction, held open until the test lets it go.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "cx.fenced", retain = "1h")]
struct FencedWrite {}

#[jobs::handler]
async fn fenced_write(_job: FencedWrite, ctx: JobContext) -> Result<(), JobError> {
    let mut tx = ctx.fenced_tx().await?;
    sqlx::query("INSERT INTO results VALUES ($1)")
        .bind(ctx.id())
        .execute(&mut *tx)
        .await?;
    wait_until("the gate opened", || async {
        sqlx::query_scalar::<_, bool>("SELECT open FROM gate")
            .fetch_one(ctx.pool())
            .await
            .unwrap()
    })
    .await;
    tx.commit().await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_cancel_that_meets_a_fenced_commit_waits_and_finds_the_job_done(pool: PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE results (job_id bigint); CREATE TABLE gate (open bool); INSERT INTO gate VALUES (false)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let id = FencedWrite {}.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["cx.fenced"]));
    // The fenced transaction holds the job's row.
    wait_until("the result written, uncommitted", || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
             WHERE l.locktype = 'transactionid' AND a.query LIKE 'INSERT INTO results%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
            > 0
    })
    .await;
    let cancel = tokio::spawn({
        let pool = pool.clone();
        async move { jobs::admin::cancel(&pool, id).await }
    });
    wait_until("the cancel waits for the row", || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
            > 0
    })
    .await;
    sqlx::query("UPDATE gate SET open = true")
        .execute(&pool)
        .await
        .unwrap();
    let cancelled = cancel.await.unwrap();
    assert!(
        matches!(cancelled, Err(jobs::Error::NotFound(_))),
        "{cancelled:?}"
    );
    rt.stop().await;
    assert_eq!(state(&pool, id).await, JobState::Done);
    let results: i64 = sqlx::query_scalar("SELECT count(*) FROM results")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(results, 1, "the result committed once, with the completion");
}

/// A periodic kind: one live job, every hour.
#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "cx.hourly", every = "1h")]
struct Hourly {}

#[jobs::handler]
async fn hourly(_job: Hourly, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_cancelled_periodic_run_is_not_replaced_at_once(pool: PgPool) {
    // The kind's live job, waiting for its next period; an operator cancels it.
    let id = Hourly {}
        .enqueue_in(&pool, Duration::from_secs(3600))
        .await
        .unwrap()
        .id;
    assert_eq!(
        jobs::admin::cancel(&pool, id).await.unwrap(),
        Cancelled::Pending
    );
    // A runtime starts and arms its periodic kinds: the cancelled run is not replaced
    // by one due now; the next comes a period after the cancel.
    let rt = Running::start(runtime(&pool, &["cx.hourly"]));
    tokio::time::sleep(Duration::from_millis(800)).await;
    rt.stop().await;
    // Nothing was armed: a run would have left its job re-armed, pending.
    let rows: Vec<String> = sqlx::query_scalar("SELECT state FROM jobs WHERE kind = 'cx.hourly'")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(rows, ["cancelled"]);
}
