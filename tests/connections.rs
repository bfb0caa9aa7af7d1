//! Connections are a budget the runtime holds: a runtime whose heartbeat cannot open
//! its connection claims nothing (it would run jobs it cannot renew, and each would run
//! again when its lease ran out), and says why in the server's words.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// A job longer than its lease: it runs once only if its lease is renewed.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "conn.long", lease = "1s")]
struct Long {
    n: i32,
}

/// How many runs of each job started.
static STARTS: Mutex<Option<HashMap<i32, u32>>> = Mutex::new(None);

#[jobs::handler]
async fn long(job: Long, _ctx: JobContext) -> Result<(), JobError> {
    *STARTS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .entry(job.n)
        .or_default() += 1;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    Ok(())
}

const GRANTS: &str = "
    GRANT USAGE ON SCHEMA public TO {role};
    GRANT SELECT, INSERT, UPDATE, DELETE ON jobs TO {role};
    GRANT SELECT ON jobs_paused TO {role};
    GRANT SELECT, INSERT, UPDATE, DELETE ON jobs_runtimes TO {role};
    GRANT SELECT, INSERT, UPDATE, DELETE ON jobs_throughput TO {role};
";

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_whose_heartbeat_cannot_connect_claims_nothing(
    pool_opts: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let admin: PgPool = pool_opts.connect_with(opts.clone()).await.unwrap();
    // Roles are cluster-wide: a name of this test's own. Room for three connections.
    let role = format!("jobs_cl_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN CONNECTION LIMIT 3; {}",
        GRANTS.replace("{role}", &role)
    )))
    .execute(&admin)
    .await
    .unwrap();
    for n in 0..10 {
        Long { n }.enqueue(&admin).await.unwrap();
    }
    // The application's pool opens nothing until a handler asks (these do not).
    let limited = PgPoolOptions::new()
        .max_connections(2)
        .min_connections(0)
        .connect_lazy_with(opts.clone().username(&role));
    let watcher = admin.clone();
    common::runtime(&limited, &["conn.long"])
        .rescue_interval(Duration::from_millis(100))
        .run_until(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
            while tokio::time::Instant::now() < deadline {
                let live: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM jobs WHERE state IN ('pending', 'running')",
                )
                .fetch_one(&watcher)
                .await
                .unwrap();
                if live == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap();
    // Room for three: the runtime's own pool took them before its heartbeat asked.
    let starts = STARTS.lock().unwrap().clone().unwrap_or_default();
    assert!(starts.is_empty(), "no handler started: {starts:?}");
    let claimed: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE attempts > 0")
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(claimed, 0, "no job claimed");
    limited.close().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "REVOKE ALL ON jobs FROM {role}; REVOKE ALL ON jobs_paused FROM {role}; REVOKE ALL ON jobs_runtimes FROM {role}; REVOKE ALL ON jobs_throughput FROM {role}; REVOKE ALL ON SCHEMA public FROM {role}; DROP ROLE {role}"
    )))
    .execute(&admin)
    .await
    .unwrap();
}
