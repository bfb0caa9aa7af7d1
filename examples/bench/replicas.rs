//! W10: replicas of the default runtime (every kind of the binary), each with a pool
//! of two, at a steady load, and what it costs the database.
//!
//! One producer enqueues single no-op jobs at 100 and at 1,000 per second (for
//! [`SECONDS`] s), while 1, 4 or 16 runtimes, each with a pool of its own (as replicas
//! of a service are), claim them. The figures are the database's time
//! (`pg_stat_database.active_time`, PostgreSQL 14 and later: the time its backends
//! spent executing statements in the benchmark's database) per job, and per second of
//! the run (the share of a core the database spends), the transactions per job
//! (`xact_commit`: a statement on its own is one), and each job's pickup (from its
//! enqueue's return to its handler's start; p50 and p99). The setup's connections close
//! before the first reading and every connection after the run closes before the
//! second, so both readings hold every statement of the run (a backend reports its
//! counts when it exits). The enqueues are counted too (about a tenth of a millisecond
//! each). `JOBS_BENCH_W10` limits the configurations (`replicas@rate`, comma
//! separated: `4@100,16@1000`).

use super::*;

/// How long the producer enqueues.
const SECONDS: u32 = 5;

/// Each replica's pool.
const POOL: u32 = 2;

/// The database's total execution time (ms) and commits so far, read on a new
/// connection.
async fn activity() -> (f64, i64) {
    let pool = pool(1).await;
    // A backend reports its counts as it exits: wait until every other one has.
    loop {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if others == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let row: (f64, i64) = sqlx::query_as(
        "SELECT active_time, xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    row
}

/// The configurations to run: `JOBS_BENCH_W10`, or every one of the table.
fn configurations() -> Vec<(usize, u32)> {
    match std::env::var("JOBS_BENCH_W10") {
        Ok(list) => list
            .split(',')
            .filter_map(|c| {
                let (replicas, rate) = c.trim().split_once('@')?;
                Some((replicas.parse().ok()?, rate.parse().ok()?))
            })
            .collect(),
        Err(_) => [1, 4, 16]
            .into_iter()
            .flat_map(|replicas| [(replicas, 100), (replicas, 1_000)])
            .collect(),
    }
}

pub async fn run(runs: usize) {
    for (replicas, rate) in configurations() {
        let (mut per_job, mut share, mut commits) = (Vec::new(), Vec::new(), Vec::new());
        let (mut p50, mut p99) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            fresh_database(2).await.close().await;
            let (time_before, commits_before) = activity().await;
            let stop = Arc::new(tokio::sync::Notify::new());
            let mut runtimes = Vec::new();
            for _ in 0..replicas {
                let (pool, stop) = (pool(POOL).await, stop.clone());
                runtimes.push(tokio::spawn(async move {
                    let rt = Claims::All.runtime(pool.clone());
                    rt.run_until(async move { stop.notified().await })
                        .await
                        .unwrap();
                    pool.close().await;
                }));
            }
            // The runtimes' first claims and reports are not the load's.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let before = DONE.load(Ordering::SeqCst);
            let started_at = STARTED.get_or_init(Default::default);
            started_at.lock().unwrap().clear();
            let producer = pool(1).await;
            let started = Instant::now();
            let mut enqueued = Vec::with_capacity((rate * SECONDS) as usize);
            let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            for seq in 0..rate * SECONDS {
                tick.tick().await;
                Noop { seq }.enqueue(&producer).await.unwrap();
                enqueued.push(Instant::now());
            }
            let n = (rate * SECONDS) as usize;
            while DONE.load(Ordering::SeqCst) - before < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let elapsed = started.elapsed().as_secs_f64();
            producer.close().await;
            stop.notify_waiters();
            for rt in runtimes {
                rt.await.unwrap();
            }
            let (time_after, commits_after) = activity().await;
            let time = time_after - time_before;
            per_job.push(time / n as f64);
            share.push(time / 1_000.0 / elapsed);
            commits.push((commits_after - commits_before) as f64 / n as f64);
            let starts = started_at.lock().unwrap();
            let mut pickups: Vec<f64> = enqueued
                .iter()
                .enumerate()
                .filter_map(|(seq, at)| {
                    let start = starts.get(&(seq as u32))?;
                    Some(start.saturating_duration_since(*at).as_secs_f64() * 1_000.0)
                })
                .collect();
            pickups.sort_by(f64::total_cmp);
            let at = |q: f64| pickups[((pickups.len() - 1) as f64 * q).round() as usize];
            p50.push(at(0.5));
            p99.push(at(0.99));
        }
        report(
            &format!("W10 {rate} jobs/s, {replicas} replica(s)"),
            "db ms/job",
            per_job,
            &[
                ("db_core_share", median(share)),
                ("commits_per_job", median(commits)),
                ("pickup_p50_ms", median(p50)),
                ("pickup_p99_ms", median(p99)),
            ],
        );
    }
}
