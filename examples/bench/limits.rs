//! W8: a kind with a global concurrency limit, claimed by four runtimes, each a process
//! of its own.
//!
//! 2,000 jobs of 1 to 20 ms (a fixed stride, 10.5 ms on average) of `bench.limited`
//! (`global_concurrency = 8`) are enqueued, then four child processes each run a
//! runtime of concurrency 10 for that kind alone. The parent samples the jobs of the
//! kind `running` in the table every 2 ms (the most seen must not pass 8), from the
//! first claim to the last completion, and reads how close the kind ran to its limit
//! three ways: the mean of those samples over 8 (what the limit counts: a job is
//! `running` from its claim until its completion is written); the handlers' total
//! time, measured in the handlers (each prints it), over eight times that span (what
//! the handlers got: less, by each job's claim and completion); and the sleeps as
//! enqueued, over the same (less again: a timer rounds a sleep up to its next
//! millisecond). A share taken the moment one frees keeps them near 1; each start that
//! waits for a notification or a poll costs that wait.

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
    let t = Instant::now();
    tokio::time::sleep(Duration::from_millis(job.ms)).await;
    // How long the handler ran (its sleep and the timer's rounding up), for the parent.
    println!("ran {}", t.elapsed().as_micros());
    Ok(())
}

/// A no-op job of a kind that starts at most 1,000 a second across every runtime.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "bench.rated", rate = "1000/1s")]
pub struct Rated {
    seq: u32,
}

#[jobs::handler]
async fn rated(_job: Rated, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

/// A no-op job of a kind that runs at most one job per tenant at once.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "bench.tenant", global_concurrency = 1, partition = "tenant")]
pub struct PerTenant {
    tenant: u32,
}

#[jobs::handler]
async fn per_tenant(_job: PerTenant, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

/// W8b's job: of tenant `tenant`, a kind limited to one per tenant at once (`limited`)
/// or its twin without limits; a small tenant's start is noted for the parent.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "bench.backlog", global_concurrency = 1, partition = "tenant")]
pub struct Backlog {
    tenant: u32,
}

/// [`Backlog`]'s twin without limits.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "bench.backlog_free")]
pub struct BacklogFree {
    tenant: u32,
}

/// When each small tenant's job started (W8b).
static STARTS: std::sync::Mutex<Vec<Instant>> = std::sync::Mutex::new(Vec::new());

fn started(tenant: u32) {
    if tenant != 0 {
        STARTS.lock().unwrap().push(Instant::now());
    }
}

#[jobs::handler]
async fn backlog(job: Backlog, _ctx: JobContext) -> Result<(), JobError> {
    started(job.tenant);
    Ok(())
}

#[jobs::handler]
async fn backlog_free(job: BacklogFree, _ctx: JobContext) -> Result<(), JobError> {
    started(job.tenant);
    Ok(())
}

/// W8b, partition fairness: 2,000 jobs of tenant 0, then one of each of 10,000 other
/// tenants, one runtime of concurrency 10; when the small tenants' jobs start, counted
/// from the end of their enqueue (p50, p99), for the kind limited to one per tenant,
/// the same without the backlog (what a partition costs by itself), and its twin
/// without limits, in the same run (`JOBS_BENCH_W8B`: those of `limited`, `no-backlog`
/// and `unlimited` it lists, separated by commas).
pub async fn run_backlog(runs: usize) {
    let only = std::env::var("JOBS_BENCH_W8B").ok();
    for (kind, limited, backlog, key, name) in [
        ("bench.backlog", true, 2_000, "limited", "limited"),
        (
            "bench.backlog",
            true,
            0,
            "no-backlog",
            "limited, no backlog",
        ),
        ("bench.backlog_free", false, 2_000, "unlimited", "unlimited"),
    ] {
        // The report's names hold a comma: the selection goes by a key of its own.
        if only
            .as_deref()
            .is_some_and(|only| !only.split(',').any(|o| o.trim() == key))
        {
            continue;
        }
        let (mut p50s, mut p99s) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let pool = super::fresh_database(12).await;
            let tenants = std::iter::repeat_n(0, backlog).chain(1..=10_000u32);
            for chunk in tenants.collect::<Vec<_>>().chunks(2_000) {
                let mut batch = EnqueueBatch::new();
                for &tenant in chunk {
                    if limited {
                        batch.push(&Backlog { tenant }).unwrap();
                    } else {
                        batch.push(&BacklogFree { tenant }).unwrap();
                    }
                }
                batch.enqueue(&pool).await.unwrap();
            }
            STARTS.lock().unwrap().clear();
            let runtime_pool = super::pool(12).await;
            let stop = Arc::new(tokio::sync::Notify::new());
            let signal = stop.clone();
            let t = Instant::now();
            let rt = tokio::spawn(async move {
                Runtime::new(runtime_pool)
                    .kinds([kind])
                    .concurrency(10)
                    .run_until(async move { signal.notified().await })
                    .await
            });
            while STARTS.lock().unwrap().len() < 10_000 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            stop.notify_one();
            rt.await.unwrap().unwrap();
            pool.close().await;
            let mut waits: Vec<f64> = STARTS
                .lock()
                .unwrap()
                .iter()
                .map(|s| s.duration_since(t).as_secs_f64() * 1e3)
                .collect();
            waits.sort_by(f64::total_cmp);
            p50s.push(waits[waits.len() / 2]);
            p99s.push(waits[waits.len() * 99 / 100]);
        }
        super::report(
            &format!("W8b small tenants' start p50, {name}"),
            "ms",
            p50s,
            &[],
        );
        super::report(
            &format!("W8b small tenants' start p99, {name}"),
            "ms",
            p99s,
            &[],
        );
    }
}

/// W8's partitions: `n` no-op jobs over 10,000 tenants (a limit of 1 each), drained by
/// one runtime of concurrency 10 and 100, beside the same drain of one kind without a
/// limit (W2's), in the same run.
pub async fn run_partitions(n: u32, runs: usize) {
    for concurrency in [10, 100] {
        let mut rates = Vec::new();
        for _ in 0..runs {
            let pool = super::fresh_database(12).await;
            for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
                let mut batch = EnqueueBatch::new();
                for &seq in chunk {
                    batch
                        .push(&PerTenant {
                            tenant: seq % 10_000,
                        })
                        .unwrap();
                }
                batch.enqueue(&pool).await.unwrap();
            }
            let runtime_pool = super::pool(12).await;
            let stop = Arc::new(tokio::sync::Notify::new());
            let signal = stop.clone();
            let t = Instant::now();
            let rt = tokio::spawn(async move {
                Runtime::new(runtime_pool)
                    .kinds(["bench.tenant"])
                    .concurrency(concurrency)
                    .run_until(async move { signal.notified().await })
                    .await
            });
            super::wait_empty(&pool, &["bench.tenant"]).await;
            rates.push(f64::from(n) / t.elapsed().as_secs_f64());
            stop.notify_one();
            rt.await.unwrap().unwrap();
            pool.close().await;
        }
        super::report(
            &format!("W8 10,000 partitions of 1, conc {concurrency}"),
            "jobs/s",
            rates,
            &[],
        );
    }
}

/// A runtime process for W8, stopped by the parent: of `kind`, concurrency 10.
pub async fn child(kind: &str) {
    let pool = super::pool(12).await;
    Runtime::new(pool)
        .kinds([kind.to_owned()])
        .concurrency(10)
        .run()
        .await
        .unwrap();
}

/// Four runtime processes of `kind`.
fn spawn(kind: &str) -> Vec<tokio::process::Child> {
    (0..4)
        .map(|_| {
            tokio::process::Command::new(std::env::current_exe().unwrap())
                .args(["--child-limited", kind])
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect()
}

/// W8's rate: 70,000 no-op jobs of a kind with a rate of 1,000/s, four runtime
/// processes; the starts per second between the 5th and the 65th second (the jobs
/// leave the table at their completion, a few ms after their start).
pub async fn run_rate(runs: usize) {
    let mut rates = Vec::new();
    for _ in 0..runs {
        let pool = super::fresh_database(4).await;
        for chunk in (0..70_000u32).collect::<Vec<_>>().chunks(10_000) {
            let mut batch = EnqueueBatch::new();
            for &seq in chunk {
                batch.push(&Rated { seq }).unwrap();
            }
            batch.enqueue(&pool).await.unwrap();
        }
        let left = || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobs WHERE kind = 'bench.rated'")
                .fetch_one(&pool)
                .await
                .unwrap()
        };
        let children = spawn("bench.rated");
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (before, t) = (left().await, Instant::now());
        tokio::time::sleep(Duration::from_secs(60)).await;
        let after = left().await;
        rates.push((before - after) as f64 / t.elapsed().as_secs_f64());
        for mut child in children {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        pool.close().await;
    }
    super::report("W8 rate 1000/s, 4 runtimes", "starts/s", rates, &[]);
}

/// Runs W8 `runs` times.
pub async fn run(runs: usize) {
    let mut usage = Vec::new();
    let mut ran = Vec::new();
    let mut held = Vec::new();
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
        let t = Instant::now();
        let watch = tokio::spawn(most_running(pool.clone(), stop.clone()));
        let children = spawn("bench.limited");
        super::wait_empty(&pool, &["bench.limited"]).await;
        let took = t.elapsed().as_secs_f64();
        stop.store(true, Ordering::SeqCst);
        let samples = watch.await.unwrap();
        let first = samples.iter().position(|&(_, n)| n > 0).unwrap_or(0);
        let span = took - samples.get(first).map_or(0.0, |(at, _)| *at);
        let counted = &samples[first..];
        let seen = counted.iter().map(|(_, n)| *n).max().unwrap_or(0);
        let mean =
            counted.iter().map(|(_, n)| *n as f64).sum::<f64>() / counted.len().max(1) as f64;
        let mut ran_us = 0;
        for mut child in children {
            let _ = child.start_kill();
            let out = child.wait_with_output().await.unwrap();
            ran_us += String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.strip_prefix("ran ")?.parse::<u64>().ok())
                .sum::<u64>();
        }
        usage.push(work_ms as f64 / 1000.0 / (LIMIT as f64 * span));
        ran.push(ran_us as f64 / 1e6 / (LIMIT as f64 * span));
        held.push(mean / LIMIT as f64);
        most.push(seen as f64);
        rates.push(2_000.0 / took);
        pool.close().await;
    }
    super::report(
        "W8 limit 8, 4 runtimes: running/8",
        "ratio",
        held,
        &[("most_running", super::median(most))],
    );
    super::report("W8 limit 8: handlers running/8", "ratio", ran, &[]);
    super::report("W8 limit 8: sleeps asked/8", "ratio", usage, &[]);
    super::report("W8 limit 8, 4 runtimes: drain", "jobs/s", rates, &[]);
}

/// The jobs of the kind running in the table, sampled every 2 ms until `stop`: seconds
/// since the start, and the count.
async fn most_running(pool: PgPool, stop: Arc<AtomicBool>) -> Vec<(f64, i64)> {
    let t = Instant::now();
    let mut samples = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE kind = 'bench.limited' AND state = 'running'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(
            n <= LIMIT,
            "{n} jobs of a kind limited to {LIMIT} running at once"
        );
        samples.push((t.elapsed().as_secs_f64(), n));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    samples
}
