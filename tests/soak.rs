//! Chaos soak: several worker processes run `jobs::Runtime` through TCP proxies that the
//! test controls, while the test kills workers with SIGKILL, stops others with SIGTERM
//! (a rolling deploy), cuts connections, and (in the long version, by hand) restarts
//! PostgreSQL. Afterwards every guarantee is checked on what the database recorded, with
//! the database's clock.
//!
//! `soak_short` runs with the other tests (about a minute on two cores). `soak_long` is
//! run by hand; it restarts the PostgreSQL server (when run as root), which breaks every
//! other test using that server at the time:
//!
//! ```sh
//! cargo test --release --test soak -- --ignored --nocapture soak_long
//! ```
//!
//! `SOAK_SEED` replays a run's random choices, `SOAK_JOBS` overrides the number of jobs,
//! `SOAK_LOG_DIR` keeps the workers' logs (with `RUST_LOG=jobs=info`, say). What is
//! checked and why is written down in RELIABILITY.md.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jobs::{EnqueueBatch, Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use uuid::Uuid;

/// The lease of both kinds (the `lease` of their `#[job]` attributes).
const LEASE: Duration = Duration::from_secs(1);
/// The `max_attempts` of both kinds.
const MAX_ATTEMPTS: i32 = 25;
/// How far past the lease a job whose worker died (or was cut off) may wait for its next
/// attempt, on the database clock. Generous: the rescue runs every 250 ms and the claim
/// follows at once, but the machine is shared, a rescued job queues behind the jobs
/// that were due before it, and a rescue slowed by a starved machine spaces out the next
/// (50 times its duration). Beside the whole suite on two cores waits reached 13 s, and
/// 20 s with two more processes spinning; the bound still catches a takeover that waits
/// for the rescue's 30 s cap or never comes.
const TAKEOVER_SLACK: Duration = Duration::from_secs(25);
/// The workers' shutdown grace: short, so that a SIGTERM hands back handlers mid-nap.
const GRACE_MS: u64 = 25;
/// The environment variable that turns `soak_child` into a worker: the database URL.
const CHILD_ENV: &str = "JOBS_SOAK_CHILD";

// ---------------------------------------------------------------------------------
// The jobs and their handlers (run in the worker processes).

/// One unit of work: its handler records the claim's start, naps, and writes its result
/// through a fenced transaction.
#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "soak.work",
    lease = "1s",
    max_attempts = 25,
    backoff = "20ms",
    max_backoff = "500ms",
    retain = "1h"
)]
struct Work {
    seq: i64,
    sleep_ms: u64,
    /// The first attempt returns an error (a retry through the failure path).
    fail_first: bool,
}

/// A keyed trigger: repeated triggers of one key coalesce or mark the running job for a
/// re-run; the handler writes the version it saw.
#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "soak.trigger",
    key = "key",
    lease = "1s",
    max_attempts = 25,
    backoff = "20ms",
    max_backoff = "500ms"
)]
struct Trigger {
    key: String,
    version: i64,
    sleep_ms: u64,
}

/// A short database-only step in transaction mode: the claim, the handler's write and
/// the completion are one transaction.
#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "soak.step",
    lease = "transaction",
    max_attempts = 25,
    backoff = "20ms",
    max_backoff = "500ms",
    retain = "1h"
)]
struct Step {
    seq: i64,
    sleep_ms: u64,
}

fn pid() -> i32 {
    i32::try_from(std::process::id()).expect("a pid fits an int")
}

#[jobs::handler]
async fn soak_work(job: Work, ctx: JobContext) -> Result<(), JobError> {
    // The claim's start, on the database clock (the claim itself was a moment before).
    sqlx::query("INSERT INTO soak_runs (token, job_id, attempt, pid) VALUES ($1, $2, $3, $4)")
        .bind(ctx.claim_token())
        .bind(ctx.id())
        .bind(ctx.attempt() as i32)
        .bind(pid())
        .execute(ctx.pool())
        .await?;
    if job.sleep_ms > 0 {
        tokio::time::sleep(Duration::from_millis(job.sleep_ms)).await;
    }
    if job.fail_first && ctx.attempt() == 1 {
        return Err(JobError::retry("planned failure of the first attempt"));
    }
    let mut tx = ctx.fenced_tx().await?;
    sqlx::query("INSERT INTO soak_results (job_id, token, attempt, pid) VALUES ($1, $2, $3, $4)")
        .bind(ctx.id())
        .bind(ctx.claim_token())
        .bind(ctx.attempt() as i32)
        .bind(pid())
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

#[jobs::handler]
async fn soak_trigger(job: Trigger, ctx: JobContext) -> Result<(), JobError> {
    if job.sleep_ms > 0 {
        tokio::time::sleep(Duration::from_millis(job.sleep_ms)).await;
    }
    let mut tx = ctx.fenced_tx().await?;
    sqlx::query("INSERT INTO soak_seen (key, version, job_id, pid) VALUES ($1, $2, $3, $4)")
        .bind(&job.key)
        .bind(job.version)
        .bind(ctx.id())
        .bind(pid())
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

#[jobs::handler]
async fn soak_step(job: Step, ctx: JobContext) -> Result<(), JobError> {
    if job.sleep_ms > 0 {
        tokio::time::sleep(Duration::from_millis(job.sleep_ms)).await;
    }
    let mut tx = ctx.tx().await?;
    sqlx::query("INSERT INTO soak_steps (job_id, attempt, pid) VALUES ($1, $2, $3)")
        .bind(ctx.id())
        .bind(ctx.attempt() as i32)
        .bind(pid())
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Not a test on its own: the body of a worker process of the soak.
#[tokio::test]
async fn soak_child() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let concurrency: usize = std::env::var("JOBS_SOAK_CONCURRENCY")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(6);
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let options: PgConnectOptions = url.parse().expect("the worker's database URL");
    // Lazy: a worker started while its proxy is cut must come up and wait it out.
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(concurrency).unwrap_or(6) + 4)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options);
    Runtime::new(pool)
        .kinds([Work::KIND, Step::KIND, Trigger::KIND])
        .concurrency(concurrency)
        .poll_interval(Duration::from_millis(200))
        .rescue_interval(Duration::from_millis(250))
        .shutdown_grace(Duration::from_millis(GRACE_MS))
        .run()
        .await
        .expect("the worker's runtime ends cleanly");
}

// ---------------------------------------------------------------------------------
// The two soaks.

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn soak_short(pool_opts: PgPoolOptions, opts: PgConnectOptions) {
    Soak {
        name: "soak_short",
        jobs: 8_000,
        triggers: 1_000,
        keys: 20,
        workers: 3,
        concurrency: 6,
        kills: 3,
        stops: 1,
        cuts: 1,
        partitions: 1,
        restarts: 0,
        cut_len: Duration::from_secs(3),
        hang_guard: Duration::from_secs(300),
    }
    .run(pool_opts, opts)
    .await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
#[ignore = "long, and restarts the PostgreSQL server: run by hand (see RELIABILITY.md)"]
async fn soak_long(pool_opts: PgPoolOptions, opts: PgConnectOptions) {
    Soak {
        name: "soak_long",
        jobs: 40_000,
        triggers: 5_000,
        keys: 50,
        workers: 4,
        concurrency: 6,
        kills: 12,
        stops: 4,
        cuts: 4,
        partitions: 3,
        restarts: 1,
        cut_len: Duration::from_secs(4),
        hang_guard: Duration::from_secs(1_200),
    }
    .run(pool_opts, opts)
    .await;
}

// ---------------------------------------------------------------------------------
// The soak.

struct Soak {
    name: &'static str,
    /// Jobs: nine in ten `soak.work` (a fenced result each), one in ten `soak.step`
    /// (transaction mode).
    jobs: usize,
    /// `soak.trigger` enqueues, spread over `keys` keys.
    triggers: usize,
    keys: usize,
    /// Worker processes alive at any time.
    workers: usize,
    /// Each worker's runtime concurrency.
    concurrency: usize,
    /// Workers killed with SIGKILL (each replaced at once).
    kills: usize,
    /// Workers stopped with SIGTERM (each replaced once it has exited).
    stops: usize,
    /// Outages: every worker's proxy cut for `cut_len`.
    cuts: usize,
    /// Partitions: one worker's proxy cut for `cut_len`, the others carry on.
    partitions: usize,
    /// PostgreSQL restarts (only when running as root; skipped otherwise).
    restarts: usize,
    cut_len: Duration,
    /// Panics if the run has not settled by then: a hang guard, not a speed check.
    hang_guard: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Kill,
    Stop,
    Cut,
    Partition,
    Restart,
}

/// Time before the first event, and between events.
const LEAD_IN: Duration = Duration::from_secs(3);
const SPACING_MS: (u64, u64) = (2_000, 3_000);
/// After an outage, time for the workers to reconnect (their backoff grows to about 3 s
/// during a 3-4 s cut) and to drain what queued up, before the next event.
const RECOVERY: Duration = Duration::from_secs(6);

/// What the chaos did.
#[derive(Debug, Default)]
struct Chaos {
    kills: usize,
    stops: usize,
    cuts: usize,
    partitions: usize,
    restarts: usize,
    restarts_skipped: usize,
    /// Workers started in all, replacements included.
    started: usize,
}

impl Soak {
    async fn run(mut self, pool_opts: PgPoolOptions, opts: PgConnectOptions) {
        if let Some(jobs) = std::env::var("SOAK_JOBS").ok().and_then(|j| j.parse().ok()) {
            self.triggers = self.triggers * jobs / self.jobs.max(1);
            self.jobs = jobs;
        }
        let seed = std::env::var("SOAK_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| Uuid::new_v4().as_u64_pair().0 | 1);
        println!(
            "{}: seed {seed} (SOAK_SEED={seed} replays the random choices)",
            self.name
        );
        let mut rng = Rng(seed);
        let pool = pool_opts
            .max_connections(5)
            .connect_with(opts.clone())
            .await
            .unwrap();
        setup(&pool).await;

        // The chaos plan, and the pace of the feed: jobs arrive over the whole plan, so
        // that every event lands while work is flowing.
        let mut plan = Vec::new();
        plan.extend(std::iter::repeat_n(Event::Kill, self.kills));
        plan.extend(std::iter::repeat_n(Event::Stop, self.stops));
        plan.extend(std::iter::repeat_n(Event::Cut, self.cuts));
        plan.extend(std::iter::repeat_n(Event::Partition, self.partitions));
        plan.extend(std::iter::repeat_n(Event::Restart, self.restarts));
        rng.shuffle(&mut plan);
        let spacing = Duration::from_millis(u64::midpoint(SPACING_MS.0, SPACING_MS.1));
        let planned = LEAD_IN
            + plan
                .iter()
                .map(|e| match e {
                    Event::Kill | Event::Stop => spacing,
                    Event::Cut | Event::Partition | Event::Restart => {
                        spacing + self.cut_len + RECOVERY
                    }
                })
                .sum::<Duration>();

        let mut proxies = Vec::new();
        for _ in 0..self.workers {
            proxies.push(Proxy::start((opts.get_host().to_owned(), opts.get_port())).await);
        }
        let database = opts.get_database().expect("the test's database").to_owned();
        let launcher = Launcher {
            urls: proxies
                .iter()
                .map(|p| {
                    format!(
                        "postgres://{}@127.0.0.1:{}/{database}",
                        opts.get_username(),
                        p.port
                    )
                })
                .collect(),
            concurrency: self.concurrency,
            log_dir: std::env::var_os("SOAK_LOG_DIR").map(PathBuf::from),
        };
        let mut chaos = Chaos::default();
        let mut workers: Vec<Worker> = (0..self.workers).map(|s| launcher.spawn(s)).collect();
        chaos.started += workers.len();

        let started = Instant::now();
        let at = || started.elapsed().as_secs_f64();
        let feeder = tokio::spawn(feed(
            pool.clone(),
            Feed {
                jobs: self.jobs,
                triggers: self.triggers,
                keys: self.keys,
                over: planned,
                seed: rng.next(),
            },
        ));

        tokio::time::sleep(LEAD_IN).await;
        for event in plan {
            check_alive(&mut workers);
            match event {
                Event::Kill => {
                    let slot = pick_busy(&pool, &workers, &mut rng).await;
                    let pid = workers[slot].pid;
                    workers[slot].child.start_kill().unwrap(); // SIGKILL
                    workers[slot].child.wait().await.unwrap();
                    let held = snapshot(&pool, "kill", pid).await;
                    workers[slot] = launcher.spawn(slot);
                    chaos.kills += 1;
                    chaos.started += 1;
                    println!(
                        "{:>6.1}s  killed worker {pid} (slot {slot}) holding {held} claim(s); started {}",
                        at(),
                        workers[slot].pid
                    );
                }
                Event::Stop => {
                    let slot = pick_busy(&pool, &workers, &mut rng).await;
                    let pid = workers[slot].pid;
                    let held = snapshot(&pool, "stop", pid).await;
                    workers[slot].terminate().await;
                    // A clean stop leaves no claim behind: each finished within the
                    // grace or was handed back, claimable at once.
                    let left = held_claims(&pool, pid).await;
                    assert_eq!(
                        left, 0,
                        "worker {pid} stopped cleanly but left {left} claims running"
                    );
                    workers[slot] = launcher.spawn(slot);
                    chaos.stops += 1;
                    chaos.started += 1;
                    println!(
                        "{:>6.1}s  stopped worker {pid} (slot {slot}) holding {held} claim(s); started {}",
                        at(),
                        workers[slot].pid
                    );
                }
                Event::Cut => {
                    println!(
                        "{:>6.1}s  cut every worker off for {:?}",
                        at(),
                        self.cut_len
                    );
                    proxies.iter().for_each(Proxy::cut);
                    tokio::time::sleep(self.cut_len).await;
                    proxies.iter().for_each(Proxy::restore);
                    chaos.cuts += 1;
                    tokio::time::sleep(RECOVERY).await;
                }
                Event::Partition => {
                    let slot = pick_busy(&pool, &workers, &mut rng).await;
                    let pid = workers[slot].pid;
                    proxies[slot].cut();
                    let held = snapshot(&pool, "partition", pid).await;
                    println!(
                        "{:>6.1}s  cut worker {pid} (slot {slot}) off for {:?}, holding {held} claim(s)",
                        at(),
                        self.cut_len
                    );
                    tokio::time::sleep(self.cut_len).await;
                    proxies[slot].restore();
                    chaos.partitions += 1;
                    tokio::time::sleep(RECOVERY).await;
                }
                Event::Restart => {
                    if restart_postgres().await {
                        println!("{:>6.1}s  restarted PostgreSQL", at());
                        chaos.restarts += 1;
                    } else {
                        println!(
                            "{:>6.1}s  PostgreSQL restart skipped: not root, or no pg_ctlcluster",
                            at()
                        );
                        chaos.restarts_skipped += 1;
                    }
                    tokio::time::sleep(RECOVERY).await;
                }
            }
            let jitter = rng.below(SPACING_MS.1 - SPACING_MS.0);
            tokio::time::sleep(Duration::from_millis(SPACING_MS.0 + jitter)).await;
        }
        let chaos_done = started.elapsed();
        let fed = feeder.await.expect("the feeder");
        println!(
            "{:>6.1}s  chaos over; {} jobs and {} triggers enqueued",
            at(),
            fed.work + fed.steps,
            fed.triggers
        );

        // Drain: every live row finished. A hang guard only.
        let deadline = started + self.hang_guard;
        loop {
            check_alive(&mut workers);
            let live: i64 = retry("count live jobs", || async {
                sqlx::query_scalar(
                    "SELECT count(*) FROM jobs WHERE state IN ('pending', 'running')",
                )
                .fetch_one(&pool)
                .await
            })
            .await;
            if live == 0 {
                break;
            }
            if Instant::now() > deadline {
                let states = states(&pool).await;
                panic!(
                    "{}: {live} jobs still live after {:?} (hang guard): {states:?}",
                    self.name, self.hang_guard
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let elapsed = started.elapsed();
        println!("{:>6.1}s  drained", at());

        // The workers stop on SIGTERM, cleanly.
        for worker in &mut workers {
            worker.terminate().await;
        }
        drop(proxies);

        let figures = check(&pool, &fed, &chaos, self.jobs).await;
        println!(
            "{name}: {jobs} jobs ({steps} in transaction mode) + {triggers} triggers over {keys} keys, {workers} workers x {conc}; \
             {kills} SIGKILLs, {stops} SIGTERMs, {cuts} cuts of every worker and {parts} of one, {cut:?} each, \
             {restarts} PostgreSQL restarts{skipped}; chaos {chaos_s:.1}s, all done in {total:.1}s",
            name = self.name,
            jobs = fed.work + fed.steps,
            steps = fed.steps,
            triggers = fed.triggers,
            keys = self.keys,
            workers = self.workers,
            conc = self.concurrency,
            kills = chaos.kills,
            stops = chaos.stops,
            cuts = chaos.cuts,
            parts = chaos.partitions,
            cut = self.cut_len,
            restarts = chaos.restarts,
            skipped = if chaos.restarts_skipped > 0 {
                format!(" ({} skipped: not root)", chaos.restarts_skipped)
            } else {
                String::new()
            },
            chaos_s = chaos_done.as_secs_f64(),
            total = elapsed.as_secs_f64(),
        );
        println!("{figures}");
        pool.close().await;
    }
}

/// Records the claims a worker holds (running jobs whose current claim it started), as
/// of now on the database clock. Returns how many.
async fn snapshot(pool: &PgPool, cause: &str, pid: i32) -> u64 {
    retry("snapshot a worker's claims", || async {
        sqlx::query(
            "INSERT INTO soak_claims (cause, job_id, token, attempt, pid, at) \
             SELECT $2, j.id, j.claimed_by, j.attempts, r.pid, clock_timestamp() \
             FROM jobs j JOIN soak_runs r ON r.token = j.claimed_by \
             WHERE j.state = 'running' AND r.pid = $1",
        )
        .bind(pid)
        .bind(cause)
        .execute(pool)
        .await
    })
    .await
    .rows_affected()
}

/// How many running claims a worker holds.
async fn held_claims(pool: &PgPool, pid: i32) -> i64 {
    retry("count a worker's claims", || async {
        sqlx::query_scalar(
            "SELECT count(*) FROM jobs j JOIN soak_runs r ON r.token = j.claimed_by \
             WHERE j.state = 'running' AND r.pid = $1",
        )
        .bind(pid)
        .fetch_one(pool)
        .await
    })
    .await
}

/// The figures of a passing run.
struct Figures {
    attempts_max: i32,
    histogram: Vec<(i32, i64)>,
    planned_failures: usize,
    runs: i64,
    takeovers: Vec<Takeovers>,
    enqueue_retries: usize,
    workers_started: usize,
}

/// What became of the claims a worker held when it was killed, cut off or stopped.
#[derive(Default)]
struct Takeovers {
    cause: String,
    claims: usize,
    /// Committed by the worker itself (its commit reached the server first).
    finished: usize,
    /// SIGTERM: handed back, the next claim at the same attempt.
    handed_back: usize,
    /// SIGTERM: ended by the planned failure within the grace, retried at the next attempt.
    retried: usize,
    /// Seconds from the claim's start to the next claim's start, sorted.
    waits: Vec<f64>,
    /// The longest from the event itself to the next claim's start.
    from_event_max: f64,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let histogram: Vec<String> = self
            .histogram
            .iter()
            .map(|(a, n)| format!("{a}: {n}"))
            .collect();
        writeln!(
            f,
            "  attempts: max {} of {MAX_ATTEMPTS}; jobs by attempts {{{}}}; {} planned failures; {} handler runs",
            self.attempts_max,
            histogram.join(", "),
            self.planned_failures,
            self.runs,
        )?;
        for t in &self.takeovers {
            write!(
                f,
                "  {}: {} claims held: {} finished by their worker, {} handed back, {} retried after their planned failure, {} taken over",
                t.cause,
                t.claims,
                t.finished,
                t.handed_back,
                t.retried,
                t.waits.len() - t.handed_back - t.retried,
            )?;
            if let Some(max) = t.waits.last() {
                let median = t.waits[t.waits.len() / 2];
                write!(
                    f,
                    "; the next claim started at most {max:.2}s after the held one \
                     (median {median:.2}s), at most {:.2}s after the {}",
                    t.from_event_max, t.cause,
                )?;
            }
            writeln!(f, " (lease {LEASE:?})")?;
        }
        write!(
            f,
            "  {} workers started in all; {} enqueue batches retried",
            self.workers_started, self.enqueue_retries
        )
    }
}

/// A held claim as analysed: cause, job, attempt, whether the job was a planned failure,
/// whether the holder's own result was committed, the next claim's attempt, seconds from
/// the held claim's start and from the event to the next claim's start.
type Held = (
    String,
    i64,
    i32,
    bool,
    bool,
    Option<i32>,
    Option<f64>,
    Option<f64>,
);

/// Every check, on the database's records. Returns the figures to print.
async fn check(pool: &PgPool, fed: &Fed, chaos: &Chaos, planned_jobs: usize) -> Figures {
    let states = states(pool).await;
    println!("  job rows by kind and state: {states:?}");
    let failed: Vec<(i64, String, i32, Option<String>)> = sqlx::query_as(
        "SELECT id, kind, attempts, last_error FROM jobs WHERE state = 'failed' ORDER BY id LIMIT 5",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(failed.is_empty(), "failed jobs: {failed:?}");

    // Every job completed: no live row, none failed, one done row per job enqueued.
    assert_eq!(
        fed.work + fed.steps,
        planned_jobs,
        "the feeder enqueued every job"
    );
    let done = |kind: &str| {
        states
            .iter()
            .find(|(k, s, _)| k == kind && s == "done")
            .map_or(0, |(_, _, n)| *n)
    };
    assert_eq!(done("soak.work"), fed.work as i64, "every job done");
    assert_eq!(done("soak.step"), fed.steps as i64, "every step done");
    assert_eq!(
        states.iter().map(|(_, _, n)| n).sum::<i64>(),
        (fed.work + fed.steps) as i64,
        "no job left pending, running or failed (a done trigger is deleted)"
    );

    // Every result recorded exactly once, by the claim that completed the job.
    let (results, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT job_id) FROM soak_results")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(results, fed.work as i64, "one result per job");
    assert_eq!(distinct, results, "no job has two results");
    let mismatched: Vec<(i64, i32, Option<i32>)> = sqlx::query_as(
        "SELECT j.id, j.attempts, r.attempt FROM jobs j LEFT JOIN soak_results r ON r.job_id = j.id \
         WHERE j.kind = 'soak.work' AND r.attempt IS DISTINCT FROM j.attempts LIMIT 5",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        mismatched.is_empty(),
        "results written by a claim other than the job's last (id, attempts, result's attempt): {mismatched:?}"
    );
    let foreign: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM soak_results r WHERE NOT EXISTS ( \
             SELECT 1 FROM soak_runs u \
             WHERE u.token = r.token AND u.job_id = r.job_id AND u.attempt = r.attempt AND u.pid = r.pid)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        foreign, 0,
        "every result was written by the worker that ran that claim"
    );

    // Transaction mode: each step's write exactly once, in the claim that completed it.
    let (steps, steps_distinct, steps_mismatched): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT s.job_id), count(*) FILTER (WHERE s.attempt <> j.attempts) \
         FROM soak_steps s JOIN jobs j ON j.id = s.job_id AND j.kind = 'soak.step'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(steps, fed.steps as i64, "one write per step");
    assert_eq!(steps_distinct, steps, "no step written twice");
    assert_eq!(
        steps_mismatched, 0,
        "every step's write committed with the claim that completed it"
    );

    // No claim ran twice, and no job was claimed again after the claim that completed it.
    let twice: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT token, count(*) FROM soak_runs GROUP BY 1 HAVING count(*) > 1 LIMIT 5",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(twice.is_empty(), "claims run twice: {twice:?}");
    let after: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM soak_runs u JOIN soak_results r USING (job_id) WHERE u.attempt > r.attempt",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(after, 0, "no claim after the completing one");

    // Attempts within bounds.
    let histogram: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT attempts, count(*) FROM jobs WHERE kind = 'soak.work' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let attempts_max = histogram.iter().map(|(a, _)| *a).max().unwrap_or(0);
    let over: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE kind IN ('soak.work', 'soak.step') AND (attempts > max_attempts OR attempts < 1)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        over, 0,
        "every job's attempts within 1..=max_attempts (max seen {attempts_max})"
    );
    assert!(attempts_max <= MAX_ATTEMPTS);
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM soak_runs")
        .fetch_one(pool)
        .await
        .unwrap();

    // What became of the claims held by killed, cut-off and stopped workers.
    let held: Vec<Held> = sqlx::query_as(
        "SELECT c.cause, c.job_id, c.attempt, \
                (j.payload->>'fail_first')::bool, \
                res.token = c.token, \
                n.attempt, \
                extract(epoch FROM n.at - r.at)::float8, \
                extract(epoch FROM n.at - c.at)::float8 \
         FROM soak_claims c \
         JOIN jobs j ON j.id = c.job_id \
         JOIN soak_runs r ON r.token = c.token \
         JOIN soak_results res ON res.job_id = c.job_id \
         LEFT JOIN LATERAL (SELECT x.attempt, x.at FROM soak_runs x \
                            WHERE x.job_id = c.job_id AND x.token <> c.token AND x.at > r.at \
                            ORDER BY x.at LIMIT 1) n ON true \
         ORDER BY c.cause, c.job_id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let snapshotted: i64 = sqlx::query_scalar("SELECT count(*) FROM soak_claims")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(
        held.len() as i64,
        snapshotted,
        "every held claim's job has a result"
    );
    if chaos.kills > 0 {
        assert!(
            held.iter().any(|h| h.0 == "kill"),
            "{} kills, but none landed on a worker holding a claim",
            chaos.kills
        );
    }
    let mut takeovers: Vec<Takeovers> = Vec::new();
    for (cause, job, attempt, fail_first, own, next_attempt, from_start, from_event) in held {
        if takeovers.last().is_none_or(|t| t.cause != cause) {
            takeovers.push(Takeovers {
                cause: cause.clone(),
                ..Takeovers::default()
            });
        }
        let t = takeovers.last_mut().unwrap();
        t.claims += 1;
        if own {
            // Finished by the worker itself: its commit reached the server first.
            t.finished += 1;
            continue;
        }
        let (Some(next_attempt), Some(from_start), Some(from_event)) =
            (next_attempt, from_start, from_event)
        else {
            panic!("job {job}: the {cause} claim at attempt {attempt} was never claimed again");
        };
        if cause == "stop" {
            // A handed-back claim spends no attempt; the planned failure spends one.
            let planned = fail_first && attempt == 1;
            assert!(
                next_attempt == attempt || planned && next_attempt == attempt + 1,
                "job {job}: stopped at attempt {attempt}, claimed next at attempt {next_attempt}"
            );
            if next_attempt == attempt {
                t.handed_back += 1;
            } else {
                t.retried += 1;
            }
        } else {
            assert!(
                next_attempt > attempt,
                "job {job}: the {cause} claim at attempt {attempt} was followed by attempt {next_attempt}"
            );
        }
        t.waits.push(from_start);
        t.from_event_max = t.from_event_max.max(from_event);
    }
    let bound = (LEASE + TAKEOVER_SLACK).as_secs_f64();
    for t in &mut takeovers {
        t.waits.sort_by(f64::total_cmp);
        let max = t.waits.last().copied().unwrap_or(0.0);
        assert!(
            max < bound,
            "a job held by a worker at a {} waited {max:.2}s for its next claim (bound {bound:.0}s): {:?}",
            t.cause,
            t.waits
        );
    }

    // No lost trigger: for every key, a run that started after its last trigger (it saw
    // that trigger's payload) committed its write.
    let seen: HashMap<String, i64> =
        sqlx::query_as::<_, (String, i64)>("SELECT key, max(version) FROM soak_seen GROUP BY key")
            .fetch_all(pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let mut lost: Vec<(String, i64, Option<i64>)> = fed
        .last
        .iter()
        .filter(|(key, version)| seen.get(*key) != Some(version))
        .map(|(key, version)| (key.clone(), *version, seen.get(key).copied()))
        .collect();
    lost.sort();
    assert!(
        lost.is_empty(),
        "triggers lost (key, last version enqueued, last version handled): {lost:?}"
    );

    Figures {
        attempts_max,
        histogram,
        planned_failures: fed.fail_first,
        runs,
        takeovers,
        enqueue_retries: fed.retries,
        workers_started: chaos.started,
    }
}

async fn setup(pool: &PgPool) {
    for statement in [
        // One row per claim a handler started, with its start on the database clock.
        "CREATE TABLE soak_runs (token uuid NOT NULL, job_id bigint NOT NULL, attempt int NOT NULL, \
         pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
        "CREATE INDEX ON soak_runs (token)",
        "CREATE INDEX ON soak_runs (job_id)",
        // The fenced result: at most one per job.
        "CREATE TABLE soak_results (job_id bigint PRIMARY KEY, token uuid NOT NULL, attempt int NOT NULL, \
         pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
        // The transaction-mode step's write: at most one per job.
        "CREATE TABLE soak_steps (job_id bigint PRIMARY KEY, attempt int NOT NULL, pid int NOT NULL)",
        // What the trigger handler saw.
        "CREATE TABLE soak_seen (key text NOT NULL, version bigint NOT NULL, job_id bigint NOT NULL, \
         pid int NOT NULL)",
        // Claims a worker held when it was killed, cut off or stopped.
        "CREATE TABLE soak_claims (cause text NOT NULL, job_id bigint NOT NULL, token uuid NOT NULL, \
         attempt int NOT NULL, pid int NOT NULL, at timestamptz NOT NULL)",
    ] {
        sqlx::query(statement).execute(pool).await.unwrap();
    }
}

async fn states(pool: &PgPool) -> Vec<(String, String, i64)> {
    retry("count jobs by state", || async {
        sqlx::query_as("SELECT kind, state, count(*) FROM jobs GROUP BY 1, 2 ORDER BY 1, 2")
            .fetch_all(pool)
            .await
    })
    .await
}

/// Retries a statement of the test itself through a PostgreSQL restart.
async fn retry<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                println!("  (retrying '{what}': {e})");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------------
// Found while building the soak: one locked job row stalled every lease renewal of the
// runtime that held it (fixed in b770a2e).

/// A long handler with a key, for `locked_row_does_not_revoke_the_other_leases`.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "soak.hold", key = "key", lease = "1s")]
struct Hold {
    key: String,
}

#[jobs::handler]
async fn soak_hold(job: Hold, ctx: JobContext) -> Result<(), JobError> {
    // Which runtime runs it: each has a pool with its own application_name.
    sqlx::query(
        "INSERT INTO hold_runs (job_id, key, attempt, runtime) \
         VALUES ($1, $2, $3, current_setting('application_name'))",
    )
    .bind(ctx.id())
    .bind(&job.key)
    .bind(ctx.attempt() as i32)
    .execute(ctx.pool())
    .await?;
    // Work for four leases; the runtime renews the lease meanwhile.
    tokio::time::sleep(LEASE * 4).await;
    let mut tx = ctx.fenced_tx().await?;
    sqlx::query(
        "INSERT INTO hold_done (job_id, attempt, runtime) \
         VALUES ($1, $2, current_setting('application_name'))",
    )
    .bind(ctx.id())
    .bind(ctx.attempt() as i32)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

type Stoppable = (
    Arc<tokio::sync::Notify>,
    tokio::task::JoinHandle<Result<(), jobs::Error>>,
);

/// A runtime of `soak.hold` on a pool of its own, named `name` on the server.
async fn hold_runtime(opts: &PgConnectOptions, name: &str) -> Stoppable {
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(opts.clone().application_name(name))
        .await
        .unwrap();
    let stop = Arc::new(tokio::sync::Notify::new());
    let signal = stop.clone();
    let runtime = Runtime::new(pool)
        .kinds([Hold::KIND])
        .poll_interval(Duration::from_millis(50))
        .rescue_interval(Duration::from_millis(50))
        .shutdown_grace(Duration::from_secs(10));
    let task = tokio::spawn(runtime.run_until(async move { signal.notified().await }));
    (stop, task)
}

/// A healthy runtime keeps the leases of the jobs it runs, whatever happens to the row of
/// one of them. Here an application enqueues a trigger for a running job's key inside its
/// own transaction (a transactional outbox, as the README recommends): the re-run mark
/// locks that job's row until the application commits. A heartbeat whose one renewal
/// UPDATE waits for that lock leaves the runtime's other claims unrenewed for as long as
/// the application's transaction lasts: past the lease, another runtime takes those jobs
/// over while their handlers still run here, and the handlers are not told.
///
/// Found by this file at 26aa3ae, where `sql::RENEW` waited for the lock and every other
/// job also ran in the second runtime; fixed in b770a2e (`RENEW` skips locked rows and
/// retries them at the next beat).
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn locked_row_does_not_revoke_the_other_leases(
    pool_opts: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = pool_opts.connect_with(opts.clone()).await.unwrap();
    sqlx::query(
        "CREATE TABLE hold_runs (job_id bigint, key text, attempt int, runtime text, \
         at timestamptz DEFAULT clock_timestamp())",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("CREATE TABLE hold_done (job_id bigint, attempt int, runtime text)")
        .execute(&pool)
        .await
        .unwrap();
    let keys = ["locked", "a", "b", "c", "d", "e"];
    for key in keys {
        Hold { key: key.into() }.enqueue(&pool).await.unwrap();
    }
    let (stop_a, a) = hold_runtime(&opts, "runtime-a").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while sqlx::query_scalar::<_, i64>("SELECT count(*) FROM hold_runs")
        .fetch_one(&pool)
        .await
        .unwrap()
        < keys.len() as i64
    {
        assert!(
            Instant::now() < deadline,
            "runtime A never started the jobs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A second replica, which takes over any claim whose lease runs out.
    let (stop_b, b) = hold_runtime(&opts, "runtime-b").await;

    // The application's transaction: a trigger for the running job "locked", then other
    // work for three leases, then commit.
    let mut tx = pool.begin().await.unwrap();
    let marked = Hold {
        key: "locked".into(),
    }
    .enqueue(&mut *tx)
    .await
    .unwrap();
    assert_eq!(marked.outcome, jobs::EnqueueOutcome::RerunMarked);
    tokio::time::sleep(LEASE * 3).await;
    tx.commit().await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(60);
    while sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM jobs WHERE state IN ('pending', 'running')",
    )
    .fetch_one(&pool)
    .await
    .unwrap()
        > 0
    {
        assert!(Instant::now() < deadline, "jobs never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_a.notify_one();
    stop_b.notify_one();
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();

    // Only "locked" had its row locked; every other job was held by a healthy runtime
    // that kept renewing, so each ran once, in runtime A.
    let runs: Vec<(String, i32, String)> = sqlx::query_as(
        "SELECT key, attempt, runtime FROM hold_runs WHERE key <> 'locked' ORDER BY key, at",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let taken_over: Vec<&(String, i32, String)> =
        runs.iter().filter(|(_, _, r)| r != "runtime-a").collect();
    assert!(
        taken_over.is_empty(),
        "jobs whose row nobody locked were taken over from a healthy runtime \
         (key, attempt, runtime): {taken_over:?}; all runs: {runs:?}"
    );
}

// ---------------------------------------------------------------------------------
// The feed: jobs arrive over the whole chaos plan.

struct Feed {
    jobs: usize,
    triggers: usize,
    keys: usize,
    over: Duration,
    seed: u64,
}

/// What the feeder enqueued.
struct Fed {
    /// `soak.work` jobs, and how many of them fail their first attempt on purpose.
    work: usize,
    fail_first: usize,
    /// `soak.step` jobs (transaction mode).
    steps: usize,
    triggers: usize,
    /// The last version enqueued (committed) per key.
    last: HashMap<String, i64>,
    /// Batches whose enqueue failed and was retried (during a restart).
    retries: usize,
}

async fn feed(pool: PgPool, plan: Feed) -> Fed {
    let mut rng = Rng(plan.seed);
    let mut fed = Fed {
        work: 0,
        fail_first: 0,
        steps: 0,
        triggers: 0,
        last: HashMap::new(),
        retries: 0,
    };
    let mut versions: HashMap<String, i64> = HashMap::new();
    let mut next_seq = 0;
    let start = Instant::now();
    while next_seq < plan.jobs || fed.triggers < plan.triggers {
        let share = (start.elapsed().as_secs_f64() / plan.over.as_secs_f64()).min(1.0);
        let due_jobs = ((plan.jobs as f64 * share).ceil() as usize).min(plan.jobs);
        let due_triggers = ((plan.triggers as f64 * share).ceil() as usize).min(plan.triggers);
        let seqs = next_seq..due_jobs.min(next_seq + 1_000);
        let mut work = Vec::new();
        let mut steps = Vec::new();
        for seq in seqs.clone() {
            // Every tenth job is a transaction-mode step.
            if seq % 10 == 9 {
                steps.push(Step {
                    seq: seq as i64,
                    sleep_ms: rng.below(21),
                });
            } else {
                work.push(Work {
                    seq: seq as i64,
                    // Half the handlers nap 0-50 ms, so that kills land mid-handler.
                    sleep_ms: if rng.below(2) == 0 { rng.below(51) } else { 0 },
                    fail_first: rng.below(20) == 0,
                });
            }
        }
        let mut triggers = Vec::new();
        let mut batch_last = HashMap::new();
        for _ in fed.triggers..due_triggers.min(fed.triggers + 200) {
            let key = format!("key-{}", rng.below(plan.keys as u64));
            let version = versions.entry(key.clone()).or_insert(0);
            *version += 1;
            batch_last.insert(key.clone(), *version);
            triggers.push(Trigger {
                key,
                version: *version,
                sleep_ms: rng.below(51),
            });
        }
        if seqs.is_empty() && triggers.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let mut batch = EnqueueBatch::new();
        for job in &work {
            batch.push(job).unwrap();
        }
        for step in &steps {
            batch.push(step).unwrap();
        }
        for trigger in &triggers {
            batch.push(trigger).unwrap();
        }
        loop {
            match batch.clone().enqueue(&pool).await {
                Ok(_) => break,
                Err(e) => {
                    fed.retries += 1;
                    println!("  (enqueue failed, checking whether it landed: {e})");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    // One statement: all of the batch landed, or none. A batch of triggers
                    // alone is simply sent again (a repeated trigger coalesces).
                    if !seqs.is_empty() {
                        let landed: i64 = retry("check a batch", || async {
                            sqlx::query_scalar(
                                "SELECT count(*) FROM jobs WHERE kind IN ('soak.work', 'soak.step') \
                                 AND (payload->>'seq')::bigint BETWEEN $1 AND $2",
                            )
                            .bind(seqs.start as i64)
                            .bind(seqs.end as i64 - 1)
                            .fetch_one(&pool)
                            .await
                        })
                        .await;
                        if landed == seqs.len() as i64 {
                            break;
                        }
                        assert_eq!(landed, 0, "a batch landed in part");
                    }
                }
            }
        }
        next_seq = seqs.end;
        fed.work += work.len();
        fed.fail_first += work.iter().filter(|w| w.fail_first).count();
        fed.steps += steps.len();
        fed.triggers += triggers.len();
        fed.last.extend(batch_last);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fed
}

// ---------------------------------------------------------------------------------
// Workers.

struct Worker {
    child: Child,
    pid: i32,
}

/// Starts worker processes: slot `i` connects through proxy `i`.
struct Launcher {
    urls: Vec<String>,
    concurrency: usize,
    log_dir: Option<PathBuf>,
}

impl Launcher {
    fn spawn(&self, slot: usize) -> Worker {
        let stderr = match &self.log_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).unwrap();
                let name = format!("worker-{slot}-{}.log", Uuid::new_v4().simple());
                Stdio::from(std::fs::File::create(dir.join(name)).unwrap())
            }
            None => Stdio::null(),
        };
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "soak_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &self.urls[slot])
            .env("JOBS_SOAK_CONCURRENCY", self.concurrency.to_string())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id().expect("a running child")).unwrap();
        Worker { child, pid }
    }
}

impl Worker {
    /// SIGTERM, and the runtime must shut down cleanly.
    async fn terminate(&mut self) {
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM {}", self.pid);
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("worker {} did not stop on SIGTERM", self.pid))
            .unwrap();
        assert!(
            status.success(),
            "worker {} ended badly on SIGTERM: {status}",
            self.pid
        );
    }
}

/// A worker that exits by itself means its runtime panicked or returned an error.
fn check_alive(workers: &mut [Worker]) {
    for worker in workers {
        if let Some(status) = worker.child.try_wait().unwrap() {
            panic!(
                "worker {} exited by itself ({status}); rerun with SOAK_LOG_DIR=dir RUST_LOG=jobs=info",
                worker.pid
            );
        }
    }
}

/// A worker that holds at least one started claim, so that the kill lands mid-handler;
/// any worker if none does for a while.
async fn pick_busy(pool: &PgPool, workers: &[Worker], rng: &mut Rng) -> usize {
    let first = rng.below(workers.len() as u64) as usize;
    for _ in 0..20 {
        for i in 0..workers.len() {
            let slot = (first + i) % workers.len();
            let held = held_claims(pool, workers[slot].pid).await;
            if held > 0 {
                return slot;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first
}

/// Restarts the local PostgreSQL cluster; false when that is not possible here.
async fn restart_postgres() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .await
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        return false;
    }
    Command::new("sh")
        .args([
            "-c",
            "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | sort -V | tail -n 1) main restart",
        ])
        .status()
        .await
        .is_ok_and(|s| s.success())
}

// ---------------------------------------------------------------------------------
// A TCP proxy to PostgreSQL per worker, which the test cuts (dropping every connection
// and refusing new ones) and restores. Loopback only.

struct Proxy {
    port: u16,
    up: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(target: (String, u16)) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (up, _) = watch::channel(true);
        let up = Arc::new(up);
        let state = up.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if !*state.borrow() {
                    let _ = inbound.shutdown().await;
                    continue;
                }
                let target = target.clone();
                let mut down = state.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = down.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Proxy { port, up, task }
    }

    fn cut(&self) {
        self.up.send_replace(false);
    }

    fn restore(&self) {
        self.up.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------

/// xorshift64*: the test's random choices, replayable from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}
