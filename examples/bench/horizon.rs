//! `bench -- horizon`: a steady offered load while a transaction holds the xmin horizon.
//!
//! The default server of a development machine often runs with autovacuum off, which is
//! not how production runs: this workload starts a PostgreSQL cluster of its own
//! (`initdb` in a temporary directory, on port 5499 unless `JOBS_BENCH_HORIZON_PORT`
//! says otherwise) with autovacuum on and the settings in [`SETTINGS`], and stops it at
//! the end. Three phases: clean, held (an idle-in-transaction session holding an XID,
//! or with `--holder readers` four `REPEATABLE READ` transactions scanning the table),
//! and recovery. Every 5 seconds it prints the completion rate against the offered
//! rate, the pickup p50/p95, the claim statement's mean time (from
//! `pg_stat_statements`), the job table's dead tuples and size; then one line per phase.

use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use jobs::{EnqueueBatch, Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

/// The cluster's settings besides the defaults: autovacuum as a queue wants it (it is on
/// by default; a short naptime and no cost delay let it keep up with a churning table),
/// and `pg_stat_statements` to read the claim's time.
const SETTINGS: &[&str] = &[
    "autovacuum=on",
    "autovacuum_naptime=1s",
    "autovacuum_vacuum_cost_delay=0",
    "shared_buffers=512MB",
    "max_wal_size=4GB",
    "shared_preload_libraries=pg_stat_statements",
    "listen_addresses=127.0.0.1",
];

/// A no-op job that carries when it was enqueued, on this process's monotonic clock.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "bench.horizon")]
struct Steady {
    at_us: u64,
}

static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
static DONE: AtomicU64 = AtomicU64::new(0);
static PICKUP_MS: Mutex<Vec<f64>> = Mutex::new(Vec::new());

fn micros() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

#[jobs::handler]
async fn steady(job: Steady, _ctx: JobContext) -> Result<(), JobError> {
    let waited = micros().saturating_sub(job.at_us) as f64 / 1000.0;
    PICKUP_MS.lock().unwrap().push(waited);
    DONE.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// What holds the horizon during the held phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Holder {
    /// One idle-in-transaction session that has an XID.
    Xid,
    /// Four `REPEATABLE READ` transactions that scan the job table every second.
    Readers,
    /// Nothing: one steady phase (`--held` seconds long), for the sustained rate.
    None,
}

/// The workload's parameters (`--rate`, `--workers`, `--clean`, `--held`, `--recovery`
/// in seconds, `--holder xid|readers`).
#[derive(Clone, Debug)]
pub struct Options {
    pub rate: u64,
    pub workers: usize,
    pub clean: u64,
    pub held: u64,
    pub recovery: u64,
    pub holder: Holder,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            rate: 1000,
            workers: 8,
            clean: 60,
            held: 600,
            recovery: 60,
            holder: Holder::Xid,
        }
    }
}

impl Options {
    /// Reads `--name value` pairs; returns the arguments it did not take.
    pub fn parse(args: &[String]) -> (Options, Vec<String>) {
        let mut o = Options::default();
        let mut rest = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut num = || it.next().and_then(|v| v.parse::<u64>().ok()).expect(a);
            match a.as_str() {
                "--rate" => o.rate = num(),
                "--workers" => o.workers = num() as usize,
                "--clean" => o.clean = num(),
                "--held" => o.held = num(),
                "--recovery" => o.recovery = num(),
                "--holder" => {
                    o.holder = match it.next().map(String::as_str) {
                        Some("readers") => Holder::Readers,
                        Some("none") => Holder::None,
                        _ => Holder::Xid,
                    }
                }
                _ => rest.push(a.clone()),
            }
        }
        (o, rest)
    }
}

/// A cluster of the benchmark's own, stopped and removed on drop.
struct Cluster {
    dir: std::path::PathBuf,
    port: u16,
}

pub(super) fn bin(name: &str) -> String {
    let out = Command::new("pg_config").arg("--bindir").output();
    match out {
        Ok(o) if o.status.success() => {
            format!("{}/{name}", String::from_utf8_lossy(&o.stdout).trim())
        }
        _ => name.to_owned(),
    }
}

/// Runs a server binary, as the `postgres` user when this process is root (the server
/// refuses to run as root).
pub(super) fn as_server(program: &str, args: &[&str]) -> std::process::ExitStatus {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let mut cmd = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", program]);
        c
    } else {
        Command::new(program)
    };
    cmd.args(args).status().expect("run a PostgreSQL binary")
}

/// A fresh, empty directory `jobs-bench-{name}-{port}` for a server of the benchmark's
/// own, owned by the server's user; a server an earlier, interrupted run left running
/// there is stopped first.
pub(super) fn fresh_dir(name: &str, port: u16) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("jobs-bench-{name}-{port}"));
    if dir.join("data/postmaster.pid").exists() {
        stop_immediately(&dir.join("data"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _ = Command::new("chown")
        .args(["postgres:postgres", dir.to_str().unwrap()])
        .status();
    dir
}

/// Stops the server of `data` at once, as a crash would: every server process killed,
/// no shutdown checkpoint.
pub(super) fn stop_immediately(data: &std::path::Path) {
    as_server(
        &bin("pg_ctl"),
        &["-D", data.to_str().unwrap(), "-m", "immediate", "stop"],
    );
}

/// Creates a cluster in `data`: superuser `postgres`, trust authentication, UTF8.
pub(super) fn init_cluster(data: &std::path::Path) {
    let ok = as_server(
        &bin("initdb"),
        &[
            "-D",
            data.to_str().unwrap(),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
        ],
    );
    assert!(ok.success(), "initdb failed");
}

/// Starts the server of `data` on `port` with `settings` (`name=value`), its socket and
/// `server.log` in `data`'s parent, and waits until it accepts connections.
pub(super) fn start_server(data: &std::path::Path, port: u16, settings: &[&str]) {
    let dir = data.parent().unwrap();
    let mut opts = format!("-p {port} -k {}", dir.to_str().unwrap());
    for s in settings {
        opts.push_str(&format!(" -c {s}"));
    }
    let log = dir.join("server.log");
    let ok = as_server(
        &bin("pg_ctl"),
        &[
            "-D",
            data.to_str().unwrap(),
            "-o",
            &opts,
            "-l",
            log.to_str().unwrap(),
            "-w",
            "start",
        ],
    );
    assert!(ok.success(), "the server on port {port} did not start");
}

impl Cluster {
    fn start(port: u16) -> Cluster {
        let dir = fresh_dir("horizon", port);
        let data = dir.join("data");
        init_cluster(&data);
        // More settings for a diagnosis (`name=value`, space-separated), such as
        // auto_explain's; the server's log is then kept as server-<port>.log in the
        // temporary directory.
        let extra = std::env::var("JOBS_BENCH_SERVER_SETTINGS").unwrap_or_default();
        let settings: Vec<&str> = SETTINGS
            .iter()
            .copied()
            .chain(extra.split_whitespace())
            .collect();
        start_server(&data, port, &settings);
        Cluster { dir, port }
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        as_server(
            &bin("pg_ctl"),
            &["-D", data.to_str().unwrap(), "-m", "fast", "stop"],
        );
        if std::env::var_os("JOBS_BENCH_SERVER_SETTINGS").is_some() {
            let kept = std::env::temp_dir().join(format!("server-{}.log", self.port));
            let _ = std::fs::copy(self.dir.join("server.log"), kept);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One 5-second window's figures.
struct Window {
    completed: f64,
    offered: f64,
    p50: f64,
    p95: f64,
    claim_ms: f64,
    /// Full claims (from the start of the range) in the window, and their mean time.
    full_n: f64,
    full_ms: f64,
    dead: i64,
    size_mb: f64,
}

/// What the claim statements have cost so far: calls and total milliseconds of all
/// claims, then of the full ones (those that do not start at a floor).
async fn claim_totals(pool: &PgPool) -> (f64, f64, f64, f64) {
    sqlx::query_as(
        "SELECT coalesce(sum(calls), 0)::float8, coalesce(sum(total_exec_time), 0)::float8, \
                coalesce(sum(calls) FILTER (WHERE query NOT LIKE '%to_timestamp(%'), 0)::float8, \
                coalesce(sum(total_exec_time) FILTER (WHERE query NOT LIKE '%to_timestamp(%'), 0)::float8 \
         FROM pg_stat_statements WHERE query LIKE '%picked AS MATERIALIZED%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Holds the horizon until `stop` turns true.
async fn hold(url: String, holder: Holder, mut stop: tokio::sync::watch::Receiver<bool>) {
    match holder {
        Holder::Xid => {
            let mut c = PgConnection::connect(&url).await.unwrap();
            sqlx::query("BEGIN").execute(&mut c).await.unwrap();
            sqlx::query("SELECT pg_current_xact_id()")
                .execute(&mut c)
                .await
                .unwrap();
            let _ = stop.wait_for(|s| *s).await;
            sqlx::query("ROLLBACK").execute(&mut c).await.unwrap();
        }
        Holder::None => {}
        Holder::Readers => {
            let mut readers = Vec::new();
            for _ in 0..4 {
                let url = url.clone();
                let mut stop = stop.clone();
                readers.push(tokio::spawn(async move {
                    let mut c = PgConnection::connect(&url).await.unwrap();
                    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
                        .execute(&mut c)
                        .await
                        .unwrap();
                    while !*stop.borrow() {
                        sqlx::query("SELECT count(*) FROM jobs WHERE state = 'pending'")
                            .execute(&mut c)
                            .await
                            .unwrap();
                        let _ = tokio::time::timeout(Duration::from_secs(1), stop.changed()).await;
                    }
                    sqlx::query("COMMIT").execute(&mut c).await.unwrap();
                }));
            }
            for r in readers {
                r.await.unwrap();
            }
        }
    }
}

/// Runs the workload and prints its windows and phases.
pub async fn run(o: Options) {
    let port = std::env::var("JOBS_BENCH_HORIZON_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(5499);
    let cluster = Cluster::start(port);
    let url = cluster.url();
    let pool = PgPoolOptions::new()
        .max_connections(10)
        .connect(&url)
        .await
        .unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&pool)
        .await
        .unwrap();
    jobs::migrate(&pool).await.unwrap();
    println!(
        "horizon: {} jobs/s offered, {} workers, holder {:?}, phases clean {} s / held {} s / recovery {} s; cluster settings: {}",
        o.rate,
        o.workers,
        o.holder,
        o.clean,
        o.held,
        o.recovery,
        SETTINGS.join(" ")
    );
    let _ = micros();

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let runtime = {
        let mut stop = stop_rx.clone();
        tokio::spawn(
            Runtime::new(pool.clone())
                .kinds(["bench.horizon"])
                .concurrency(o.workers)
                .run_until(async move {
                    let _ = stop.wait_for(|s| *s).await;
                }),
        )
    };
    let offered = std::sync::Arc::new(AtomicU64::new(0));
    let producer = {
        let pool = pool.clone();
        let offered = offered.clone();
        let stop = stop_rx.clone();
        let per_tick = (o.rate / 100).max(1);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            while !*stop.borrow() {
                tick.tick().await;
                let mut batch = EnqueueBatch::new();
                for _ in 0..per_tick {
                    batch.push(&Steady { at_us: micros() }).unwrap();
                }
                if batch.enqueue(&pool).await.is_ok() {
                    offered.fetch_add(per_tick, Ordering::Relaxed);
                }
            }
        })
    };

    let phases = if o.holder == Holder::None {
        vec![("steady", o.held)]
    } else {
        vec![
            ("clean", o.clean),
            ("held", o.held),
            ("recovery", o.recovery),
        ]
    };
    let (hold_tx, hold_rx) = tokio::sync::watch::channel(false);
    let mut holder = None;
    let mut clean_claim = 0.0;
    println!(
        "{:<9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>10} {:>9}",
        "phase",
        "t_s",
        "done/s",
        "offered/s",
        "p50_ms",
        "p95_ms",
        "claim_ms",
        "full_n",
        "full_ms",
        "dead_tup",
        "size_MB"
    );
    for (phase, secs) in phases {
        if phase == "held" {
            holder = Some(tokio::spawn(hold(url.clone(), o.holder, hold_rx.clone())));
        }
        if phase == "recovery" {
            let _ = hold_tx.send(true);
            if let Some(h) = holder.take() {
                h.await.unwrap();
            }
        }
        let mut windows = Vec::new();
        let start = Instant::now();
        let (done0, offered0) = (
            DONE.load(Ordering::Relaxed),
            offered.load(Ordering::Relaxed),
        );
        let mut recovered_at = None;
        while start.elapsed() < Duration::from_secs(secs) {
            let w = window(&pool, &offered).await;
            let t = start.elapsed().as_secs();
            println!(
                "{phase:<9} {t:>6} {:>9.0} {:>9.0} {:>9.1} {:>9.1} {:>9.2} {:>7.0} {:>9.1} {:>10} {:>9.1}",
                w.completed,
                w.offered,
                w.p50,
                w.p95,
                w.claim_ms,
                w.full_n,
                w.full_ms,
                w.dead,
                w.size_mb
            );
            let backlog = offered.load(Ordering::Relaxed) - DONE.load(Ordering::Relaxed);
            if phase == "recovery"
                && recovered_at.is_none()
                && backlog < o.rate
                && w.claim_ms <= clean_claim * 1.5
            {
                recovered_at = Some(t);
            }
            windows.push(w);
        }
        let done = DONE.load(Ordering::Relaxed) - done0;
        let off = offered.load(Ordering::Relaxed) - offered0;
        let mean = |f: fn(&Window) -> f64| {
            windows.iter().map(f).sum::<f64>() / windows.len().max(1) as f64
        };
        let claim = mean(|w| w.claim_ms);
        if phase == "clean" {
            clean_claim = claim;
        }
        let max_p95 = windows.iter().map(|w| w.p95).fold(0.0, f64::max);
        let mut rates: Vec<f64> = windows.iter().map(|w| w.completed).collect();
        rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let (min_rate, median_rate) = match rates.len() {
            0 => (0.0, 0.0),
            n => (rates[0], rates[n / 2]),
        };
        let max_dead = windows.iter().map(|w| w.dead).max().unwrap_or(0);
        let max_size = windows.iter().map(|w| w.size_mb).fold(0.0, f64::max);
        println!(
            "PHASE {phase}: completed/offered {:.3}, 5 s rate min/median {:.0}/{:.0} ({:.2}), claim mean {:.2} ms ({:.2}x clean), window p95 pickup mean {:.1} ms max {:.1} ms, dead tuples max {}, table max {:.1} MB{}",
            done as f64 / off.max(1) as f64,
            min_rate,
            median_rate,
            if median_rate > 0.0 {
                min_rate / median_rate
            } else {
                0.0
            },
            claim,
            if clean_claim > 0.0 {
                claim / clean_claim
            } else {
                1.0
            },
            mean(|w| w.p95),
            max_p95,
            max_dead,
            max_size,
            match (phase, recovered_at) {
                ("recovery", Some(t)) => format!(", back to clean within {t} s"),
                ("recovery", None) => ", not back to clean".to_owned(),
                _ => String::new(),
            }
        );
        println!(
            "{}",
            serde_json::json!({
                "workload": format!("horizon {phase}"),
                "holder": format!("{:?}", o.holder),
                "completed_ratio": done as f64 / off.max(1) as f64,
                "rate_min": min_rate,
                "rate_median": median_rate,
                "claim_ms": claim,
                "p95_ms_mean": mean(|w| w.p95),
                "p95_ms_max": max_p95,
                "dead_max": max_dead,
                "size_mb_max": max_size,
                "recovered_s": recovered_at,
            })
        );
    }
    let _ = stop_tx.send(true);
    producer.await.unwrap();
    runtime.await.unwrap().unwrap();
    pool.close().await;
    drop(cluster);
}

/// Waits 5 seconds and returns that window's figures.
async fn window(pool: &PgPool, offered: &AtomicU64) -> Window {
    let (calls0, ms0, full_calls0, full_ms0) = claim_totals(pool).await;
    let done0 = DONE.load(Ordering::Relaxed);
    let offered0 = offered.load(Ordering::Relaxed);
    PICKUP_MS.lock().unwrap().clear();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let done = DONE.load(Ordering::Relaxed) - done0;
    let off = offered.load(Ordering::Relaxed) - offered0;
    let mut pickups = std::mem::take(&mut *PICKUP_MS.lock().unwrap());
    let (calls1, ms1, full_calls1, full_ms1) = claim_totals(pool).await;
    let (dead, size): (i64, i64) = sqlx::query_as(
        "SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs'), 0), \
                pg_total_relation_size('jobs')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    Window {
        completed: done as f64 / 5.0,
        offered: off as f64 / 5.0,
        p50: percentile(&mut pickups, 0.5),
        p95: percentile(&mut pickups, 0.95),
        claim_ms: if calls1 > calls0 {
            (ms1 - ms0) / (calls1 - calls0)
        } else {
            0.0
        },
        full_n: full_calls1 - full_calls0,
        full_ms: if full_calls1 > full_calls0 {
            (full_ms1 - full_ms0) / (full_calls1 - full_calls0)
        } else {
            0.0
        },
        dead,
        size_mb: size as f64 / 1_048_576.0,
    }
}
