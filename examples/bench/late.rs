//! `bench -- w7`: pickup after commit, by the path that made a job pending.
//!
//! A default runtime (`Runtime::new(pool)`: every kind of the binary, concurrency 10,
//! poll 1 s) under a steady load of the same kind (none, 5, 1,000 or 2,000 jobs/s, and
//! 1,000 jobs/s while a transaction holds an xid, and so the xmin horizon), and jobs
//! made pending by each path, `--samples` of each, started at random moments within 2 s:
//!
//! - `at once`: `enqueue(&pool)`, committed by the statement;
//! - `late D s`: enqueued in a transaction that commits D seconds later;
//! - `locked`: a committed job, locked (`FOR UPDATE`) by another transaction for 1 s
//!   from before it became due;
//! - `waited`: an enqueue of a key whose job another transaction holds (it coalesced a
//!   trigger into it and commits 0.5 s later); `waited, priority` raises its priority;
//! - `retry in tx`: `admin::retry` of a failed job in a transaction that commits 0.5 s
//!   later.
//!
//! Every sample is of the load's priority (0), but for the job whose priority the
//! coalescing enqueue raises (from 5 to 0).
//!
//! Pickup is the handler's start less the moment the path's last statement returned
//! (the commit, the rollback, the waiting enqueue), on this process's clock. The goal:
//! each path's p99 within 2x, and its max within 50 ms, of `at once` in the same run.
//! Two baselines: the `at once` samples (enqueued within the first 2 s, as every path
//! starts), and each sample's companion, a job enqueued `at once` the moment that
//! sample's last statement returned. A late commit is picked up seconds or a minute
//! after the run began, when the horizon that the run's own late transactions hold
//! is older and every claim slower; its companion meets the same claims.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jobs::{EnqueueBatch, EnqueueOptions, Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::{Connection, PgConnection, PgPool};

/// A job of the load (tag 0) or a sample (its tag).
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "bench.late", key = "key")]
struct Late {
    tag: u64,
    key: Option<String>,
}

/// When each sample's handler started, by tag.
static STARTED: Mutex<Option<HashMap<u64, Instant>>> = Mutex::new(None);
static NEXT_TAG: AtomicU64 = AtomicU64::new(1);

#[jobs::handler]
async fn late(job: Late, _ctx: JobContext) -> Result<(), JobError> {
    if job.tag != 0
        && let Some(started) = STARTED.lock().unwrap().as_mut()
    {
        started.entry(job.tag).or_insert_with(Instant::now);
    }
    Ok(())
}

fn tag() -> u64 {
    NEXT_TAG.fetch_add(1, Ordering::Relaxed)
}

/// The paths, in the table's order.
const PATHS: &[&str] = &[
    "at once",
    "late 0.15 s",
    "late 0.5 s",
    "late 2 s",
    "late 10 s",
    "late 60 s",
    "locked",
    "waited",
    "waited, priority",
    "retry in tx",
];

/// One sample of `path`: makes a job pending that way; returns its tag and the moment
/// the path's last statement returned.
async fn sample(pool: PgPool, path: &'static str) -> (u64, Instant) {
    let t = tag();
    let job = move |key: Option<String>| Late { tag: t, key };
    match path {
        "at once" => {
            job(None).enqueue(&pool).await.unwrap();
        }
        "locked" => {
            let id = job(None)
                .enqueue_with(
                    &pool,
                    EnqueueOptions::new().delay(Duration::from_millis(100)),
                )
                .await
                .unwrap()
                .id;
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("SELECT id FROM jobs WHERE id = $1 FOR UPDATE")
                .bind(id)
                .execute(&mut *tx)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.rollback().await.unwrap();
        }
        "waited" | "waited, priority" => {
            let key = Some(format!("w{t}"));
            // The job waits at the load's priority, or is raised to it.
            let priority = if path == "waited" { 0 } else { 5 };
            let later = EnqueueOptions::new()
                .delay(Duration::from_secs(3600))
                .priority(priority);
            job(key.clone()).enqueue_with(&pool, later).await.unwrap();
            let mut tx = pool.begin().await.unwrap();
            Late {
                tag: 0,
                key: key.clone(),
            }
            .enqueue_with(&mut *tx, later)
            .await
            .unwrap();
            let waiter = tokio::spawn({
                let pool = pool.clone();
                async move {
                    job(key)
                        .enqueue_with(&pool, EnqueueOptions::new().priority(0))
                        .await
                        .unwrap();
                    Instant::now()
                }
            });
            tokio::time::sleep(Duration::from_millis(500)).await;
            tx.commit().await.unwrap();
            return (t, waiter.await.unwrap());
        }
        "retry in tx" => {
            let id = job(None)
                .enqueue_with(
                    &pool,
                    EnqueueOptions::new().delay(Duration::from_secs(3600)),
                )
                .await
                .unwrap()
                .id;
            sqlx::query("UPDATE jobs SET state = 'failed', finished_at = now() WHERE id = $1")
                .bind(id)
                .execute(&pool)
                .await
                .unwrap();
            let mut tx = pool.begin().await.unwrap();
            jobs::admin::retry(&mut *tx, id).await.unwrap();
            tokio::time::sleep(Duration::from_millis(500)).await;
            tx.commit().await.unwrap();
        }
        late => {
            let seconds: f64 = late
                .trim_start_matches("late ")
                .trim_end_matches(" s")
                .parse()
                .unwrap();
            let mut tx = pool.begin().await.unwrap();
            job(None).enqueue(&mut *tx).await.unwrap();
            tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
            tx.commit().await.unwrap();
        }
    }
    (t, Instant::now())
}

/// A job enqueued at once, beside a sample that just ended: its tag and the moment
/// its enqueue returned.
async fn companion(pool: &PgPool) -> (u64, Instant) {
    let t = tag();
    Late { tag: t, key: None }.enqueue(pool).await.unwrap();
    (t, Instant::now())
}

/// Enqueues `rate` jobs a second of the same kind until `stop`.
async fn load(pool: PgPool, rate: u32, stop: Arc<AtomicBool>) {
    if rate == 0 {
        return;
    }
    // Batches every 5 ms above 200 jobs/s, single jobs below.
    let (every, per) = if rate >= 200 {
        (Duration::from_millis(5), (rate / 200) as usize)
    } else {
        (Duration::from_secs_f64(1.0 / f64::from(rate)), 1)
    };
    let mut tick = tokio::time::interval(every);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        if per == 1 {
            Late { tag: 0, key: None }.enqueue(&pool).await.unwrap();
        } else {
            let mut batch = EnqueueBatch::new();
            for _ in 0..per {
                batch.push(&Late { tag: 0, key: None }).unwrap();
            }
            batch.enqueue(&pool).await.unwrap();
        }
    }
}

/// The levels: the load's rate, and whether a transaction holds an xid meanwhile.
const LEVELS: &[(&str, u32, bool)] = &[
    ("idle", 0, false),
    ("5/s", 5, false),
    ("1,000/s", 1_000, false),
    ("2,000/s", 2_000, false),
    ("1,000/s, held horizon", 1_000, true),
];

/// Runs W7: every level, every path.
pub async fn run(samples: usize) {
    println!(
        "{:<24} {:<18} {:>9} {:>9}  goal (p99 <= 2x at once, max <= at once + 50 ms)",
        "W7 level", "path", "p99 ms", "max ms"
    );
    for &(level, rate, held) in LEVELS {
        let pool = super::fresh_database(40).await;
        *STARTED.lock().unwrap() = Some(HashMap::new());
        let stop = Arc::new(tokio::sync::Notify::new());
        let signal = stop.clone();
        let rt = tokio::spawn(
            Runtime::new(pool.clone()).run_until(async move { signal.notified().await }),
        );
        let holder = if held {
            let mut c = PgConnection::connect(&super::url()).await.unwrap();
            sqlx::query("BEGIN").execute(&mut c).await.unwrap();
            sqlx::query("SELECT pg_current_xact_id()")
                .execute(&mut c)
                .await
                .unwrap();
            Some(c)
        } else {
            None
        };
        let loading = Arc::new(AtomicBool::new(false));
        let loader = tokio::spawn(load(pool.clone(), rate, loading.clone()));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut tasks = Vec::new();
        for &path in PATHS {
            for i in 0..samples {
                let pool = pool.clone();
                // Spread over 2 s without a random source: a fixed stride.
                let offset =
                    Duration::from_millis((i as u64 * 397 + path.len() as u64 * 61) % 2_000);
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep(offset).await;
                    let made = sample(pool.clone(), path).await;
                    (path, made, companion(&pool).await)
                }));
            }
        }
        // Each sample, and its companion (marked `true`).
        let mut done: Vec<(&str, bool, u64, Instant)> = Vec::new();
        for task in tasks {
            let (path, (tag, at), (companion_tag, companion_at)) = task.await.unwrap();
            done.push((path, false, tag, at));
            done.push((path, true, companion_tag, companion_at));
        }
        // Every sample has started (or waits at most this long).
        let deadline = Instant::now() + Duration::from_secs(60);
        let pickups = loop {
            let started = STARTED.lock().unwrap().clone().unwrap();
            if done.iter().all(|(_, _, tag, _)| started.contains_key(tag))
                || Instant::now() > deadline
            {
                break done
                    .iter()
                    .map(|(path, companion, tag, at)| {
                        let ms = started.get(tag).map_or(f64::INFINITY, |s| {
                            s.saturating_duration_since(*at).as_secs_f64() * 1000.0
                        });
                        (*path, *companion, ms)
                    })
                    .collect::<Vec<_>>();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        loading.store(true, Ordering::Relaxed);
        let _ = loader.await;
        drop(holder);
        stop.notify_one();
        rt.await.unwrap().unwrap();
        pool.close().await;
        report(level, &pickups);
    }
}

/// Prints one level's table: each path's p99 and max against `at once`, and against
/// its companions (jobs enqueued at once the moment each of its samples ended).
fn report(level: &str, pickups: &[(&str, bool, f64)]) {
    let stats = |path: &str, companions: bool| {
        let mut v: Vec<f64> = pickups
            .iter()
            .filter(|(p, c, _)| *p == path && *c == companions)
            .map(|(_, _, ms)| *ms)
            .collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let p99 = v[((v.len() * 99).div_ceil(100)).saturating_sub(1)];
        (p99, v[v.len() - 1])
    };
    let within = |(p99, max): (f64, f64), (base_p99, base_max): (f64, f64)| {
        p99 <= 2.0 * base_p99.max(1.0) && max <= base_max + 50.0
    };
    let at_once = stats("at once", false);
    for &path in PATHS {
        let (p99, max) = stats(path, false);
        let (c_p99, c_max) = stats(path, true);
        let met = within((p99, max), at_once);
        let met_paired = within((p99, max), (c_p99, c_max));
        let word = |met: bool| if met { "met" } else { "MISSED" };
        println!(
            "{level:<24} {path:<18} {p99:>9.1} {max:>9.1}  {}; companions {c_p99:.1} {c_max:.1}: {}",
            word(met),
            word(met_paired)
        );
        println!(
            "{}",
            serde_json::json!({
                "workload": "W7", "level": level, "path": path, "p99_ms": p99, "max_ms": max,
                "met": met, "companions_p99_ms": c_p99, "companions_max_ms": c_max,
                "met_against_companions": met_paired,
            })
        );
    }
}
