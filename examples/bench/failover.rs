//! `bench failover`: the runtime through a failover.
//!
//! Starts a primary and a synchronous streaming standby of its own (`initdb`, then
//! `pg_basebackup -R`, ports 5497 and 5498, `synchronous_standby_names = '*'`), and a
//! TCP proxy in this process that the application's pool connects to. A producer
//! offers a steady load of transaction-mode jobs, each recording its run in a table of
//! the application's (`failover_runs`) inside the job's completion transaction. After
//! `--before` seconds the primary is crashed (`pg_ctl stop -m immediate`: every server
//! process killed, no shutdown checkpoint), `--down` seconds later the standby is
//! promoted and the proxy sends new connections to it (it cuts the old ones when the
//! primary goes). Then `--after` seconds of load, and a drain.
//!
//! Prints, per second: jobs offered (acknowledged enqueues), enqueues refused,
//! completions (handlers whose transaction committed) and the backlog. Then the
//! verdict, read on the promoted server: every acknowledged enqueue ran (none lost), how
//! many ran more than once, how long after the promotion the first job and the full
//! rate came back.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jobs::{EnqueueBatch, Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use tokio::net::{TcpListener, TcpStream};

use super::horizon::{as_server, bin, fresh_dir, init_cluster, start_server, stop_immediately};

/// One job of the soak, numbered by the producer.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "bench.failover", lease = "transaction")]
struct Failover {
    seq: i64,
}

/// Handlers that wrote their row, counted by this process (a few of those roll back
/// when the primary goes: the table on the promoted server is the verdict).
static RAN: AtomicU64 = AtomicU64::new(0);
/// When the first handler after the switch started.
static FIRST_AFTER: Mutex<Option<Instant>> = Mutex::new(None);
static SWITCHED: AtomicBool = AtomicBool::new(false);

#[jobs::handler]
async fn failover(job: Failover, ctx: JobContext) -> Result<(), JobError> {
    if SWITCHED.load(Ordering::Acquire) {
        FIRST_AFTER.lock().unwrap().get_or_insert_with(Instant::now);
    }
    let mut tx = ctx.tx().await?;
    sqlx::query("INSERT INTO failover_runs (seq) VALUES ($1)")
        .bind(job.seq)
        .execute(&mut *tx)
        .await?;
    drop(tx);
    RAN.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The soak's parameters (`--rate` jobs/s, `--workers`, `--before`, `--down`,
/// `--after` in seconds).
#[derive(Clone, Debug)]
pub struct Options {
    pub rate: u64,
    pub workers: usize,
    pub before: u64,
    pub down: u64,
    pub after: u64,
}

impl Options {
    pub fn parse(args: &[String]) -> Options {
        let mut o = Options {
            rate: 500,
            workers: 8,
            before: 20,
            down: 2,
            after: 30,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let v = || -> u64 {
                it.clone()
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{a} takes a number"))
            };
            match a.as_str() {
                "--rate" => o.rate = v(),
                "--workers" => o.workers = v() as usize,
                "--before" => o.before = v(),
                "--down" => o.down = v(),
                "--after" => o.after = v(),
                other => panic!("unknown argument to failover: {other}"),
            }
            it.next();
        }
        o
    }
}

/// A server of the soak, stopped (immediately) and removed on drop.
struct Node {
    data: std::path::PathBuf,
    port: u16,
}

impl Node {
    fn start(data: std::path::PathBuf, port: u16, settings: &[&str]) -> Node {
        start_server(&data, port, settings);
        Node { data, port }
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Kills every server process at once, as a crash would (no shutdown checkpoint).
    fn crash(&self) {
        stop_immediately(&self.data);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.data.join("postmaster.pid").exists() {
            self.crash();
        }
        let _ = std::fs::remove_dir_all(self.data.parent().unwrap());
    }
}

/// Both servers' settings; the primary adds [`SYNCHRONOUS`] (the promoted standby has
/// no standby of its own, so it must not wait for one).
const SETTINGS: &[&str] = &[
    "listen_addresses=127.0.0.1",
    "wal_level=replica",
    "max_wal_senders=4",
    "synchronous_commit=on",
    "shared_buffers=256MB",
    "autovacuum=on",
];

/// A commit on the primary returns once the standby has flushed it.
const SYNCHRONOUS: &str = "synchronous_standby_names='*'";

/// A TCP proxy to `upstream`'s port; `cut` ends every connection open through it.
struct Proxy {
    port: u16,
    upstream: Arc<AtomicU16>,
    open: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstream = Arc::new(AtomicU16::new(upstream));
        let open: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (to, tasks) = (upstream.clone(), open.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                let to = to.load(Ordering::Acquire);
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(("127.0.0.1", to)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                let mut tasks = tasks.lock().unwrap();
                tasks.retain(|t| !t.is_finished());
                tasks.push(task);
            }
        });
        Proxy {
            port,
            upstream,
            open,
        }
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Ends every connection open through the proxy (the client sees a reset).
    fn cut(&self) {
        for t in self.open.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    fn point_to(&self, port: u16) {
        self.upstream.store(port, Ordering::Release);
    }
}

pub async fn run(o: Options) {
    let (p_port, s_port) = (5497u16, 5498u16);
    let p_dir = fresh_dir("failover", p_port);
    let p_data = p_dir.join("data");
    init_cluster(&p_data);
    let primary = Node::start(p_data, p_port, &[SETTINGS, &[SYNCHRONOUS]].concat());
    let s_dir = fresh_dir("failover", s_port);
    let s_data = s_dir.join("data");
    let ok = as_server(
        &bin("pg_basebackup"),
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &p_port.to_string(),
            "-U",
            "postgres",
            "-D",
            s_data.to_str().unwrap(),
            "-X",
            "stream",
            "-R",
        ],
    );
    assert!(ok.success(), "pg_basebackup failed");
    let standby = Node::start(s_data, s_port, SETTINGS);

    // Synchronous before any job: every acknowledged commit is on the standby.
    let admin = sqlx::PgPool::connect(&primary.url()).await.unwrap();
    loop {
        let state: Option<String> =
            sqlx::query_scalar("SELECT sync_state FROM pg_stat_replication LIMIT 1")
                .fetch_optional(&admin)
                .await
                .unwrap();
        if state.as_deref() == Some("sync") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    jobs::migrate(&admin).await.unwrap();
    sqlx::query("CREATE TABLE failover_runs (seq bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())")
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;

    let proxy = Proxy::start(p_port).await;
    println!(
        "failover: {} jobs/s offered, {} workers; primary :{p_port}, synchronous standby :{s_port}, proxy :{}; crash after {} s, promote {} s later, then {} s; server settings: {}",
        o.rate,
        o.workers,
        proxy.port,
        o.before,
        o.down,
        o.after,
        [SETTINGS, &[SYNCHRONOUS]].concat().join(" ")
    );
    let pool = PgPoolOptions::new()
        .max_connections(10)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&proxy.url())
        .await
        .unwrap();

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let runtime = {
        let mut stop = stop_rx.clone();
        tokio::spawn(
            Runtime::new(pool.clone())
                .kinds(["bench.failover"])
                .concurrency(o.workers)
                .statement_timeout(Duration::from_secs(5))
                .run_until(async move {
                    let _ = stop.wait_for(|s| *s).await;
                }),
        )
    };

    // The producer: acknowledged sequence numbers, and those whose enqueue failed (in
    // doubt: the commit may or may not have happened).
    let acked: Arc<Mutex<Vec<i64>>> = Arc::default();
    let doubtful: Arc<Mutex<Vec<i64>>> = Arc::default();
    let refused = Arc::new(AtomicU64::new(0));
    let producing = Arc::new(AtomicBool::new(true));
    let producer = {
        let (pool, acked, doubtful, refused, producing) = (
            pool.clone(),
            acked.clone(),
            doubtful.clone(),
            refused.clone(),
            producing.clone(),
        );
        let per_tick = (o.rate / 100).max(1) as i64;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut seq = 0i64;
            while producing.load(Ordering::Acquire) {
                tick.tick().await;
                let mut batch = EnqueueBatch::new();
                let first = seq;
                for _ in 0..per_tick {
                    batch.push(&Failover { seq }).unwrap();
                    seq += 1;
                }
                match batch.enqueue(&pool).await {
                    Ok(_) => acked.lock().unwrap().extend(first..seq),
                    Err(_) => {
                        refused.fetch_add((seq - first) as u64, Ordering::Relaxed);
                        doubtful.lock().unwrap().extend(first..seq);
                    }
                }
            }
        })
    };

    let start = Instant::now();
    let mut switched_at = None;
    let mut crashed = false;
    let mut back_at = None;
    let mut peak_backlog = 0i64;
    let mut last = (0usize, 0u64, 0u64);
    println!(
        "{:>5} {:>9} {:>9} {:>9} {:>8}  event",
        "t_s", "offered", "refused", "ran", "backlog"
    );
    let total = o.before + o.down + o.after;
    let mut t = 0;
    while t < total {
        tokio::time::sleep_until((start + Duration::from_secs(t + 1)).into()).await;
        t += 1;
        let mut event = String::new();
        if !crashed && t >= o.before {
            primary.crash();
            proxy.cut();
            crashed = true;
            event = "primary crashed".into();
        } else if crashed && switched_at.is_none() && t >= o.before + o.down {
            let ok = as_server(
                &bin("pg_ctl"),
                &["-D", standby.data.to_str().unwrap(), "-w", "promote"],
            );
            assert!(ok.success(), "the standby did not promote");
            proxy.point_to(s_port);
            SWITCHED.store(true, Ordering::Release);
            switched_at = Some(Instant::now());
            event = "standby promoted, proxy switched".into();
        }
        let offered = acked.lock().unwrap().len();
        let refused_n = refused.load(Ordering::Relaxed);
        let ran = RAN.load(Ordering::Relaxed);
        let backlog = offered as i64 - ran as i64;
        peak_backlog = peak_backlog.max(backlog);
        let rate_ran = ran - last.2;
        if switched_at.is_some()
            && back_at.is_none()
            && offered - last.0 > 0
            && rate_ran as f64 >= 0.9 * (offered - last.0) as f64
            && backlog < o.rate as i64
        {
            back_at = Some(t);
            event.push_str(" (completions keep up with the offered load again)");
        }
        println!(
            "{t:>5} {:>9} {:>9} {:>9} {backlog:>8}  {event}",
            offered - last.0,
            refused_n - last.1,
            rate_ran,
        );
        last = (offered, refused_n, ran);
    }
    producing.store(false, Ordering::Release);
    producer.await.unwrap();

    // Drain: until every acknowledged job has run, at most a minute.
    let acked: HashSet<i64> = acked.lock().unwrap().iter().copied().collect();
    let verdict = sqlx::PgPool::connect(&standby.url()).await.unwrap();
    let drain = Instant::now();
    let runs: Vec<(i64, i64)> = loop {
        let runs: Vec<(i64, i64)> =
            sqlx::query_as("SELECT seq, count(*) FROM failover_runs GROUP BY seq")
                .fetch_all(&verdict)
                .await
                .unwrap();
        let ran: HashSet<i64> = runs.iter().map(|(s, _)| *s).collect();
        if acked.is_subset(&ran) || drain.elapsed() > Duration::from_secs(60) {
            break runs;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = stop_tx.send(true);
    let _ = runtime.await;
    pool.close().await;

    let ran: HashSet<i64> = runs.iter().map(|(s, _)| *s).collect();
    let lost = acked.difference(&ran).count();
    let twice = runs.iter().filter(|(_, n)| *n > 1).count();
    let doubtful = doubtful.lock().unwrap().clone();
    let doubtful_ran = doubtful.iter().filter(|s| ran.contains(s)).count();
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE kind = 'bench.failover' AND state IN ('pending', 'running')",
    )
    .fetch_one(&verdict)
    .await
    .unwrap();
    let first_after_ms = match (*FIRST_AFTER.lock().unwrap(), switched_at) {
        (Some(first), Some(at)) => Some(first.duration_since(at).as_secs_f64() * 1000.0),
        _ => None,
    };
    println!(
        "FAILOVER: acknowledged {}, lost {lost}, ran twice {twice}; refused enqueues {} (of which {doubtful_ran} had committed and ran); left pending or running {left}; first job {} after the switch; back to the offered rate {}; backlog peak {peak_backlog}",
        acked.len(),
        doubtful.len(),
        first_after_ms.map_or("never".into(), |ms| format!("{ms:.0} ms")),
        back_at.map_or("never".into(), |t| format!(
            "{} s after the switch",
            t - o.before - o.down
        )),
    );
    println!(
        "{}",
        serde_json::json!({
            "workload": "failover",
            "acknowledged": acked.len(),
            "lost": lost,
            "ran_twice": twice,
            "refused": doubtful.len(),
            "refused_but_ran": doubtful_ran,
            "left": left,
            "first_job_after_switch_ms": first_after_ms,
            "back_to_rate_s": back_at.map(|t| t - o.before - o.down),
            "backlog_peak": peak_backlog,
        })
    );
    verdict.close().await;
    drop(standby);
    drop(primary);
}
