//! The runtime against a real database: claims, retries, leases, fencing, transaction
//! mode, shutdown, crashes and database faults.

mod common;

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Proxy, Running, count, record, runs, runtime, wait_until};
use jobs::{EnqueueBatch, Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// A table where handlers record what they did, in the test's own database.
async fn setup(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS runs (job_id bigint, attempt int, note text, at timestamptz DEFAULT clock_timestamp())",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS results (job_id bigint PRIMARY KEY, attempt int)")
        .execute(pool)
        .await
        .unwrap();
}

/// Writes this attempt's result through a fenced transaction: committed together with
/// the job's completion, or refused if the claim is gone.
async fn write_result(ctx: &JobContext) -> Result<(), JobError> {
    let mut tx = ctx.fenced_tx().await?;
    sqlx::query("INSERT INTO results (job_id, attempt) VALUES ($1, $2)")
        .bind(ctx.id())
        .bind(ctx.attempt() as i32)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

// ---------------------------------------------------------------------------------
// Every job runs, and no claim runs twice, with two runtimes.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.count")]
struct Count {
    n: u32,
}

#[jobs::handler]
async fn count_handler(_job: Count, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "count").await?;
    write_result(&ctx).await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn two_runtimes_run_every_job_exactly_once(pool: PgPool) {
    setup(&pool).await;
    let mut batch = EnqueueBatch::new();
    for n in 0..5_000 {
        batch.push(&Count { n }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();

    let a = Running::start(runtime(&pool, &["rt.count"]).concurrency(20));
    let b = Running::start(runtime(&pool, &["rt.count"]).concurrency(20));
    wait_until("all 5000 jobs done", || async {
        common::live(&pool).await == 0
    })
    .await;
    a.stop().await;
    b.stop().await;

    let (runs, distinct, results): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM runs), (SELECT count(DISTINCT job_id) FROM runs), (SELECT count(*) FROM results)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(results, 5_000, "every job's result recorded once");
    assert_eq!(distinct, 5_000, "every job ran");
    assert_eq!(runs, 5_000, "no claim ran twice");
    assert_eq!(
        common::count_kind(&pool, "rt.count").await,
        0,
        "completed jobs are deleted"
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn full_claims_beside_floor_claims_run_every_job_exactly_once(pool: PgPool) {
    // A full claim (from the start of the ranges) runs beside the claims from the
    // floors, on another connection; with a short poll interval one is in flight every
    // few claims. Jobs keep arriving while the runtime drains, so both find work; and
    // ten jobs, due first but locked by the application while the claims pass them,
    // end behind the floor, where only full claims find them.
    setup(&pool).await;
    let mut first = EnqueueBatch::new();
    for n in 0..10 {
        first.push(&Count { n: 100_000 + n }).unwrap();
    }
    let held: Vec<i64> = first
        .enqueue(&pool)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    let mut app = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobs WHERE id = ANY($1) FOR UPDATE")
        .bind(&held)
        .execute(&mut *app)
        .await
        .unwrap();
    let rt = Running::start(
        runtime(&pool, &["rt.count"])
            .concurrency(20)
            .poll_interval(Duration::from_millis(5)),
    );
    for round in 0..20 {
        let mut batch = EnqueueBatch::new();
        for n in 0..200 {
            batch.push(&Count { n: round * 200 + n }).unwrap();
        }
        batch.enqueue(&pool).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_until("the 4000 jobs not held done", || async {
        common::live(&pool).await == 10
    })
    .await;
    app.commit().await.unwrap();
    wait_until("the held jobs done", || async {
        common::live(&pool).await == 0
    })
    .await;
    rt.stop().await;
    let (runs, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT job_id) FROM runs")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(distinct, 4_010, "every job ran");
    assert_eq!(runs, 4_010, "no job ran twice");
}

// ---------------------------------------------------------------------------------
// Retries, permanent failure, snooze, panic, timeout, bad payload, max attempts.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.flaky", backoff = "10ms", max_attempts = 5, retain = "1h")]
struct Flaky {
    fail_times: u32,
}

#[jobs::handler]
async fn flaky(job: Flaky, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "flaky").await?;
    if ctx.attempt() <= job.fail_times {
        return Err(std::io::Error::other(format!("attempt {} failed", ctx.attempt())).into());
    }
    Ok(())
}

async fn job_row(pool: &PgPool, id: i64) -> (String, i32, Option<String>) {
    sqlx::query_as("SELECT state, attempts, last_error FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn failures_are_retried_until_success_or_max_attempts(pool: PgPool) {
    setup(&pool).await;
    let ok = Flaky { fail_times: 2 }.enqueue(&pool).await.unwrap().id;
    let doomed = Flaky { fail_times: 99 }.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["rt.flaky"]));
    wait_until("both settled", || async {
        job_row(&pool, ok).await.0 == "done" && job_row(&pool, doomed).await.0 == "failed"
    })
    .await;
    rt.stop().await;

    let (_, attempts, last_error) = job_row(&pool, ok).await;
    assert_eq!(attempts, 3);
    assert_eq!(last_error, None, "success clears the error");
    let (_, attempts, last_error) = job_row(&pool, doomed).await;
    assert_eq!(attempts, 5, "max_attempts");
    assert_eq!(last_error.as_deref(), Some("attempt 5 failed"));
    assert_eq!(runs(&pool, "flaky").await, 3 + 5);
    // Backoff spaced the attempts on the database clock.
    let gaps: Vec<f64> = sqlx::query_scalar::<_, Option<f64>>(
        "SELECT extract(epoch FROM at - lag(at) OVER (ORDER BY at))::float8 FROM runs WHERE job_id = $1 ORDER BY at",
    )
    .bind(doomed)
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .flatten()
    .collect();
    assert_eq!(gaps.len(), 4);
    // Backoff 10ms doubling, jitter keeps at least half: >= 5, 10, 20, 40 ms.
    for (i, gap) in gaps.iter().enumerate() {
        let floor = 0.005 * f64::from(1u32 << i);
        assert!(*gap >= floor, "gap {i} was {gap}s, below {floor}s");
    }
}

// The outcomes' timeout is long: a handler that is only slow (a loaded machine can
// take more than 200 ms for its two queries) must not spend an attempt where the test
// counts them. The hanging job has a kind of its own, with a short timeout.
#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "rt.outcomes",
    backoff = "10ms",
    max_attempts = 3,
    retain = "1h",
    timeout = "30s"
)]
enum Outcome {
    Permanent,
    SnoozeOnce,
    Panic,
}

#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "rt.hang",
    backoff = "10ms",
    max_attempts = 3,
    retain = "1h",
    timeout = "200ms"
)]
struct Hang;

#[jobs::handler]
async fn hang(_job: Hang, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "hang").await?;
    std::future::pending::<()>().await;
    Ok(())
}

#[jobs::handler]
async fn outcomes(job: Outcome, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "outcomes").await?;
    match job {
        Outcome::Permanent => Err(JobError::permanent("not worth retrying")),
        Outcome::SnoozeOnce => {
            let snoozed: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE job_id = $1")
                .bind(ctx.id())
                .fetch_one(ctx.pool())
                .await?;
            if snoozed == 1 {
                Err(JobError::snooze(Duration::from_millis(20)))
            } else {
                Ok(())
            }
        }
        Outcome::Panic => panic!("boom at attempt {}", ctx.attempt()),
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn permanent_snooze_panic_and_timeout(pool: PgPool) {
    setup(&pool).await;
    let permanent = Outcome::Permanent.enqueue(&pool).await.unwrap().id;
    let snooze = Outcome::SnoozeOnce.enqueue(&pool).await.unwrap().id;
    let panic = Outcome::Panic.enqueue(&pool).await.unwrap().id;
    let hang = Hang.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["rt.outcomes", "rt.hang"]));
    wait_until("all settled", || async {
        let mut settled = true;
        for id in [permanent, snooze, panic, hang] {
            settled &= ["done", "failed"].contains(&job_row(&pool, id).await.0.as_str());
        }
        settled
    })
    .await;
    rt.stop().await;

    let (state, attempts, err) = job_row(&pool, permanent).await;
    assert_eq!((state.as_str(), attempts), ("failed", 1));
    assert_eq!(err.as_deref(), Some("permanent: not worth retrying"));

    let (state, attempts, _) = job_row(&pool, snooze).await;
    assert_eq!(state, "done");
    assert_eq!(attempts, 1, "a snooze spends no attempt");

    let (state, attempts, err) = job_row(&pool, panic).await;
    assert_eq!((state.as_str(), attempts), ("failed", 3));
    assert_eq!(err.as_deref(), Some("handler panicked: boom at attempt 3"));

    let (state, attempts, err) = job_row(&pool, hang).await;
    assert_eq!((state.as_str(), attempts), ("failed", 3));
    assert!(err.unwrap().starts_with("timed out after 200ms"));
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.typed", retain = "1h")]
struct Typed {
    count: u32,
}

#[jobs::handler]
async fn typed(job: Typed, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, &format!("typed {}", job.count)).await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn bad_payload_fails_that_job_only(pool: PgPool) {
    setup(&pool).await;
    let bad: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (kind, payload, max_attempts) VALUES ('rt.typed', '{\"count\": \"many\"}', 5) RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let good = Typed { count: 3 }.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["rt.typed"]));
    wait_until("both settled", || async {
        job_row(&pool, bad).await.0 == "failed" && job_row(&pool, good).await.0 == "done"
    })
    .await;
    rt.stop().await;
    let (_, attempts, err) = job_row(&pool, bad).await;
    assert_eq!(
        attempts, 1,
        "no retry for a payload that cannot deserialize"
    );
    let err = err.unwrap();
    assert!(
        err.contains("rt.typed") && err.contains("invalid type"),
        "{err}"
    );
    assert_eq!(runs(&pool, "typed 3").await, 1);
}

// ---------------------------------------------------------------------------------
// Kinds without a handler here are never touched.

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn kinds_without_a_handler_are_never_claimed(pool: PgPool) {
    setup(&pool).await;
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts) SELECT 'nobody.here', '{}', 3 FROM generate_series(1, 500)",
    )
    .execute(&pool)
    .await
    .unwrap();
    // Another kind with a handler in this binary, but not given to this runtime.
    Typed { count: 1 }.enqueue(&pool).await.unwrap();
    for n in 0..50 {
        Count { n }.enqueue(&pool).await.unwrap();
    }
    let rt = Running::start(runtime(&pool, &["rt.count"]));
    wait_until("count jobs done", || async {
        common::count_kind(&pool, "rt.count").await == 0
    })
    .await;
    rt.stop().await;
    let untouched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE kind IN ('nobody.here', 'rt.typed') AND state = 'pending' AND attempts = 0 AND claimed_by IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(untouched, 501);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn claim_reads_only_its_kinds_claimable_rows(pool: PgPool) {
    // A backlog of another kind and of future jobs of the same kind.
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts) SELECT 'nobody.here', '{}', 3 FROM generate_series(1, 100000)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts, run_after) SELECT 'rt.count', '{\"n\":1}', 3, now() + interval '1 hour' FROM generate_series(1, 100000)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts) SELECT 'rt.count', '{\"n\":1}', 3 FROM generate_series(1, 20)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE jobs").execute(&pool).await.unwrap();

    // Both plans: sqlx caches the prepared claim, and PostgreSQL switches a cached
    // statement to its generic plan, which cannot see the parameters' values. Both
    // claims: the full one, and the one from a floor (here a day ago).
    let floor = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64())
        - 86_400.0;
    for (mode, statement) in [
        ("force_custom_plan", jobs::__private::CLAIM_SQL),
        ("force_generic_plan", jobs::__private::CLAIM_SQL),
        ("force_custom_plan", jobs::__private::CLAIM_SQL),
        ("force_generic_plan", jobs::__private::CLAIM_SQL),
    ] {
        let plan = claim_plan(&pool, statement, floor, mode).await;
        let text = plan.to_string();
        assert!(
            text.contains("\"Index Name\":\"jobs_claim\""),
            "{mode}: claim uses jobs_claim: {text}"
        );
        assert!(
            !text.contains("\"JIT\""),
            "{mode}: the claim is JIT-compiled: {text}"
        );
        let top = &plan[0]["Plan"];
        let blocks = top["Shared Hit Blocks"].as_i64().unwrap()
            + top["Shared Read Blocks"].as_i64().unwrap();
        // 200,000 rows fill thousands of pages; the claim of 10 reads a few dozen.
        assert!(
            blocks < 200,
            "{mode}: the claim read {blocks} blocks: {text}"
        );
        let claimed = plan[0]["Plan"]["Actual Rows"].as_i64().unwrap();
        assert_eq!(claimed, 10, "{mode}");
    }
}

/// Jobs enqueued in one statement share a run-after. A claim of 10 from the front of
/// 100,000 such jobs reads a few dozen blocks, in both plans: its count of what its
/// scans passed (`passed`) ends at the last row taken. Scanned forward, bounded by
/// `(run_after, id) <= (..)`, it read on through every row of that run-after: 4 ms per
/// 10,000 rows on a slow database, in every claim until the batch was drained.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_claim_amid_jobs_of_one_statement_reads_only_what_it_takes(pool: PgPool) {
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts) SELECT 'rt.count', '{\"n\":1}', 3 FROM generate_series(1, 100000)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE jobs").execute(&pool).await.unwrap();
    for mode in ["force_custom_plan", "force_generic_plan"] {
        let plan = claim_plan(&pool, jobs::__private::CLAIM_SQL, f64::NEG_INFINITY, mode).await;
        let top = &plan[0]["Plan"];
        let blocks = top["Shared Hit Blocks"].as_i64().unwrap()
            + top["Shared Read Blocks"].as_i64().unwrap();
        assert_eq!(top["Actual Rows"].as_i64().unwrap(), 10, "{mode}");
        assert!(
            blocks < 200,
            "{mode}: the claim read {blocks} blocks: {plan}"
        );
    }
}

// ---------------------------------------------------------------------------------
// A concurrency above what one claim takes of a kind: every claim that takes its limit
// counts as full, so the runtime claims again at once instead of waiting for the poll.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.wide")]
struct Wide {
    n: u32,
}

#[jobs::handler]
async fn wide(_job: Wide, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_concurrency_above_one_claims_limit_keeps_claiming(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    for n in 0..10_000 {
        batch.push(&Wide { n }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    // No poll within the test, and no notification after the start: only claims that
    // follow full claims take the rest. (The poll's first tick and the first full claim
    // wake an idle runtime twice; 10,000 jobs need more than four claims of 1,000.)
    let rt = Running::start(
        runtime(&pool, &["rt.wide"])
            .concurrency(2_500)
            .poll_interval(Duration::from_secs(3600)),
    );
    wait_until("all 10,000 jobs done without a poll", || async {
        common::live(&pool).await == 0
    })
    .await;
    rt.stop().await;
}

// ---------------------------------------------------------------------------------
// The rows a claim took start while the next claim is in flight: a claim that waits
// (here for a lock on the whole table) holds up none of the jobs claimed before it.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.beside")]
struct Beside {
    n: u32,
}

/// The jobs whose handler has started (each test runs in a process of its own).
static BESIDE_STARTED: std::sync::Mutex<Vec<i64>> = std::sync::Mutex::new(Vec::new());

#[jobs::handler]
async fn beside(_job: Beside, ctx: JobContext) -> Result<(), JobError> {
    BESIDE_STARTED.lock().unwrap().push(ctx.id());
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn jobs_claimed_before_a_claim_that_waits_start_anyway(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    for n in 0..20_000 {
        batch.push(&Beside { n }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    // A concurrency above what one claim takes of a kind (1,000): after each claim the
    // room left calls for the next one at once, which goes out while the rows of the
    // one before start. The runtime waits for its statements far longer than the test.
    let rt = Running::start(
        runtime(&pool, &["rt.beside"])
            .concurrency(2_500)
            .statement_timeout(Duration::from_secs(600)),
    );
    wait_until("two claims' jobs started", || async {
        BESIDE_STARTED.lock().unwrap().len() >= 1_500
    })
    .await;
    // From here every claim and completion waits for this transaction. Granted once
    // the statements in flight have ended: the rows of a claim that has committed are
    // `running`, whether or not the runtime has started them yet.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let claimed: Vec<i64> = sqlx::query_scalar("SELECT id FROM jobs WHERE state = 'running'")
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'pending'")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert!(left > 0, "the drain ended before the table was locked");
    wait_until(
        "every job claimed before the lock started while it is held",
        || async {
            let started: std::collections::HashSet<i64> =
                BESIDE_STARTED.lock().unwrap().iter().copied().collect();
            claimed.iter().all(|id| started.contains(id))
        },
    )
    .await;
    tx.rollback().await.unwrap();
    wait_until("all 20,000 jobs done", || async {
        common::live(&pool).await == 0
    })
    .await;
    rt.stop().await;
    assert_eq!(BESIDE_STARTED.lock().unwrap().len(), 20_000);
}

// ---------------------------------------------------------------------------------
// Wake-up: an idle runtime that polls once an hour still starts a job at once.

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn notification_wakes_an_idle_runtime(pool: PgPool) {
    setup(&pool).await;
    let rt = Running::start(runtime(&pool, &["rt.typed"]).poll_interval(Duration::from_secs(3600)));
    // Let it go idle: its first claim finds nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Typed { count: 7 }.enqueue(&pool).await.unwrap();
    wait_until("job ran without a poll", || async {
        runs(&pool, "typed 7").await == 1
    })
    .await;
    rt.stop().await;
}

// An idle runtime that polls once an hour still starts a scheduled job, and a retry, when
// they become due: it sleeps until the next run-after, not until the next poll.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.due", backoff = "300ms", max_attempts = 3)]
struct Due {
    fail_first: bool,
}

#[jobs::handler]
async fn due(job: Due, ctx: JobContext) -> Result<(), JobError> {
    // How late this run started, on the database clock.
    sqlx::query(
        "INSERT INTO runs (job_id, attempt, note) SELECT $1, $2, 'due ' || (clock_timestamp() >= run_after) FROM jobs WHERE id = $1",
    )
    .bind(ctx.id())
    .bind(ctx.attempt() as i32)
    .execute(ctx.pool())
    .await?;
    if job.fail_first && ctx.attempt() == 1 {
        return Err(JobError::retry("first attempt fails"));
    }
    Ok(())
}

// A producer notifies at most once per kind every few milliseconds; an idle runtime
// woken by a notification claims once more shortly after, and finds the jobs whose
// enqueue sent none.

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn jobs_enqueued_right_after_a_notified_one_start_without_a_poll(pool: PgPool) {
    setup(&pool).await;
    let rt = Running::start(runtime(&pool, &["rt.typed"]).poll_interval(Duration::from_secs(3600)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    for count in 1..=5 {
        // Back to back: the first notifies, the rest fall within its window.
        Typed { count }.enqueue(&pool).await.unwrap();
    }
    wait_until("all five ran without a poll", || async {
        common::live(&pool).await == 0
    })
    .await;
    rt.stop().await;
    for count in 1..=5 {
        assert_eq!(runs(&pool, &format!("typed {count}")).await, 1);
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn scheduled_jobs_and_retries_start_when_due_without_a_poll(pool: PgPool) {
    setup(&pool).await;
    let rt = Running::start(runtime(&pool, &["rt.due"]).poll_interval(Duration::from_secs(3600)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    Due { fail_first: false }
        .enqueue_in(&pool, Duration::from_millis(700))
        .await
        .unwrap();
    Due { fail_first: true }.enqueue(&pool).await.unwrap();
    wait_until("the delayed job and the retry ran", || async {
        runs(&pool, "due true").await == 3 && common::live(&pool).await == 0
    })
    .await;
    rt.stop().await;
    assert_eq!(
        runs(&pool, "due false").await,
        0,
        "no run before its run-after"
    );
}

// ---------------------------------------------------------------------------------
// Re-run mark: a trigger that arrives while the job runs gets one more run.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.rerun", key = "key")]
struct Rerun {
    key: String,
    version: u32,
}

#[jobs::handler]
async fn rerun(job: Rerun, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, &format!("rerun v{}", job.version)).await?;
    if job.version == 1 {
        // A trigger for the same key while this one runs.
        let e = Rerun {
            key: job.key,
            version: 2,
        }
        .enqueue(ctx.pool())
        .await?;
        assert_eq!(e.outcome, jobs::EnqueueOutcome::RerunMarked);
    }
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn trigger_during_a_run_causes_one_more_run(pool: PgPool) {
    setup(&pool).await;
    Rerun {
        key: "k".into(),
        version: 1,
    }
    .enqueue(&pool)
    .await
    .unwrap();
    let rt = Running::start(runtime(&pool, &["rt.rerun"]));
    wait_until("second run done", || async {
        runs(&pool, "rerun v2").await == 1 && common::live(&pool).await == 0
    })
    .await;
    rt.stop().await;
    assert_eq!(runs(&pool, "rerun v1").await, 1);
    assert_eq!(runs(&pool, "rerun v2").await, 1);
}

// ---------------------------------------------------------------------------------
// Leases: a lost lease is reported, the job is taken over, a late result is refused.

#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "rt.stall",
    lease = "500ms",
    cancel_on_lease_loss = false,
    retain = "1h"
)]
struct Stall {}

#[jobs::handler]
async fn stall(_job: Stall, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "stall").await?;
    if ctx.attempt() == 1 {
        // Stand in for a worker that stalls past its lease: expire the claim, and wait
        // for the runtime to notice and for another claim to take the job over.
        sqlx::query("UPDATE jobs SET claimed_until = now() - interval '1 second' WHERE id = $1")
            .bind(ctx.id())
            .execute(ctx.pool())
            .await?;
        ctx.lease_lost().await;
        assert!(ctx.is_lease_lost());
        let pool = ctx.pool().clone();
        let id = ctx.id();
        wait_until("taken over", || async {
            sqlx::query_scalar::<_, i32>("SELECT attempt FROM results WHERE job_id = $1")
                .bind(id)
                .fetch_optional(&pool)
                .await
                .unwrap()
                == Some(2)
        })
        .await;
        // The late result of the first claim is refused and writes nothing.
        let refused = match ctx.fenced_tx().await {
            Err(e) => e.is_lease_lost(),
            Ok(_) => false,
        };
        record(
            &ctx,
            if refused {
                "late refused"
            } else {
                "late accepted"
            },
        )
        .await?;
        return Err(JobError::lease_lost());
    }
    write_result(&ctx).await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn expired_claim_is_taken_over_and_late_result_refused(pool: PgPool) {
    setup(&pool).await;
    let id = Stall {}.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["rt.stall"]));
    wait_until("late write attempted", || async {
        runs(&pool, "late refused").await + runs(&pool, "late accepted").await == 1
    })
    .await;
    rt.stop().await;
    assert_eq!(runs(&pool, "late refused").await, 1);
    let results: Vec<(i64, i32)> = sqlx::query_as("SELECT job_id, attempt FROM results")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        results,
        [(id, 2)],
        "only the current claim's result is written"
    );
    assert_eq!(job_row(&pool, id).await.0, "done");
}

// ---------------------------------------------------------------------------------
// Transaction mode.

#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "rt.tx",
    lease = "transaction",
    backoff = "10ms",
    max_attempts = 2,
    retain = "1h"
)]
struct TxStep {
    fail: bool,
}

#[jobs::handler]
async fn tx_step(job: TxStep, ctx: JobContext) -> Result<(), JobError> {
    let mut tx = ctx.tx().await?;
    sqlx::query("INSERT INTO results (job_id, attempt) VALUES ($1, $2)")
        .bind(ctx.id())
        .bind(ctx.attempt() as i32)
        .execute(&mut *tx)
        .await?;
    if job.fail {
        return Err(JobError::retry("failed after writing"));
    }
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn transaction_mode_commits_writes_with_completion_or_neither(pool: PgPool) {
    setup(&pool).await;
    let ok = TxStep { fail: false }.enqueue(&pool).await.unwrap().id;
    let bad = TxStep { fail: true }.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["rt.tx"]));
    wait_until("both settled", || async {
        job_row(&pool, ok).await.0 == "done" && job_row(&pool, bad).await.0 == "failed"
    })
    .await;
    rt.stop().await;
    let results: Vec<i64> = sqlx::query_scalar("SELECT job_id FROM results")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(results, [ok], "the failing step's writes were rolled back");
    let (_, attempts, err) = job_row(&pool, bad).await;
    assert_eq!(attempts, 2, "failures are still counted");
    assert_eq!(err.as_deref(), Some("failed after writing"));
}

// ---------------------------------------------------------------------------------
// Shutdown: a job still running after the grace period is handed back.

static HANG_STARTED: AtomicBool = AtomicBool::new(false);

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.forever")]
struct Forever {}

#[jobs::handler]
async fn forever(_job: Forever, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "forever").await?;
    HANG_STARTED.store(true, Ordering::SeqCst);
    std::future::pending::<()>().await;
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn shutdown_hands_back_unfinished_jobs(pool: PgPool) {
    setup(&pool).await;
    let id = Forever {}.enqueue(&pool).await.unwrap().id;
    let rt =
        Running::start(runtime(&pool, &["rt.forever"]).shutdown_grace(Duration::from_millis(200)));
    wait_until("handler started", || async {
        runs(&pool, "forever").await == 1
    })
    .await;
    rt.stop().await;
    let (state, attempts, claimed, claimable): (String, i32, bool, bool) = sqlx::query_as(
        "SELECT state, attempts, claimed_by IS NOT NULL, run_after <= now() FROM jobs WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(state, "pending");
    assert!(!claimed);
    assert!(
        claimable,
        "claimable at once, without waiting for the lease"
    );
    assert_eq!(attempts, 0, "a hand-back spends no attempt");
}

// ---------------------------------------------------------------------------------
// Registration is checked at start.

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn unknown_kind_in_runtime_filter_is_an_error(pool: PgPool) {
    let err = Runtime::new(pool)
        .kinds(["no.such.kind"])
        .run_until(async {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no.such.kind"), "{err}");
}

// ---------------------------------------------------------------------------------
// A runtime process killed mid-handler: its job is taken over after the lease.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.crash", lease = "1s", retain = "1h")]
struct Crash {}

#[jobs::handler]
async fn crash(_job: Crash, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "crash").await?;
    if std::env::var_os("JOBS_TEST_CHILD").is_some() {
        std::future::pending::<()>().await; // killed here
    }
    Ok(())
}

/// Not a test on its own: the body of the child process of `killed_worker_...`.
#[tokio::test]
async fn child_runtime() {
    let Ok(url) = std::env::var("JOBS_TEST_CHILD") else {
        return;
    };
    let pool = PgPool::connect(&url).await.unwrap();
    runtime(&pool, &["rt.crash"]).run().await.unwrap();
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn killed_worker_job_is_taken_over_after_its_lease(
    pool_opts: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let pool = pool_opts.connect_with(opts.clone()).await.unwrap();
    setup(&pool).await;
    let id = Crash {}.enqueue(&pool).await.unwrap().id;
    let url = format!(
        "postgres://{}@{}:{}/{}",
        opts.get_username(),
        opts.get_host(),
        opts.get_port(),
        opts.get_database().unwrap()
    );
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_runtime", "--nocapture"])
        .env("JOBS_TEST_CHILD", &url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_until("child started the job", || async {
        runs(&pool, "crash").await == 1
    })
    .await;
    child.start_kill().unwrap(); // SIGKILL
    child.wait().await.unwrap();
    assert_eq!(
        job_row(&pool, id).await.0,
        "running",
        "the dead worker's claim remains"
    );

    let rt = Running::start(runtime(&pool, &["rt.crash"]));
    wait_until("taken over and done", || async {
        job_row(&pool, id).await.0 == "done"
    })
    .await;
    rt.stop().await;
    let (_, attempts, _) = job_row(&pool, id).await;
    assert_eq!(attempts, 2, "the killed attempt counts");
}

// ---------------------------------------------------------------------------------
// Database faults: a proxy between the runtime and PostgreSQL is cut and restored.

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn database_outage_is_waited_out(
    pool_opts: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let pool = pool_opts.connect_with(opts.clone()).await.unwrap();
    setup(&pool).await;
    let (proxy, proxied) = Proxy::pool(&opts).await;
    for n in 0..200 {
        Count { n }.enqueue(&pool).await.unwrap();
    }
    let rt = Running::start(runtime(&proxied, &["rt.count"]).concurrency(4));
    wait_until("some jobs done", || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM results")
            .fetch_one(&pool)
            .await
            .unwrap()
            > 0
    })
    .await;
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // More work arrives while the runtime cannot reach the database.
    for n in 200..300 {
        Count { n }.enqueue(&pool).await.unwrap();
    }
    proxy.restore();
    wait_until("every job done after the outage", || async {
        common::count_kind(&pool, "rt.count").await == 0
    })
    .await;
    rt.stop().await;
    let results: i64 = sqlx::query_scalar("SELECT count(*) FROM results")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(results, 300, "every job's result recorded exactly once");
    assert_eq!(count(&pool, "failed").await, 0);
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.quick", lease = "2s")]
struct Quick {
    n: u32,
}

/// The first four run for two leases (their claims need renewals); the others end at
/// once.
#[jobs::handler]
async fn quick(job: Quick, _ctx: JobContext) -> Result<(), JobError> {
    if job.n < 4 {
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    Ok(())
}

/// The database goes silent: connections dropped, new ones taken and never answered
/// (a frozen server, a balancer in front of a dead one). The renewals' connection,
/// opened while it is silent, gives up within a lease at most and opens again: once the
/// database answers, the runtime claims again. (Before, the renewals waited on that
/// connection for good, and the runtime claimed nothing more.)
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_database_that_takes_connections_and_never_answers_is_waited_out(
    pool_opts: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let pool = pool_opts.connect_with(opts.clone()).await.unwrap();
    setup(&pool).await;
    let (proxy, proxied) = Proxy::pool(&opts).await;
    for n in 0..4 {
        Quick { n }.enqueue(&pool).await.unwrap();
    }
    let rt = Running::start(runtime(&proxied, &["rt.quick"]).concurrency(4));
    wait_until("four jobs running", || async {
        count(&pool, "running").await == 4
    })
    .await;
    proxy.silence();
    // The renewals find their connection gone within a third of the 2 s lease, and
    // open another while the database is silent.
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.restore();
    for n in 4..24 {
        Quick { n }.enqueue(&pool).await.unwrap();
    }
    wait_until("every job done after the silence", || async {
        common::count_kind(&pool, "rt.quick").await == 0
    })
    .await;
    rt.stop().await;
}

// ---------------------------------------------------------------------------------
// Periodic kinds: one live job across replicas, re-armed one period after completion.

#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "rt.periodic", every = "300ms")]
struct Tick {}

#[jobs::handler]
async fn tick(_job: Tick, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "tick").await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn periodic_kind_keeps_one_live_job_across_replicas(pool: PgPool) {
    setup(&pool).await;
    // An explicit enqueue of a periodic kind is its one live job (the runtime arms
    // the same row), not a second schedule.
    let first = Tick::default().enqueue(&pool).await.unwrap();
    assert!(first.inserted());
    let again = Tick::default().enqueue(&pool).await.unwrap();
    assert_eq!(again.id, first.id);
    // Replicas are separate processes with pools of their own.
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let own = sqlx::postgres::PgPoolOptions::new()
            .max_connections(5)
            .connect_with(pool.connect_options().as_ref().clone())
            .await
            .unwrap();
        replicas.push(Running::start(runtime(&own, &["rt.periodic"])));
    }
    let mut max_live = 0;
    while runs(&pool, "tick").await < 5 {
        let live: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE kind = 'rt.periodic' AND state IN ('pending', 'running')",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        max_live = max_live.max(live);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for r in replicas {
        r.stop().await;
    }
    assert_eq!(max_live, 1, "never more than one live job of the kind");
    assert_eq!(
        common::count_kind(&pool, "rt.periodic").await,
        1,
        "still armed"
    );
    // The period holds on the database clock: consecutive runs start at least one
    // period apart (the next run is armed one period after the previous completes).
    let gaps: Vec<f64> = sqlx::query_scalar::<_, Option<f64>>(
        "SELECT extract(epoch FROM at - lag(at) OVER (ORDER BY at))::float8 FROM runs WHERE note = 'tick' ORDER BY at",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .flatten()
    .collect();
    assert!(gaps.len() >= 4);
    for gap in gaps {
        assert!(gap >= 0.3, "runs {gap}s apart, less than the period");
    }
}

// ---------------------------------------------------------------------------------
// Retention: done rows of a kind that keeps history are pruned after `retain`.

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn done_rows_are_pruned_after_their_retention(pool: PgPool) {
    setup(&pool).await;
    // rt.typed keeps done rows for an hour.
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts, state, finished_at) \
         SELECT 'rt.typed', '{\"count\": 1}'::jsonb, 3, 'done', now() - interval '2 hours' FROM generate_series(1, 2500) \
         UNION ALL \
         SELECT 'rt.typed', '{\"count\": 1}'::jsonb, 3, 'done', now() - interval '10 minutes' FROM generate_series(1, 7)",
    )
    .execute(&pool)
    .await
    .unwrap();
    // Two replicas prune at once, in batches of 1,000.
    let a = Running::start(runtime(&pool, &["rt.typed"]));
    let b = Running::start(runtime(&pool, &["rt.typed"]));
    wait_until("old done rows pruned", || async {
        count(&pool, "done").await == 7
    })
    .await;
    a.stop().await;
    b.stop().await;
    assert_eq!(
        common::count_kind(&pool, "rt.typed").await,
        7,
        "recent done rows are kept"
    );
}

// ---------------------------------------------------------------------------------
// Unusual input: a very large payload, and a kind with unusual characters.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.ünïcödé kind/with:odd 'chars' \"and\" ; --", retain = "1h")]
struct Odd {
    blob: String,
}

#[jobs::handler]
async fn odd(job: Odd, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, &format!("odd {}", job.blob.len())).await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn large_payload_and_unusual_kind_run(pool: PgPool) {
    setup(&pool).await;
    // As large as an enqueue takes (jobs::DEFAULT_MAX_PAYLOAD_BYTES, 16 MiB of JSON).
    let big = "x".repeat(jobs::DEFAULT_MAX_PAYLOAD_BYTES - 1024);
    let id = Odd { blob: big.clone() }.enqueue(&pool).await.unwrap().id;
    Odd {
        blob: "small".into(),
    }
    .enqueue(&pool)
    .await
    .unwrap();
    let rt = Running::start(runtime(&pool, &[Odd::KIND]));
    wait_until("both ran", || async { common::live(&pool).await == 0 }).await;
    rt.stop().await;
    assert_eq!(runs(&pool, &format!("odd {}", big.len())).await, 1);
    assert_eq!(runs(&pool, "odd 5").await, 1);
    assert_eq!(job_row(&pool, id).await.0, "done");
}

// ---------------------------------------------------------------------------------
// Claims taken ahead of free slots: concurrency holds, and shutdown hands them back
// unstarted, their attempt not counted.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.ahead")]
struct Ahead {
    block: bool,
}

static AHEAD_RUNNING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static AHEAD_MAX: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static AHEAD_RELEASE: AtomicBool = AtomicBool::new(false);

#[jobs::handler]
async fn ahead(job: Ahead, ctx: JobContext) -> Result<(), JobError> {
    let now = AHEAD_RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
    AHEAD_MAX.fetch_max(now, Ordering::SeqCst);
    let note = if job.block { "ahead-block" } else { "ahead" };
    let result = record(&ctx, note).await;
    while job.block && !AHEAD_RELEASE.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    AHEAD_RUNNING.fetch_sub(1, Ordering::SeqCst);
    result
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn claims_taken_ahead_respect_concurrency_and_are_handed_back_at_shutdown(pool: PgPool) {
    setup(&pool).await;
    // Fast jobs first, so that the runtime measures a rate and claims ahead; then one
    // that blocks its only slot while the claims behind it wait.
    let mut batch = EnqueueBatch::new();
    for _ in 0..3_000 {
        batch.push(&Ahead { block: false }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    Ahead { block: true }.enqueue(&pool).await.unwrap();
    let mut batch = EnqueueBatch::new();
    for _ in 0..500 {
        batch.push(&Ahead { block: false }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();

    let rt = Running::start(runtime(&pool, &["rt.ahead"]).concurrency(1));
    wait_until("the blocking job started", || async {
        runs(&pool, "ahead-block").await == 1
    })
    .await;
    wait_until("claims taken ahead of the busy slot", || async {
        count(&pool, "running").await > 1
    })
    .await;
    let ahead: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM jobs WHERE state = 'running' \
         AND id NOT IN (SELECT job_id FROM runs WHERE note = 'ahead-block')",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!ahead.is_empty());

    // Shut down while the slot is busy: the claims ahead go back at once, unstarted.
    let stopping = tokio::spawn(rt.stop());
    wait_until("the claims ahead handed back", || async {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE id = ANY($1) AND state = 'running'",
        )
        .bind(&ahead)
        .fetch_one(&pool)
        .await
        .unwrap();
        left == 0
    })
    .await;
    AHEAD_RELEASE.store(true, Ordering::SeqCst);
    stopping.await.unwrap();

    assert_eq!(AHEAD_MAX.load(Ordering::SeqCst), 1, "one handler at a time");
    let (pending, attempts, ran): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(attempts), 0), \
                (SELECT count(*) FROM runs WHERE job_id = ANY($1)) \
         FROM jobs WHERE id = ANY($1) AND state = 'pending'",
    )
    .bind(&ahead)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        pending,
        ahead.len() as i64,
        "every claim ahead is pending again"
    );
    assert_eq!(
        attempts, 0,
        "a claim handed back unstarted counts no attempt"
    );
    assert_eq!(ran, 0, "no claim ahead started after shutdown began");
    assert_eq!(runs(&pool, "ahead-block").await, 1);
    let (total_runs, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT job_id) FROM runs")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(total_runs, distinct, "no job ran twice");
    assert_eq!(
        total_runs + common::live(&pool).await,
        3_501,
        "every job ran or is pending"
    );
}

// ---------------------------------------------------------------------------------
// A held xmin horizon: claimed and finished rows leave index entries nobody may
// remove. The claim from a floor starts past them; a full claim finds what lies behind.

/// The plan of a claim of 10 `rt.count` jobs by `statement` from `floor`, executed
/// (`EXPLAIN ANALYZE`, with buffers) and rolled back, under `plan_cache_mode`.
async fn claim_plan(pool: &PgPool, statement: &str, floor: f64, mode: &str) -> serde_json::Value {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SET LOCAL plan_cache_mode = {mode}"
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}"
    )))
    .bind(vec!["rt.count"])
    .bind(vec![10i32])
    .bind(vec![Some(30_000i64)])
    .bind(10i32)
    .bind(vec![floor])
    .bind(uuid::Uuid::nil())
    .bind(Vec::<i64>::new())
    .bind(Vec::<f64>::new())
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    plan
}

/// Blocks a claim of 10 by `statement` read, and how many rows it claimed.
async fn claim_blocks(pool: &PgPool, statement: &str, floor: f64) -> (i64, i64) {
    let plan = claim_plan(pool, statement, floor, "auto").await;
    let top = &plan[0]["Plan"];
    (
        top["Shared Hit Blocks"].as_i64().unwrap() + top["Shared Read Blocks"].as_i64().unwrap(),
        top["Actual Rows"].as_i64().unwrap(),
    )
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_claim_from_its_floor_skips_the_dead_entries_a_held_horizon_keeps(pool: PgPool) {
    // A session holding an XID: no row version deleted after this may be removed, nor
    // its index entries marked dead.
    let mut holder = pool.acquire().await.unwrap();
    sqlx::query("BEGIN").execute(&mut *holder).await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *holder)
        .await
        .unwrap();

    // 50,000 jobs claimed and finished under the held horizon, then 20 due ones.
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts, run_after) \
         SELECT 'rt.count', '{\"n\":1}', 3, now() - interval '1 hour' + g * interval '1 millisecond' \
         FROM generate_series(1, 50000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE jobs SET state = 'running'")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM jobs")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts) SELECT 'rt.count', '{\"n\":1}', 3 FROM generate_series(1, 20)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let latest_finished: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM now() - interval '1 hour' + 50000 * interval '1 millisecond')::float8",
    )
    .fetch_one(&pool)
    .await
    .unwrap();

    let (full, full_rows) =
        claim_blocks(&pool, jobs::__private::CLAIM_SQL, f64::NEG_INFINITY).await;
    let (from, from_rows) = claim_blocks(&pool, jobs::__private::CLAIM_SQL, latest_finished).await;
    assert_eq!((full_rows, from_rows), (10, 10));
    // The full claim walks every dead entry and visits its heap page; the one from the
    // floor starts past them, and reads what a claim of 10 reads on a clean table
    // (about 100 blocks: the scan, and the update of 10 rows and their index entries).
    assert!(full > 1_000, "the full claim read {full} blocks");
    assert!(from * 5 < full, "from the floor {from} blocks, full {full}");
    sqlx::query("ROLLBACK").execute(&mut *holder).await.unwrap();
}

/// Rows that the plan's nodes read and threw away (filters and join filters).
fn rows_removed(node: &serde_json::Value) -> i64 {
    let own: i64 = ["Rows Removed by Filter", "Rows Removed by Join Filter"]
        .iter()
        .filter_map(|k| node[*k].as_i64())
        .sum::<i64>()
        * node["Actual Loops"].as_i64().unwrap_or(1);
    own + node["Plans"]
        .as_array()
        .map_or(0, |plans| plans.iter().map(rows_removed).sum())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn renewals_and_completions_probe_their_claims_by_id_whatever_the_statistics_say(
    pool: PgPool,
) {
    // Statistics from a moment when every running claim's lease had passed (autovacuum
    // busy elsewhere for longer than a lease), then a burst: 58,000 pending jobs and
    // 2,300 running claims the planner believes are one row.
    for sql in [
        "INSERT INTO jobs (kind, payload, max_attempts, state, attempts, claimed_by, claimed_until) \
         SELECT 'rt.count', '{}', 3, 'running', 1, gen_random_uuid(), now() - interval '1 hour' \
         FROM generate_series(1, 20000)",
        "ANALYZE jobs",
        "DELETE FROM jobs",
        "INSERT INTO jobs (kind, payload, max_attempts) SELECT 'rt.count', '{}', 3 FROM generate_series(1, 58000)",
        "INSERT INTO jobs (kind, payload, max_attempts, state, attempts, claimed_by, claimed_until) \
         SELECT 'rt.count', '{}', 3, 'running', 1, gen_random_uuid(), now() + interval '1 hour' \
         FROM generate_series(1, 2300)",
    ] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    let (ids, tokens): (String, String) = sqlx::query_as(
        "SELECT array_agg(id ORDER BY id)::text, array_agg(claimed_by ORDER BY id)::text \
         FROM (SELECT id, claimed_by FROM jobs WHERE state = 'running' ORDER BY id LIMIT 2000) s",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    for (name, types, rest) in [
        (
            "RENEW",
            "bigint[], uuid[], bigint[]",
            ", array_fill(30000::bigint, ARRAY[2000])",
        ),
        ("COMPLETE_DELETE", "bigint[], uuid[]", ""),
        (
            "COMPLETE_KEEP",
            "bigint[], uuid[], bigint[], bool[], text[]",
            ", array_fill(NULL::bigint, ARRAY[2000]), array_fill(true, ARRAY[2000]), '{}'",
        ),
    ] {
        let run = |sql: String| sqlx::query(sqlx::AssertSqlSafe(sql));
        // Planned for its arguments at each execution, as the runtime sends it (unnamed).
        run(format!("PREPARE s({types}) AS {}", common::statement(name)))
            .execute(&mut *conn)
            .await
            .unwrap();
        run("BEGIN".into()).execute(&mut *conn).await.unwrap();
        run("SET LOCAL plan_cache_mode = force_custom_plan".into())
            .execute(&mut *conn)
            .await
            .unwrap();
        let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE s('{ids}', '{tokens}'{rest})"
        )))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        run("ROLLBACK".into()).execute(&mut *conn).await.unwrap();
        run("DEALLOCATE s".into())
            .execute(&mut *conn)
            .await
            .unwrap();

        let top = &plan[0]["Plan"];
        assert_eq!(
            top["Actual Rows"].as_i64(),
            Some(2_000),
            "{name}: every claim"
        );
        // One probe per claim: nothing compares the table with the batch (the joins of
        // the table to the batch threw away 4.6 million rows here).
        let removed = rows_removed(top);
        assert!(
            removed < 2_000,
            "{name} threw away {removed} rows: {plan:#}"
        );
    }
}

/// The interleaving that made scheduled jobs start up to 50 ms late: an idle runtime's
/// claim runs a moment before a job is due, the job becomes due, then the query for the
/// next due time runs. That query used to look only past its own `now()`, so it missed
/// the job and the runtime slept until the next one. It now looks back over the time
/// since the claim was sent: a job due in that window is reported due (claim at once),
/// and one due before it (the claim's to take, left because its row was locked or its
/// key's job was running) is not, so an idle runtime does not spin on it.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_next_due_time_counts_a_job_that_became_due_after_the_claim_looked(pool: PgPool) {
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts, run_after) VALUES \
         ('rt.count', '{}', 3, now() + interval '1 s'), \
         ('rt.count', '{}', 3, now() - interval '1 hour'), \
         ('rt.count', '{}', 3, now() + interval '1 hour')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let next_due = |window: f64| {
        sqlx::query_scalar::<_, Option<f64>>(common::statement("NEXT_DUE"))
            .bind(vec!["rt.count"])
            .bind(window)
            .bind(Vec::<i64>::new())
            .fetch_one(&pool)
    };
    // Before the first job is due: the time until it.
    let before = next_due(0.002).await.unwrap().unwrap();
    assert!(before > 0.0 && before <= 1.0, "{before}");
    // The claim looks now (and finds nothing due but the hour-old job, which it leaves).
    let claim_sent = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The job became due after the claim: reported due, to be claimed at once.
    let window = claim_sent.elapsed().as_secs_f64() + 0.002;
    let after = next_due(window).await.unwrap().unwrap();
    assert!(after <= 0.0, "a job due since the claim looked: {after}");
    // A claim that looked after it became due had its chance; the hour-old job too:
    // the next due time is the job an hour ahead.
    let later = next_due(0.002).await.unwrap().unwrap();
    assert!(later > 3_000.0, "{later}");
}

/// The next-due query names the kinds of the jobs that became due since the claim
/// looked, so that the claim after it asks for those kinds and not for every quiet one
/// (each kind with a limit is a claim of its own). A job due before the window, one
/// scheduled later and a kind without jobs are not named.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_next_due_query_names_the_kinds_that_became_due_since_the_claim(pool: PgPool) {
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts, priority, run_after) VALUES \
         ('rt.now', '{}', 3, 4, now() - interval '200 ms'), \
         ('rt.now2', '{}', 3, 0, now() - interval '10 ms'), \
         ('rt.old', '{}', 3, 0, now() - interval '1 hour'), \
         ('rt.later', '{}', 3, 0, now() + interval '1 hour')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let kinds = vec!["rt.later", "rt.none", "rt.now", "rt.now2", "rt.old"];
    let next_due = |window: f64| {
        sqlx::query_as::<_, (Option<f64>, bool, Vec<i64>, Vec<String>)>(common::statement(
            "NEXT_DUE",
        ))
        .bind(&kinds)
        .bind(window)
        .bind(Vec::<i64>::new())
        .fetch_one(&pool)
    };
    let (due, _, _, due_now) = next_due(1.0).await.unwrap();
    assert!(due.unwrap() <= 0.0, "{due:?}");
    assert_eq!(due_now, ["rt.now", "rt.now2"]);
    // With a window that starts after both became due: none is named, and the next
    // due time is the job an hour ahead.
    let (due, _, _, due_now) = next_due(0.001).await.unwrap();
    assert!(due.unwrap() > 3_000.0, "{due:?}");
    assert!(due_now.is_empty(), "{due_now:?}");
}

/// A writer the last claim saw ends while the next-due query runs, after the query's
/// snapshot was taken and before it read the locks: the query must still say so (as a
/// writer at work, or as one ended), or the idle runtime sleeps until the poll. The
/// query is made slow (many kinds to probe) and the writer rolls back during it.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_writer_ending_while_the_next_due_query_runs_is_reported(pool: PgPool) {
    let mut writer = pool.begin().await.unwrap();
    let xid: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (kind, payload, max_attempts) VALUES ('rt.writer', '{}', 3) \
         RETURNING pg_current_xact_id()::text::bigint",
    )
    .fetch_one(&mut *writer)
    .await
    .unwrap();
    let kinds: Vec<String> = (0..20_000).map(|i| format!("rt.many{i}")).collect();
    let mut conn = pool.acquire().await.unwrap();
    let query = sqlx::query_as::<_, (Option<f64>, bool, Vec<i64>)>(common::statement("NEXT_DUE"))
        .bind(&kinds)
        .bind(0.002_f64)
        .bind(vec![xid])
        .fetch_one(&mut *conn);
    let end = async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        writer.rollback().await.unwrap();
    };
    let ((_, writers, ended), ()) = tokio::join!(async { query.await.unwrap() }, end);
    assert!(
        writers || ended == [xid],
        "the writer neither at work nor ended: writers {writers}, ended {ended:?}"
    );
}

/// The next-due query of a runtime of one kind is planned once for all, like that of a
/// runtime of many: PostgreSQL keeps a prepared statement's generic plan only when it
/// looks no dearer than the plans made for each call, and with the array of kinds seen
/// one kind looked cheaper planned each time (a quarter of a millisecond per call).
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_next_due_query_of_one_kind_keeps_its_generic_plan(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    for _ in 0..8 {
        sqlx::query(common::statement("NEXT_DUE"))
            .bind(vec!["rt.count"])
            .bind(0.002_f64)
            .bind(Vec::<i64>::new())
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    }
    let (generic, custom): (i64, i64) = sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1",
    )
    .bind(common::statement("NEXT_DUE"))
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert!(
        generic >= 2 && custom <= 6,
        "generic {generic}, custom {custom}"
    );
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.behind")]
struct Behind {
    n: u32,
}

#[jobs::handler]
async fn behind(job: Behind, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, &format!("behind-{}", job.n)).await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_locked_while_claims_passed_it_still_runs(pool: PgPool) {
    setup(&pool).await;
    // Job 0 is due first, but the application holds its row while the runtime claims
    // and runs jobs due after it, so the runtime's floor moves past it.
    let first = Behind { n: 0 }.enqueue(&pool).await.unwrap().id;
    let mut app = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE")
        .bind(first)
        .execute(&mut *app)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in 1..=20 {
        Behind { n }.enqueue(&pool).await.unwrap();
    }
    let rt = Running::start(runtime(&pool, &["rt.behind"]));
    wait_until("the jobs behind it ran", || async {
        runs(&pool, "behind-20").await == 1
    })
    .await;
    // Later jobs again, so that claims keep starting from a floor past job 0.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in 21..=40 {
        Behind { n }.enqueue(&pool).await.unwrap();
    }
    wait_until("the later jobs ran", || async {
        runs(&pool, "behind-40").await == 1
    })
    .await;
    assert_eq!(runs(&pool, "behind-0").await, 0, "its row is held");
    app.commit().await.unwrap();
    // A full claim, at least once per poll interval, finds it.
    wait_until("the job behind the floor ran", || async {
        runs(&pool, "behind-0").await == 1
    })
    .await;
    rt.stop().await;
}

// A kind's own concurrency holds with claims taken ahead.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.capped", concurrency = 2)]
struct Capped {}

static CAPPED_RUNNING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static CAPPED_MAX: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[jobs::handler]
async fn capped(_job: Capped, ctx: JobContext) -> Result<(), JobError> {
    let now = CAPPED_RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
    CAPPED_MAX.fetch_max(now, Ordering::SeqCst);
    let result = record(&ctx, "capped").await;
    tokio::task::yield_now().await;
    CAPPED_RUNNING.fetch_sub(1, Ordering::SeqCst);
    result
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_kinds_concurrency_holds_with_claims_taken_ahead(pool: PgPool) {
    setup(&pool).await;
    let mut batch = EnqueueBatch::new();
    for _ in 0..2_000 {
        batch.push(&Capped {}).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let rt = Running::start(runtime(&pool, &["rt.capped"]).concurrency(10));
    let ahead_seen = AtomicBool::new(false);
    wait_until("every capped job ran", || async {
        // Claims held beyond the kind's two slots show that it claimed ahead.
        if count(&pool, "running").await > 2 {
            ahead_seen.store(true, Ordering::SeqCst);
        }
        runs(&pool, "capped").await == 2_000
    })
    .await;
    rt.stop().await;
    assert!(
        ahead_seen.load(Ordering::SeqCst),
        "the runtime claimed ahead of the kind's slots"
    );
    assert_eq!(CAPPED_MAX.load(Ordering::SeqCst), 2, "at most two at once");
    let distinct: i64 = sqlx::query_scalar("SELECT count(DISTINCT job_id) FROM runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(distinct, 2_000, "each ran once");
}

// ---------------------------------------------------------------------------------
// Claims taken ahead whose slot does not free go back, so another runtime runs them.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.stuck")]
struct Stuck {
    block: bool,
}

static STUCK_RELEASE: AtomicBool = AtomicBool::new(false);

#[jobs::handler]
async fn stuck(job: Stuck, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, if job.block { "stuck-block" } else { "stuck" }).await?;
    while job.block && !STUCK_RELEASE.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn claims_held_ahead_of_a_slot_that_does_not_free_go_to_another_runtime(pool: PgPool) {
    setup(&pool).await;
    // As in the test above: fast jobs so that runtime A claims ahead, then one that
    // holds A's only slot (until the end of the test), then jobs behind it.
    let mut batch = EnqueueBatch::new();
    for _ in 0..3_000 {
        batch.push(&Stuck { block: false }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    Stuck { block: true }.enqueue(&pool).await.unwrap();
    let mut batch = EnqueueBatch::new();
    for _ in 0..300 {
        batch.push(&Stuck { block: false }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();

    let a = Running::start(runtime(&pool, &["rt.stuck"]).concurrency(1));
    wait_until("the blocking job started", || async {
        runs(&pool, "stuck-block").await == 1
    })
    .await;
    wait_until("claims taken ahead of the busy slot", || async {
        count(&pool, "running").await > 1
    })
    .await;
    // Runtime B has free slots: every job behind the blocked one runs, those A held
    // ahead included, while A's slot stays busy.
    let b = Running::start(runtime(&pool, &["rt.stuck"]).concurrency(4));
    wait_until("every other job ran", || async {
        runs(&pool, "stuck").await == 3_300
    })
    .await;
    // A handler records its run before its completion is written.
    wait_until("their completions written", || async {
        count(&pool, "running").await <= 1
    })
    .await;
    assert_eq!(
        count(&pool, "running").await,
        1,
        "only the blocked job is held"
    );
    STUCK_RELEASE.store(true, Ordering::SeqCst);
    a.stop().await;
    b.stop().await;
    let (total, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT job_id) FROM runs")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((total, distinct), (3_301, 3_301), "each job ran once");
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(attempts, 0, "every job completed");
}

// ---------------------------------------------------------------------------------
// A re-run whose trigger came while the job ran is claimed at once when the run ends,
// even though the runtime's claims have moved past the trigger's time.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "rt.rerun_floor", key = "key")]
struct RerunFloor {
    key: String,
    n: u32,
}

#[jobs::handler]
async fn rerun_floor(job: RerunFloor, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, &format!("rerun-{}-{}", job.key, job.n)).await?;
    if job.key == "slow" && job.n == 1 {
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_rerun_mark_is_not_left_behind_the_claims_floor(pool: PgPool) {
    setup(&pool).await;
    // Polling once an hour: only the completion's wake-up and the floor claim it
    // triggers can start the re-run in time.
    let rt = Running::start(
        runtime(&pool, &["rt.rerun_floor"])
            .concurrency(4)
            .poll_interval(Duration::from_secs(3600)),
    );
    let slow = |n| RerunFloor {
        key: "slow".into(),
        n,
    };
    slow(1).enqueue(&pool).await.unwrap();
    wait_until("the slow run started", || async {
        runs(&pool, "rerun-slow-1").await == 1
    })
    .await;
    // A trigger while it runs: a re-run mark at this instant.
    slow(2).enqueue(&pool).await.unwrap();
    // Later jobs of the kind, claimed while the slow one runs: the floor moves past
    // the mark's time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..5 {
        RerunFloor {
            key: format!("other{i}"),
            n: 1,
        }
        .enqueue(&pool)
        .await
        .unwrap();
    }
    wait_until("the re-run ran", || async {
        runs(&pool, "rerun-slow-2").await == 1
    })
    .await;
    rt.stop().await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_keeping_completion_leaves_a_claim_of_a_kind_without_history_to_the_delete(
    pool: PgPool,
) {
    // A claim of a kind that keeps no done rows, which the delete skipped because a
    // renewal held its row; by the time the keeping completion runs the row is free.
    let token = uuid::Uuid::new_v4();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (kind, payload, max_attempts, state, attempts, claimed_by, claimed_until) \
         VALUES ('rt.count', '{\"n\":1}', 3, 'running', 1, $1, now() + interval '1 minute') RETURNING id",
    )
    .bind(token)
    .fetch_one(&pool)
    .await
    .unwrap();
    let keep = |kept: bool| {
        sqlx::query_as::<_, (i64, bool, bool)>(common::statement("COMPLETE_KEEP"))
            .bind(vec![id])
            .bind(vec![token])
            .bind(vec![None::<i64>])
            .bind(vec![kept])
            .bind(Vec::<String>::new())
    };
    let row = keep(false).fetch_one(&pool).await.unwrap();
    assert_eq!(
        row,
        (id, false, true),
        "not completed, still held: the delete retries"
    );
    let state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(state, "running", "no done row for a kind that keeps none");
    // A kind that keeps its done rows is completed here.
    let (_, done, _) = keep(true).fetch_one(&pool).await.unwrap();
    assert!(done);
}

/// Runs the runtime's claim of up to `n` jobs of `kind` (no floors, no writers):
/// each job's id and token.
async fn claim_tokens(pool: &PgPool, kind: &str, n: i32) -> Vec<(i64, uuid::Uuid)> {
    let sql = common::statement("CLAIM");
    let rows = sqlx::query(sql)
        .bind(vec![kind])
        .bind(vec![n])
        .bind(vec![60_000_i64])
        .bind(n)
        .bind(Vec::<f64>::new())
        .bind(uuid::Uuid::new_v4())
        .bind(Vec::<i64>::new())
        .bind(Vec::<f64>::new())
        .fetch_all(pool)
        .await
        .unwrap();
    use sqlx::Row;
    rows.iter()
        .map(|r| (r.get::<i64, _>("id"), r.get::<uuid::Uuid, _>("claimed_by")))
        .collect()
}

/// A claim's tokens are 8 random bytes drawn once per claim, then the job's id: each
/// job of a claim has a token of its own, and a job claimed again gets another.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn each_claim_of_a_job_has_a_token_of_its_own(pool: PgPool) {
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts) \
         SELECT 'rt.tokens', '{}', 3 FROM generate_series(1, 3)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let first = claim_tokens(&pool, "rt.tokens", 3).await;
    assert_eq!(first.len(), 3);
    for (id, token) in &first {
        assert_eq!(token.as_bytes()[8..], id.to_be_bytes(), "ends in its id");
        assert_eq!(token.as_bytes()[..8], first[0].1.as_bytes()[..8]);
    }
    sqlx::query("UPDATE jobs SET state = 'pending', claimed_by = NULL, claimed_until = NULL")
        .execute(&pool)
        .await
        .unwrap();
    let again = claim_tokens(&pool, "rt.tokens", 3).await;
    assert_eq!(again.len(), 3);
    for (id, token) in &again {
        let before = first.iter().find(|(i, _)| i == id).expect("the same job").1;
        assert_ne!(*token, before, "a job claimed again has a new token");
    }
}
