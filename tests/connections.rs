//! Connections are a budget the runtime holds: under a connection limit its renewals
//! never lose their connection to its other statements, it claims nothing it cannot
//! renew, and every job runs once.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use common::{Running, count, runtime, wait_until};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "conn.slow", lease = "4s", retain = "1h")]
struct Slow {
    n: i32,
}

/// Handler runs, across this binary's tests (each test has a kind of its own).
static SLOW_RUNS: AtomicU64 = AtomicU64::new(0);

/// Outlives its lease: only renewals keep the claim. (A lease of 4 s, renewed every
/// 1.3 s. With 2 s, in two runs of the whole suite on 2 cores, each while the macro
/// tests compiled beside it, every running job of one of these tests ran twice, and
/// neither test failed alone or beside a busy loop on each core: renewals late by a
/// lease's last two thirds, 1.3 s, under that load is the likely reason; not proven.)
#[jobs::handler]
async fn slow(_job: Slow, _ctx: JobContext) -> Result<(), JobError> {
    SLOW_RUNS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "conn.cut", lease = "4s", retain = "1h")]
struct Cut {
    n: i32,
}

static CUT_RUNS: AtomicU64 = AtomicU64::new(0);

#[jobs::handler]
async fn cut(_job: Cut, _ctx: JobContext) -> Result<(), JobError> {
    CUT_RUNS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "conn.shut", lease = "9s", retain = "1h")]
struct Shut {
    n: i32,
}

static SHUT_RUNS: AtomicU64 = AtomicU64::new(0);

/// Outlives its lease by a third: only renewals keep its claim.
#[jobs::handler]
async fn shut(_job: Shut, _ctx: JobContext) -> Result<(), JobError> {
    SHUT_RUNS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(12)).await;
    Ok(())
}

/// A login role of this test's own (roles are cluster-wide) with the runtime's grants
/// and at most `limit` connections, and a lazy pool of it: the application's pool
/// holds no connection until a handler or the runtime asks for one.
async fn limited_role(admin: &PgPool, opts: &PgConnectOptions, limit: i32) -> (String, PgPool) {
    let role = format!("jobs_conn_{}", uuid::Uuid::new_v4().simple());
    // The runtime's grants, as the README lists them.
    let grants = common::readme_grants()[0].replace("app_runtime", &role);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN CONNECTION LIMIT {limit}; {grants}"
    )))
    .execute(admin)
    .await
    .unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy_with(opts.clone().username(&role));
    (role, pool)
}

async fn set_limit(admin: &PgPool, role: &str, limit: i32) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER ROLE {role} CONNECTION LIMIT {limit}"
    )))
    .execute(admin)
    .await
    .unwrap();
}

/// Ends every session of `role`, as a restart of a pooler or a failover does.
async fn cut_sessions(admin: &PgPool, role: &str) {
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1")
        .bind(role)
        .execute(admin)
        .await
        .unwrap();
}

/// While the runtime has room for two of its connections it runs no job twice (before,
/// its renewals lost their connection, and 20 jobs ran 44 times in 25 s), and once it
/// has room it runs every job.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn short_of_connections_no_job_runs_twice(pool_opts: PgPoolOptions, opts: PgConnectOptions) {
    let admin: PgPool = pool_opts.connect_with(opts.clone()).await.unwrap();
    let (role, limited) = limited_role(&admin, &opts, 2).await;
    for n in 0..20 {
        Slow { n }.enqueue(&admin).await.unwrap();
    }
    let running = Running::start(runtime(&limited, &["conn.slow"]).concurrency(10));
    // Longer than a lease and a handler: a job claimed without renewals would run again.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(SLOW_RUNS.load(Ordering::SeqCst) <= 20);
    set_limit(&admin, &role, 20).await;
    wait_until("every job completed", || async {
        count(&admin, "done").await == 20
    })
    .await;
    running.stop().await;
    assert_eq!(SLOW_RUNS.load(Ordering::SeqCst), 20, "a job ran twice");
    let attempts: i32 = sqlx::query_scalar("SELECT max(attempts) FROM jobs")
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(attempts, 1);
    cut_sessions(&admin, &role).await;
}

/// Cut mid-run and allowed back only two connections: the renewals get one of them,
/// and no running job is claimed again.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_cut_under_a_connection_limit_runs_no_job_twice(
    pool_opts: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let admin: PgPool = pool_opts.connect_with(opts.clone()).await.unwrap();
    let (role, limited) = limited_role(&admin, &opts, 20).await;
    for n in 0..30 {
        Cut { n }.enqueue(&admin).await.unwrap();
    }
    let running = Running::start(runtime(&limited, &["conn.cut"]).concurrency(10));
    wait_until("ten jobs running", || async {
        count(&admin, "running").await == 10
    })
    .await;
    set_limit(&admin, &role, 2).await;
    cut_sessions(&admin, &role).await;
    // Longer than a lease: the running jobs' claims live only if renewals go on.
    tokio::time::sleep(Duration::from_secs(6)).await;
    set_limit(&admin, &role, 20).await;
    wait_until("every job completed", || async {
        count(&admin, "done").await == 30
    })
    .await;
    running.stop().await;
    assert_eq!(CUT_RUNS.load(Ordering::SeqCst), 30, "a job ran twice");
    cut_sessions(&admin, &role).await;
}

/// The renewals' connection is cut just after a renewal and the server takes no
/// connection for most of a lease (6.5 s of 9): the renewals get one back in time, and
/// no running job is claimed again. (Before, a failed renewal was tried again a third
/// of a lease later, then another third: both fell inside the outage, and the leases
/// lapsed.)
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn renewals_resume_as_soon_as_the_server_takes_a_connection(
    pool_opts: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let admin: PgPool = pool_opts.connect_with(opts.clone()).await.unwrap();
    let (role, limited) = limited_role(&admin, &opts, 20).await;
    for n in 0..10 {
        Shut { n }.enqueue(&admin).await.unwrap();
    }
    let running = Running::start(runtime(&limited, &["conn.shut"]).concurrency(10));
    wait_until("ten jobs running", || async {
        count(&admin, "running").await == 10
    })
    .await;
    let leases = || async {
        sqlx::query_scalar::<_, Option<chrono::DateTime<chrono::Utc>>>(
            "SELECT min(claimed_until) FROM jobs WHERE state = 'running'",
        )
        .fetch_one(&admin)
        .await
        .unwrap()
    };
    let before = leases().await;
    wait_until("a renewal", || async { leases().await > before }).await;
    set_limit(&admin, &role, 0).await;
    cut_sessions(&admin, &role).await;
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    set_limit(&admin, &role, 20).await;
    wait_until("every job completed", || async {
        count(&admin, "done").await == 10
    })
    .await;
    running.stop().await;
    assert_eq!(SHUT_RUNS.load(Ordering::SeqCst), 10, "a job ran twice");
    cut_sessions(&admin, &role).await;
}
