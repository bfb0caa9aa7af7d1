//! Cron kinds: one live job across replicas, run at each fire time on the database's
//! clock; a missed fire time runs once.

mod common;

use std::time::Duration;

use common::{Running, runtime, wait_until};
use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// Every two seconds, at even seconds (UTC).
#[derive(Job, Serialize, Deserialize, Default)]
#[job(
    kind = "cron.tick",
    cron = "*/2 * * * * *",
    timezone = "UTC",
    retain = "1h"
)]
struct Tick {}

#[jobs::handler]
async fn tick(_job: Tick, ctx: JobContext) -> Result<(), JobError> {
    sqlx::query("INSERT INTO ticks (job_id, at) VALUES ($1, clock_timestamp())")
        .bind(ctx.id())
        .execute(ctx.pool())
        .await?;
    Ok(())
}

async fn setup(pool: &PgPool) {
    sqlx::query("CREATE TABLE ticks (job_id bigint, at timestamptz)")
        .execute(pool)
        .await
        .unwrap();
}

/// When each run started, in seconds since the epoch, oldest first.
async fn ticks(pool: &PgPool) -> Vec<f64> {
    sqlx::query_scalar("SELECT extract(epoch FROM at)::float8 FROM ticks ORDER BY at")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn live(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE kind = 'cron.tick' AND state IN ('pending', 'running')",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn two_replicas_run_each_fire_time_once(pool: PgPool) {
    setup(&pool).await;
    let a = Running::start(runtime(&pool, &["cron.tick"]));
    let b = Running::start(runtime(&pool, &["cron.tick"]));
    wait_until("three runs", || async { ticks(&pool).await.len() >= 3 }).await;
    a.stop().await;
    b.stop().await;
    assert_eq!(live(&pool).await, 1, "one live job, re-armed");

    let runs = ticks(&pool).await;
    // Each run starts at or after an even second (the database's clock decides), and
    // close to it (generous: a loaded machine); no fire time runs twice.
    let mut fires: Vec<i64> = Vec::new();
    for at in &runs {
        let fire = (at / 2.0).floor() as i64 * 2;
        assert!(
            at - fire as f64 <= 1.5,
            "a run {at} long after its fire time {fire}"
        );
        fires.push(fire);
    }
    let mut distinct = fires.clone();
    distinct.dedup();
    assert_eq!(distinct, fires, "a fire time ran twice: {runs:?}");
    // The first arm waits for the next fire time instead of running at once.
    let armed_at: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM min(created_at))::float8 FROM jobs WHERE kind = 'cron.tick'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        runs[0] >= (armed_at / 2.0).floor() * 2.0 + 2.0 - 0.001,
        "{armed_at} {runs:?}"
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn missed_fire_times_run_once(pool: PgPool) {
    setup(&pool).await;
    // Armed long ago and missed while no runtime ran: five fire times have passed.
    sqlx::query(
        "INSERT INTO jobs (kind, key, payload, max_attempts, run_after) \
         VALUES ('cron.tick', 'every', '{}', 20, now() - interval '10 seconds')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let rt = Running::start(runtime(&pool, &["cron.tick"]));
    wait_until("the catch-up run", || async {
        !ticks(&pool).await.is_empty()
    })
    .await;
    // Then it waits for the next fire time: at most one more run within the next
    // second and a half, never five.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    rt.stop().await;
    let runs = ticks(&pool).await;
    assert!(runs.len() <= 2, "{runs:?}");
    if let [first, second] = runs[..] {
        assert!(
            second - first >= 0.0 && (second / 2.0).fract() < 0.75,
            "{runs:?}"
        );
    }
    assert_eq!(live(&pool).await, 1);
}

/// Fails for good every time.
#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "cron.broken", cron = "*/2 * * * * *", timezone = "UTC")]
struct Broken {}

#[jobs::handler]
async fn broken(_job: Broken, ctx: JobContext) -> Result<(), JobError> {
    sqlx::query("INSERT INTO ticks (job_id, at) VALUES ($1, clock_timestamp())")
        .bind(ctx.id())
        .execute(ctx.pool())
        .await?;
    Err(JobError::permanent("the report source is gone"))
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_failing_cron_kind_waits_for_its_next_fire_instead_of_parking(pool: PgPool) {
    setup(&pool).await;
    let rt = Running::start(runtime(&pool, &["cron.broken"]));
    wait_until("two runs", || async { ticks(&pool).await.len() >= 2 }).await;
    rt.stop().await;
    let runs = ticks(&pool).await;
    // Each failure waited for the next fire time: runs are a fire time apart, at even
    // seconds, and the job is pending again, never parked as failed.
    assert!(runs[1] - runs[0] >= 1.0, "{runs:?}");
    assert!((runs[1] / 2.0).fract() < 0.75, "{runs:?}");
    let states: Vec<String> =
        sqlx::query_scalar("SELECT state FROM jobs WHERE kind = 'cron.broken'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(states, ["pending"]);
    let error: Option<String> =
        sqlx::query_scalar("SELECT last_error FROM jobs WHERE kind = 'cron.broken'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        error.as_deref(),
        Some("permanent: the report source is gone")
    );
}
