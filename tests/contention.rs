//! Guarantees under contention: interleavings built on purpose (a second connection
//! holding a lock, a small pool, a session the server ends, overlapping batches, a
//! dropped runtime). Each test failed against the protocol before these fixes.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use common::{Running, record, runs, runtime, wait_until};
use jobs::{EnqueueBatch, EnqueueOutcome, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// Where handlers record each run: job, attempt, what, and when (database clock).
async fn setup(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE runs (seq bigserial, job_id bigint, attempt int, note text, at timestamptz DEFAULT clock_timestamp())",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("CREATE TABLE results (job_id bigint, attempt int)")
        .execute(pool)
        .await
        .unwrap();
}

/// The most runs any one job of `note` had.
async fn most_runs_of_one_job(pool: &PgPool, note: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM runs WHERE note = $1 GROUP BY job_id) r",
    )
    .bind(note)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn state_of(pool: &PgPool, id: i64) -> Option<(String, i32, Option<String>)> {
    sqlx::query_as("SELECT state, attempts, last_error FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap()
}

async fn wait_flag(what: &str, flag: &AtomicBool) {
    wait_until(what, || async { flag.load(Ordering::SeqCst) }).await;
}

// ---------------------------------------------------------------------------------
// 1. A completion stalled on a locked row holds up no other job, and no succeeded job
//    runs again.

static HELD_RUNNING: AtomicBool = AtomicBool::new(false);
static HELD_RELEASE: AtomicBool = AtomicBool::new(false);

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.held", key = "key", lease = "1s")]
struct Held {
    key: String,
    version: u32,
}

#[jobs::handler]
async fn held(job: Held, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, &format!("held v{}", job.version)).await?;
    if job.version == 1 {
        HELD_RUNNING.store(true, Ordering::SeqCst);
        while !HELD_RELEASE.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.other", lease = "1s")]
struct Other {
    n: u32,
}

#[jobs::handler]
async fn other(_job: Other, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "other").await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn locked_row_holds_up_no_other_completion(pool: PgPool) {
    setup(&pool).await;
    let held_key = || "k".to_owned();
    Held {
        key: held_key(),
        version: 1,
    }
    .enqueue(&pool)
    .await
    .unwrap();
    let rt = Running::start(runtime(&pool, &["ct.held", "ct.other"]));
    wait_flag("the held job runs", &HELD_RUNNING).await;

    // The application's transaction marks the running job for a re-run and stays open:
    // it holds the job's row lock.
    let mut app = pool.begin().await.unwrap();
    let marked = Held {
        key: held_key(),
        version: 2,
    }
    .enqueue(&mut *app)
    .await
    .unwrap();
    assert_eq!(marked.outcome, EnqueueOutcome::RerunMarked);
    // The held job finishes: its completion meets the locked row.
    HELD_RELEASE.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Unrelated jobs run and complete meanwhile, while the lock is held for four leases.
    let mut batch = EnqueueBatch::new();
    for n in 0..5 {
        batch.push(&Other { n }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    wait_until("the other jobs complete", || async {
        common::count_kind(&pool, "ct.other").await == 0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    app.commit().await.unwrap();

    wait_until("the re-run of the held key completes", || async {
        runs(&pool, "held v2").await == 1 && common::live(&pool).await == 0
    })
    .await;
    rt.stop().await;
    assert_eq!(runs(&pool, "other").await, 5);
    assert_eq!(
        most_runs_of_one_job(&pool, "other").await,
        1,
        "a completed job ran again"
    );
    assert_eq!(runs(&pool, "held v1").await, 1);
    assert_eq!(common::count(&pool, "failed").await, 0);
}

// ---------------------------------------------------------------------------------
// 2. The runtime's statements never wait behind handlers for a connection.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.busy", lease = "1s")]
struct Busy {
    n: u32,
}

#[jobs::handler]
async fn busy(_job: Busy, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "busy").await?;
    // Hold a connection of the application's pool for longer than a lease, then write
    // the result through a fenced transaction (which waits for a connection too).
    {
        let mut conn = ctx.pool().acquire().await?;
        sqlx::query("SELECT pg_sleep(0.3)")
            .execute(&mut *conn)
            .await?;
    }
    let mut tx = ctx.fenced_tx().await?;
    sqlx::query("INSERT INTO results (job_id, attempt) VALUES ($1, $2)")
        .bind(ctx.id())
        .bind(ctx.attempt() as i32)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn handlers_that_exhaust_the_pool_do_not_starve_the_runtime(pool: PgPool) {
    setup(&pool).await;
    // A pool smaller than the concurrency, as with sqlx's defaults.
    let small = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .unwrap();
    let mut batch = EnqueueBatch::new();
    for n in 0..30 {
        batch.push(&Busy { n }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let rt = Running::start(runtime(&small, &["ct.busy"]).concurrency(10));
    wait_until("every job completes", || async {
        common::count_kind(&pool, "ct.busy").await == 0
    })
    .await;
    rt.stop().await;
    let results: i64 = sqlx::query_scalar("SELECT count(*) FROM results")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(results, 30, "one committed result per job");
    assert_eq!(
        most_runs_of_one_job(&pool, "busy").await,
        1,
        "a lease lapsed while its handler waited for a connection"
    );
}

// ---------------------------------------------------------------------------------
// 3. Transaction mode: a handler that reports a lost lease leaves a claim that expires.

static LOSER_RUNS: AtomicU32 = AtomicU32::new(0);

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.loser", key = "key", lease = "transaction")]
struct Loser {
    key: String,
}

#[jobs::handler]
async fn loser(_job: Loser, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "loser").await?;
    if LOSER_RUNS.fetch_add(1, Ordering::SeqCst) == 0 {
        let mut tx = ctx.tx().await?;
        sqlx::query("INSERT INTO results (job_id, attempt) VALUES ($1, $2)")
            .bind(ctx.id())
            .bind(ctx.attempt() as i32)
            .execute(&mut *tx)
            .await?;
        return Err(JobError::lease_lost());
    }
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn transaction_mode_lease_lost_leaves_an_expiring_claim(pool: PgPool) {
    setup(&pool).await;
    let id = Loser { key: "k".into() }.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["ct.loser"]));
    wait_until("the first run returned", || async {
        LOSER_RUNS.load(Ordering::SeqCst) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (state, finite): (String, bool) =
        sqlx::query_as("SELECT state, claimed_until < 'infinity' FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(state, "running");
    assert!(finite, "the claim has a lease that can expire");
    // A trigger meanwhile is a re-run mark, as for any running job.
    let again = Loser { key: "k".into() }.enqueue(&pool).await.unwrap();
    assert_eq!(again.outcome, EnqueueOutcome::RerunMarked);
    // Let the lease run out (as the clock would), without waiting for it.
    sqlx::query("UPDATE jobs SET claimed_until = now() - interval '1 second' WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    wait_until("the job is rescued and runs again", || async {
        runs(&pool, "loser").await == 2 && common::live(&pool).await == 0
    })
    .await;
    rt.stop().await;
    let results: i64 = sqlx::query_scalar("SELECT count(*) FROM results")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(results, 0, "the lost run's writes were rolled back");
    let fresh = Loser { key: "k".into() }.enqueue(&pool).await.unwrap();
    assert_eq!(fresh.outcome, EnqueueOutcome::Inserted);
}

// ---------------------------------------------------------------------------------
// 4. Transaction mode: a session the server ends counts its attempt, and never leaves
//    two runs of one job going at once.

#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "ct.dies",
    lease = "transaction",
    max_attempts = 2,
    backoff = "10ms"
)]
struct Dies {}

#[jobs::handler]
async fn dies(_job: Dies, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "dies start").await?;
    {
        let mut tx = ctx.tx().await?;
        sqlx::query("SET LOCAL idle_in_transaction_session_timeout = '100ms'")
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO results (job_id, attempt) VALUES ($1, $2)")
            .bind(ctx.id())
            .bind(ctx.attempt() as i32)
            .execute(&mut *tx)
            .await?;
    }
    // Idle in the transaction past its timeout: the server ends the session.
    tokio::time::sleep(Duration::from_millis(600)).await;
    record(&ctx, "dies end").await?;
    let mut tx = ctx.tx().await?;
    sqlx::query("SELECT 1").execute(&mut *tx).await?;
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn transaction_mode_session_loss_counts_the_attempt(pool: PgPool) {
    setup(&pool).await;
    let id = Dies {}.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["ct.dies"]).concurrency(2));
    wait_until("the job fails", || async {
        state_of(&pool, id).await.is_some_and(|s| s.0 == "failed")
    })
    .await;
    rt.stop().await;
    let (_, attempts, error) = state_of(&pool, id).await.unwrap();
    assert_eq!(attempts, 2);
    assert!(error.is_some());
    assert_eq!(runs(&pool, "dies start").await, 2, "one run per attempt");
    // No run started while another was going: each started after the previous ended.
    let overlapping: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM runs s JOIN runs e ON e.note = 'dies end' AND e.attempt = s.attempt - 1
         WHERE s.note = 'dies start' AND s.at < e.at",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(overlapping, 0);
    let results: i64 = sqlx::query_scalar("SELECT count(*) FROM results")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(results, 0, "no write of a lost session committed");
}

// ---------------------------------------------------------------------------------
// 5. Transaction mode: an enqueue of the running job's key does not wait for it.

static STEP_WRITING: AtomicBool = AtomicBool::new(false);
static STEP_GO: AtomicBool = AtomicBool::new(false);

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.step", key = "key", lease = "transaction")]
struct Step {
    key: String,
    version: u32,
}

#[jobs::handler]
async fn step(job: Step, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, &format!("step v{}", job.version)).await?;
    let mut tx = ctx.tx().await?;
    sqlx::query("INSERT INTO results (job_id, attempt) VALUES ($1, $2)")
        .bind(ctx.id())
        .bind(job.version as i32)
        .execute(&mut *tx)
        .await?;
    if job.version == 1 {
        STEP_WRITING.store(true, Ordering::SeqCst);
        while !STEP_GO.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn transaction_mode_never_blocks_an_enqueue_of_its_key(pool: PgPool) {
    setup(&pool).await;
    Step {
        key: "k".into(),
        version: 1,
    }
    .enqueue(&pool)
    .await
    .unwrap();
    let rt = Running::start(runtime(&pool, &["ct.step"]));
    wait_flag("the handler is writing", &STEP_WRITING).await;
    // The handler goes on only after this enqueue returns: if the enqueue waited for
    // the handler, this would never finish.
    let enqueued = tokio::time::timeout(
        Duration::from_secs(30),
        Step {
            key: "k".into(),
            version: 2,
        }
        .enqueue(&pool),
    )
    .await
    .expect("the enqueue waited for the running handler")
    .unwrap();
    assert_eq!(enqueued.outcome, EnqueueOutcome::RerunMarked);
    STEP_GO.store(true, Ordering::SeqCst);
    wait_until("both versions ran", || async {
        runs(&pool, "step v2").await == 1 && common::live(&pool).await == 0
    })
    .await;
    rt.stop().await;
    let results: Vec<i32> = sqlx::query_scalar("SELECT attempt FROM results ORDER BY attempt")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(results, [1, 2], "each run's writes committed once");
}

// ---------------------------------------------------------------------------------
// 6. Claims are fair across lease modes: by run_after, whatever the mode.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.fair_tx", lease = "transaction")]
struct FairTx {}

#[jobs::handler]
async fn fair_tx(_job: FairTx, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "fair").await
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.fair_hb")]
struct FairHb {
    n: u32,
}

#[jobs::handler]
async fn fair_hb(_job: FairHb, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "fair").await?;
    tokio::time::sleep(Duration::from_millis(2)).await;
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn transaction_mode_kinds_take_their_turn_by_run_after(pool: PgPool) {
    setup(&pool).await;
    let oldest = FairTx {}.enqueue(&pool).await.unwrap().id;
    let mut batch = EnqueueBatch::new();
    for n in 0..300 {
        batch.push(&FairHb { n }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let rt = Running::start(runtime(&pool, &["ct.fair_tx", "ct.fair_hb"]).concurrency(2));
    wait_until("the transaction-mode job ran", || async {
        state_of(&pool, oldest).await.is_none()
    })
    .await;
    rt.stop().await;
    let position: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM runs WHERE seq < (SELECT seq FROM runs WHERE job_id = $1)",
    )
    .bind(oldest)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        position < 4,
        "the oldest job ran after {position} younger ones"
    );
}

// ---------------------------------------------------------------------------------
// 7. A fenced transaction dropped without commit, then Ok(()), does not complete.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.dropped", backoff = "10ms")]
struct Dropped {}

#[jobs::handler]
async fn dropped(_job: Dropped, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "dropped").await?;
    let mut tx = ctx.fenced_tx().await?;
    sqlx::query("INSERT INTO results (job_id, attempt) VALUES ($1, $2)")
        .bind(ctx.id())
        .bind(ctx.attempt() as i32)
        .execute(&mut *tx)
        .await?;
    if ctx.attempt() == 1 {
        drop(tx); // forgot to commit: the write is rolled back
        return Ok(());
    }
    tx.commit().await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn dropped_fenced_transaction_does_not_complete_the_job(pool: PgPool) {
    setup(&pool).await;
    Dropped {}.enqueue(&pool).await.unwrap();
    let rt = Running::start(runtime(&pool, &["ct.dropped"]));
    wait_until("the job completes", || async {
        common::count_kind(&pool, "ct.dropped").await == 0
    })
    .await;
    rt.stop().await;
    assert_eq!(
        runs(&pool, "dropped").await,
        2,
        "the first run was a failure"
    );
    let results: Vec<i32> = sqlx::query_scalar("SELECT attempt FROM results")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(results, [2], "the completing run's write, and only it");
}

// ---------------------------------------------------------------------------------
// 8. A failing periodic kind runs at its own period and leaves no failed rows.

#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "ct.hourly", every = "1h", max_attempts = 1)]
struct Hourly {}

#[jobs::handler]
async fn hourly(_job: Hourly, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "hourly").await?;
    Err(JobError::retry("the hourly job always fails"))
}

#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "ct.every_second", every = "1s")]
struct EverySecond {}

#[jobs::handler]
async fn every_second(_job: EverySecond, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "every second").await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn failing_periodic_kind_waits_its_own_period(pool: PgPool) {
    setup(&pool).await;
    let rt = Running::start(runtime(&pool, &["ct.hourly", "ct.every_second"]));
    wait_until("the fast kind ran four times", || async {
        runs(&pool, "every second").await >= 4
    })
    .await;
    rt.stop().await;
    assert_eq!(runs(&pool, "hourly").await, 1, "one run per hour");
    let rows: Vec<(String, Option<String>, bool)> = sqlx::query_as(
        "SELECT state, last_error, run_after > now() + interval '50 minutes' FROM jobs WHERE kind = 'ct.hourly'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 1, "no failed rows pile up: {rows:?}");
    let (state, error, next_in_an_hour) = &rows[0];
    assert_eq!(state, "pending");
    assert_eq!(error.as_deref(), Some("the hourly job always fails"));
    assert!(next_in_an_hour, "the next run is one period later");
}

// ---------------------------------------------------------------------------------
// 9. A trigger that coalesces into a pending job gives it a fresh attempt budget.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.budget", key = "key", max_attempts = 20)]
struct Budget {
    key: String,
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn coalescing_gives_a_fresh_attempt_budget(pool: PgPool) {
    let id = Budget { key: "k".into() }.enqueue(&pool).await.unwrap().id;
    // As if 19 attempts had failed and the 20th waits out its backoff.
    sqlx::query(
        "UPDATE jobs SET attempts = 19, last_error = 'boom', run_after = now() + interval '1 hour' WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    let again = Budget { key: "k".into() }.enqueue(&pool).await.unwrap();
    assert_eq!(again.id, id);
    assert_eq!(again.outcome, EnqueueOutcome::Coalesced);
    let (attempts, due): (i32, bool) =
        sqlx::query_as("SELECT attempts, run_after <= now() FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(attempts, 0, "the new trigger gets all 20 attempts");
    assert!(due, "the newest trigger's run-after wins");

    // The same through a batch.
    sqlx::query("UPDATE jobs SET attempts = 19 WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    jobs::enqueue_all(&pool, &[Budget { key: "k".into() }])
        .await
        .unwrap();
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(attempts, 0);
}

// ---------------------------------------------------------------------------------
// 10. Batches of overlapping keys in opposite orders never deadlock.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.keyed", key = "key")]
struct Keyed {
    key: String,
}

/// Enqueues the keys `{round}-a`, `-x` and `-b`, and returns a transaction that holds
/// the row lock of `-x`.
async fn seed_and_hold_x(
    pool: &PgPool,
    round: usize,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let key = |k: &str| format!("{round}-{k}");
    jobs::enqueue_all(
        pool,
        &[
            Keyed { key: key("a") },
            Keyed { key: key("x") },
            Keyed { key: key("b") },
        ],
    )
    .await
    .unwrap();
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM jobs WHERE key = $1 FOR UPDATE")
        .bind(key("x"))
        .execute(&mut *holder)
        .await
        .unwrap();
    holder
}

/// Waits until two sessions of the test's database wait for a lock.
async fn both_batches_wait_for_a_lock(pool: &PgPool) {
    wait_until("both batches wait for a lock", || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        waiting == 2
    })
    .await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn overlapping_batches_never_deadlock(pool: PgPool) {
    // Batches [a, x, b] and [b, x, a] while a third transaction holds x: each batch
    // takes its first key, then waits for x; when x is free, each needs the other's
    // first key. Locked in input order, that is a deadlock every time.
    for round in 0..3 {
        let key = |k: &str| format!("{round}-{k}");
        let holder = seed_and_hold_x(&pool, round).await;
        let mut tasks = Vec::new();
        for order in [["a", "x", "b"], ["b", "x", "a"]] {
            let pool = pool.clone();
            let jobs: Vec<Keyed> = order.iter().map(|k| Keyed { key: key(k) }).collect();
            tasks.push(tokio::spawn(async move {
                let mut tx = pool.begin().await?;
                jobs::enqueue_all(&mut *tx, &jobs).await?;
                tx.commit().await?;
                Ok::<_, jobs::Error>(())
            }));
        }
        both_batches_wait_for_a_lock(&pool).await;
        holder.commit().await.unwrap();
        for task in tasks {
            task.await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    }
    assert_eq!(common::live(&pool).await, 9);
}

/// The same, with rows without a key between the keyed ones: the bulk statement inserts
/// those by a plain `INSERT` beside the keyed one. While both batches wait for the held
/// key, neither waits on the other's unkeyed rows, none deadlocks, and every unkeyed row
/// is inserted once, its id rising in push order.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn overlapping_batches_with_unkeyed_rows_never_deadlock(pool: PgPool) {
    for round in 0..3 {
        let key = |k: &str| format!("{round}-{k}");
        let holder = seed_and_hold_x(&pool, round).await;
        let mut tasks = Vec::new();
        for (b, order) in [["a", "x", "b"], ["b", "x", "a"]].into_iter().enumerate() {
            let pool = pool.clone();
            let mut batch = EnqueueBatch::new();
            for (i, k) in order.iter().enumerate() {
                let n = (round * 100 + b * 10 + i) as u32;
                batch.push(&Other { n }).unwrap();
                batch.push(&Keyed { key: key(k) }).unwrap();
            }
            tasks.push(tokio::spawn(async move {
                let mut tx = pool.begin().await?;
                let results = batch.enqueue(&mut *tx).await?;
                tx.commit().await?;
                Ok::<_, jobs::Error>(results)
            }));
        }
        both_batches_wait_for_a_lock(&pool).await;
        holder.commit().await.unwrap();
        for task in tasks {
            let results = task
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            let unkeyed: Vec<_> = results.iter().step_by(2).collect();
            assert!(
                unkeyed
                    .iter()
                    .all(|e| e.outcome == EnqueueOutcome::Inserted)
            );
            assert!(
                unkeyed.windows(2).all(|w| w[0].id < w[1].id),
                "unkeyed ids rise in push order: {unkeyed:?}"
            );
            assert!(
                results
                    .iter()
                    .skip(1)
                    .step_by(2)
                    .all(|e| e.outcome == EnqueueOutcome::Coalesced)
            );
        }
    }
    let unkeyed: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE kind = 'ct.other'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(unkeyed, 18, "every unkeyed row once");
    assert_eq!(common::live(&pool).await, 9 + 18);
}

// ---------------------------------------------------------------------------------
// 11. The claim locks only the rows it takes.

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn claim_locks_only_what_it_takes(pool: PgPool) {
    let kinds: Vec<String> = (0..10).map(|k| format!("ct.lock{k}")).collect();
    for kind in &kinds {
        sqlx::query(
            "INSERT INTO jobs (kind, payload, max_attempts) SELECT $1, '{}', 3 FROM generate_series(1, 20)",
        )
        .bind(kind)
        .execute(&pool)
        .await
        .unwrap();
    }
    let mut claimer = pool.begin().await.unwrap();
    // Ten kinds, each allowed the whole claim of ten: the runtime claims through
    // CLAIM_SPLIT then.
    let rows = sqlx::query(jobs::__private::CLAIM_SPLIT_SQL)
        .bind(&kinds)
        .bind(vec![10i32; 10])
        .bind(vec![30_000i64; 10])
        .bind(10i32)
        .bind(vec![f64::NEG_INFINITY; 10])
        .bind(uuid::Uuid::nil())
        .bind(Vec::<i64>::new())
        .bind(Vec::<f64>::new())
        .fetch_all(&mut *claimer)
        .await
        .unwrap();
    assert_eq!(rows.len(), 10);
    // From another session: every row the claim holds is skipped.
    let lockable: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT id FROM jobs FOR UPDATE SKIP LOCKED) free",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(200 - lockable, 10, "rows locked by a claim of 10");
    claimer.rollback().await.unwrap();
}

/// Each row a claim of several kinds takes gets its own kind's lease, in the plain claim
/// and in the split one (the update looks each row's kind up in the claim's arrays).
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn each_claimed_row_gets_its_kinds_lease(pool: PgPool) {
    let kinds: Vec<String> = (0..3).map(|k| format!("ct.lease{k}")).collect();
    let leases = vec![10_000i64, 20_000, 30_000];
    for kind in &kinds {
        sqlx::query(
            "INSERT INTO jobs (kind, payload, max_attempts) SELECT $1, '{}', 3 FROM generate_series(1, 4)",
        )
        .bind(kind)
        .execute(&pool)
        .await
        .unwrap();
    }
    // The plain claim (limits within the total), then the split one.
    for (statement, limits, want) in [
        (jobs::__private::CLAIM_SQL, vec![2i32; 3], 6i32),
        (jobs::__private::CLAIM_SPLIT_SQL, vec![6i32; 3], 6),
    ] {
        let mut tx = pool.begin().await.unwrap();
        let taken = sqlx::query(statement)
            .bind(&kinds)
            .bind(&limits)
            .bind(&leases)
            .bind(want)
            .bind(vec![f64::NEG_INFINITY; 30])
            .bind(uuid::Uuid::nil())
            .bind(Vec::<i64>::new())
            .bind(Vec::<f64>::new())
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        assert_eq!(taken.len(), 6);
        // In the claim's transaction `now()` is the claim's own.
        let got: Vec<(String, f64)> = sqlx::query_as(
            "SELECT kind, extract(epoch FROM claimed_until - now())::float8 * 1000
             FROM jobs WHERE state = 'running' ORDER BY kind",
        )
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        assert_eq!(got.len(), 6);
        for (kind, ms) in got {
            let i = kinds.iter().position(|k| *k == kind).unwrap();
            assert!((ms - leases[i] as f64).abs() < 1.0, "{kind}: lease {ms} ms");
        }
        tx.rollback().await.unwrap();
    }
}

// ---------------------------------------------------------------------------------
// 12. A backlog of rows to prune does not hold up the rescue of expired claims.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.kept", retain = "1h")]
struct Kept {}

#[jobs::handler]
async fn kept(_job: Kept, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "kept").await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn pruning_a_backlog_does_not_hold_up_rescues(pool: PgPool) {
    setup(&pool).await;
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts, state, finished_at)
         SELECT 'ct.kept', '{}', 3, 'done', now() - interval '2 hours' FROM generate_series(1, 30000)",
    )
    .execute(&pool)
    .await
    .unwrap();
    // A claim whose runtime died.
    let expired: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (kind, payload, max_attempts, state, attempts, claimed_by, claimed_until)
         VALUES ('ct.kept', '{}', 3, 'running', 1, gen_random_uuid(), now() - interval '1 second')
         RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let rt = Running::start(runtime(&pool, &["ct.kept"]));
    wait_until("the expired claim is rescued and runs", || async {
        runs(&pool, "kept").await == 1
    })
    .await;
    let done_left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE state = 'done' AND finished_at < now() - interval '1 hour'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    rt.stop().await;
    assert!(
        done_left >= 20_000,
        "the rescue waited for the prune: {done_left} of 30,000 old rows were left when job {expired} ran"
    );
}

// ---------------------------------------------------------------------------------
// 13. Dropping the runtime's future stops it and hands its jobs back.

static DROP_RUNS: AtomicU32 = AtomicU32::new(0);

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.drop")]
struct DropMe {
    n: u32,
}

#[jobs::handler]
async fn drop_me(_job: DropMe, ctx: JobContext) -> Result<(), JobError> {
    DROP_RUNS.fetch_add(1, Ordering::SeqCst);
    record(&ctx, "drop").await?;
    std::future::pending::<()>().await;
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn dropping_the_runtime_stops_it_and_hands_back(pool: PgPool) {
    setup(&pool).await;
    let mut batch = EnqueueBatch::new();
    for n in 0..5 {
        batch.push(&DropMe { n }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let task = tokio::spawn(
        runtime(&pool, &["ct.drop"])
            .concurrency(2)
            .run_until(std::future::pending()),
    );
    wait_until("two handlers run", || async {
        DROP_RUNS.load(Ordering::SeqCst) == 2
    })
    .await;
    task.abort(); // drops the run_until future
    let _ = task.await;
    wait_until("the running jobs are handed back", || async {
        common::count(&pool, "running").await == 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        DROP_RUNS.load(Ordering::SeqCst),
        2,
        "a handler started after the runtime was dropped"
    );
    let attempts: Vec<i32> = sqlx::query_scalar("SELECT attempts FROM jobs ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(attempts, [0; 5], "handed back without spending an attempt");
    // The dropped runtime closes its connections (its heartbeat's last) in a task of its
    // own: the test's database can be dropped once they are gone.
    wait_until("the dropped runtime's connections are closed", || async {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        open <= i64::from(pool.size())
    })
    .await;
}

// ---------------------------------------------------------------------------------
// 14. Durations the database cannot add to its clock are a clear error; failed rows
//     can be pruned.

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_delay_past_the_database_clock_is_a_clear_error(pool: PgPool) {
    let err = Keyed { key: "k".into() }
        .enqueue_in(&pool, Duration::MAX)
        .await
        .unwrap_err();
    assert!(matches!(err, jobs::Error::InvalidInput(_)), "{err}");
    assert!(err.to_string().contains("1,000 years"), "{err}");
    assert_eq!(common::live(&pool).await, 0, "nothing written");
    let far = Keyed { key: "k".into() }
        .enqueue_in(&pool, Duration::from_secs(900 * 365 * 24 * 3600))
        .await
        .unwrap();
    assert!(far.inserted());
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.failing", max_attempts = 1)]
struct Failing {}

#[jobs::handler]
async fn failing(_job: Failing, _ctx: JobContext) -> Result<(), JobError> {
    Err(JobError::permanent("no"))
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn failed_rows_are_pruned_after_their_retention(pool: PgPool) {
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts, state, finished_at)
         SELECT 'ct.failing', '{}', 1, 'failed', now() - interval '2 hours' FROM generate_series(1, 10)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let recent = Failing {}.enqueue(&pool).await.unwrap().id;
    let rt =
        Running::start(runtime(&pool, &["ct.failing"]).retain_failed(Duration::from_secs(3600)));
    wait_until("old failed rows pruned, the new one kept", || async {
        common::count(&pool, "failed").await == 1
            && state_of(&pool, recent)
                .await
                .is_some_and(|s| s.0 == "failed")
    })
    .await;
    rt.stop().await;
}

// ---------------------------------------------------------------------------------
// Renewals do not share threads with handlers: a handler that blocks its thread for
// longer than its lease keeps its claim.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.blocking", lease = "1s")]
struct Blocking {}

#[jobs::handler]
async fn blocking(_job: Blocking, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "blocking").await?;
    // Blocks the thread (the test's runtime has only one) for more than two leases.
    std::thread::sleep(Duration::from_millis(2500));
    let mut tx = ctx.fenced_tx().await?;
    sqlx::query("INSERT INTO results (job_id, attempt) VALUES ($1, $2)")
        .bind(ctx.id())
        .bind(ctx.attempt() as i32)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_blocking_handler_keeps_its_lease(pool: PgPool) {
    setup(&pool).await;
    Blocking {}.enqueue(&pool).await.unwrap();
    let rt = Running::start(runtime(&pool, &["ct.blocking"]));
    wait_until("the job completes", || async {
        common::count_kind(&pool, "ct.blocking").await == 0
    })
    .await;
    rt.stop().await;
    assert_eq!(runs(&pool, "blocking").await, 1, "the lease lapsed");
    let results: Vec<i32> = sqlx::query_scalar("SELECT attempt FROM results")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(results, [1]);
}

// ---------------------------------------------------------------------------------
// A connection that dies silently (it stays open and carries nothing) does not stall
// the claim loop: the runtime's statements have a time limit.

/// A TCP proxy in front of PostgreSQL whose `blackhole` makes every connection open at
/// that moment silent for good: nothing is forwarded any more and nothing is closed, as
/// with a peer that vanished without a FIN. Later connections work. Dropping the proxy
/// closes every connection it holds, the silent ones included: their server sessions
/// end, and `#[sqlx::test]` can drop the test's database (a session still open in it
/// made the drop fail, and the database of a passing test stayed behind).
struct Blackhole {
    port: u16,
    epoch: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
    closed: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
}

impl Blackhole {
    async fn start(target: (String, u16)) -> Blackhole {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let epoch = std::sync::Arc::new(tokio::sync::watch::channel(0u64).0);
        let closed = std::sync::Arc::new(tokio::sync::watch::channel(false).0);
        let (state, stop) = (epoch.clone(), closed.clone());
        tokio::spawn(async move {
            let mut stopping = stop.subscribe();
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = closing(&mut stopping) => return,
                };
                let Ok((mut inbound, _)) = accepted else {
                    continue;
                };
                let target = target.clone();
                let mut changed = state.subscribe();
                let mut stopping = stop.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = changed.changed() => {
                            // Keep both ends open, and forward nothing, until the proxy
                            // is dropped.
                            let _held = (inbound, outbound);
                            closing(&mut stopping).await;
                        }
                        _ = closing(&mut stopping) => {}
                    }
                });
            }
        });
        Blackhole {
            port,
            epoch,
            closed,
        }
    }

    fn blackhole(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }
}

/// Resolves when the proxy is dropped.
async fn closing(closed: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = closed.wait_for(|closed| *closed).await;
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.closed.send_replace(true);
    }
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ct.silent", lease = "2s")]
struct Silent {
    n: u32,
}

#[jobs::handler]
async fn silent(_job: Silent, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_silently_dead_connection_does_not_stall_claims(
    pool_opts: PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let direct = pool_opts.clone().connect_with(opts.clone()).await.unwrap();
    let proxy = Blackhole::start((opts.get_host().to_owned(), opts.get_port())).await;
    let proxied = PgPoolOptions::new()
        .max_connections(5)
        .connect_with(opts.clone().host("127.0.0.1").port(proxy.port))
        .await
        .unwrap();
    Silent { n: 0 }.enqueue(&direct).await.unwrap();
    let rt = Running::start(
        runtime(&proxied, &["ct.silent"]).statement_timeout(Duration::from_millis(500)),
    );
    wait_until("the first job ran", || async {
        common::count_kind(&direct, "ct.silent").await == 0
    })
    .await;
    // Every connection the runtime holds now goes silent, its claimer's among them.
    proxy.blackhole();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut batch = EnqueueBatch::new();
    for n in 1..=5 {
        batch.push(&Silent { n }).unwrap();
    }
    batch.enqueue(&direct).await.unwrap();
    wait_until(
        "the runtime gave up on the silent connections and ran the rest",
        || async { common::count_kind(&direct, "ct.silent").await == 0 },
    )
    .await;
    rt.stop().await;
    // Close the silent connections (their sessions end on the server), then the pools,
    // so that the test's database can be dropped.
    drop(proxy);
    proxied.close().await;
    direct.close().await;
}
