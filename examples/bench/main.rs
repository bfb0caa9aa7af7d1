//! The project's benchmark: enqueue, drain, pickup latency, backlog and scale-out.
//!
//! ```sh
//! cargo run --release --example bench -- [--runs 3] [--jobs 20000] [w1 w1m w2 w2k w2s w2s-one w2s-ten w3 w4 w5 w6 w7 w8 w8r w8p w8b w9 w10]
//! cargo run --release --example bench -- horizon [--held 600] [--holder xid|readers]
//! cargo run --release --example bench -- web [--rows 2000000] [--runs 9]
//! cargo run --release --example bench -- failover [--rate 500] [--before 20] [--down 2] [--after 30]
//! cargo run --release --example bench -- fresh [--rate 400] [--seconds 120] [--vacuum-first] [--every-kind]
//! ```
//!
//! Each workload runs on a freshly created database (`JOBS_BENCH_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/jobs_bench`). Prints a table and one JSON line
//! per result; figures are medians of `--runs` runs. With `JOBS_BENCH_POOLER_URL` (the
//! same database through a pooler in transaction mode), the runtimes connect through it,
//! after `jobs::behind_transaction_pooler()`; the setup stays direct. With
//! `JOBS_BENCH_SETUP_SQL`, each fresh database runs that SQL after the migrations: a way
//! to measure a changed index or setting beside the shipped schema before changing it.
//! `fresh` runs on a server with autovacuum on (`JOBS_BENCH_FRESH_URL`, `fresh.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use jobs::{EnqueueBatch, Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres};

mod claim_cost;
mod failover;
mod fresh;
mod horizon;
mod late;
mod limits;
mod replicas;
mod web;

/// A no-op job.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "bench.noop")]
struct Noop {
    seq: u32,
}

static DONE: AtomicUsize = AtomicUsize::new(0);
static STARTED: OnceLock<Mutex<HashMap<u32, Instant>>> = OnceLock::new();

#[jobs::handler]
async fn noop(job: Noop, _ctx: JobContext) -> Result<(), JobError> {
    if let Some(started) = STARTED.get() {
        started.lock().unwrap().insert(job.seq, Instant::now());
    }
    DONE.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Kinds an application has besides the busy one: `bench.k0` to `bench.k9` (W2's "ten
/// busy" spreads its jobs over them; otherwise idle) and forty more that stay idle. The
/// default runtime claims every kind of the binary, as `jobs::run()` does.
macro_rules! kinds {
    ($($module:ident = $kind:literal),* $(,)?) => {
        $(
            mod $module {
                use super::*;
                #[derive(Job, Serialize, Deserialize)]
                #[job(kind = $kind)]
                pub struct Other {
                    pub seq: u32,
                }
                #[jobs::handler]
                async fn handle(_job: Other, _ctx: JobContext) -> Result<(), JobError> {
                    DONE.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
            }
        )*
    };
}

kinds!(
    k0 = "bench.k0",
    k1 = "bench.k1",
    k2 = "bench.k2",
    k3 = "bench.k3",
    k4 = "bench.k4",
    k5 = "bench.k5",
    k6 = "bench.k6",
    k7 = "bench.k7",
    k8 = "bench.k8",
    k9 = "bench.k9",
    i00 = "bench.i00",
    i01 = "bench.i01",
    i02 = "bench.i02",
    i03 = "bench.i03",
    i04 = "bench.i04",
    i05 = "bench.i05",
    i06 = "bench.i06",
    i07 = "bench.i07",
    i08 = "bench.i08",
    i09 = "bench.i09",
    i10 = "bench.i10",
    i11 = "bench.i11",
    i12 = "bench.i12",
    i13 = "bench.i13",
    i14 = "bench.i14",
    i15 = "bench.i15",
    i16 = "bench.i16",
    i17 = "bench.i17",
    i18 = "bench.i18",
    i19 = "bench.i19",
    i20 = "bench.i20",
    i21 = "bench.i21",
    i22 = "bench.i22",
    i23 = "bench.i23",
    i24 = "bench.i24",
    i25 = "bench.i25",
    i26 = "bench.i26",
    i27 = "bench.i27",
    i28 = "bench.i28",
    i29 = "bench.i29",
    i30 = "bench.i30",
    i31 = "bench.i31",
    i32 = "bench.i32",
    i33 = "bench.i33",
    i34 = "bench.i34",
    i35 = "bench.i35",
    i36 = "bench.i36",
    i37 = "bench.i37",
    i38 = "bench.i38",
    i39 = "bench.i39",
);

/// Which kinds a benchmark's runtime claims.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Claims {
    /// Every kind of the binary (the default, as `jobs::run()`).
    All,
    /// `bench.noop` and the first `n - 1` others (`bench.k1`.., then `bench.i00`..).
    First(usize),
}

impl Claims {
    /// The runtime of a benchmark, over `pool`.
    fn runtime(self, pool: PgPool) -> Runtime {
        let rt = Runtime::new(pool);
        match self {
            Claims::All => rt,
            Claims::First(n) => {
                let others = (1..10)
                    .map(|k| format!("bench.k{k}"))
                    .chain((0..40).map(|i| format!("bench.i{i:02}")));
                rt.kinds(
                    std::iter::once("bench.noop".to_owned())
                        .chain(others)
                        .take(n),
                )
            }
        }
    }

    fn label(self) -> String {
        match self {
            Claims::All => "every kind".to_owned(),
            Claims::First(1) => "1 kind".to_owned(),
            Claims::First(n) => format!("{n} kinds"),
        }
    }
}

/// A job whose handler records when it started (W6).
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "bench.timed")]
struct Timed {
    seq: u32,
}

/// When each W6 job's handler started, by sequence number.
static TIMED_STARTED: Mutex<Vec<(u32, chrono::DateTime<chrono::Utc>)>> = Mutex::new(Vec::new());

#[jobs::handler]
async fn timed(job: Timed, _ctx: JobContext) -> Result<(), JobError> {
    // The database runs on this machine: its clock is this clock.
    TIMED_STARTED
        .lock()
        .unwrap()
        .push((job.seq, chrono::Utc::now()));
    Ok(())
}

fn url() -> String {
    std::env::var("JOBS_BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/jobs_bench".to_owned())
}

async fn fresh_database(max_connections: u32) -> PgPool {
    let url = url();
    if Postgres::database_exists(&url).await.unwrap() {
        Postgres::force_drop_database(&url).await.unwrap();
    }
    Postgres::create_database(&url).await.unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .connect(&url)
        .await
        .unwrap();
    jobs::migrate(&pool).await.unwrap();
    if let Ok(setup) = std::env::var("JOBS_BENCH_SETUP_SQL") {
        sqlx::raw_sql(sqlx::AssertSqlSafe(setup))
            .execute(&pool)
            .await
            .expect("JOBS_BENCH_SETUP_SQL");
    }
    pool
}

/// The benchmark's database through a pooler in transaction mode, when one is named.
fn pooler_url() -> Option<String> {
    std::env::var("JOBS_BENCH_POOLER_URL").ok()
}

/// A pool for runtimes: through the pooler of [`pooler_url`] when it is set.
async fn pool(max_connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .connect(&pooler_url().unwrap_or_else(url))
        .await
        .unwrap()
}

/// User plus system CPU seconds of this process so far.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| {
        f.iter().filter_map(|v| v.parse::<f64>().ok()).sum()
    });
    ticks / 100.0
}

/// Peak resident set size of this process, in MB.
fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn report(name: &str, unit: &str, values: Vec<f64>, extra: &[(&str, f64)]) {
    let m = median(values.clone());
    let extras: Vec<String> = extra.iter().map(|(k, v)| format!("{k}={v:.2}")).collect();
    println!(
        "{name:<34} {m:>12.1} {unit:<8} runs={values:.1?} {}",
        extras.join(" ")
    );
    let mut json =
        serde_json::json!({ "workload": name, "unit": unit, "median": m, "runs": values });
    for (k, v) in extra {
        json[*k] = serde_json::json!(v);
    }
    println!("{json}");
}

async fn enqueue_bulk(pool: &PgPool, n: u32) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let mut batch = EnqueueBatch::new();
        for &seq in chunk {
            batch.push(&Noop { seq }).unwrap();
        }
        batch.enqueue(pool).await.unwrap();
    }
}

async fn w1(n: u32, runs: usize) {
    let mut via_pool = Vec::new();
    let mut single = Vec::new();
    let mut bulk = Vec::new();
    for _ in 0..runs {
        let pool = fresh_database(4).await;
        let t = Instant::now();
        for seq in 0..n {
            Noop { seq }.enqueue(&pool).await.unwrap();
        }
        via_pool.push(f64::from(n) / t.elapsed().as_secs_f64());
        pool.close().await;

        let pool = fresh_database(4).await;
        let mut conn = pool.acquire().await.unwrap();
        let t = Instant::now();
        for seq in 0..n {
            Noop { seq }.enqueue(&mut *conn).await.unwrap();
        }
        single.push(f64::from(n) / t.elapsed().as_secs_f64());
        drop(conn);
        pool.close().await;

        let pool = fresh_database(4).await;
        let t = Instant::now();
        enqueue_bulk(&pool, n).await;
        bulk.push(f64::from(n) / t.elapsed().as_secs_f64());
        pool.close().await;
    }
    report("W1 enqueue, one at a time", "jobs/s", single, &[]);
    report("W1 enqueue, one at a time, &pool", "jobs/s", via_pool, &[]);
    report("W1 enqueue, bulk 1000 per call", "jobs/s", bulk, &[]);
}

/// How many producers W1m runs at once.
const PRODUCERS: usize = 8;

/// W1m: `PRODUCERS` concurrent producers, each on a held connection, each enqueueing one
/// job at a time for a few seconds; beside it, the same number of clients inserting raw
/// rows (the ceiling: a plain `INSERT`, no notification, no coalescing).
async fn w1m(runs: usize) {
    w1m_with(runs, 1).await;
    w1m_with(runs, 100).await;
}

/// What one W1m client does per statement.
#[derive(Clone, Copy, PartialEq)]
enum W1mSide {
    /// `per` jobs through the library: one `enqueue`, or an `EnqueueBatch` of `per`.
    Jobs,
    /// A plain `INSERT` of `per` rows the server builds (`generate_series`): no payload
    /// crosses the wire.
    RawServerRows,
    /// A plain `INSERT` of `per` rows sent by the client, each with its own payload (an
    /// array per column, as a producer of raw rows would send them).
    RawClientRows,
}

/// W1m with `per` jobs per enqueue (one job, or an `EnqueueBatch` of `per`) against raw
/// inserts of `per` rows per statement.
async fn w1m_with(runs: usize, per: usize) {
    const SECONDS: f64 = 4.0;
    let sides: &[W1mSide] = if per == 1 {
        &[W1mSide::Jobs, W1mSide::RawServerRows]
    } else {
        &[
            W1mSide::Jobs,
            W1mSide::RawServerRows,
            W1mSide::RawClientRows,
        ]
    };
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    // This process's CPU time per row, microseconds (the clients' share of the two cores).
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    for _ in 0..runs {
        for (i, &side) in sides.iter().enumerate() {
            let pool = fresh_database(PRODUCERS as u32 + 2).await;
            let cpu_before = cpu_seconds();
            let until = Instant::now() + Duration::from_secs_f64(SECONDS);
            let producers: Vec<_> = (0..PRODUCERS)
                .map(|_| {
                    let pool = pool.clone();
                    tokio::spawn(async move {
                        let mut conn = pool.acquire().await.unwrap();
                        let mut n = 0u64;
                        while Instant::now() < until {
                            w1m_call(&mut conn, side, per).await;
                            n += per as u64;
                        }
                        n
                    })
                })
                .collect();
            let mut total = 0;
            for p in producers {
                total += p.await.unwrap();
            }
            rates[i].push(total as f64 / SECONDS);
            cpu[i].push((cpu_seconds() - cpu_before) * 1e6 / total as f64);
            pool.close().await;
        }
    }
    let server_rows = median(rates[1].clone());
    let mut extra = vec![
        ("ratio_to_raw", median(rates[0].clone()) / server_rows),
        ("client_cpu_us_per_job", median(cpu[0].clone())),
    ];
    if per > 1 {
        extra.push((
            "ratio_to_raw_client_rows",
            median(rates[0].clone()) / median(rates[2].clone()),
        ));
    }
    report(
        &format!("W1m enqueue, {PRODUCERS} producers, {per} per call"),
        "jobs/s",
        rates[0].clone(),
        &extra,
    );
    report(
        &format!("W1m raw INSERT, {PRODUCERS} clients, {per} rows (ceiling)"),
        "rows/s",
        rates[1].clone(),
        &[("client_cpu_us_per_row", median(cpu[1].clone()))],
    );
    if per > 1 {
        report(
            &format!("W1m raw INSERT, {PRODUCERS} clients, {per} rows sent"),
            "rows/s",
            rates[2].clone(),
            &[("client_cpu_us_per_row", median(cpu[2].clone()))],
        );
    }
}

/// One statement of a W1m client.
async fn w1m_call(conn: &mut sqlx::PgConnection, side: W1mSide, per: usize) {
    match (side, per) {
        (W1mSide::Jobs, 1) => {
            Noop { seq: 0 }.enqueue(&mut *conn).await.unwrap();
        }
        (W1mSide::Jobs, _) => {
            let mut batch = EnqueueBatch::new();
            for seq in 0..per as u32 {
                batch.push(&Noop { seq }).unwrap();
            }
            batch.enqueue(&mut *conn).await.unwrap();
        }
        (_, 1) => {
            sqlx::query(
                "INSERT INTO jobs (kind, payload, max_attempts) VALUES ('bench.noop', '{\"seq\": 0}', 20)",
            )
            .execute(&mut *conn)
            .await
            .unwrap();
        }
        (W1mSide::RawServerRows, _) => {
            sqlx::query(
                "INSERT INTO jobs (kind, payload, max_attempts) SELECT 'bench.noop', '{\"seq\": 0}', 20 FROM generate_series(1, $1)",
            )
            .bind(per as i32)
            .execute(&mut *conn)
            .await
            .unwrap();
        }
        (W1mSide::RawClientRows, _) => {
            let kinds = vec!["bench.noop"; per];
            let payloads: Vec<String> = (0..per as u32)
                .map(|seq| serde_json::to_string(&Noop { seq }).unwrap())
                .collect();
            let max_attempts = vec![20i32; per];
            sqlx::query(
                "INSERT INTO jobs (kind, payload, max_attempts) \
                 SELECT kind, payload::jsonb, max_attempts FROM unnest($1::text[], $2::text[], $3::int[]) AS u(kind, payload, max_attempts)",
            )
            .bind(&kinds)
            .bind(&payloads)
            .bind(&max_attempts)
            .execute(&mut *conn)
            .await
            .unwrap();
        }
    }
}

/// Runs one runtime until `n` jobs are done and the table has no live job.
async fn drain(pool: &PgPool, n: u32, concurrency: usize, claims: Claims) -> (f64, f64) {
    DONE.store(0, Ordering::SeqCst);
    let cpu = cpu_seconds();
    let watcher = pool.clone();
    let runtime_pool = if pooler_url().is_some() {
        self::pool(12).await
    } else {
        pool.clone()
    };
    let t = Instant::now();
    claims
        .runtime(runtime_pool)
        .concurrency(concurrency)
        .run_until(async move {
            while DONE.load(Ordering::Relaxed) < n as usize {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            wait_empty(&watcher, BUSY_KINDS).await;
        })
        .await
        .unwrap();
    let elapsed = t.elapsed().as_secs_f64();
    (f64::from(n) / elapsed, cpu_seconds() - cpu)
}

/// Waits until no job of `kinds` is claimable now or running (W4's backlog scheduled
/// an hour ahead stays).
///
/// Two index probes (`jobs_running`, and the first entry of `jobs_claim` for the kind
/// at priority 0, which every benchmark job has). A `count(*)` with the same conditions
/// was planned as a sequential scan of W4's two million rows, 250 to 400 ms per check,
/// and that time was counted in W4's drain.
async fn wait_empty(pool: &PgPool, kinds: &[&str]) {
    loop {
        let live: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM jobs WHERE kind = ANY($1) AND state = 'running') \
             OR EXISTS (SELECT 1 FROM unnest($1::text[]) AS k(kind) \
                        WHERE (SELECT min(run_after) FROM jobs \
                               WHERE kind = k.kind AND state = 'pending' AND priority = 0) <= now())",
        )
        .bind(kinds)
        .fetch_one(pool)
        .await
        .unwrap();
        if !live {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The kinds a drain's jobs may be of.
const BUSY_KINDS: &[&str] = &[
    "bench.noop",
    "bench.k0",
    "bench.k1",
    "bench.k2",
    "bench.k3",
    "bench.k4",
    "bench.k5",
    "bench.k6",
    "bench.k7",
    "bench.k8",
    "bench.k9",
];

/// W2 (or W4, with `backlog`): `n` jobs drained by a runtime that claims `claims`; with
/// `spread`, the jobs are spread over the ten kinds `bench.k0` to `bench.k9`.
async fn w2(
    n: u32,
    runs: usize,
    backlog: bool,
    concurrencies: &[usize],
    claims: Claims,
    spread: bool,
) {
    for &concurrency in concurrencies {
        let mut rates = Vec::new();
        let mut cpus = Vec::new();
        for _ in 0..runs {
            let pool = fresh_database(12).await;
            if backlog {
                add_backlog(&pool).await;
            }
            if spread {
                enqueue_spread(&pool, n).await;
            } else {
                enqueue_bulk(&pool, n).await;
            }
            let (rate, cpu) = drain(&pool, n, concurrency, claims).await;
            rates.push(rate);
            cpus.push(cpu);
            pool.close().await;
        }
        let what = if spread {
            "ten busy kinds".to_owned()
        } else {
            claims.label()
        };
        let name = if backlog {
            format!("W4 drain with 2M backlog, conc {concurrency}, {what}")
        } else {
            format!("W2 drain, concurrency {concurrency}, {what}")
        };
        report(
            &name,
            "jobs/s",
            rates,
            &[("cpu_s", median(cpus)), ("peak_rss_mb", peak_rss_mb())],
        );
    }
}

/// `n` jobs spread evenly over `bench.k0` to `bench.k9`, in batches of 1,000.
async fn enqueue_spread(pool: &PgPool, n: u32) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let mut batch = EnqueueBatch::new();
        for &seq in chunk {
            match seq % 10 {
                0 => batch.push(&k0::Other { seq }),
                1 => batch.push(&k1::Other { seq }),
                2 => batch.push(&k2::Other { seq }),
                3 => batch.push(&k3::Other { seq }),
                4 => batch.push(&k4::Other { seq }),
                5 => batch.push(&k5::Other { seq }),
                6 => batch.push(&k6::Other { seq }),
                7 => batch.push(&k7::Other { seq }),
                8 => batch.push(&k8::Other { seq }),
                _ => batch.push(&k9::Other { seq }),
            }
            .unwrap();
        }
        batch.enqueue(pool).await.unwrap();
    }
}

async fn add_backlog(pool: &PgPool) {
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts) SELECT 'bench.unclaimed', '{\"seq\": 0}', 20 FROM generate_series(1, 1000000)",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts, run_after) SELECT 'bench.noop', '{\"seq\": 0}', 20, now() + interval '1 hour' FROM generate_series(1, 1000000)",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE jobs")
        .execute(pool)
        .await
        .unwrap();
}

async fn w3(runs: usize, claims: Claims) {
    let mut p50 = Vec::new();
    let mut p99 = Vec::new();
    let mut max = Vec::new();
    let mut floor_p50 = Vec::new();
    let mut floor_p99 = Vec::new();
    for _ in 0..runs {
        let pool = fresh_database(12).await;
        STARTED
            .get_or_init(|| Mutex::new(HashMap::new()))
            .lock()
            .unwrap()
            .clear();
        DONE.store(0, Ordering::SeqCst);
        let mut before = HashMap::new();
        let runtime_pool = pool.clone();
        let stop = Arc::new(tokio::sync::Notify::new());
        let signal = stop.clone();
        let rt = tokio::spawn(async move {
            claims
                .runtime(runtime_pool)
                .run_until(async move { signal.notified().await })
                .await
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        for seq in 0..200u32 {
            before.insert(seq, Instant::now());
            Noop { seq }.enqueue(&pool).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        while DONE.load(Ordering::Relaxed) < 200 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.notify_one();
        rt.await.unwrap().unwrap();
        let started = STARTED.get().unwrap().lock().unwrap().clone();
        let mut lat: Vec<f64> = before
            .iter()
            .map(|(seq, t)| started[seq].duration_since(*t).as_secs_f64() * 1000.0)
            .collect();
        lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
        p50.push(lat[lat.len() / 2]);
        p99.push(lat[lat.len() * 99 / 100]);
        max.push(lat[lat.len() - 1]);
        let floor = pickup_floor(&pool).await;
        floor_p50.push(floor[floor.len() / 2]);
        floor_p99.push(floor[floor.len() * 99 / 100]);
        pool.close().await;
    }
    report(
        &format!("W3 pickup latency p50, {}", claims.label()),
        "ms",
        p50,
        &[],
    );
    report(
        &format!("W3 pickup latency p99, {}", claims.label()),
        "ms",
        p99,
        &[],
    );
    report(
        &format!("W3 pickup latency max, {}", claims.label()),
        "ms",
        max,
        &[],
    );
    report("W3 raw floor p50", "ms", floor_p50, &[]);
    report("W3 raw floor p99", "ms", floor_p99, &[]);
}

/// The floor under W3 on this machine: the least a queue on this database can do, in
/// raw SQL on connections held open (no pool acquire). One client inserts a row and
/// notifies in one statement; a listener, on each notification, claims the oldest
/// pending row in an update that commits, and notes when the answer arrives. Two
/// commits in series and a notification between them, as in W3; 200 rows, one every
/// 20 ms. Returns the latencies in ms, sorted.
async fn pickup_floor(pool: &PgPool) -> Vec<f64> {
    sqlx::query(
        "CREATE TABLE floor_q (id bigserial PRIMARY KEY, payload jsonb NOT NULL, \
         pending bool NOT NULL DEFAULT true, claimed_until timestamptz)",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("CREATE INDEX ON floor_q (id) WHERE pending")
        .execute(pool)
        .await
        .unwrap();
    let mut listener = sqlx::postgres::PgListener::connect_with(pool)
        .await
        .unwrap();
    listener.listen("bench_floor").await.unwrap();
    let mut claimer = pool.acquire().await.unwrap();
    let mut producer = pool.acquire().await.unwrap();
    let claims = tokio::spawn(async move {
        let mut at = HashMap::new();
        while at.len() < 200 {
            listener.recv().await.unwrap();
            let ids: Vec<i64> = sqlx::query_scalar(
                "UPDATE floor_q SET pending = false, claimed_until = now() + interval '30 s' \
                 WHERE id = ANY(ARRAY(SELECT id FROM floor_q WHERE pending ORDER BY id \
                 LIMIT 10 FOR UPDATE SKIP LOCKED)) RETURNING id",
            )
            .fetch_all(&mut *claimer)
            .await
            .unwrap();
            let now = Instant::now();
            for id in ids {
                at.insert(id, now);
            }
        }
        at
    });
    let mut sent = HashMap::new();
    for seq in 0..200 {
        let t = Instant::now();
        let id: i64 = sqlx::query_scalar(
            "WITH ins AS (INSERT INTO floor_q (payload) VALUES ($1) RETURNING id) \
             SELECT id FROM ins, pg_notify('bench_floor', '')",
        )
        .bind(serde_json::json!({ "seq": seq }))
        .fetch_one(&mut *producer)
        .await
        .unwrap();
        sent.insert(id, t);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let claimed = claims.await.unwrap();
    let mut lat: Vec<f64> = sent
        .iter()
        .map(|(id, t)| claimed[id].duration_since(*t).as_secs_f64() * 1000.0)
        .collect();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    lat
}

/// W6: an idle runtime (default poll interval, 1 s) and 200 jobs each scheduled 50 to
/// 500 ms ahead, one every 10 ms: how late each handler starts after its run-after. The
/// run-after is an instant (`EnqueueOptions::at`) and the start is read at the
/// handler's first line, on the same clock as the database's (one machine).
async fn w6(runs: usize) {
    let mut p50 = Vec::new();
    let mut p99 = Vec::new();
    for _ in 0..runs {
        let pool = fresh_database(12).await;
        TIMED_STARTED.lock().unwrap().clear();
        let runtime_pool = pool.clone();
        let stop = Arc::new(tokio::sync::Notify::new());
        let signal = stop.clone();
        let rt = tokio::spawn(async move {
            Runtime::new(runtime_pool)
                .run_until(async move { signal.notified().await })
                .await
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut due = HashMap::new();
        for seq in 0..200u32 {
            // Delays spread over 50..500 ms without a random source: a fixed stride.
            let delay = Duration::from_millis(50 + (u64::from(seq) * 37) % 450);
            let at = chrono::Utc::now() + delay;
            due.insert(seq, at);
            Timed { seq }
                .enqueue_with(&pool, jobs::EnqueueOptions::new().at(at))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        while TIMED_STARTED.lock().unwrap().len() < 200 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.notify_one();
        rt.await.unwrap().unwrap();
        let mut late: Vec<f64> = TIMED_STARTED
            .lock()
            .unwrap()
            .iter()
            .map(|(seq, started)| (*started - due[seq]).as_seconds_f64() * 1000.0)
            .collect();
        late.sort_by(|a, b| a.partial_cmp(b).unwrap());
        p50.push(late[late.len() / 2]);
        p99.push(late[late.len() * 99 / 100]);
        pool.close().await;
    }
    report("W6 start after run-after p50", "ms", p50, &[]);
    report("W6 start after run-after p99", "ms", p99, &[]);
}

async fn w5(n: u32, runs: usize) {
    for processes in [1, 2, 4] {
        let mut rates = Vec::new();
        for _ in 0..runs {
            let pool = fresh_database(4).await;
            enqueue_bulk(&pool, n).await;
            let t = Instant::now();
            let children: Vec<_> = (0..processes)
                .map(|_| {
                    tokio::process::Command::new(std::env::current_exe().unwrap())
                        .arg("--child")
                        .kill_on_drop(true)
                        .spawn()
                        .unwrap()
                })
                .collect();
            wait_empty(&pool, BUSY_KINDS).await;
            rates.push(f64::from(n) / t.elapsed().as_secs_f64());
            for mut child in children {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
            pool.close().await;
        }
        report(
            &format!("W5 drain, {processes} process(es), conc 100"),
            "jobs/s",
            rates,
            &[],
        );
    }
}

/// A runtime process for W5, stopped by the parent.
async fn child() {
    let pool = pool(12).await;
    Runtime::new(pool).concurrency(100).run().await.unwrap();
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if pooler_url().is_some() {
        jobs::behind_transaction_pooler();
    }
    if args.first().map(String::as_str) == Some("--child") {
        child().await;
        return;
    }
    if args.first().map(String::as_str) == Some("--child-limited") {
        limits::child(&args[1]).await;
        return;
    }
    if args.first().map(String::as_str) == Some("horizon") {
        let (options, rest) = horizon::Options::parse(&args[1..]);
        assert!(rest.is_empty(), "unknown arguments to horizon: {rest:?}");
        horizon::run(options).await;
        return;
    }
    if args.first().map(String::as_str) == Some("failover") {
        failover::run(failover::Options::parse(&args[1..])).await;
        return;
    }
    if args.first().map(String::as_str) == Some("fresh") {
        fresh::run(fresh::Options::parse(&args[1..])).await;
        return;
    }
    if args.first().map(String::as_str) == Some("web") {
        web::run(&args[1..]).await;
        return;
    }
    let mut runs = 3;
    let mut n = 20_000;
    let mut workloads = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--runs" => runs = it.next().and_then(|v| v.parse().ok()).expect("--runs N"),
            "--jobs" => n = it.next().and_then(|v| v.parse().ok()).expect("--jobs N"),
            w => workloads.push(w.to_owned()),
        }
    }
    if workloads.is_empty() {
        workloads = ["w1", "w1m", "w2", "w3", "w4", "w5", "w6"]
            .map(String::from)
            .to_vec();
    }
    println!("{:<34} {:>12} unit", "workload", "median");
    for w in &workloads {
        match w.as_str() {
            "w1" => w1(n, runs).await,
            // 500 shows what larger claims give (the ceiling's best batch).
            "w2" => w2(n, runs, false, &[10, 100, 500], Claims::All, false).await,
            // The same drain by runtimes claiming 1, 2, 10 and 50 kinds (one with jobs),
            // and with the jobs spread over ten kinds.
            "w2k" => {
                for claims in [
                    Claims::First(1),
                    Claims::First(2),
                    Claims::First(10),
                    Claims::First(50),
                    Claims::All,
                ] {
                    w2(n, runs, false, &[10, 100], claims, false).await;
                }
                w2(n, runs, false, &[10, 100], Claims::All, true).await;
            }
            // Only the ten busy kinds, beside the one-kind drain they are read against.
            "w2s" => {
                w2(n, runs, false, &[10, 100], Claims::First(1), false).await;
                w2(n, runs, false, &[10, 100], Claims::All, true).await;
            }
            // One drain of each at concurrency 10, for statistics read per drain.
            "w2s-one" => w2(n, runs, false, &[10], Claims::First(1), false).await,
            "w2s-ten" => w2(n, runs, false, &[10], Claims::All, true).await,
            "w3" => {
                w3(runs, Claims::All).await;
                w3(runs, Claims::First(1)).await;
            }
            "w4" => w2(n, runs, true, &[10, 100], Claims::All, false).await,
            "w7" => late::run(runs.max(20)).await,
            "w8" => limits::run(runs).await,
            "w8r" => limits::run_rate(runs).await,
            "w8p" => {
                w2(n, runs, false, &[10, 100], Claims::First(1), false).await;
                limits::run_partitions(n, runs).await;
            }
            "w8b" => limits::run_backlog(runs).await,
            "w5" => w5(n, runs).await,
            "w6" => w6(runs).await,
            "w1m" => w1m(runs).await,
            "w9" => claim_cost::run(runs).await,
            "w10" => replicas::run(runs).await,
            other => {
                panic!(
                    "unknown workload {other}: expected w1, w1m, w2, w2k, w2s, w2s-one, w2s-ten, w3..w10, w8r, w8p, w8b"
                )
            }
        }
    }
}
