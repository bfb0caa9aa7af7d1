//! Pausing a kind: no runtime claims it, running jobs finish, enqueues go on.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Running, record, runs, runtime, wait_until};
use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pause.a")]
struct A {
    block: bool,
}

static RELEASE: AtomicBool = AtomicBool::new(false);

#[jobs::handler]
async fn a(job: A, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, if job.block { "a-block" } else { "a" }).await?;
    while job.block && !RELEASE.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pause.b")]
struct B {}

#[jobs::handler]
async fn b(_job: B, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "b").await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_paused_kind_is_not_claimed_until_resumed(pool: PgPool) {
    sqlx::query("CREATE TABLE runs (job_id bigint, attempt int, note text)")
        .execute(&pool)
        .await
        .unwrap();
    let rt = Running::start(runtime(&pool, &["pause.a", "pause.b"]));
    A { block: true }.enqueue(&pool).await.unwrap();
    wait_until("the blocking job started", || async {
        runs(&pool, "a-block").await == 1
    })
    .await;

    assert!(jobs::admin::pause(&pool, "pause.a").await.unwrap());
    assert!(
        !jobs::admin::pause(&pool, "pause.a").await.unwrap(),
        "already paused"
    );
    // Within a poll interval (50 ms here) every runtime has read it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Enqueues go on while the kind is paused.
    for _ in 0..5 {
        A { block: false }.enqueue(&pool).await.unwrap();
        B {}.enqueue(&pool).await.unwrap();
    }
    // The running job finishes.
    RELEASE.store(true, Ordering::SeqCst);
    wait_until("the other kind ran", || async {
        runs(&pool, "b").await == 5
    })
    .await;
    wait_until("the running job finished", || async {
        common::count(&pool, "running").await == 0
    })
    .await;
    // Many poll intervals (50 ms here) later, nothing of the paused kind has started.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(runs(&pool, "a").await, 0);
    assert_eq!(common::count_kind(&pool, "pause.a").await, 5);
    let stats = jobs::admin::stats(&pool).await.unwrap();
    let a = stats.iter().find(|k| k.kind == "pause.a").unwrap();
    assert!(a.paused && a.ready == 5, "{a:?}");
    assert!(stats.iter().all(|k| k.kind == "pause.a" || !k.paused));
    let paused = jobs::admin::paused(&pool).await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0].0, "pause.a");

    assert!(jobs::admin::resume(&pool, "pause.a").await.unwrap());
    assert!(
        !jobs::admin::resume(&pool, "pause.a").await.unwrap(),
        "not paused"
    );
    wait_until("the resumed kind ran", || async {
        runs(&pool, "a").await == 5
    })
    .await;
    rt.stop().await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_started_while_its_only_kind_is_paused_waits_for_resume(pool: PgPool) {
    sqlx::query("CREATE TABLE runs (job_id bigint, attempt int, note text)")
        .execute(&pool)
        .await
        .unwrap();
    jobs::admin::pause_forced(&pool, "pause.b").await.unwrap();
    B {}.enqueue(&pool).await.unwrap();
    // A long poll: the resume's notification is what wakes it.
    let rt = Running::start(runtime(&pool, &["pause.b"]).poll_interval(Duration::from_secs(3600)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runs(&pool, "b").await, 0);
    jobs::admin::resume(&pool, "pause.b").await.unwrap();
    wait_until("resumed at once", || async { runs(&pool, "b").await == 1 }).await;
    rt.stop().await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn pausing_a_kind_nobody_knows_is_refused_unless_forced(pool: PgPool) {
    let err = jobs::admin::pause(&pool, "pause.typo").await.unwrap_err();
    assert!(matches!(err, jobs::Error::InvalidInput(_)), "{err:?}");
    assert!(
        err.to_string().contains("no kind `pause.typo` here"),
        "{err}"
    );
    assert!(jobs::admin::paused(&pool).await.unwrap().is_empty());
    assert!(
        jobs::admin::stats(&pool).await.unwrap().is_empty(),
        "no phantom row"
    );

    // A job of the kind makes it known, whatever the job's state.
    B {}.enqueue(&pool).await.unwrap();
    assert!(jobs::admin::pause(&pool, "pause.b").await.unwrap());

    assert!(
        jobs::admin::pause_forced(&pool, "pause.typo")
            .await
            .unwrap()
    );
    assert!(
        !jobs::admin::pause(&pool, "pause.typo").await.unwrap(),
        "already paused"
    );
}
