//! A handler's output (`Result<T, JobError>`, `T: Serialize`): stored with the
//! completion of a kind that keeps done rows, in its fenced write; read by
//! `admin::get`; refused when too large; never stored for a kind that keeps no done rows.

use jobs::admin::{self, JobState};
use jobs::testing::{Drain, drain_with};
use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Rendition {
    height: u32,
    url: String,
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "output.transcode", retain = "1h", max_attempts = 2)]
struct Transcode {
    height: u32,
    /// Fail the first attempt.
    flaky: bool,
}

#[jobs::handler]
async fn transcode(job: Transcode, ctx: JobContext) -> Result<Rendition, JobError> {
    if job.flaky && ctx.attempt() == 1 {
        return Err(JobError::retry("the encoder is busy"));
    }
    Ok(Rendition {
        height: job.height,
        url: format!("https://cdn.example/{}.mp4", job.height),
    })
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "output.unkept")]
struct Unkept {}

#[jobs::handler]
async fn unkept(_job: Unkept, _ctx: JobContext) -> Result<Rendition, JobError> {
    Ok(Rendition {
        height: 1,
        url: String::new(),
    })
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "output.huge", retain = "1h")]
struct Huge {}

#[jobs::handler]
async fn huge(_job: Huge, _ctx: JobContext) -> Result<String, JobError> {
    Ok("x".repeat(jobs::MAX_OUTPUT_BYTES))
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "output.anyhow", retain = "1h")]
struct WithAnyhow {}

#[jobs::handler]
async fn with_anyhow(_job: WithAnyhow, _ctx: JobContext) -> anyhow::Result<Vec<u32>> {
    Ok(vec![1, 2, 3])
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "output.unit", retain = "1h")]
struct Unit {}

#[jobs::handler]
async fn unit(_job: Unit, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_kept_kinds_output_is_stored_with_its_completion(pool: PgPool) {
    let id = Transcode {
        height: 1080,
        flaky: true,
    }
    .enqueue(&pool)
    .await
    .unwrap()
    .id;
    let unit = Unit {}.enqueue(&pool).await.unwrap().id;
    let typed = WithAnyhow {}.enqueue(&pool).await.unwrap().id;
    let drained = drain_with(&pool, Drain::new().with_scheduled(true))
        .await
        .unwrap();
    assert_eq!(drained.counts.succeeded, 3);

    let job = admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Done);
    let rendition: Rendition = serde_json::from_value(job.output.unwrap()).unwrap();
    assert_eq!(
        rendition,
        Rendition {
            height: 1080,
            url: "https://cdn.example/1080.mp4".into()
        }
    );
    assert_eq!(
        admin::get(&pool, typed).await.unwrap().unwrap().output,
        Some(serde_json::json!([1, 2, 3]))
    );
    // `()` stores nothing.
    let unit = admin::get(&pool, unit).await.unwrap().unwrap();
    assert_eq!((unit.state, unit.output), (JobState::Done, None));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_output_over_the_limit_fails_the_run_for_good_and_stores_nothing(pool: PgPool) {
    let id = Huge {}.enqueue(&pool).await.unwrap().id;
    drain_with(&pool, Drain::new()).await.unwrap();
    let job = admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.output, None);
    let error = job.last_error.unwrap();
    assert!(
        error.contains("more than jobs::MAX_OUTPUT_BYTES (1048576)"),
        "{error}"
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_kind_that_keeps_no_done_rows_stores_no_output(pool: PgPool) {
    let id = Unkept {}.enqueue(&pool).await.unwrap().id;
    let drained = drain_with(&pool, Drain::new()).await.unwrap();
    assert_eq!(drained.counts.succeeded, 1);
    assert!(admin::get(&pool, id).await.unwrap().is_none(), "deleted");
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "output.taken_over", retain = "1h", lease = "2s")]
struct TakenOver {}

/// Loses its claim before it returns: another claim's token replaces its own, as a
/// rescue and a new claim would after its lease ran out.
#[jobs::handler]
async fn taken_over(_job: TakenOver, ctx: JobContext) -> Result<Rendition, JobError> {
    sqlx::query("UPDATE jobs SET claimed_by = gen_random_uuid() WHERE id = $1")
        .bind(ctx.id())
        .execute(ctx.pool())
        .await
        .map_err(|e| JobError::retry(e.to_string()))?;
    Ok(Rendition {
        height: 720,
        url: "stale".into(),
    })
}

/// A lost claim stores nothing: the completion that carries the output is fenced by the
/// claim's token, like every write of a claim.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_lost_claim_stores_no_output(pool: PgPool) {
    let e = jobs::testing::perform(&pool, &TakenOver {})
        .await
        .unwrap_err();
    assert!(e.is_lease_lost(), "{e}");
    let id: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'output.taken_over'")
        .fetch_one(&pool)
        .await
        .unwrap();
    let job = admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!((job.state, job.output), (JobState::Running, None));
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "output.ledger", lease = "transaction", retain = "1h")]
struct Ledger {
    amount: i64,
}

/// Writes through the run's transaction and returns what it wrote.
#[jobs::handler]
async fn ledger(job: Ledger, ctx: JobContext) -> Result<i64, JobError> {
    let mut tx = ctx.tx().await?;
    let total: i64 = sqlx::query_scalar("SELECT $1::bigint * 2")
        .bind(job.amount)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| JobError::retry(e.to_string()))?;
    Ok(total)
}

/// In transaction mode the output commits with the handler's writes and the completion.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_transaction_mode_output_commits_with_the_completion(pool: PgPool) {
    let id = Ledger { amount: 21 }.enqueue(&pool).await.unwrap().id;
    let drained = drain_with(&pool, Drain::new()).await.unwrap();
    assert_eq!(drained.counts.succeeded, 1);
    let job = admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(
        (job.state, job.output),
        (JobState::Done, Some(serde_json::json!(42)))
    );
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "output.nul", retain = "1h")]
struct Nul {}

#[jobs::handler]
async fn nul(_job: Nul, _ctx: JobContext) -> Result<String, JobError> {
    Ok("before\0after".into())
}

/// An output jsonb cannot hold (a NUL character) fails its run for good at the handler's
/// end. Sent on, its cast would fail the completion of the whole batch it rode in, the
/// other jobs' with it, at every retry.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_output_with_a_nul_fails_its_run_and_no_other_completion(pool: PgPool) {
    let bad = Nul {}.enqueue(&pool).await.unwrap().id;
    let mut good = Vec::new();
    for height in [240, 360, 480] {
        let job = Transcode {
            height,
            flaky: false,
        };
        good.push(job.enqueue(&pool).await.unwrap().id);
    }
    let drained = drain_with(&pool, Drain::new()).await.unwrap();
    assert_eq!((drained.counts.succeeded, drained.counts.failed), (3, 1));
    let job = admin::get(&pool, bad).await.unwrap().unwrap();
    assert_eq!((job.state, job.output), (JobState::Failed, None));
    assert!(
        job.last_error.unwrap().contains("NUL character"),
        "a clear reason"
    );
    for id in good {
        let job = admin::get(&pool, id).await.unwrap().unwrap();
        assert_eq!(job.state, JobState::Done);
        assert!(job.output.is_some());
    }
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "output.large", retain = "1h")]
struct Large {
    n: u32,
}

/// Near the limit: 900 KiB of one letter, the job's own.
#[jobs::handler]
async fn large(job: Large, _ctx: JobContext) -> Result<String, JobError> {
    let letter = char::from(b'a' + (job.n % 26) as u8);
    Ok(std::iter::repeat_n(letter, 900 * 1024).collect())
}

/// A hundred outputs near the limit, 88 MiB in all, complete together: the completer
/// writes them in statements of at most 64 MiB of outputs each (one statement's outputs
/// travel as one value, which PostgreSQL ends at 1 GB), and every one is stored, once,
/// with its own job.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn outputs_near_the_limit_complete_together_each_with_its_job(pool: PgPool) {
    let mut ids = Vec::new();
    for n in 0..100 {
        ids.push((n, Large { n }.enqueue(&pool).await.unwrap().id));
    }
    // A hundred handlers at once, so that their completions come in one round.
    let stop = std::sync::Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    let runtime = jobs::Runtime::new(pool.clone())
        .kinds(["output.large"])
        .concurrency(100);
    let running = tokio::spawn(runtime.run_until(async move { stopped.notified().await }));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let done = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM jobs WHERE kind = 'output.large' AND state = 'done'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    while done().await < 100 {
        assert!(std::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    stop.notify_one();
    running.await.unwrap().unwrap();
    for (n, id) in ids {
        let job = admin::get(&pool, id).await.unwrap().unwrap();
        assert_eq!(job.state, JobState::Done);
        assert_eq!(job.attempts, 1, "job {id}'s first completion was written");
        let letter = char::from(b'a' + (n % 26) as u8);
        let output = job.output.expect("stored");
        let text = output.as_str().expect("a string");
        assert_eq!(text.len(), 900 * 1024);
        assert!(text.chars().all(|c| c == letter), "job {id}'s own output");
    }
}
