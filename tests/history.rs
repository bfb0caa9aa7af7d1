//! Attempt history: every failed attempt kept with its kind, message and runtime.

mod common;

use std::time::Duration;

use common::{Running, runtime, wait_state};
use jobs::admin::JobState;
use jobs::{FailureKind, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "hist.steps",
    max_attempts = 5,
    backoff = "10ms",
    timeout = "1s",
    retain = "1h"
)]
struct Steps {}

#[jobs::handler]
async fn steps(_job: Steps, ctx: JobContext) -> Result<(), JobError> {
    match ctx.attempt() {
        1 => Err(std::io::Error::other("boom").into()),
        2 => panic!("kaboom"),
        3 => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(())
        }
        _ => {
            // What this attempt saw of the earlier ones.
            let seen: Vec<String> = ctx
                .previous_errors()
                .await?
                .iter()
                .map(|e| format!("{}:{}", e.attempt, e.kind))
                .collect();
            sqlx::query("INSERT INTO seen (job_id, kinds) VALUES ($1, $2)")
                .bind(ctx.id())
                .bind(seen.join(","))
                .execute(ctx.pool())
                .await?;
            Ok(())
        }
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn failed_attempts_are_kept_with_their_kind_and_runtime(pool: PgPool) {
    sqlx::query("CREATE TABLE seen (job_id bigint, kinds text)")
        .execute(&pool)
        .await
        .unwrap();
    let id = Steps {}.enqueue(&pool).await.unwrap().id;
    // A job of the kind whose payload does not deserialize.
    let bad: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (kind, payload, max_attempts) VALUES ('hist.steps', '[1]', 5) RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();

    let rt = Running::start(runtime(&pool, &["hist.steps"]));
    wait_state(&pool, id, JobState::Done).await;
    wait_state(&pool, bad, JobState::Failed).await;
    rt.stop().await;

    let job = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    let kinds: Vec<(u32, FailureKind)> = job.errors.iter().map(|e| (e.attempt, e.kind)).collect();
    assert_eq!(
        kinds,
        [
            (1, FailureKind::Error),
            (2, FailureKind::Panic),
            (3, FailureKind::Timeout)
        ]
    );
    assert!(job.errors[0].message.contains("boom"), "{:?}", job.errors);
    assert!(job.errors[1].message.contains("kaboom"), "{:?}", job.errors);
    assert!(
        job.errors[2].message.contains("timed out"),
        "{:?}",
        job.errors
    );
    assert!(job.errors.windows(2).all(|w| w[0].at <= w[1].at));
    let runtime = job.runtime.expect("the claim recorded its runtime");
    assert!(job.errors.iter().all(|e| e.runtime == Some(runtime)));

    let seen: String = sqlx::query_scalar("SELECT kinds FROM seen WHERE job_id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(seen, "1:error,2:panic,3:timeout");

    let bad = jobs::admin::get(&pool, bad).await.unwrap().unwrap();
    assert_eq!(bad.errors.len(), 1);
    assert_eq!(bad.errors[0].kind, FailureKind::Payload);
    assert!(bad.errors[0].message.contains("does not deserialize"));
}

#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "hist.always",
    max_attempts = 25,
    backoff = "1ms",
    max_backoff = "2ms"
)]
struct Always {}

#[jobs::handler]
async fn always(_job: Always, ctx: JobContext) -> Result<(), JobError> {
    Err(JobError::retry(format!("attempt {} failed", ctx.attempt())))
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_history_keeps_the_last_20_attempts(pool: PgPool) {
    let id = Always {}.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["hist.always"]));
    wait_state(&pool, id, JobState::Failed).await;
    rt.stop().await;
    let job = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    let attempts: Vec<u32> = job.errors.iter().map(|e| e.attempt).collect();
    assert_eq!(attempts, (6..=25).collect::<Vec<u32>>());
    assert_eq!(job.errors[19].message, "attempt 25 failed");
    assert_eq!(job.last_error.as_deref(), Some("attempt 25 failed"));
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "hist.ok", retain = "1h")]
struct Ok_ {}

#[jobs::handler]
async fn ok(_job: Ok_, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_rescued_attempt_names_the_runtime_that_held_it(pool: PgPool) {
    let id = Ok_ {}.enqueue(&pool).await.unwrap().id;
    // Another runtime's claim, with a lease of 1 ms: it has died.
    let dead = uuid::Uuid::new_v4();
    let claimed: Vec<(i64,)> = sqlx::query_as(jobs::__private::CLAIM_SQL)
        .bind(vec!["hist.ok"])
        .bind(vec![1i32])
        .bind(vec![1i64])
        .bind(1i32)
        .bind(vec![f64::NEG_INFINITY])
        .bind(dead)
        .bind(Vec::<i64>::new())
        .bind(Vec::<f64>::new())
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(claimed, [(id,)]);
    tokio::time::sleep(Duration::from_millis(20)).await;

    let rt = Running::start(runtime(&pool, &["hist.ok"]));
    wait_state(&pool, id, JobState::Done).await;
    rt.stop().await;
    let job = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(job.errors.len(), 1, "{:?}", job.errors);
    assert_eq!(job.errors[0].kind, FailureKind::LeaseExpired);
    assert_eq!(job.errors[0].attempt, 1);
    assert_eq!(job.errors[0].runtime, Some(dead));
    assert_ne!(job.runtime, Some(dead), "the rescuing runtime ran it");
}
