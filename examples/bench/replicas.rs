//! W10: replicas of the default runtime (every kind of the binary) at a light load, and
//! what it costs the database; and four replicas of a runtime of one kind beside them.
//!
//! One producer enqueues single no-op jobs at [`RATE`] per second for [`SECONDS`] s,
//! while one or four runtimes, each with a pool of its own (as replicas of a service
//! are), claim them. Every job is picked up at once by some replica; the figure is the
//! database's time (`pg_stat_database.active_time`, PostgreSQL 14 and later: the time
//! its backends spent executing statements in the benchmark's database) per job, and
//! per second of the run (the share of a core the database spends), with the
//! transactions per job (`xact_commit`: a statement on its own is one). The setup's connections close before the first
//! reading and every connection after the run closes before the second, so both
//! readings hold every statement of the run (a backend reports its counts when it
//! exits). The enqueues are counted too (about a tenth of a millisecond each).

use super::*;

/// Jobs enqueued per second.
const RATE: u32 = 100;

/// How long the producer enqueues.
const SECONDS: u32 = 10;

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

pub async fn run(runs: usize) {
    for (replicas, claims) in [(1, Claims::All), (4, Claims::All), (4, Claims::First(1))] {
        let (mut per_job, mut share, mut statements) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            fresh_database(2).await.close().await;
            let (time_before, commits_before) = activity().await;
            let stop = Arc::new(tokio::sync::Notify::new());
            let mut runtimes = Vec::new();
            for _ in 0..replicas {
                let (pool, stop) = (pool(6).await, stop.clone());
                runtimes.push(tokio::spawn(async move {
                    let rt = claims.runtime(pool.clone());
                    rt.run_until(async move { stop.notified().await })
                        .await
                        .unwrap();
                    pool.close().await;
                }));
            }
            let before = DONE.load(Ordering::SeqCst);
            let producer = pool(1).await;
            let started = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_secs(1) / RATE);
            for seq in 0..RATE * SECONDS {
                tick.tick().await;
                Noop { seq }.enqueue(&producer).await.unwrap();
            }
            let n = (RATE * SECONDS) as usize;
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
            statements.push((commits_after - commits_before) as f64 / n as f64);
        }
        let name = format!(
            "W10 {RATE} jobs/s, {replicas} replica(s) of {}",
            claims.label()
        );
        report(
            &name,
            "db ms/job",
            per_job,
            &[
                ("db_core_share", median(share)),
                ("commits_per_job", median(statements)),
            ],
        );
    }
}
