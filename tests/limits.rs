//! Limits across every runtime on a database: a kind's global concurrency.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Running, runtime, wait_until};
use jobs::admin::KindLimits;
use jobs::{EnqueueBatch, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// How many handlers of a kind run at this instant in this process, and the most seen.
struct Gauge {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Gauge {
    const fn new() -> Self {
        Gauge {
            now: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        }
    }

    /// Counts a handler in for `ms` milliseconds.
    async fn run_for(&self, ms: u64) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.three", global_concurrency = 3)]
struct Three {
    ms: u64,
}

static THREE: Gauge = Gauge::new();

#[jobs::handler]
async fn three(job: Three, _ctx: JobContext) -> Result<(), JobError> {
    THREE.run_for(job.ms).await;
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.set", global_concurrency = 3)]
struct Set {
    ms: u64,
}

static SET: Gauge = Gauge::new();

#[jobs::handler]
async fn set(job: Set, _ctx: JobContext) -> Result<(), JobError> {
    SET.run_for(job.ms).await;
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.dead", global_concurrency = 2, lease = "1s")]
struct Dead {}

static DEAD: Gauge = Gauge::new();

#[jobs::handler]
async fn dead(_job: Dead, _ctx: JobContext) -> Result<(), JobError> {
    DEAD.run_for(5).await;
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.woken", global_concurrency = 1)]
struct Woken {
    ms: u64,
}

#[jobs::handler]
async fn woken(job: Woken, _ctx: JobContext) -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_millis(job.ms)).await;
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.stalled", global_concurrency = 2)]
struct Stalled {}

#[jobs::handler]
async fn stalled(_job: Stalled, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.free")]
struct Free {}

#[jobs::handler]
async fn free(_job: Free, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.rate", rate = "10/500ms")]
struct Rated {}

static RATED: std::sync::Mutex<Vec<std::time::Instant>> = std::sync::Mutex::new(Vec::new());

#[jobs::handler]
async fn rated(_job: Rated, _ctx: JobContext) -> Result<(), JobError> {
    RATED.lock().unwrap().push(std::time::Instant::now());
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.rr", global_concurrency = 3)]
struct Rr {
    ms: u64,
}

static RR: Gauge = Gauge::new();

#[jobs::handler]
async fn rr(job: Rr, _ctx: JobContext) -> Result<(), JobError> {
    RR.run_for(job.ms).await;
    Ok(())
}

/// A pool of its own for each runtime, as separate processes would have.
async fn own_pool(pool: &PgPool) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap()
}

/// The most jobs of `kind` the database held running at once while `until` was false,
/// sampled as fast as it answers: the count the limit is about, read independently of
/// the runtimes.
fn watch_running(
    pool: &PgPool,
    kind: &'static str,
) -> (
    tokio::task::JoinHandle<i64>,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (pool, until) = (pool.clone(), stop.clone());
    let task = tokio::spawn(async move {
        let mut most = 0;
        while !until.load(Ordering::SeqCst) {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM jobs WHERE kind = $1 AND state = 'running'",
            )
            .bind(kind)
            .fetch_one(&pool)
            .await
            .unwrap();
            most = most.max(n);
        }
        most
    });
    (task, stop)
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn no_more_than_the_global_concurrency_run_at_once_across_four_runtimes(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    for i in 0..300u64 {
        batch
            .push(&Three {
                ms: 1 + (i * 7) % 20,
            })
            .unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let (watch, stop) = watch_running(&pool, "limits.three");
    let mut runtimes = Vec::new();
    for _ in 0..4 {
        let own = own_pool(&pool).await;
        runtimes.push(Running::start(runtime(&own, &["limits.three"])));
    }
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.three").await == 0
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let most_in_db = watch.await.unwrap();
    for rt in runtimes {
        rt.stop().await;
    }
    assert!(most_in_db <= 3, "{most_in_db} running at once in the table");
    assert_eq!(
        THREE.most(),
        3,
        "handlers at once (each runtime could run 10)"
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_operators_limit_wins_over_the_attribute(pool: PgPool) {
    let err = jobs::admin::set_limits(&pool, "limits.set", KindLimits::default().concurrency(0))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("pause the kind instead"), "{err}");
    jobs::admin::set_limits(&pool, "limits.set", KindLimits::default().concurrency(1))
        .await
        .unwrap();
    let rows = jobs::admin::limits(&pool).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].kind.as_str(), rows[0].limits.concurrency),
        ("limits.set", Some(1))
    );

    let mut batch = EnqueueBatch::new();
    for _ in 0..40 {
        batch.push(&Set { ms: 10 }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let mut runtimes = Vec::new();
    for _ in 0..2 {
        let own = own_pool(&pool).await;
        runtimes.push(Running::start(runtime(&own, &["limits.set"])));
    }
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.set").await == 0
    })
    .await;
    assert_eq!(
        SET.most(),
        1,
        "the operator's limit of 1, not the attribute's 3"
    );

    // Cleared, the attribute's limit holds again.
    assert!(
        jobs::admin::clear_limits(&pool, "limits.set")
            .await
            .unwrap()
    );
    assert!(
        !jobs::admin::clear_limits(&pool, "limits.set")
            .await
            .unwrap()
    );
    assert!(jobs::admin::limits(&pool).await.unwrap().is_empty());
    let mut batch = EnqueueBatch::new();
    for _ in 0..60 {
        batch.push(&Set { ms: 20 }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.set").await == 0
    })
    .await;
    for rt in runtimes {
        rt.stop().await;
    }
    assert_eq!(SET.most(), 3, "the attribute's limit once cleared");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_dead_runtimes_share_returns_after_its_lease(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    for _ in 0..10 {
        batch.push(&Dead {}).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    // A runtime that died holding two claims: running, leased for a second more,
    // never renewed.
    let held: Vec<i64> = sqlx::query_scalar(
        "UPDATE jobs SET state = 'running', attempts = 1, claimed_by = gen_random_uuid(),
                claimed_until = now() + interval '1 second'
         WHERE id IN (SELECT id FROM jobs WHERE kind = 'limits.dead' ORDER BY id LIMIT 2)
         RETURNING id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(held.len(), 2);
    let rt = Running::start(runtime(&pool, &["limits.dead"]));
    // Its share is held: nothing of the kind starts while the dead claims are leased.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE kind = 'limits.dead' AND state = 'running'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let still_leased: bool =
        sqlx::query_scalar("SELECT bool_and(claimed_until > now()) FROM jobs WHERE id = ANY($1)")
            .bind(&held)
            .fetch_one(&pool)
            .await
            .unwrap();
    if still_leased {
        assert_eq!(started, 2, "only the dead runtime's two claims run");
        assert_eq!(DEAD.most(), 0);
    }
    // After the lease the rescuer takes them back, and every job runs.
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.dead").await == 0
    })
    .await;
    rt.stop().await;
    assert!(DEAD.most() <= 2, "{} at once", DEAD.most());
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_kind_at_its_limit_claims_when_a_share_frees_not_at_the_poll(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    for _ in 0..20 {
        batch.push(&Woken { ms: 20 }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    // Two runtimes that poll once an hour: each job of the one share starts because the
    // end of the one before it is announced (the other runtime's, or its own).
    let mut runtimes = Vec::new();
    for _ in 0..2 {
        let own = own_pool(&pool).await;
        runtimes.push(Running::start(
            runtime(&own, &["limits.woken"]).poll_interval(Duration::from_secs(3600)),
        ));
    }
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.woken").await == 0
    })
    .await;
    for rt in runtimes {
        rt.stop().await;
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_claim_stalled_holding_a_kinds_lock_holds_up_no_other_kind(pool: PgPool) {
    // Another runtime froze in the middle of its claim of the limited kind: its
    // transaction holds the kind's lock for as long as it is frozen.
    let mut frozen = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext('limits.stalled'))")
        .bind(0x6a6f_6273_i32)
        .execute(&mut *frozen)
        .await
        .unwrap();
    let mut batch = EnqueueBatch::new();
    for _ in 0..20 {
        batch.push(&Stalled {}).unwrap();
        batch.push(&Free {}).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    // Its own statements may wait five minutes: longer than this test waits.
    let rt = Running::start(
        runtime(&pool, &["limits.stalled", "limits.free"])
            .statement_timeout(Duration::from_secs(300)),
    );
    wait_until("the other kind's jobs ran", || async {
        common::count_kind(&pool, "limits.free").await == 0
    })
    .await;
    assert_eq!(common::count_kind(&pool, "limits.stalled").await, 20);
    // Thawed, the limited kind runs too.
    frozen.rollback().await.unwrap();
    wait_until("the limited kind's jobs ran", || async {
        common::count_kind(&pool, "limits.stalled").await == 0
    })
    .await;
    rt.stop().await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn no_window_of_the_rates_length_holds_more_starts_than_it_allows(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    for _ in 0..40 {
        batch.push(&Rated {}).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let mut runtimes = Vec::new();
    for _ in 0..4 {
        let own = own_pool(&pool).await;
        runtimes.push(Running::start(runtime(&own, &["limits.rate"])));
    }
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.rate").await == 0
    })
    .await;
    for rt in runtimes {
        rt.stop().await;
    }
    let mut starts = RATED.lock().unwrap().clone();
    starts.sort();
    assert_eq!(starts.len(), 40);
    // Counted at the handlers' starts, over the rate's whole window. (Counted at the
    // claims, a handler began a moment after its claim, and a window of 500 ms of
    // starts held 12.)
    for (i, first) in starts.iter().enumerate() {
        let within = starts[i..]
            .iter()
            .take_while(|t| t.duration_since(*first) < Duration::from_millis(500))
            .count();
        assert!(within <= 10, "{within} starts within 500 ms of start {i}");
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_limit_holds_when_the_databases_default_isolation_is_repeatable_read(pool: PgPool) {
    // At REPEATABLE READ a transaction's snapshot is its first statement's: taken
    // before the kind's lock was granted, it would miss the claims committed while
    // the claim waited for the lock.
    sqlx::query(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = %L', current_database(), 'repeatable read'); END $$",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut batch = EnqueueBatch::new();
    for i in 0..300u64 {
        batch.push(&Rr { ms: i % 3 }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let (watch, stop) = watch_running(&pool, "limits.rr");
    let mut runtimes = Vec::new();
    for _ in 0..4 {
        let own = own_pool(&pool).await;
        let isolation: String = sqlx::query_scalar("SHOW default_transaction_isolation")
            .fetch_one(&own)
            .await
            .unwrap();
        assert_eq!(isolation, "repeatable read");
        runtimes.push(Running::start(runtime(&own, &["limits.rr"])));
    }
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.rr").await == 0
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let most_in_db = watch.await.unwrap();
    for rt in runtimes {
        rt.stop().await;
    }
    assert!(most_in_db <= 3, "{most_in_db} running at once in the table");
    assert!(RR.most() <= 3, "{} handlers at once", RR.most());
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.procs", global_concurrency = 3, lease = "1s")]
struct Procs {
    ms: u64,
}

/// Records the handler's start, on the database clock, then its end in a fenced
/// transaction: an end that commits proves its claim was never taken over, so the
/// job's row was `running` under this claim from before the start to the end.
#[jobs::handler]
async fn procs(job: Procs, ctx: JobContext) -> Result<(), JobError> {
    sqlx::query("INSERT INTO limits_runs (token, started) VALUES ($1, clock_timestamp())")
        .bind(ctx.claim_token())
        .execute(ctx.pool())
        .await?;
    tokio::time::sleep(Duration::from_millis(job.ms)).await;
    let mut tx = ctx.fenced_tx().await?;
    sqlx::query(
        "INSERT INTO limits_results (job_id, token, ended) VALUES ($1, $2, clock_timestamp())",
    )
    .bind(ctx.id())
    .bind(ctx.claim_token())
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// The environment variable that makes [`limits_child`] a runtime process, with its
/// database's URL.
const CHILD_ENV: &str = "JOBS_LIMITS_CHILD_URL";

/// Not a test on its own: the body of a runtime process of
/// `a_limit_holds_across_processes_killed_and_cut`.
#[tokio::test]
async fn limits_child() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    // Few connections: four of these run beside the suite's other tests, on a server
    // that allows 100 (the runtime opens 6 of its own besides).
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .expect("the child's database");
    jobs::Runtime::new(pool)
        .kinds(["limits.procs"])
        .concurrency(10)
        .poll_interval(Duration::from_millis(200))
        .rescue_interval(Duration::from_millis(250))
        .run()
        .await
        .expect("the child's runtime ends cleanly");
}

fn spawn_child(url: &str) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "limits_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_limit_holds_across_processes_killed_and_cut(pool: PgPool) {
    sqlx::query("CREATE TABLE limits_runs (token uuid PRIMARY KEY, started timestamptz)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE limits_results (job_id bigint PRIMARY KEY, token uuid, ended timestamptz)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut batch = EnqueueBatch::new();
    for i in 0..300u64 {
        batch
            .push(&Procs {
                ms: 1 + (i * 7) % 20,
            })
            .unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let url = common::url_of(&pool).await;
    let (watch, stop) = watch_running(&pool, "limits.procs");
    let mut children: Vec<_> = (0..4).map(|_| spawn_child(&url)).collect();
    // Eight kills of a runtime process (SIGKILL: its claims stay until their lease
    // runs out, 1 s) and one cut of a session, 400 ms apart, while the jobs run.
    for round in 0..9u64 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        if round == 4 {
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                 ORDER BY backend_start DESC LIMIT 1",
            )
            .execute(&pool)
            .await
            .unwrap();
            continue;
        }
        let victim = usize::try_from(round * 5 % 4).unwrap();
        let _ = children[victim].start_kill();
        let _ = children[victim].wait().await;
        children[victim] = spawn_child(&url);
    }
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.procs").await == 0
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let most_in_db = watch.await.unwrap();
    for mut child in children {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    assert!(most_in_db <= 3, "{most_in_db} running at once in the table");
    // Every job's one committed end, and the most handlers between a start and a
    // committed end at any instant (each start and each end an event, in time order;
    // at the same instant, ends first).
    let done: i64 = sqlx::query_scalar("SELECT count(*) FROM limits_results")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(done, 300);
    let most: i64 = sqlx::query_scalar(
        "SELECT max(n) FROM (
             SELECT sum(d) OVER (ORDER BY at, d ROWS UNBOUNDED PRECEDING) AS n FROM (
                 SELECT r.started AS at, 1 AS d FROM limits_runs r JOIN limits_results x USING (token)
                 UNION ALL
                 SELECT x.ended, -1 FROM limits_results x
             ) e
         ) m",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        most <= 3,
        "{most} handlers at once between their start and their committed end"
    );
    assert!(
        most >= 2,
        "the processes ran the kind side by side ({most} at most)"
    );
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.tenant", global_concurrency = 1, partition = "tenant")]
struct Tenant {
    tenant: String,
    ms: u64,
}

static TENANTS: std::sync::Mutex<Vec<(String, bool)>> = std::sync::Mutex::new(Vec::new());

/// The most handlers of one tenant at once in this process, from a log of starts
/// (true) and ends (false).
fn most_per_tenant(log: &std::sync::Mutex<Vec<(String, bool)>>) -> usize {
    let mut now: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut most = 0;
    for (tenant, start) in log.lock().unwrap().iter() {
        let n = now.entry(tenant.clone()).or_default();
        if *start {
            *n += 1;
            most = most.max(*n);
        } else {
            *n -= 1;
        }
    }
    most
}

/// A handler of `tenant` for `ms` milliseconds, logged in `log` at its start and end.
async fn logged(log: &std::sync::Mutex<Vec<(String, bool)>>, tenant: String, ms: u64) {
    log.lock().unwrap().push((tenant.clone(), true));
    tokio::time::sleep(Duration::from_millis(ms)).await;
    log.lock().unwrap().push((tenant, false));
}

#[jobs::handler]
async fn tenant(job: Tenant, _ctx: JobContext) -> Result<(), JobError> {
    logged(&TENANTS, job.tenant, job.ms).await;
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_partitions_limit_holds_per_value_and_a_backlog_holds_up_no_other(pool: PgPool) {
    // Tenant `a`'s backlog first, then five jobs of each other tenant.
    let mut batch = EnqueueBatch::new();
    for _ in 0..100 {
        batch
            .push(&Tenant {
                tenant: "a".into(),
                ms: 20,
            })
            .unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let mut batch = EnqueueBatch::new();
    for t in ["b", "c", "d", "e"] {
        for _ in 0..5 {
            batch
                .push(&Tenant {
                    tenant: t.into(),
                    ms: 5,
                })
                .unwrap();
        }
    }
    batch.enqueue(&pool).await.unwrap();
    let mut runtimes = Vec::new();
    for _ in 0..3 {
        let own = own_pool(&pool).await;
        runtimes.push(Running::start(runtime(&own, &["limits.tenant"])));
    }
    wait_until("the other tenants' jobs ran", || async {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE kind = 'limits.tenant' AND payload->>'tenant' <> 'a'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        left == 0
    })
    .await;
    // Tenant `a` runs one at a time: most of its backlog is still there.
    let a_left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE kind = 'limits.tenant' AND payload->>'tenant' = 'a'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(a_left > 50, "{a_left} of tenant a's 100 jobs left");
    for rt in runtimes {
        rt.stop().await;
    }
    assert_eq!(most_per_tenant(&TENANTS), 1, "one job per tenant at once");
    let tenants_at_once = {
        let log = TENANTS.lock().unwrap();
        let mut running = 0usize;
        let mut most = 0;
        for (_, start) in log.iter() {
            if *start {
                running += 1;
                most = most.max(running);
            } else {
                running -= 1;
            }
        }
        most
    };
    assert!(
        tenants_at_once >= 2,
        "tenants ran side by side ({tenants_at_once} at most)"
    );
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.pair", global_concurrency = 2, partition = "tenant")]
struct Pair {
    tenant: u32,
    ms: u64,
}

/// Handlers of each tenant of `limits.pair` running now in this process, and the most
/// of one tenant seen at once.
static PAIRS: std::sync::Mutex<(Vec<usize>, usize)> = std::sync::Mutex::new((Vec::new(), 0));

#[jobs::handler]
async fn pair(job: Pair, _ctx: JobContext) -> Result<(), JobError> {
    let tenant = job.tenant as usize;
    {
        let mut pairs = PAIRS.lock().unwrap();
        if pairs.0.len() <= tenant {
            pairs.0.resize(tenant + 1, 0);
        }
        pairs.0[tenant] += 1;
        pairs.1 = pairs.1.max(pairs.0[tenant]);
    }
    tokio::time::sleep(Duration::from_millis(job.ms)).await;
    PAIRS.lock().unwrap().0[tenant] -= 1;
    Ok(())
}

/// A partition's limit of 2 holds with claims held ahead of the slots (short jobs, so
/// the runtimes claim hundreds at once) and each claim ranking a partition's jobs after
/// those it already runs: three runtimes over 25 tenants never hold more than 2 of a
/// tenant running, in the table (sampled) or in the handlers, and do reach 2. (Jobs of
/// 10 to 16 ms: with 1 to 4 ms, two of a tenant rarely overlapped in the handlers once
/// each claim of these deep backlogs also walked past the tenants it filled, and with
/// 4 to 7 ms they did not once in a full run on a slow day.)
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_partitions_limit_of_two_holds_with_claims_held_ahead(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    for i in 0..1_500u32 {
        batch
            .push(&Pair {
                tenant: i % 25,
                ms: 10 + 2 * u64::from(i % 4),
            })
            .unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (sampler, until) = (pool.clone(), stop.clone());
    let watch = tokio::spawn(async move {
        let mut most = 0i64;
        while !until.load(Ordering::SeqCst) {
            let n: Option<i64> = sqlx::query_scalar(
                "SELECT max(n) FROM (SELECT count(*) AS n FROM jobs
                  WHERE kind = 'limits.pair' AND state = 'running'
                  GROUP BY payload -> 'tenant') t",
            )
            .fetch_one(&sampler)
            .await
            .unwrap();
            most = most.max(n.unwrap_or(0));
        }
        most
    });
    let mut runtimes = Vec::new();
    for _ in 0..3 {
        let own = own_pool(&pool).await;
        runtimes.push(Running::start(runtime(&own, &["limits.pair"])));
    }
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.pair").await == 0
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let most_in_db = watch.await.unwrap();
    for rt in runtimes {
        rt.stop().await;
    }
    assert!(
        most_in_db <= 2,
        "{most_in_db} of a tenant running at once in the table"
    );
    assert_eq!(
        PAIRS.lock().unwrap().1,
        2,
        "most handlers of one tenant at once"
    );
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.tenant_rate", rate = "5/500ms", partition = "tenant")]
struct TenantRate {
    tenant: String,
}

static TENANT_STARTS: std::sync::Mutex<Vec<(String, std::time::Instant)>> =
    std::sync::Mutex::new(Vec::new());

#[jobs::handler]
async fn tenant_rate(job: TenantRate, _ctx: JobContext) -> Result<(), JobError> {
    TENANT_STARTS
        .lock()
        .unwrap()
        .push((job.tenant, std::time::Instant::now()));
    Ok(())
}

/// A rate per partition: tenant `a`'s backlog of 300 comes first, longer than a claim's
/// walk, then 10 jobs of `b` and of `c`. Three runtimes run `b`'s and `c`'s while `a`
/// waits for its windows, and no tenant has more than 5 starts in a window of the
/// rate's length (read at the handlers, so a little shorter).
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_rate_per_partition_holds_per_value_and_a_backlog_holds_up_no_other(pool: PgPool) {
    for (tenant, n) in [("a", 300), ("b", 10), ("c", 10)] {
        let mut batch = EnqueueBatch::new();
        for _ in 0..n {
            batch
                .push(&TenantRate {
                    tenant: tenant.into(),
                })
                .unwrap();
        }
        batch.enqueue(&pool).await.unwrap();
    }
    let mut runtimes = Vec::new();
    for _ in 0..3 {
        let own = own_pool(&pool).await;
        runtimes.push(Running::start(runtime(&own, &["limits.tenant_rate"])));
    }
    wait_until("the other tenants' jobs ran", || async {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs
              WHERE kind = 'limits.tenant_rate' AND payload->>'tenant' <> 'a'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        left == 0
    })
    .await;
    for rt in runtimes {
        rt.stop().await;
    }
    let starts = TENANT_STARTS.lock().unwrap().clone();
    let a = starts.iter().filter(|(t, _)| t == "a").count();
    assert!(a < 100, "{a} of tenant a's jobs started meanwhile");
    for tenant in ["a", "b", "c"] {
        let mut at: Vec<_> = starts
            .iter()
            .filter(|(t, _)| t == tenant)
            .map(|(_, at)| *at)
            .collect();
        at.sort();
        for (i, first) in at.iter().enumerate() {
            let within = at[i..]
                .iter()
                .take_while(|t| t.duration_since(*first) < Duration::from_millis(500))
                .count();
            assert!(
                within <= 5,
                "tenant {tenant}: {within} starts within 500 ms"
            );
        }
    }
    // The tenants ran side by side: more starts of the kind in some window than one
    // tenant's rate allows.
    let mut all: Vec<_> = starts.iter().map(|(_, at)| *at).collect();
    all.sort();
    let most = (0..all.len())
        .map(|i| {
            all[i..]
                .iter()
                .take_while(|t| t.duration_since(all[i]) < Duration::from_millis(450))
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(most > 5, "{most} starts of the kind within 450 ms at most");
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.region", global_concurrency = 1, partition = ["tenant", "region"])]
struct Region {
    tenant: String,
    region: String,
}

static REGIONS: [Gauge; 2] = [Gauge::new(), Gauge::new()];

#[jobs::handler]
async fn region(job: Region, _ctx: JobContext) -> Result<(), JobError> {
    let gauge = &REGIONS[usize::from(job.region == "eu")];
    gauge.run_for(10).await;
    Ok(())
}

/// A partition of two fields: the same tenant in two regions is two partitions, each
/// one job at a time, side by side.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_partition_of_two_fields_holds_per_pair_of_values(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    for i in 0..40 {
        batch
            .push(&Region {
                tenant: "t".into(),
                region: if i % 2 == 0 { "eu" } else { "us" }.into(),
            })
            .unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let mut runtimes = Vec::new();
    for _ in 0..2 {
        let own = own_pool(&pool).await;
        runtimes.push(Running::start(runtime(&own, &["limits.region"])));
    }
    let (watch, stop) = watch_running(&pool, "limits.region");
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.region").await == 0
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let most_in_db = watch.await.unwrap();
    for rt in runtimes {
        rt.stop().await;
    }
    assert!(most_in_db <= 2, "{most_in_db} running at once in the table");
    assert_eq!(REGIONS[0].most(), 1, "one job of (t, eu) at once");
    assert_eq!(REGIONS[1].most(), 1, "one job of (t, us) at once");
    assert_eq!(most_in_db, 2, "both regions ran side by side");
}

#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "limits.keyed",
    key = "id",
    global_concurrency = 1,
    partition = "tenant"
)]
struct Keyed {
    id: String,
    tenant: String,
    ms: u64,
}

/// Starts (true) and ends (false) of `limits.keyed`'s handlers, by tenant.
static KEYED: std::sync::Mutex<Vec<(String, bool)>> = std::sync::Mutex::new(Vec::new());

#[jobs::handler]
async fn keyed(job: Keyed, _ctx: JobContext) -> Result<(), JobError> {
    logged(&KEYED, job.tenant, job.ms).await;
    Ok(())
}

/// A running job counts in the partition it runs for, whatever a trigger that
/// coalesces into it does to its payload: job `k1` of tenant `a` runs; a trigger of
/// `k1` for tenant `b` marks it to run again (the row's payload is now `b`'s), and a
/// job `k2` of tenant `a` waits for `k1`'s run to end.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_trigger_that_changes_a_running_jobs_partition_does_not_free_it(pool: PgPool) {
    let job = |id: &str, tenant: &str, ms| Keyed {
        id: id.into(),
        tenant: tenant.into(),
        ms,
    };
    a_trigger_then(&pool, "limits.keyed", &KEYED, job, 500, ("k2", "a", 10)).await;
}

/// Runs three jobs of `kind` (keyed by `id`, limited to one per tenant; `log` is its
/// handlers' log): `k1` of tenant `a` for `first_ms`; once it runs, a trigger of `k1`
/// for tenant `b` (its next run, 10 ms) and then `third` (id, tenant, ms). Checks, once
/// every job ran, that there were three runs and never two of a tenant at once.
async fn a_trigger_then<J: Job>(
    pool: &PgPool,
    kind: &'static str,
    log: &std::sync::Mutex<Vec<(String, bool)>>,
    job: impl Fn(&str, &str, u64) -> J,
    first_ms: u64,
    third: (&str, &str, u64),
) {
    job("k1", "a", first_ms).enqueue(pool).await.unwrap();
    let running = Running::start(runtime(pool, &[kind]));
    wait_until("k1 runs", || async { !log.lock().unwrap().is_empty() }).await;
    job("k1", "b", 10).enqueue(pool).await.unwrap();
    job(third.0, third.1, third.2).enqueue(pool).await.unwrap();
    wait_until("every job ran", || async {
        common::count_kind(pool, kind).await == 0
    })
    .await;
    running.stop().await;
    let runs = log.lock().unwrap().clone();
    assert_eq!(runs.len(), 6, "three runs: {runs:?}");
    assert_eq!(
        most_per_tenant(log),
        1,
        "two jobs of a tenant at once: {runs:?}"
    );
}

#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "limits.rekeyed",
    key = "id",
    global_concurrency = 1,
    partition = "tenant"
)]
struct Rekeyed {
    id: String,
    tenant: String,
    ms: u64,
}

/// Starts (true) and ends (false) of `limits.rekeyed`'s handlers, by tenant.
static REKEYED: std::sync::Mutex<Vec<(String, bool)>> = std::sync::Mutex::new(Vec::new());

#[jobs::handler]
async fn rekeyed(job: Rekeyed, _ctx: JobContext) -> Result<(), JobError> {
    logged(&REKEYED, job.tenant, job.ms).await;
    Ok(())
}

/// A running job whose payload a trigger changed, back to pending for its next run, is
/// ranked in the partition of its new payload, not the one stamped before: job `k1` of
/// tenant `a` runs; a trigger of `k1` for tenant `b` marks it to run again, and `k3` of
/// tenant `b` starts beside it and runs on after `k1`'s first run ends. Its next run,
/// `b`'s, waits for `k3`. (A claim that ranked pending rows by a partition stamped on
/// the row before, at its enqueue or its first claim, would start it at once: two of
/// `b` at once.)
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_whose_next_run_changed_partition_is_ranked_in_the_new_one(pool: PgPool) {
    let job = |id: &str, tenant: &str, ms| Rekeyed {
        id: id.into(),
        tenant: tenant.into(),
        ms,
    };
    a_trigger_then(
        &pool,
        "limits.rekeyed",
        &REKEYED,
        job,
        600,
        ("k3", "b", 2_000),
    )
    .await;
}

/// The partitioned claim of a kind with no jobs reads a few blocks beside another
/// kind's backlog, in the generic plan a prepared statement switches to: its recheck of
/// the rows it locks (still pending, still due) was answered from `jobs_claim`, every
/// kind's pending entries, which it read whole (5.8 ms beside 68,000 rows, and 30 to 45
/// ms under a held horizon, at every wake-up of a runtime that claims every kind).
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_partitioned_claim_of_an_empty_kind_reads_no_other_kinds_backlog(pool: PgPool) {
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts) \
         SELECT 'lim.other', '{}', 3 FROM generate_series(1, 50000)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let statement = common::statement("CLAIM_PARTITIONED");
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL plan_cache_mode = force_generic_plan")
        .execute(&mut *tx)
        .await
        .unwrap();
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}"
    )))
    .bind("lim.empty")
    .bind(10i32)
    .bind(30_000i64)
    .bind(1i32)
    .bind(uuid::Uuid::nil())
    .bind(vec!["tenant"])
    .bind(None::<i32>)
    .bind(None::<i64>)
    .bind(None::<i32>)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let top = &plan[0]["Plan"];
    let blocks =
        top["Shared Hit Blocks"].as_i64().unwrap() + top["Shared Read Blocks"].as_i64().unwrap();
    assert!(blocks < 100, "the claim read {blocks} blocks: {plan}");
}

/// Holds a kind's first job until the test lets it go.
struct Gate {
    started: std::sync::atomic::AtomicBool,
    open: tokio::sync::Notify,
}

impl Gate {
    const fn new() -> Self {
        Gate {
            started: std::sync::atomic::AtomicBool::new(false),
            open: tokio::sync::Notify::const_new(),
        }
    }

    /// In the handler: says it started, and waits to be let go.
    async fn hold(&self) {
        self.started.store(true, Ordering::SeqCst);
        self.open.notified().await;
    }

    async fn until_started(&self) {
        wait_until("the first job started", || async {
            self.started.load(Ordering::SeqCst)
        })
        .await;
    }

    fn let_go(&self) {
        self.open.notify_one();
    }
}

/// A kind of one share whose first job waits for [`HANDED_GATE`].
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.handed", global_concurrency = 1)]
struct Handed {
    first: bool,
}

static HANDED: Gauge = Gauge::new();
static HANDED_GATE: Gate = Gate::new();

#[jobs::handler]
async fn handed(job: Handed, _ctx: JobContext) -> Result<(), JobError> {
    if job.first {
        HANDED_GATE.hold().await;
    }
    HANDED.run_for(5).await;
    Ok(())
}

/// The same, for the test of a paused kind.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.handed_paused", global_concurrency = 1)]
struct HandedPaused {
    first: bool,
}

static PAUSED_GATE: Gate = Gate::new();

#[jobs::handler]
async fn handed_paused(job: HandedPaused, _ctx: JobContext) -> Result<(), JobError> {
    if job.first {
        PAUSED_GATE.hold().await;
    }
    Ok(())
}

/// Holds the advisory lock of `kind`'s limited claims in a transaction of its own, as a
/// claim of another runtime that froze while it held it.
async fn hold_kinds_lock(pool: &PgPool, kind: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut frozen = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
        .bind(0x6a6f_6273_i32)
        .bind(kind)
        .execute(&mut *frozen)
        .await
        .unwrap();
    frozen
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_finished_jobs_share_goes_to_the_next_job_in_its_completion(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    batch.push(&Handed { first: true }).unwrap();
    for _ in 0..5 {
        batch.push(&Handed { first: false }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    // Polls once an hour: a claim that cannot get the kind's lock leaves the kind until
    // then.
    let rt =
        Running::start(runtime(&pool, &["limits.handed"]).poll_interval(Duration::from_secs(3600)));
    HANDED_GATE.until_started().await;
    // From now on no claim of the kind gets its lock: each job after the first starts
    // only because the completion of the one before it handed its share on.
    let frozen = hold_kinds_lock(&pool, "limits.handed").await;
    HANDED_GATE.let_go();
    wait_until("every job ran, the kind's lock held elsewhere", || async {
        common::count_kind(&pool, "limits.handed").await == 0
    })
    .await;
    frozen.rollback().await.unwrap();
    rt.stop().await;
    assert_eq!(HANDED.most(), 1, "more than the one share ran at once");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_paused_kinds_share_is_not_handed_on(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    batch.push(&HandedPaused { first: true }).unwrap();
    for _ in 0..3 {
        batch.push(&HandedPaused { first: false }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let rt = Running::start(
        runtime(&pool, &["limits.handed_paused"]).poll_interval(Duration::from_secs(3600)),
    );
    PAUSED_GATE.until_started().await;
    // The kind's lock held elsewhere: only a hand-off could start another job.
    let frozen = hold_kinds_lock(&pool, "limits.handed_paused").await;
    jobs::admin::pause(&pool, "limits.handed_paused")
        .await
        .unwrap();
    PAUSED_GATE.let_go();
    wait_until("the first job's completion", || async {
        common::count_kind(&pool, "limits.handed_paused").await == 3
    })
    .await;
    // Its completion took nothing in the same statement: the rest are pending.
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE kind = 'limits.handed_paused' AND state = 'pending'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(pending, 3, "a paused kind's share was handed on");
    // Resumed, and the lock free, they run.
    frozen.rollback().await.unwrap();
    jobs::admin::resume(&pool, "limits.handed_paused")
        .await
        .unwrap();
    wait_until("the rest ran once resumed", || async {
        common::count_kind(&pool, "limits.handed_paused").await == 0
    })
    .await;
    rt.stop().await;
}

/// A kind limited to one job per tenant at once, whose handlers count themselves in
/// `$gauge` for 50 ms (one kind per test: the tests of a binary may share a process).
macro_rules! backlog_kind {
    ($ty:ident, $kind:literal, $gauge:ident, $handler:ident) => {
        #[derive(Job, Serialize, Deserialize)]
        #[job(kind = $kind, global_concurrency = 1, partition = "tenant")]
        struct $ty {
            tenant: u32,
        }

        static $gauge: Gauge = Gauge::new();

        #[jobs::handler]
        async fn $handler(_job: $ty, _ctx: JobContext) -> Result<(), JobError> {
            $gauge.run_for(50).await;
            Ok(())
        }
    };
}

backlog_kind!(Backlog, "limits.backlog", BACKLOG, backlog);
backlog_kind!(
    BacklogAfter,
    "limits.backlog_after",
    BACKLOG_AFTER,
    backlog_after
);
backlog_kind!(BacklogTwo, "limits.backlog_two", BACKLOG_TWO, backlog_two);

/// One tenant's backlog of 500, longer than a claim's walk, and one job of each of a
/// hundred other tenants, enqueued in `order`; `runtimes` runtimes of concurrency 10.
/// The runtimes still run at their concurrency, a job of each of ten tenants at once
/// each. Before, each claim's walk filled with the backlog's rows, took one, reported
/// the kind at its limit and waited for that job: about one handler at a time.
async fn no_partition_waits_behind_a_backlog<J: Job>(
    pool: &PgPool,
    job: fn(u32) -> J,
    gauge: &Gauge,
    backlog_first: bool,
    runtimes: usize,
) {
    let mut backlog = EnqueueBatch::new();
    for _ in 0..500 {
        backlog.push(&job(0)).unwrap();
    }
    let mut others = EnqueueBatch::new();
    for tenant in 1..=100 {
        others.push(&job(tenant)).unwrap();
    }
    if backlog_first {
        backlog.enqueue(pool).await.unwrap();
        others.enqueue(pool).await.unwrap();
    } else {
        others.enqueue(pool).await.unwrap();
        backlog.enqueue(pool).await.unwrap();
    }
    let mut running = Vec::new();
    for _ in 0..runtimes {
        let own = own_pool(pool).await;
        running.push(Running::start(runtime(&own, &[J::KIND]).concurrency(10)));
    }
    wait_until("every other tenant's job ran", || async {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE kind = $1 AND payload->>'tenant' <> '0'",
        )
        .bind(J::KIND)
        .fetch_one(pool)
        .await
        .unwrap();
        left == 0
    })
    .await;
    for rt in running {
        rt.stop().await;
    }
    assert_eq!(
        gauge.most(),
        10 * runtimes,
        "the runtimes ran below their concurrency while partitions had room"
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_backlog_longer_than_the_walk_keeps_no_partition_waiting(pool: PgPool) {
    no_partition_waits_behind_a_backlog(&pool, |tenant| Backlog { tenant }, &BACKLOG, true, 1)
        .await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_backlog_enqueued_after_the_others_keeps_no_partition_waiting(pool: PgPool) {
    no_partition_waits_behind_a_backlog(
        &pool,
        |tenant| BacklogAfter { tenant },
        &BACKLOG_AFTER,
        false,
        1,
    )
    .await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_backlog_keeps_no_partition_waiting_with_two_runtimes(pool: PgPool) {
    no_partition_waits_behind_a_backlog(
        &pool,
        |tenant| BacklogTwo { tenant },
        &BACKLOG_TWO,
        true,
        2,
    )
    .await;
}

/// `set_limits` checks its input as `enqueue` checks a kind, and bounds a rate's
/// window: each mistake is `InvalidInput`, and nothing is written. Before, a NUL gave
/// the database's raw error, an empty kind was stored, and a window of `Duration::MAX`
/// became 1,000 years without a word.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn set_limits_refuses_what_it_cannot_store_in_words(pool: PgPool) {
    let one = KindLimits::default().concurrency(1);
    let rate = |per: Duration| KindLimits::default().rate(10, per);
    let cases = [
        ("", one, "the kind is empty"),
        ("a\0b", one, "NUL character"),
        (&*"k".repeat(jobs::MAX_KIND_BYTES + 1), one, "bytes long"),
        ("limits.set", rate(Duration::MAX), "30 days"),
        (
            "limits.set",
            rate(jobs::MAX_RATE_WINDOW + Duration::from_millis(1)),
            "30 days",
        ),
    ];
    for (kind, limits, says) in cases {
        let e = jobs::admin::set_limits(&pool, kind, limits)
            .await
            .unwrap_err();
        assert!(matches!(e, jobs::Error::InvalidInput(_)), "{kind:?}: {e:?}");
        assert!(e.to_string().contains(says), "{kind:?}: {e}");
    }
    assert!(jobs::admin::limits(&pool).await.unwrap().is_empty());
    jobs::admin::set_limits(&pool, "limits.set", rate(jobs::MAX_RATE_WINDOW))
        .await
        .unwrap();
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.many_rated", rate = "1/2s", partition = "tenant")]
struct ManyRated {
    tenant: u32,
}

static MANY_RATED: std::sync::Mutex<Vec<(u32, std::time::Instant)>> =
    std::sync::Mutex::new(Vec::new());

#[jobs::handler]
async fn many_rated(job: ManyRated, _ctx: JobContext) -> Result<(), JobError> {
    MANY_RATED
        .lock()
        .unwrap()
        .push((job.tenant, std::time::Instant::now()));
    Ok(())
}

/// A rate per partition over 10,000 partitions: two jobs of each tenant at one start
/// per 2 s each. Every tenant's first job runs while the seconds wait their window,
/// and no tenant starts twice within 2 s.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_rate_holds_per_partition_over_ten_thousand_partitions(pool: PgPool) {
    for _ in 0..2 {
        let mut batch = EnqueueBatch::new();
        for tenant in 0..10_000 {
            batch.push(&ManyRated { tenant }).unwrap();
        }
        batch.enqueue(&pool).await.unwrap();
    }
    let rt = Running::start(runtime(&pool, &["limits.many_rated"]).concurrency(20));
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.many_rated").await == 0
    })
    .await;
    rt.stop().await;
    let starts = MANY_RATED.lock().unwrap().clone();
    assert_eq!(starts.len(), 20_000);
    let mut per_tenant: std::collections::HashMap<u32, Vec<std::time::Instant>> =
        std::collections::HashMap::new();
    for (tenant, at) in starts {
        per_tenant.entry(tenant).or_default().push(at);
    }
    for (tenant, mut at) in per_tenant {
        at.sort();
        assert_eq!(at.len(), 2, "tenant {tenant}");
        let gap = at[1].duration_since(at[0]);
        assert!(
            gap >= Duration::from_secs(2),
            "tenant {tenant}: {gap:?} apart"
        );
    }
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.rate_lock_wait", rate = "1000/10s")]
struct RateLockWait {}

static RATE_LOCK_WAIT_RUNS: AtomicUsize = AtomicUsize::new(0);

#[jobs::handler]
async fn rate_lock_wait(_job: RateLockWait, _ctx: JobContext) -> Result<(), JobError> {
    RATE_LOCK_WAIT_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// A claim of a kind with a rate that waited for the kind's lock (another runtime's
/// claim held it) starts what it took: the margin to start (here 100 ms) counts from
/// the claim's statement, as the rate's log of starts does, not from before the wait.
/// Counted before the wait, every job of such a claim went back unstarted and was
/// claimed again: each claim's starts are logged, so the log held two per job.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_claim_that_waited_for_the_kinds_lock_starts_what_it_took(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    for _ in 0..5 {
        batch.push(&RateLockWait {}).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    // Hold the kind's lock, as another runtime's claim would, a little longer than the
    // margin, once the runtime's claim waits for it.
    let mut holder = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1, hashtext($2))")
        .bind(0x6a6f_6273_i32)
        .bind("limits.rate_lock_wait")
        .execute(&mut *holder)
        .await
        .unwrap();
    let rt = Running::start(runtime(&pool, &["limits.rate_lock_wait"]));
    common::wait_for_advisory_lock(&pool, "the runtime's claim waits for the lock").await;
    tokio::time::sleep(Duration::from_millis(180)).await;
    sqlx::query("SELECT pg_advisory_unlock($1, hashtext($2))")
        .bind(0x6a6f_6273_i32)
        .bind("limits.rate_lock_wait")
        .execute(&mut *holder)
        .await
        .unwrap();
    wait_until("every job ran", || async {
        RATE_LOCK_WAIT_RUNS.load(Ordering::SeqCst) == 5
    })
    .await;
    rt.stop().await;
    let logged: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(n), 0)::bigint FROM jobs_starts WHERE kind = 'limits.rate_lock_wait'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(logged, 5, "each job claimed once: none went back unstarted");
    assert_eq!(RATE_LOCK_WAIT_RUNS.load(Ordering::SeqCst), 5);
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.distant", rate = "4/1s")]
struct Distant {}

static DISTANT: std::sync::Mutex<Vec<std::time::Instant>> = std::sync::Mutex::new(Vec::new());

#[jobs::handler]
async fn distant(_job: Distant, _ctx: JobContext) -> Result<(), JobError> {
    DISTANT.lock().unwrap().push(std::time::Instant::now());
    Ok(())
}

/// A runtime whose database is 80 ms away (a round trip) runs a kind with a rate: its
/// claim, a statement and a commit, takes about 160 ms, longer than the 50 ms margin
/// that a rate of 4 per second gives a runtime of a near database. With that margin
/// alone it handed back every job it claimed, unstarted, at every claim, and ran none.
/// A near runtime then joins it, and counts the distant one's starts until their own
/// margin has passed: no window of a second holds more than 4 starts.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_of_a_distant_database_starts_the_jobs_of_a_rated_kind(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    for _ in 0..12 {
        batch.push(&Distant {}).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let (_proxy, far) =
        common::Proxy::pool_delayed(&pool.connect_options(), Duration::from_millis(40)).await;
    let far_rt = Running::start(runtime(&far, &["limits.distant"]));
    wait_until("the distant runtime ran a job", || async {
        !DISTANT.lock().unwrap().is_empty()
    })
    .await;
    let near = own_pool(&pool).await;
    let near_rt = Running::start(runtime(&near, &["limits.distant"]));
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.distant").await == 0
    })
    .await;
    near_rt.stop().await;
    far_rt.stop().await;
    let mut starts = DISTANT.lock().unwrap().clone();
    starts.sort();
    assert_eq!(starts.len(), 12, "each job ran once");
    for (i, first) in starts.iter().enumerate() {
        let within = starts[i..]
            .iter()
            .take_while(|t| t.duration_since(*first) < Duration::from_secs(1))
            .count();
        assert!(within <= 4, "{within} starts within a second of start {i}");
    }
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "limits.announced", global_concurrency = 8)]
struct Announced {}

#[jobs::handler]
async fn announced(_job: Announced, _ctx: JobContext) -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(())
}

/// The notifications of `limits.announced` heard until none comes for 300 ms.
async fn heard(listener: &mut sqlx::postgres::PgListener) -> usize {
    let mut n = 0;
    while let Ok(Ok(notification)) =
        tokio::time::timeout(Duration::from_millis(300), listener.recv()).await
    {
        n += usize::from(notification.payload() == "limits.announced");
    }
    n
}

/// Enqueues 40 jobs of `limits.announced`, due in `delay`.
async fn forty_announced(pool: &PgPool, delay: Duration) {
    let mut batch = EnqueueBatch::new();
    for _ in 0..40 {
        batch
            .push_with(&Announced {}, jobs::EnqueueOptions::new().delay(delay))
            .unwrap();
    }
    batch.enqueue(pool).await.unwrap();
}

/// A runtime tells the others of the free shares of a limited kind that it does not
/// take (a claim that took all it asked while more shares were free), by a `NOTIFY`
/// of the kind, only while another live runtime claims the kind: alone it sends none
/// (each woke only itself, at most of its claims); beside a second runtime of the kind
/// (seen at its next presence round), it does again.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn free_shares_are_announced_only_while_another_runtime_claims_the_kind(pool: PgPool) {
    // Due after the runtime's first presence round, their enqueue's own notification
    // sent before anyone listens.
    forty_announced(&pool, Duration::from_secs(3)).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .unwrap();
    listener.listen("jobs").await.unwrap();
    let runtimes_seen = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobs_runtimes")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let first =
        Running::start(runtime(&own_pool(&pool).await, &["limits.announced"]).concurrency(2));
    wait_until("the runtime registered", || async {
        runtimes_seen().await == 1
    })
    .await;
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.announced").await == 0
    })
    .await;
    assert_eq!(
        heard(&mut listener).await,
        0,
        "a runtime alone announced its free shares"
    );
    let second =
        Running::start(runtime(&own_pool(&pool).await, &["limits.announced"]).concurrency(2));
    wait_until("the second runtime registered", || async {
        runtimes_seen().await == 2
    })
    .await;
    // The first runtime's next presence round sees the second (every 5 s): from then on
    // it announces the shares it does not take (the second takes few jobs of its own).
    tokio::time::sleep(Duration::from_secs(6)).await;
    forty_announced(&pool, Duration::ZERO).await;
    wait_until("every job ran", || async {
        common::count_kind(&pool, "limits.announced").await == 0
    })
    .await;
    let n = heard(&mut listener).await;
    assert!(
        n >= 3,
        "{n} notifications with two runtimes of the kind: the enqueue's, and free shares announced"
    );
    first.stop().await;
    second.stop().await;
}
