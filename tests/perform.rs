//! `jobs::testing::perform` runs one handler inline with a real claim;
//! `jobs::testing::drain_with` reports failures and runs scheduled jobs at once.

mod common;

use std::time::Duration;

use jobs::admin::JobState;
use jobs::testing::{Drain, drain_with, perform};
use jobs::{FailureKind, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

async fn setup(pool: &PgPool) {
    sqlx::query("CREATE TABLE results (job_id bigint, note text)")
        .execute(pool)
        .await
        .unwrap();
}

async fn notes(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT note FROM results ORDER BY note")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn the_row(pool: &PgPool, kind: &str) -> jobs::admin::JobRow {
    let id: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE kind = $1")
        .bind(kind)
        .fetch_one(pool)
        .await
        .unwrap();
    jobs::admin::get(pool, id).await.unwrap().unwrap()
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pf.fenced", key = "n", retain = "1h", max_attempts = 3)]
struct Fenced {
    n: i64,
    fail: Option<String>,
}

#[jobs::handler]
async fn fenced(job: Fenced, ctx: JobContext) -> Result<(), JobError> {
    ctx.checkpoint(&job.n).await?;
    match job.fail.as_deref() {
        Some("permanent") => return Err(JobError::permanent("bad invoice")),
        Some("retry") => return Err(JobError::retry("try later")),
        Some("panic") => panic!("handler blew up"),
        _ => {}
    }
    let mut tx = ctx.fenced_tx().await?;
    sqlx::query("INSERT INTO results VALUES ($1, $2)")
        .bind(ctx.id())
        .bind(format!("fenced {}", job.n))
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn perform_runs_the_handler_with_a_real_claim(pool: PgPool) {
    setup(&pool).await;
    perform(&pool, &Fenced { n: 1, fail: None }).await.unwrap();
    assert_eq!(notes(&pool).await, ["fenced 1"]);
    let row = the_row(&pool, "pf.fenced").await;
    assert_eq!(row.state, JobState::Done, "completed with the fenced write");
    assert_eq!(row.attempts, 1);
    assert_eq!(row.checkpoint, Some(serde_json::json!(1)));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn perform_returns_the_handlers_error_and_writes_it_as_a_runtime_would(pool: PgPool) {
    setup(&pool).await;
    let err = perform(
        &pool,
        &Fenced {
            n: 2,
            fail: Some("permanent".into()),
        },
    )
    .await
    .unwrap_err();
    assert!(err.is_permanent(), "{err}");
    let row = the_row(&pool, "pf.fenced").await;
    assert_eq!(row.state, JobState::Failed);
    assert_eq!(row.errors.len(), 1);
    assert_eq!(row.errors[0].kind, FailureKind::Permanent);
    assert!(notes(&pool).await.is_empty());
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn perform_writes_a_retry_and_runs_a_scheduled_job_now(pool: PgPool) {
    setup(&pool).await;
    let err = perform(
        &pool,
        &Fenced {
            n: 3,
            fail: Some("retry".into()),
        },
    )
    .await
    .unwrap_err();
    assert!(!err.is_permanent());
    assert_eq!(err.to_string(), "try later");
    let row = the_row(&pool, "pf.fenced").await;
    assert_eq!(
        row.state,
        JobState::Pending,
        "a retry waits out its backoff"
    );
    assert_eq!(row.errors[0].message, "try later");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_panic_in_perform_is_written_then_resumed(pool: PgPool) {
    setup(&pool).await;
    use futures_util::FutureExt;
    let job = Fenced {
        n: 4,
        fail: Some("panic".into()),
    };
    let ran = std::panic::AssertUnwindSafe(perform(&pool, &job))
        .catch_unwind()
        .await;
    assert!(ran.is_err(), "the panic is resumed");
    let row = the_row(&pool, "pf.fenced").await;
    assert_eq!(row.state, JobState::Pending);
    assert_eq!(row.errors[0].kind, FailureKind::Panic);
    assert!(row.errors[0].message.contains("handler blew up"));
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pf.tx", lease = "transaction")]
struct InTx {
    fail: bool,
}

#[jobs::handler]
async fn in_tx(job: InTx, ctx: JobContext) -> Result<(), JobError> {
    let mut tx = ctx.tx().await?;
    sqlx::query("INSERT INTO results VALUES ($1, 'in tx')")
        .bind(ctx.id())
        .execute(&mut *tx)
        .await?;
    drop(tx);
    if job.fail {
        return Err(JobError::retry("rolled back"));
    }
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn perform_commits_a_transaction_mode_handlers_writes_with_the_completion(pool: PgPool) {
    setup(&pool).await;
    assert!(perform(&pool, &InTx { fail: true }).await.is_err());
    assert!(
        notes(&pool).await.is_empty(),
        "a failure rolls the writes back"
    );
    sqlx::query("DELETE FROM jobs")
        .execute(&pool)
        .await
        .unwrap();
    perform(&pool, &InTx { fail: false }).await.unwrap();
    assert_eq!(notes(&pool).await, ["in tx"]);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        left, 0,
        "completed (a kind without history deletes its job)"
    );
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pf.flaky", backoff = "1h", max_attempts = 5, retain = "1h")]
struct Flaky {
    fails: u32,
}

#[jobs::handler]
async fn flaky(job: Flaky, ctx: JobContext) -> Result<(), JobError> {
    if ctx.attempt() <= job.fails {
        return Err(JobError::retry(format!("attempt {} failed", ctx.attempt())));
    }
    sqlx::query("INSERT INTO results VALUES ($1, 'flaky done')")
        .bind(ctx.id())
        .execute(ctx.pool())
        .await?;
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn drain_with_scheduled_runs_retries_and_delayed_jobs_and_reports_failures(pool: PgPool) {
    setup(&pool).await;
    let flaky = Flaky { fails: 2 }.enqueue(&pool).await.unwrap().id;
    Flaky { fails: 0 }
        .enqueue_in(&pool, Duration::from_secs(3600))
        .await
        .unwrap();

    // Without scheduled jobs: the first attempt fails, its retry waits an hour, and the
    // delayed job waits too.
    let drained = drain_with(&pool, Drain::new()).await.unwrap();
    assert_eq!(drained.counts.retried, 1);
    assert_eq!(drained.failures.len(), 1);
    assert_eq!(drained.failures[0].id, flaky);
    assert_eq!(drained.failures[0].state, JobState::Pending);
    assert_eq!(drained.failures[0].error.message, "attempt 1 failed");
    assert!(notes(&pool).await.is_empty());

    let drained = drain_with(&pool, Drain::new().with_scheduled(true))
        .await
        .unwrap();
    assert_eq!(drained.counts.succeeded, 2);
    let failed: Vec<(i64, u32)> = drained
        .failures
        .iter()
        .map(|f| (f.id, f.error.attempt))
        .collect();
    assert_eq!(failed, [(flaky, 2)], "only this drain's failures");
    assert_eq!(notes(&pool).await, ["flaky done", "flaky done"]);
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pf.forgetful", backoff = "1h", max_attempts = 5)]
struct Forgetful {
    fails: u32,
}

#[jobs::handler]
async fn forgetful(job: Forgetful, ctx: JobContext) -> Result<(), JobError> {
    if ctx.attempt() <= job.fails {
        return Err(JobError::retry(format!("attempt {} failed", ctx.attempt())));
    }
    Ok(())
}

/// A job of a kind without history that fails twice, then succeeds: its row is deleted,
/// and the drain still reports both failed attempts. (Before, it reported none.)
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn drain_reports_the_failures_of_a_job_whose_row_its_success_deleted(pool: PgPool) {
    let id = Forgetful { fails: 2 }.enqueue(&pool).await.unwrap().id;
    let drained = drain_with(&pool, Drain::new().with_scheduled(true))
        .await
        .unwrap();
    assert_eq!(drained.counts.succeeded, 1);
    let failed: Vec<(i64, u32, &str, JobState)> = drained
        .failures
        .iter()
        .map(|f| (f.id, f.error.attempt, f.error.message.as_str(), f.state))
        .collect();
    assert_eq!(
        failed,
        [
            (id, 1, "attempt 1 failed", JobState::Done),
            (id, 2, "attempt 2 failed", JobState::Done)
        ]
    );
}
