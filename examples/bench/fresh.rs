//! `bench fresh`: pickup on a freshly migrated table, against the same table warm.
//!
//! On a server with autovacuum on (`JOBS_BENCH_FRESH_URL`, default
//! `postgres://postgres@127.0.0.1:5444/postgres`; the workload creates the database
//! `jobs_bench_fresh` there afresh and migrates it), one runtime (concurrency 10) of a
//! no-op kind, and one producer enqueueing one job at a time on a held connection at
//! `--rate` jobs/s for `--seconds`. Then the same again on the same database, its table
//! now vacuumed and analyzed by autovacuum (`warm`), with a new runtime and producer.
//!
//! Prints, per 10 s window of enqueues: the pickup latency's p50 and p95 (from the
//! enqueue's return, its commit acknowledged, to the handler's start) and, at the end
//! of the window, the table's autovacuum and autoanalyze counts and the seconds since
//! the last of each (`pg_stat_user_tables`), its pages (`pg_relation_size`), and the
//! rows sequential scans of it read during the window (`seq_tup_read`: a claim planned
//! for an empty table reads it whole, `runtime::HeldConn`).
//!
//! `--vacuum-first` vacuums the empty table before the run, as autovacuum does when it
//! visits the new database first; `--every-kind` has the runtime claim every kind of the
//! benchmark's binary.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jobs::{Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres};

/// The workload's no-op job.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "bench.fresh")]
struct Fresh {
    seq: u32,
}

/// When each job's handler started, by sequence number.
static STARTED: Mutex<Option<HashMap<u32, Instant>>> = Mutex::new(None);
static RAN: AtomicUsize = AtomicUsize::new(0);

#[jobs::handler]
async fn handle(job: Fresh, _ctx: JobContext) -> Result<(), JobError> {
    let now = Instant::now();
    if let Some(started) = STARTED.lock().unwrap().as_mut() {
        started.insert(job.seq, now);
    }
    RAN.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The workload's parameters (`--rate` jobs/s, `--seconds` per run).
pub struct Options {
    rate: u32,
    seconds: u64,
    /// Vacuum the empty table right after migrating, as autovacuum does when its first
    /// visit to the new database comes before the traffic.
    vacuum_first: bool,
    /// The runtime claims every kind of the benchmark's binary (51 more, all idle), as
    /// W3's "every kind" does, not the workload's kind alone.
    every_kind: bool,
}

impl Options {
    pub fn parse(args: &[String]) -> Options {
        let mut o = Options {
            rate: 400,
            seconds: 120,
            vacuum_first: false,
            every_kind: false,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--vacuum-first" {
                o.vacuum_first = true;
                continue;
            }
            if a == "--every-kind" {
                o.every_kind = true;
                continue;
            }
            let v = it
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{a} takes a number"));
            match a.as_str() {
                "--rate" => o.rate = u32::try_from(v).expect("--rate"),
                "--seconds" => o.seconds = v,
                other => panic!("unknown argument to fresh: {other}"),
            }
        }
        o
    }
}

/// The workload's database on the server of `JOBS_BENCH_FRESH_URL`.
fn url() -> String {
    let server = std::env::var("JOBS_BENCH_FRESH_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5444/postgres".to_owned());
    let (base, _) = server.rsplit_once('/').expect("a database URL");
    format!("{base}/jobs_bench_fresh")
}

pub async fn run(o: Options) {
    let url = url();
    if Postgres::database_exists(&url).await.unwrap() {
        Postgres::force_drop_database(&url).await.unwrap();
    }
    Postgres::create_database(&url).await.unwrap();
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .unwrap();
    jobs::migrate(&admin).await.unwrap();
    if o.vacuum_first {
        sqlx::query("VACUUM jobs").execute(&admin).await.unwrap();
    }
    let settings: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, setting FROM pg_settings WHERE name IN \
         ('autovacuum', 'autovacuum_naptime', 'shared_buffers', 'jit', 'synchronous_commit') \
         ORDER BY name",
    )
    .fetch_all(&admin)
    .await
    .unwrap();
    println!(
        "fresh: {url}, {} jobs/s for {} s{}{}; {settings:?}",
        o.rate,
        o.seconds,
        if o.vacuum_first {
            ", vacuumed first"
        } else {
            ""
        },
        if o.every_kind {
            ", every kind claimed"
        } else {
            ""
        }
    );
    let started = Instant::now();
    for label in ["fresh", "warm"] {
        one(&admin, &url, &o, label, started).await;
    }
    admin.close().await;
}

/// One run: the runtime, the producer, and the report of each window.
async fn one(admin: &PgPool, url: &str, o: &Options, label: &str, since: Instant) {
    *STARTED.lock().unwrap() = Some(HashMap::new());
    RAN.store(0, Ordering::SeqCst);
    let pool = PgPoolOptions::new()
        .max_connections(12)
        .connect(url)
        .await
        .unwrap();
    let stop = Arc::new(tokio::sync::Notify::new());
    let signal = stop.clone();
    let mut runtime = Runtime::new(pool.clone()).concurrency(10);
    if !o.every_kind {
        runtime = runtime.kinds(["bench.fresh"]);
    }
    let runtime = tokio::spawn(runtime.run_until(async move { signal.notified().await }));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let first = table_stats(admin).await;
    let mut conn = pool.acquire().await.unwrap();
    let period = Duration::from_secs_f64(1.0 / f64::from(o.rate));
    let mut tick = tokio::time::interval(period);
    let t0 = Instant::now();
    let mut sent: Vec<Instant> = Vec::new();
    let mut stats = Vec::new();
    let mut window_end = t0 + Duration::from_secs(10);
    let end = t0 + Duration::from_secs(o.seconds);
    let mut seq = 0u32;
    while Instant::now() < end {
        tick.tick().await;
        Fresh { seq }.enqueue(&mut *conn).await.unwrap();
        sent.push(Instant::now());
        seq += 1;
        if Instant::now() >= window_end {
            stats.push(table_stats(admin).await);
            window_end += Duration::from_secs(10);
        }
    }
    drop(conn);
    let deadline = Instant::now() + Duration::from_secs(60);
    while RAN.load(Ordering::Relaxed) < sent.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if stats.len() < (o.seconds / 10) as usize {
        stats.push(table_stats(admin).await);
    }
    stop.notify_one();
    runtime.await.unwrap().unwrap();
    pool.close().await;

    let starts = STARTED.lock().unwrap().take().unwrap();
    println!(
        "\n{label} (from {:.0} s after migrating): {} jobs, {} ran",
        t0.duration_since(since).as_secs_f64(),
        sent.len(),
        starts.len()
    );
    println!(
        "{:>8} {:>6} {:>8} {:>8} {:>8}  {:>6} {:>9} {:>8} {:>11} {:>7} {:>10}",
        "window",
        "jobs",
        "p50 ms",
        "p95 ms",
        "max ms",
        "vacs",
        "last vac",
        "analyzes",
        "last anlz",
        "pages",
        "seq rows"
    );
    let mut all = Vec::new();
    let mut seq_before = first.seq_read;
    for (w, stat) in stats.iter().enumerate() {
        let from = t0 + Duration::from_secs(10 * w as u64);
        let to = from + Duration::from_secs(10);
        let mut lat: Vec<f64> = sent
            .iter()
            .enumerate()
            .filter(|(_, t)| **t >= from && **t < to)
            .filter_map(|(s, t)| {
                let at = starts.get(&u32::try_from(s).unwrap())?;
                Some(at.saturating_duration_since(*t).as_secs_f64() * 1000.0)
            })
            .collect();
        if lat.is_empty() {
            continue;
        }
        lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
        all.extend_from_slice(&lat);
        let at = |q: usize| lat[(lat.len() * q / 100).min(lat.len() - 1)];
        let ago = |s: Option<f64>| s.map_or_else(|| "-".to_owned(), |s| format!("{s:.0} s ago"));
        println!(
            "{:>5}-{:<3} {:>6} {:>8.1} {:>8.1} {:>8.1}  {:>6} {:>9} {:>8} {:>11} {:>7} {:>10}",
            10 * w,
            10 * (w + 1),
            lat.len(),
            at(50),
            at(95),
            lat[lat.len() - 1],
            stat.vacuums,
            ago(stat.vacuumed_ago),
            stat.analyzes,
            ago(stat.analyzed_ago),
            stat.pages,
            stat.seq_read - seq_before
        );
        seq_before = stat.seq_read;
    }
    all.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if !all.is_empty() {
        let at = |q: usize| all[(all.len() * q / 100).min(all.len() - 1)];
        let json = serde_json::json!({
            "workload": format!("fresh {label}"), "unit": "ms",
            "p50": at(50), "p95": at(95),
            "windows": stats.len(),
        });
        println!("{json}");
    }
}

/// The job table's vacuums and analyzes by autovacuum, at the end of a window.
struct TableStats {
    vacuums: i64,
    vacuumed_ago: Option<f64>,
    analyzes: i64,
    analyzed_ago: Option<f64>,
    pages: i64,
    /// Rows read by sequential scans of the table so far.
    seq_read: i64,
}

async fn table_stats(admin: &PgPool) -> TableStats {
    // Statistics are read within one transaction as of its first read: a fresh one.
    let row: (i64, Option<f64>, i64, Option<f64>, i64, i64) = sqlx::query_as(
        "SELECT autovacuum_count + vacuum_count,
                extract(epoch FROM now() - greatest(last_autovacuum, last_vacuum))::float8,
                autoanalyze_count + analyze_count,
                extract(epoch FROM now() - greatest(last_autoanalyze, last_analyze))::float8,
                pg_relation_size('jobs') / 8192, coalesce(seq_tup_read, 0)
         FROM pg_stat_user_tables WHERE relname = 'jobs'",
    )
    .fetch_one(admin)
    .await
    .unwrap();
    TableStats {
        vacuums: row.0,
        vacuumed_ago: row.1,
        analyzes: row.2,
        analyzed_ago: row.3,
        pages: row.4,
        seq_read: row.5,
    }
}
