//! W8: a kind with a global concurrency limit, claimed by four runtimes, each a process
//! of its own.
//!
//! 2,000 jobs of 1 to 20 ms (a fixed stride, 10.5 ms on average) of `bench.limited`
//! (`global_concurrency = 8`) are enqueued, then four child processes each run a
//! runtime of concurrency 10 for that kind alone. The parent samples the jobs of the
//! kind `running` in the table as fast as the database answers (the most seen must not
//! pass 8), and reads how close the kind ran to its limit: the handlers' total time
//! over eight times the drain's. A share taken the moment one frees keeps it near 1;
//! each start that waits for a notification or a poll costs that wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use jobs::{EnqueueBatch, Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// The limit of [`Limited`].
const LIMIT: i64 = 8;

/// A job that sleeps `ms`, of a kind at most [`LIMIT`] of which run at once.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "bench.limited", global_concurrency = 8)]
pub struct Limited {
    ms: u64,
}

#[jobs::handler]
async fn limited(job: Limited, _ctx: JobContext) -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_millis(job.ms)).await;
    Ok(())
}

/// A runtime process for W8, stopped by the parent.
pub async fn child() {
    let pool = super::pool(12).await;
    Runtime::new(pool)
        .kinds(["bench.limited"])
        .concurrency(10)
        .run()
        .await
        .unwrap();
}

/// Runs W8 `runs` times.
pub async fn run(runs: usize) {
    let mut usage = Vec::new();
    let mut most = Vec::new();
    let mut rates = Vec::new();
    for _ in 0..runs {
        let pool = super::fresh_database(4).await;
        let mut work_ms = 0;
        let mut batch = EnqueueBatch::new();
        for i in 0..2_000u64 {
            let ms = 1 + (i * 7) % 20;
            work_ms += ms;
            batch.push(&Limited { ms }).unwrap();
        }
        batch.enqueue(&pool).await.unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let watch = tokio::spawn(most_running(pool.clone(), stop.clone()));
        let t = Instant::now();
        let children: Vec<_> = (0..4)
            .map(|_| {
                tokio::process::Command::new(std::env::current_exe().unwrap())
                    .arg("--child-limited")
                    .kill_on_drop(true)
                    .spawn()
                    .unwrap()
            })
            .collect();
        loop {
            let left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM jobs WHERE kind = 'bench.limited'")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let took = t.elapsed().as_secs_f64();
        stop.store(true, Ordering::SeqCst);
        let seen = watch.await.unwrap();
        for mut child in children {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        // The drain counts from the spawn: the runtimes' start is in it (about the
        // same for every run), so the figure errs low.
        usage.push(work_ms as f64 / 1000.0 / (LIMIT as f64 * took));
        most.push(seen as f64);
        rates.push(2_000.0 / took);
        pool.close().await;
    }
    super::report(
        "W8 limit 8, 4 runtimes: of limit",
        "ratio",
        usage,
        &[("most_running", super::median(most))],
    );
    super::report("W8 limit 8, 4 runtimes: drain", "jobs/s", rates, &[]);
}

/// The most jobs of the kind running at once in the table, sampled until `stop`.
async fn most_running(pool: PgPool, stop: Arc<AtomicBool>) -> i64 {
    let mut most = 0;
    while !stop.load(Ordering::SeqCst) {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE kind = 'bench.limited' AND state = 'running'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(n <= LIMIT, "{n} jobs of a kind limited to {LIMIT} running at once");
        most = most.max(n);
    }
    most
}
