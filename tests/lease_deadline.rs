//! A handler learns that its lease is lost before the database can give its job to
//! another claim, whether or not its runtime can reach the database (SPEC invariant
//! 13): counted here as handlers live at once, per job and per kind.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use common::{Proxy, Running, wait_until};
use futures_util::FutureExt;
use jobs::{Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "lease.cut", lease = "2s", global_concurrency = 2)]
struct Cut {
    n: u32,
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "lease.silent", lease = "2s", global_concurrency = 2)]
struct Silent {
    n: u32,
}

/// What one kind's runs came to (each test has a kind of its own).
#[derive(Default, Clone)]
struct Counts {
    /// Handlers live now, and the most ever at once.
    live: usize,
    most: usize,
    /// Per job: handlers live now, and the most ever at once.
    per_job: HashMap<i64, (usize, usize)>,
    /// Runs that ended (returned or dropped) with their lease lost.
    told: usize,
}

static COUNTS: Mutex<Option<HashMap<&'static str, Counts>>> = Mutex::new(None);

fn counts<T>(kind: &'static str, f: impl FnOnce(&mut Counts) -> T) -> T {
    let mut all = COUNTS.lock().unwrap();
    f(all
        .get_or_insert_with(HashMap::new)
        .entry(kind)
        .or_default())
}

/// Counts a live handler from its start until it returns or is dropped.
struct Live(JobContext);

impl Live {
    fn enter(ctx: &JobContext) -> Live {
        counts(ctx.kind(), |c| {
            c.live += 1;
            c.most = c.most.max(c.live);
            let job = c.per_job.entry(ctx.id()).or_default();
            job.0 += 1;
            job.1 = job.1.max(job.0);
        });
        Live(ctx.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let lost = self.0.is_lease_lost();
        counts(self.0.kind(), |c| {
            c.live -= 1;
            c.told += usize::from(lost);
            if let Some(job) = c.per_job.get_mut(&self.0.id()) {
                job.0 -= 1;
            }
        });
    }
}

/// Runs for six seconds (three leases), awaiting often.
async fn six_seconds(ctx: JobContext) -> Result<(), JobError> {
    let _live = Live::enter(&ctx);
    for _ in 0..120 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[jobs::handler]
async fn cut(_job: Cut, ctx: JobContext) -> Result<(), JobError> {
    six_seconds(ctx).await
}

#[jobs::handler]
async fn silent(_job: Silent, ctx: JobContext) -> Result<(), JobError> {
    six_seconds(ctx).await
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "lease.mid_renewal", lease = "2s", global_concurrency = 2)]
struct MidRenewal {
    n: u32,
}

#[jobs::handler]
async fn mid_renewal(_job: MidRenewal, ctx: JobContext) -> Result<(), JobError> {
    six_seconds(ctx).await
}

/// How runtime A is cut off from the database.
#[derive(Clone, Copy)]
enum Fault {
    /// The proxy drops every connection and refuses new ones.
    Cut,
    /// The proxy drops every connection and holds each new one open without a word.
    Silence,
    /// The proxy drops every connection, and refuses new ones, while a renewal is
    /// mid-statement: the server carries it out, and extends the leases, for a runtime
    /// that never hears of it.
    CutMidRenewal,
}

/// Runtime A runs both jobs through a proxy; then `fault` cuts it off. Runtime B, on a
/// direct connection, takes both jobs over once their leases end and runs them to
/// their end. Never more than the limit of handlers live, never one job's twice.
async fn taken_over_after<J: Job>(
    jobs: [J; 2],
    fault: Fault,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let kind = J::KIND;
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let (proxy, proxied) = Proxy::pool(&opts).await;
    for job in &jobs {
        job.enqueue(&pool).await.unwrap();
    }
    let runtime = |pool: &PgPool| {
        Runtime::new(pool.clone())
            .kinds([kind])
            .poll_interval(Duration::from_millis(100))
            .shutdown_grace(Duration::from_millis(100))
    };
    let a = Running::start(runtime(&proxied));
    wait_until("runtime A runs both jobs", || async {
        counts(kind, |c| c.live) == 2
    })
    .await;
    // A renewal or two go through first.
    tokio::time::sleep(Duration::from_millis(900)).await;
    match fault {
        Fault::Cut => proxy.cut(),
        Fault::Silence => proxy.silence(),
        Fault::CutMidRenewal => {
            // A's next renewal waits, mid-statement, for a lock the test holds (a
            // trigger on the renewal of these jobs' rows takes it); the proxy drops
            // A's connections, and the lock is let go: the server carries the renewal
            // out and commits it, for a runtime that never hears of it.
            let mut holder = pool.acquire().await.unwrap();
            sqlx::query("SELECT pg_advisory_lock(4242)")
                .execute(&mut *holder)
                .await
                .unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "CREATE FUNCTION hold_renewal() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN
                     IF NEW.kind = '{kind}' AND NEW.claimed_until > OLD.claimed_until THEN
                         PERFORM pg_advisory_xact_lock_shared(4242);
                     END IF;
                     RETURN NEW;
                 END $$;
                 CREATE TRIGGER hold_renewal BEFORE UPDATE ON jobs
                     FOR EACH ROW EXECUTE FUNCTION hold_renewal();"
            )))
            .execute(&pool)
            .await
            .unwrap();
            let leases = || async {
                sqlx::query_scalar::<_, Option<chrono::DateTime<chrono::Utc>>>(
                    "SELECT max(claimed_until) FROM jobs WHERE kind = $1",
                )
                .bind(kind)
                .fetch_one(&pool)
                .await
                .unwrap()
            };
            let before = leases().await;
            common::wait_for_advisory_lock(&pool, "a renewal waits mid-statement").await;
            proxy.cut();
            sqlx::query("SELECT pg_advisory_unlock(4242)")
                .execute(&mut *holder)
                .await
                .unwrap();
            wait_until("the renewal A never hears of is carried out", || async {
                leases().await > before
            })
            .await;
        }
    }
    let b = Running::start(runtime(&pool));
    wait_until("runtime B runs both jobs to their end", || async {
        common::count_kind(&pool, kind).await == 0
    })
    .await;
    b.stop().await;
    proxy.restore();
    a.stop().await;

    let counts = counts(kind, |c| c.clone());
    assert_eq!(counts.told, 2, "both of A's runs heard of the loss");
    assert_eq!(counts.per_job.len(), 2);
    for (id, (_, most)) in counts.per_job {
        assert_eq!(most, 1, "job {id} had two handlers live at once");
    }
    assert!(
        counts.most <= 2,
        "more handlers live than the global limit of 2"
    );
}

/// The proxy drops every connection and refuses new ones: A's renewals cannot reach
/// the database at all.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_cut_off_tells_its_handlers_before_the_jobs_are_taken_over(
    _pool_opts: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    taken_over_after([Cut { n: 0 }, Cut { n: 1 }], Fault::Cut, opts).await;
}

/// The proxy drops every connection and holds each new one open without a word: A's
/// renewals hang mid-statement rather than fail.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_whose_database_goes_silent_tells_its_handlers_in_time(
    _pool_opts: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    taken_over_after([Silent { n: 0 }, Silent { n: 1 }], Fault::Silence, opts).await;
}

/// The worst moment to be cut off: mid-renewal, with the renewal carried out. The
/// leases the database holds then end later than A's last renewal it heard answered;
/// A tells its handlers by that one, so still before B can take the jobs.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_cut_off_mid_renewal_tells_its_handlers_before_the_jobs_are_taken_over(
    _pool_opts: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    taken_over_after(
        [MidRenewal { n: 0 }, MidRenewal { n: 1 }],
        Fault::CutMidRenewal,
        opts,
    )
    .await;
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "lease.frozen", lease = "2s", global_concurrency = 2)]
struct Frozen {
    n: u32,
}

/// Writes, every 50 ms for six seconds, that this run of the job is alive, on the
/// database's clock: the runs of a job must never overlap in the table.
#[jobs::handler]
async fn frozen(_job: Frozen, ctx: JobContext) -> Result<(), JobError> {
    for _ in 0..120 {
        sqlx::query(
            "INSERT INTO lease_alive (job_id, token, at) VALUES ($1, $2, clock_timestamp())",
        )
        .bind(ctx.id())
        .bind(ctx.claim_token())
        .execute(ctx.pool())
        .await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The environment variable that makes [`frozen_child`] a runtime process, with its
/// database's URL.
const CHILD_ENV: &str = "JOBS_LEASE_CHILD_URL";

/// The environment variable that names the kind [`frozen_child`] runs, when not
/// `lease.frozen`.
const CHILD_KIND_ENV: &str = "JOBS_LEASE_CHILD_KIND";

/// Not a test on its own: the runtime process that
/// `a_runtime_frozen_for_two_leases_drops_its_handlers_when_it_resumes` freezes, and
/// whose wall clock `a_jump_of_the_runtimes_wall_clock_changes_nothing` moves.
#[tokio::test]
async fn frozen_child() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .expect("the child's database");
    let kind = match std::env::var(CHILD_KIND_ENV).as_deref() {
        Ok("lease.jump") => "lease.jump",
        _ => "lease.frozen",
    };
    Runtime::new(pool)
        .kinds([kind])
        .poll_interval(Duration::from_millis(100))
        .run()
        .await
        .expect("the child's runtime ends cleanly");
}

/// A runtime process frozen (SIGSTOP) for two leases while it runs two jobs, which
/// another runtime takes over meanwhile, then resumed (SIGCONT): its handlers are
/// dropped before they run again, so no run of a job writes after another run of it
/// began. (Before, the resumed handlers went on beside the new ones.)
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_frozen_for_two_leases_drops_its_handlers_when_it_resumes(pool: PgPool) {
    sqlx::query("CREATE TABLE lease_alive (job_id bigint, token uuid, at timestamptz)")
        .execute(&pool)
        .await
        .unwrap();
    for n in 0..2 {
        Frozen { n }.enqueue(&pool).await.unwrap();
    }
    let url = common::url_of(&pool).await;
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "frozen_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let alive = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(DISTINCT token) FROM lease_alive")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    wait_until("the child runs both jobs", || {
        alive(pool.clone()).map(|n| n == 2)
    })
    .await;
    let pid = child.id().unwrap().to_string();
    let signal = |name: &str| {
        std::process::Command::new("kill")
            .args([name, &pid])
            .status()
            .unwrap()
    };
    assert!(signal("-STOP").success());
    let b = Running::start(
        Runtime::new(pool.clone())
            .kinds(["lease.frozen"])
            .poll_interval(Duration::from_millis(100)),
    );
    wait_until("the jobs taken over", || {
        alive(pool.clone()).map(|n| n == 4)
    })
    .await;
    // Two leases frozen in all, then resumed while the new runs go on.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(signal("-CONT").success());
    wait_until("the new runs end", || async {
        common::count_kind(&pool, "lease.frozen").await == 0
    })
    .await;
    b.stop().await;
    child.kill().await.unwrap();
    // For each job: the last write of its first run comes before the first write of
    // the run that took it over.
    let overlaps: Vec<(i64, f64)> = sqlx::query_as(
        "WITH runs AS (
             SELECT job_id, token, min(at) AS first, max(at) AS last
             FROM lease_alive GROUP BY job_id, token)
         SELECT a.job_id, extract(epoch FROM a.last - b.first)::float8
         FROM runs a JOIN runs b ON a.job_id = b.job_id AND a.token <> b.token
         WHERE a.first < b.first AND a.last >= b.first",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        overlaps.is_empty(),
        "runs of one job overlapped: {overlaps:?}"
    );
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "lease.jump", lease = "2s")]
struct Jump {
    n: u32,
}

/// Writes, every 50 ms for six seconds, that this run of the job is alive, with the
/// database's clock and the runtime process's wall clock.
#[jobs::handler]
async fn jump(_job: Jump, ctx: JobContext) -> Result<(), JobError> {
    for _ in 0..120 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        sqlx::query(
            "INSERT INTO lease_jump (job_id, token, at, wall) \
             VALUES ($1, $2, clock_timestamp(), $3)",
        )
        .bind(ctx.id())
        .bind(ctx.claim_token())
        .bind(wall)
        .execute(ctx.pool())
        .await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Debian's libfaketime, which moves a process's wall clock (and, told so, not its
/// monotonic one). `None` when it is missing and the test is to be skipped, saying so;
/// under `JOBS_REQUIRE_ALL_TESTS` (which `.ci/run` sets, installing it) a missing
/// library fails the test instead.
fn faketime() -> Option<&'static str> {
    const LIBRARY: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    if std::path::Path::new(LIBRARY).exists() {
        return Some(LIBRARY);
    }
    let why = format!(
        "libfaketime is missing ({LIBRARY}): the clock-jump test needs it \
         (`apt-get install libfaketime`; .ci/run installs it)"
    );
    if std::env::var("JOBS_REQUIRE_ALL_TESTS").is_ok_and(|v| !v.is_empty() && v != "0") {
        panic!("{why} (JOBS_REQUIRE_ALL_TESTS is set: nothing may be skipped)");
    }
    println!("skipped: {why}");
    None
}

/// The wall clock of a runtime process jumps an hour ahead while it runs two jobs of a
/// 2 s lease, then two hours back, while another runtime stands by to take over any
/// lease that lapses: nothing the runtime does depends on the wall clock (its deadlines
/// are measured on the monotonic clock, its leases on the database's), so each job
/// runs once, to its end, and no lease is lost.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_jump_of_the_runtimes_wall_clock_changes_nothing(pool: PgPool) {
    let Some(library) = faketime() else {
        return;
    };
    sqlx::query("CREATE TABLE lease_jump (job_id bigint, token uuid, at timestamptz, wall float8)")
        .execute(&pool)
        .await
        .unwrap();
    for n in 0..2 {
        Jump { n }.enqueue(&pool).await.unwrap();
    }
    let offset = std::env::temp_dir().join(format!("jobs-clock-jump-{}", std::process::id()));
    std::fs::write(&offset, "+0\n").unwrap();
    let url = common::url_of(&pool).await;
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "frozen_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &url)
        .env(CHILD_KIND_ENV, "lease.jump")
        .env("LD_PRELOAD", library)
        .env("FAKETIME_TIMESTAMP_FILE", &offset)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // How far the child's wall clock is from the database's, as its last write says.
    let skew = |pool: PgPool| async move {
        sqlx::query_scalar::<_, Option<f64>>(
            "SELECT wall - extract(epoch FROM at)::float8 FROM lease_jump \
             ORDER BY at DESC LIMIT 1",
        )
        .fetch_one(&pool)
        .await
        .ok()
        .flatten()
    };
    let runs = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(DISTINCT token) FROM lease_jump")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    wait_until("the child runs both jobs", || {
        runs(pool.clone()).map(|n| n == 2)
    })
    .await;
    let b = Running::start(
        Runtime::new(pool.clone())
            .kinds(["lease.jump"])
            .poll_interval(Duration::from_millis(100)),
    );
    std::fs::write(&offset, "+1h\n").unwrap();
    wait_until("the child's wall clock is an hour ahead", || {
        skew(pool.clone()).map(|s| s.is_some_and(|s| s > 3000.0))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    std::fs::write(&offset, "-1h\n").unwrap();
    wait_until("the child's wall clock is an hour behind", || {
        skew(pool.clone()).map(|s| s.is_some_and(|s| s < -3000.0))
    })
    .await;
    wait_until("both jobs end", || async {
        common::count_kind(&pool, "lease.jump").await == 0
    })
    .await;
    b.stop().await;
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&offset);
    let per_job: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT job_id, count(DISTINCT token), count(*) FROM lease_jump GROUP BY job_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(per_job.len(), 2);
    for (job, runs, writes) in per_job {
        assert_eq!(runs, 1, "job {job} ran {runs} times: a lease lapsed");
        assert_eq!(writes, 120, "job {job}'s run ended early");
    }
}
