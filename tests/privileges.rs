//! The runtime needs only the grants the README lists: it runs as a role that has them
//! and nothing else.

use std::time::Duration;

use jobs::{Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "priv.work", key = "n", retain = "1h")]
struct Work {
    n: i32,
}

#[jobs::handler]
async fn work(job: Work, ctx: JobContext) -> Result<(), JobError> {
    if job.n == 0 {
        return Err(JobError::permanent("zero is not work"));
    }
    ctx.fenced_tx().await?.commit().await
}

/// The grants of the README's "Privileges" section, for role `{role}`.
const RUNTIME_GRANTS: &str = "
    GRANT USAGE ON SCHEMA public TO {role};
    GRANT SELECT, INSERT, UPDATE, DELETE ON jobs TO {role};
    GRANT SELECT ON jobs_paused TO {role};
    GRANT SELECT, INSERT, UPDATE, DELETE ON jobs_runtimes TO {role};
    GRANT SELECT, INSERT, UPDATE, DELETE ON jobs_throughput TO {role};
";

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn runtime_runs_with_only_the_documented_grants(
    pool_opts: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let admin: PgPool = pool_opts.connect_with(opts.clone()).await.unwrap();
    // Roles are cluster-wide: a name of this test's own.
    let role = format!("jobs_rt_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE ROLE {role} LOGIN")))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query("REVOKE ALL ON SCHEMA public FROM PUBLIC")
        .execute(&admin)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(RUNTIME_GRANTS.replace("{role}", &role)))
        .execute(&admin)
        .await
        .unwrap();

    let limited = PgPoolOptions::new()
        .max_connections(5)
        .connect_with(opts.clone().username(&role))
        .await
        .unwrap();
    // The role can enqueue, in bulk too, and run every kind of outcome.
    for n in 1..=20 {
        Work { n }.enqueue(&limited).await.unwrap();
    }
    jobs::enqueue_all(&limited, &[Work { n: 0 }, Work { n: 21 }])
        .await
        .unwrap();
    // It cannot migrate, or create anything.
    assert!(jobs::migrate(&limited).await.is_err());

    let watcher = admin.clone();
    Runtime::new(limited.clone())
        .kinds(["priv.work"])
        .poll_interval(Duration::from_millis(20))
        .run_until(async move {
            loop {
                let live: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM jobs WHERE state IN ('pending', 'running')",
                )
                .fetch_one(&watcher)
                .await
                .unwrap();
                if live == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap();
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM jobs GROUP BY state ORDER BY state")
            .fetch_all(&admin)
            .await
            .unwrap();
    assert_eq!(states, [("done".to_owned(), 21), ("failed".to_owned(), 1)]);

    limited.close().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "REVOKE ALL ON jobs FROM {role}; REVOKE ALL ON jobs_paused FROM {role}; REVOKE ALL ON jobs_runtimes FROM {role}; REVOKE ALL ON jobs_throughput FROM {role}; REVOKE ALL ON SCHEMA public FROM {role}; DROP ROLE {role}"
    )))
    .execute(&admin)
    .await
    .unwrap();
}
