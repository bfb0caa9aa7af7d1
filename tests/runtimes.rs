//! Runtimes are visible: each registers itself, its claims name it, a clean shutdown
//! removes it, and rows of runtimes long gone are removed.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Running, runtime, wait_until};
use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "presence.hold")]
struct Hold {}

static STARTED: AtomicBool = AtomicBool::new(false);
static RELEASE: AtomicBool = AtomicBool::new(false);

#[jobs::handler]
async fn hold(_job: Hold, _ctx: JobContext) -> Result<(), JobError> {
    STARTED.store(true, Ordering::SeqCst);
    while !RELEASE.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_registers_itself_and_its_claims_name_it(pool: PgPool) {
    // A runtime that died an hour ago, and one seen a minute ago.
    sqlx::query(
        "INSERT INTO jobs_runtimes (id, host, pid, version, kinds, concurrency, started_at, last_seen) VALUES \
         (gen_random_uuid(), 'gone', 1, '0.0.0', '{x}', 1, now() - interval '2 hours', now() - interval '1 hour'), \
         (gen_random_uuid(), 'other', 2, '0.0.0', '{x}', 1, now() - interval '2 hours', now() - interval '1 minute')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let id = Hold {}.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(
        runtime(&pool, &["presence.hold"])
            .name("worker-a")
            .concurrency(3),
    );
    wait_until("the job is running", || async {
        STARTED.load(Ordering::SeqCst)
    })
    .await;
    wait_until("registered, and the stale row removed", || async {
        let rows = jobs::admin::runtimes(&pool).await.unwrap();
        rows.len() == 2 && rows.iter().any(|r| r.name.as_deref() == Some("worker-a"))
    })
    .await;

    let rows = jobs::admin::runtimes(&pool).await.unwrap();
    assert!(rows.iter().all(|r| r.host != "gone"), "{rows:?}");
    let me = rows
        .iter()
        .find(|r| r.name.as_deref() == Some("worker-a"))
        .unwrap();
    assert_eq!(me.kinds, ["presence.hold"]);
    assert_eq!(me.concurrency, 3);
    assert_eq!(me.pid, i32::try_from(std::process::id()).unwrap());
    assert_eq!(me.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(me.running, 1);
    assert!(me.last_seen >= me.started_at);
    let job = jobs::admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(
        job.runtime,
        Some(me.id),
        "the running job names its runtime"
    );

    RELEASE.store(true, Ordering::SeqCst);
    rt.stop().await;
    let rows = jobs::admin::runtimes(&pool).await.unwrap();
    assert_eq!(rows.len(), 1, "a clean shutdown removes its row: {rows:?}");
    assert_eq!(rows[0].host, "other");
}
