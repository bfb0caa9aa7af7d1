//! Helpers shared by the integration tests.
#![allow(dead_code, missing_docs)]

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;

/// Waits until `check` returns true, polling; panics with `what` after a generous
/// limit. The limit guards against a hung test, it asserts nothing about speed.
pub async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Rows of the job table in a state.
pub async fn count(pool: &PgPool, state: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = $1")
        .bind(state)
        .fetch_one(pool)
        .await
        .expect("count jobs")
}

/// Rows of the job table of a kind.
pub async fn count_kind(pool: &PgPool, kind: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE kind = $1")
        .bind(kind)
        .fetch_one(pool)
        .await
        .expect("count jobs")
}

/// Live (pending or running) rows.
pub async fn live(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state IN ('pending', 'running')")
        .fetch_one(pool)
        .await
        .expect("count jobs")
}
