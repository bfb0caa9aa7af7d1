//! `#[jobs::test]`: each test gets a database of its own, migrated, from
//! `DATABASE_URL`, with no `#[sqlx::test]` (and no second sqlx dependency).

use jobs::sqlx::PgPool;
use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "attr.ping")]
struct Ping {
    n: u32,
}

#[jobs::handler]
async fn ping(_job: Ping, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

/// The database is this test's alone: empty and migrated at the start, whatever the
/// other test of this file does at the same time.
#[jobs::test]
async fn a_test_gets_an_empty_migrated_database(pool: PgPool) {
    let live: i64 = jobs::sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(live, 0);
    Ping { n: 1 }.enqueue(&pool).await.unwrap();
    let ran = jobs::testing::drain(&pool).await.unwrap();
    assert_eq!(ran.succeeded, 1);
}

#[jobs::test]
async fn another_test_gets_another_database(pool: PgPool) {
    for n in 0..5 {
        Ping { n }.enqueue(&pool).await.unwrap();
    }
    let db: String = jobs::sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        db.starts_with("jobs_test_another_test_gets_another_"),
        "{db}"
    );
    let live: i64 = jobs::sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(live, 5);
}

/// A passing test's database is dropped.
#[test]
fn a_passing_tests_database_is_dropped() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let name = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let seen = name.clone();
    jobs::testing::run_test("dropped", |pool: PgPool| async move {
        let db: String = jobs::sqlx::query_scalar("SELECT current_database()::text")
            .fetch_one(&pool)
            .await
            .unwrap();
        *seen.lock().unwrap() = db;
    });
    let name = name.lock().unwrap().clone();
    assert!(name.starts_with("jobs_test_dropped_"), "{name}");
    runtime.block_on(async {
        let admin = PgPool::connect(&std::env::var("DATABASE_URL").unwrap())
            .await
            .unwrap();
        let exists: bool = jobs::sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)",
        )
        .bind(&name)
        .fetch_one(&admin)
        .await
        .unwrap();
        assert!(!exists, "{name} is still there");
    });
}
