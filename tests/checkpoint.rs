//! Checkpoints: progress a handler stores, fenced by its claim, that the next attempt
//! resumes from.

mod common;

use common::{Running, runtime, wait_state, wait_until};
use jobs::admin::JobState;
use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

async fn setup(pool: &PgPool) {
    sqlx::query("CREATE TABLE processed (job_id bigint, item int, attempt int)")
        .execute(pool)
        .await
        .unwrap();
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "cp.items", backoff = "10ms", retain = "1h")]
struct Items {
    count: i32,
    /// The first attempt fails after storing this item's checkpoint.
    fail_after: i32,
}

#[jobs::handler]
async fn items(job: Items, ctx: JobContext) -> Result<(), JobError> {
    let done: i32 = ctx.last_checkpoint().await?.unwrap_or(0);
    for item in done + 1..=job.count {
        sqlx::query("INSERT INTO processed VALUES ($1, $2, $3)")
            .bind(ctx.id())
            .bind(item)
            .bind(ctx.attempt() as i32)
            .execute(ctx.pool())
            .await?;
        ctx.checkpoint(&item).await?;
        if ctx.attempt() == 1 && item == job.fail_after {
            return Err(JobError::retry("the source went away"));
        }
    }
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_retry_resumes_after_the_last_checkpoint(pool: PgPool) {
    setup(&pool).await;
    let id = Items {
        count: 5,
        fail_after: 2,
    }
    .enqueue(&pool)
    .await
    .unwrap()
    .id;
    let rt = Running::start(runtime(&pool, &["cp.items"]));
    wait_state(&pool, id, JobState::Done).await;
    rt.stop().await;

    let processed: Vec<(i32, i32)> =
        sqlx::query_as("SELECT item, attempt FROM processed WHERE job_id = $1 ORDER BY item")
            .bind(id)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(processed, [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]);
    let row = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(row.checkpoint, Some(serde_json::json!(5)));
    assert_eq!(row.attempts, 2);
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "cp.stolen", lease = "2s", retain = "1h")]
struct Stolen {}

#[jobs::handler]
async fn stolen(_job: Stolen, ctx: JobContext) -> Result<(), JobError> {
    ctx.checkpoint("first").await?;
    // The test takes the claim over: another runtime now holds the job.
    wait_until("the claim taken over", || async {
        sqlx::query_scalar::<_, bool>("SELECT claimed_by <> $2 FROM jobs WHERE id = $1")
            .bind(ctx.id())
            .bind(ctx.claim_token())
            .fetch_one(ctx.pool())
            .await
            .unwrap()
    })
    .await;
    let late = ctx.checkpoint("late").await;
    let lost = late.as_ref().is_err_and(JobError::is_lease_lost);
    sqlx::query("INSERT INTO processed VALUES ($1, $2, 0)")
        .bind(ctx.id())
        .bind(i32::from(lost))
        .execute(ctx.pool())
        .await?;
    late
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_checkpoint_of_a_lost_claim_is_refused(pool: PgPool) {
    setup(&pool).await;
    let id = Stolen {}.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["cp.stolen"]));
    wait_until("the first checkpoint", || async {
        jobs::admin::get(&pool, id)
            .await
            .unwrap()
            .is_some_and(|j| j.checkpoint.is_some())
    })
    .await;
    // Another claimer's token, as a rescue and a new claim would leave it.
    sqlx::query("UPDATE jobs SET claimed_by = gen_random_uuid() WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    wait_until("the handler's report", || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM processed WHERE job_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
            == 1
    })
    .await;
    rt.stop().await;
    let lost: i32 = sqlx::query_scalar("SELECT item FROM processed WHERE job_id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(lost, 1, "the late checkpoint reported a lost lease");
    let row = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(row.checkpoint, Some(serde_json::json!("first")));
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "cp.keyed", key = "id", retain = "1h")]
struct Keyed {
    id: i64,
}

#[jobs::handler]
async fn keyed(_job: Keyed, ctx: JobContext) -> Result<(), JobError> {
    // A checkpoint of another type than the stored one.
    match ctx.last_checkpoint::<Vec<String>>().await {
        Err(e) if e.is_permanent() => Err(e),
        _ => Ok(()),
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_new_trigger_clears_the_checkpoint_and_a_retry_keeps_it(pool: PgPool) {
    let id = Keyed { id: 1 }.enqueue(&pool).await.unwrap().id;
    let set = |state: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query("UPDATE jobs SET checkpoint = '42', state = $2 WHERE id = $1")
                .bind(id)
                .bind(state)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    // Left by a failed attempt of the pending job: a trigger coalesced into it is a new
    // request, which starts over.
    set("pending").await;
    let again = Keyed { id: 1 }.enqueue(&pool).await.unwrap();
    assert_eq!(again.id, id);
    let row = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(row.checkpoint, None);

    // An operator's retry of a failed job resumes where it stopped.
    set("failed").await;
    jobs::admin::retry(&pool, id).await.unwrap();
    let row = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(row.checkpoint, Some(serde_json::json!(42)));

    // A stored value of another type is a permanent error, named.
    let rt = Running::start(runtime(&pool, &["cp.keyed"]));
    wait_state(&pool, id, JobState::Failed).await;
    rt.stop().await;
    let row = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    let err = row.last_error.unwrap();
    assert!(
        err.contains("checkpoint") && err.contains("does not deserialize"),
        "{err}"
    );
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "cp.fenced", retain = "1h")]
struct Fenced {}

#[jobs::handler]
async fn fenced(_job: Fenced, ctx: JobContext) -> Result<(), JobError> {
    let tx = ctx.fenced_tx().await?;
    let refused = ctx.checkpoint(&1).await;
    tx.commit().await?;
    match refused {
        Err(e) if e.to_string().contains("fenced transaction") => Ok(()),
        other => Err(JobError::permanent(format!("not refused: {other:?}"))),
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_checkpoint_inside_a_fenced_transaction_is_refused_not_deadlocked(pool: PgPool) {
    let id = Fenced {}.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["cp.fenced"]));
    wait_state(&pool, id, JobState::Done).await;
    rt.stop().await;
    let row = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(row.checkpoint, None);
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "cp.rerun", key = "id", retain = "1h")]
struct Rerun {
    id: i64,
}

#[jobs::handler]
async fn rerun(_job: Rerun, ctx: JobContext) -> Result<(), JobError> {
    let seen: Option<i32> = ctx.last_checkpoint().await?;
    sqlx::query("INSERT INTO processed VALUES ($1, $2, $3)")
        .bind(ctx.id())
        .bind(seen.unwrap_or(-1))
        .bind(ctx.attempt() as i32)
        .execute(ctx.pool())
        .await?;
    ctx.checkpoint(&7).await?;
    // The first run waits for the trigger that marks the job for a re-run.
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM processed WHERE job_id = $1")
        .bind(ctx.id())
        .fetch_one(ctx.pool())
        .await?;
    if runs == 1 {
        wait_until("the re-run mark", || async {
            sqlx::query_scalar::<_, bool>("SELECT rerun_after IS NOT NULL FROM jobs WHERE id = $1")
                .bind(ctx.id())
                .fetch_one(ctx.pool())
                .await
                .unwrap()
        })
        .await;
    }
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_rerun_after_success_starts_without_the_checkpoint(pool: PgPool) {
    setup(&pool).await;
    let id = Rerun { id: 1 }.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["cp.rerun"]));
    wait_until("the first run", || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM processed")
            .fetch_one(&pool)
            .await
            .unwrap()
            == 1
    })
    .await;
    let again = Rerun { id: 1 }.enqueue(&pool).await.unwrap();
    assert_eq!(again.outcome, jobs::EnqueueOutcome::RerunMarked);
    wait_until("the re-run", || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM processed")
            .fetch_one(&pool)
            .await
            .unwrap()
            == 2
    })
    .await;
    wait_state(&pool, id, JobState::Done).await;
    rt.stop().await;
    let seen: Vec<i32> = sqlx::query_scalar("SELECT item FROM processed ORDER BY item DESC")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(seen, [-1, -1], "neither run saw a checkpoint");
}

// ---------------------------------------------------------------------------------
// A checkpoint belongs to its request: a trigger that arrives while the job runs is a
// new request, and the run after it starts clean, however the run before ended.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "cp.request", key = "key", backoff = "10ms")]
struct Request {
    key: String,
    /// How the first run ends once the trigger has arrived: `fail` or `snooze`.
    then: String,
}

#[jobs::handler]
async fn request(job: Request, ctx: JobContext) -> Result<(), JobError> {
    let seen: Option<String> = ctx.last_checkpoint().await?;
    sqlx::query("INSERT INTO seen (run, checkpoint) VALUES ((SELECT count(*) FROM seen), $1)")
        .bind(&seen)
        .execute(ctx.pool())
        .await?;
    if seen.is_some() || ctx.attempt() > 1 {
        return Ok(());
    }
    ctx.checkpoint("the first request's progress").await?;
    // Wait for the test's second trigger of this key.
    loop {
        let arrived: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM go)")
            .fetch_one(ctx.pool())
            .await?;
        if arrived {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    match job.then.as_str() {
        "snooze" => Err(JobError::snooze(std::time::Duration::from_millis(10))),
        _ => Err(JobError::retry(
            "the first run fails after the second trigger",
        )),
    }
}

async fn a_new_request_starts_clean(pool: PgPool, then: &str) {
    sqlx::query("CREATE TABLE seen (run bigint, checkpoint text)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE go ()")
        .execute(&pool)
        .await
        .unwrap();
    let job = |then: &str| Request {
        key: "k".to_owned(),
        then: then.to_owned(),
    };
    let id = job(then).enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["cp.request"]));
    wait_until("the first run stored its checkpoint", || async {
        jobs::admin::get(&pool, id)
            .await
            .unwrap()
            .is_some_and(|j| j.checkpoint.is_some())
    })
    .await;
    // A second trigger of the key while the first runs: a re-run mark.
    job(then).enqueue(&pool).await.unwrap();
    sqlx::query("INSERT INTO go DEFAULT VALUES")
        .execute(&pool)
        .await
        .unwrap();
    wait_until("a second run", || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM seen")
            .fetch_one(&pool)
            .await
            .unwrap()
            >= 2
    })
    .await;
    rt.stop().await;
    let seen: Vec<Option<String>> = sqlx::query_scalar("SELECT checkpoint FROM seen ORDER BY run")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(seen[..2], [None, None], "the second request starts clean");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_trigger_during_a_failed_run_starts_clean(pool: PgPool) {
    a_new_request_starts_clean(pool, "fail").await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_trigger_during_a_snoozed_run_starts_clean(pool: PgPool) {
    a_new_request_starts_clean(pool, "snooze").await;
}
