//! `jobs::migrate` beside an application's own sqlx migrations.

use sqlx::PgPool;
use sqlx::migrate::{Migration, MigrationType, Migrator};

fn app_migrator() -> Migrator {
    Migrator::with_migrations(vec![Migration::new(
        1,
        "app users".into(),
        MigrationType::Simple,
        sqlx::SqlSafeStr::into_sql_str("CREATE TABLE app_users (id bigint PRIMARY KEY)"),
        false,
    )])
}

async fn tables(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn coexists_with_application_migrations_in_either_order(pool: PgPool) {
    let app = app_migrator();
    jobs::migrate(&pool).await.unwrap();
    app.run(&pool).await.unwrap();
    jobs::migrate(&pool).await.unwrap();
    app.run(&pool).await.unwrap();
    assert_eq!(
        tables(&pool).await,
        ["_jobs_migrations", "_sqlx_migrations", "app_users", "jobs"]
    );
}

#[sqlx::test(migrations = false)]
async fn application_first_then_jobs(pool: PgPool) {
    let app = app_migrator();
    app.run(&pool).await.unwrap();
    jobs::migrate(&pool).await.unwrap();
    app.run(&pool).await.unwrap();
    jobs::migrate(&pool).await.unwrap();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM _jobs_migrations")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(versions, [1]);
}

#[sqlx::test(migrations = false)]
async fn concurrent_migrations_do_not_race(pool: PgPool) {
    let runs = (0..8).map(|_| {
        let pool = pool.clone();
        tokio::spawn(async move { jobs::migrate(&pool).await })
    });
    for r in futures_util::future::join_all(runs).await {
        r.unwrap().expect("every concurrent migrate succeeds");
    }
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _jobs_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(applied, 1);
}
