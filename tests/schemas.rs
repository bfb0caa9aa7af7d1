//! The job tables in a schema of the application's choosing: two applications on one
//! database, each with its pool's `search_path` on a schema of its own, migrate, enqueue
//! and run without seeing each other's jobs.

mod common;

use std::time::Duration;

use common::{Running, wait_until};
use jobs::{Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "schemas.work", retain = "1h")]
struct Work {
    app: String,
}

/// Records which application's job ran where: the schema its context's pool sees.
#[jobs::handler]
async fn work(job: Work, ctx: JobContext) -> Result<(), JobError> {
    let schema: String = sqlx::query_scalar("SELECT current_schema()::text")
        .fetch_one(ctx.pool())
        .await?;
    if schema != job.app {
        return Err(JobError::permanent(format!(
            "a job of {} ran in {schema}",
            job.app
        )));
    }
    Ok(())
}

/// A pool whose connections use `schema` (the job tables live there).
async fn app_pool(admin: &PgPool, opts: &PgConnectOptions, schema: &str) -> PgPool {
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(admin)
        .await
        .unwrap();
    PgPoolOptions::new()
        .max_connections(5)
        .connect_with(opts.clone().options([("search_path", schema)]))
        .await
        .unwrap()
}

async fn states(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT state, count(*) FROM jobs GROUP BY state ORDER BY state")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn two_applications_with_two_schemas_do_not_see_each_others_jobs(
    pool_opts: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let admin = pool_opts.connect_with(opts.clone()).await.unwrap();
    let a = app_pool(&admin, &opts, "app_a").await;
    let b = app_pool(&admin, &opts, "app_b").await;
    jobs::migrate(&a).await.unwrap();
    jobs::migrate(&b).await.unwrap();
    // Both sets of tables, none in `public`.
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_schema || '.' || table_name FROM information_schema.tables
          WHERE table_name IN ('jobs', '_jobs_migrations') ORDER BY 1",
    )
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(
        tables,
        [
            "app_a._jobs_migrations",
            "app_a.jobs",
            "app_b._jobs_migrations",
            "app_b.jobs"
        ]
    );
    for _ in 0..20 {
        Work {
            app: "app_a".into(),
        }
        .enqueue(&a)
        .await
        .unwrap();
    }
    for _ in 0..30 {
        Work {
            app: "app_b".into(),
        }
        .enqueue(&b)
        .await
        .unwrap();
    }
    let runtime = |pool: &PgPool| {
        Runtime::new(pool.clone())
            .kinds(["schemas.work"])
            .poll_interval(Duration::from_millis(50))
    };
    let ra = Running::start(runtime(&a));
    let rb = Running::start(runtime(&b));
    wait_until("both applications' jobs done", || async {
        common::live(&a).await == 0 && common::live(&b).await == 0
    })
    .await;
    ra.stop().await;
    rb.stop().await;
    assert_eq!(states(&a).await, [("done".to_owned(), 20)]);
    assert_eq!(states(&b).await, [("done".to_owned(), 30)]);
    // The operator's view of each is its own.
    let stats = jobs::admin::stats(&a).await.unwrap();
    assert_eq!(stats.iter().map(|s| s.done).sum::<u64>(), 20);
    a.close().await;
    b.close().await;
}
