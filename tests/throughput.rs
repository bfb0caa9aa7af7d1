//! Throughput history: per kind and minute, how runs ended and how long they ran.

mod common;

use std::time::Duration;

use common::{Running, runtime, wait_until};
use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "tp.work", backoff = "10ms", max_attempts = 2)]
enum Work {
    /// Succeeds after sleeping this many ms.
    Sleep(u64),
    /// Fails every attempt: retried once, then failed.
    Fail,
    /// Cancels itself.
    Cancel,
}

#[jobs::handler]
async fn work(job: Work, _ctx: JobContext) -> Result<(), JobError> {
    match job {
        Work::Sleep(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(())
        }
        Work::Fail => Err(JobError::retry("no")),
        Work::Cancel => Err(JobError::cancel("not needed")),
    }
}

fn totals(rows: &[jobs::admin::MinuteStats]) -> (u64, u64, u64, u64) {
    rows.iter().fold((0, 0, 0, 0), |t, r| {
        (
            t.0 + r.succeeded,
            t.1 + r.failed,
            t.2 + r.retried,
            t.3 + r.cancelled,
        )
    })
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn runs_are_counted_per_kind_and_minute_with_run_times(pool: PgPool) {
    for _ in 0..20 {
        Work::Sleep(30).enqueue(&pool).await.unwrap();
    }
    Work::Fail.enqueue(&pool).await.unwrap();
    Work::Cancel.enqueue(&pool).await.unwrap();
    // Two runtimes: their counts add up in the same rows.
    let a = Running::start(runtime(&pool, &["tp.work"]));
    let b = Running::start(runtime(&pool, &["tp.work"]));
    wait_until("every job ended", || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM jobs WHERE state IN ('pending', 'running')",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
            == 0
    })
    .await;
    a.stop().await;
    b.stop().await;

    let rows = jobs::admin::history(&pool, Some("tp.work"), Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(
        !rows.is_empty() && rows.len() <= 2,
        "one or two minutes: {rows:?}"
    );
    assert_eq!(totals(&rows), (20, 1, 1, 1));
    // The minutes are the database's, and recent.
    let now: sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc> =
        sqlx::query_scalar("SELECT now()")
            .fetch_one(&pool)
            .await
            .unwrap();
    for r in &rows {
        assert!(
            r.minute <= now && (now - r.minute).num_seconds() < 180,
            "{r:?}"
        );
        assert_eq!(r.minute.timestamp() % 60, 0);
    }
    // Most runs slept 30 ms: the median is at least that, and within the histogram's
    // resolution of it (plus a loaded machine's delays).
    let busiest = rows.iter().max_by_key(|r| r.succeeded).unwrap();
    let p = busiest.run_time.expect("run times");
    assert!(p.p50 >= Duration::from_millis(30), "{p:?}");
    assert!(p.p50 < Duration::from_secs(2), "{p:?}");
    assert!(p.p50 <= p.p95 && p.p95 <= p.p99);

    // Another kind, and the whole table.
    assert!(
        jobs::admin::history(&pool, Some("tp.other"), Duration::from_secs(3600))
            .await
            .unwrap()
            .is_empty()
    );
    let all = jobs::admin::history(&pool, None, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(totals(&all), (20, 1, 1, 1));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_idle_runtime_writes_what_it_counted(pool: PgPool) {
    Work::Sleep(1).enqueue(&pool).await.unwrap();
    let rt = Running::start(runtime(&pool, &["tp.work"]));
    // Without stopping: the completer writes once it goes quiet.
    wait_until("the history row", || async {
        totals(
            &jobs::admin::history(&pool, None, Duration::from_secs(600))
                .await
                .unwrap(),
        ) == (1, 0, 0, 0)
    })
    .await;
    rt.stop().await;
}
