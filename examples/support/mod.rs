//! Helpers shared by the consumer examples: the database, replicas, and waiting.
//!
//! Each example includes this file with `#[path = "support/mod.rs"] mod support;`, and
//! `tests/examples.rs` includes the examples, so it is compiled once per example.
// Each example uses its own subset of these helpers.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgExecutor, PgPool, Postgres};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The error type of the examples' own functions.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The database the examples use when `JOBS_DATABASE_URL` is not set.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/jobs_examples";

/// Connects to `JOBS_DATABASE_URL` (or [`DEFAULT_URL`]), creating the database if it is
/// missing, and applies the job table's migrations. `RUST_LOG=jobs=info` shows the
/// runtime's own log on stderr.
pub async fn connect() -> Result<PgPool, BoxError> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let url = std::env::var("JOBS_DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
    if !Postgres::database_exists(&url).await? {
        Postgres::create_database(&url).await?;
    }
    let pool = PgPoolOptions::new()
        .max_connections(5)
        .connect(&url)
        .await?;
    jobs::migrate(&pool).await?;
    Ok(pool)
}

/// A pool to the same database as `base`, whose connections carry `name` as their
/// `application_name`: a handler finds out which replica runs it with [`replica_name`],
/// and `pg_stat_activity` shows it too.
pub async fn replica_pool(base: &PgPool, name: &str) -> Result<PgPool, sqlx::Error> {
    let options = (*base.connect_options()).clone().application_name(name);
    PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
}

/// The `application_name` of the connection: the replica that runs this code.
pub async fn replica_name<'e, E: PgExecutor<'e>>(executor: E) -> Result<String, sqlx::Error> {
    sqlx::query_scalar("SELECT current_setting('application_name')")
        .fetch_one(executor)
        .await
}

/// One replica of the service: its own pool and a job runtime over it, in the
/// background, claiming only `kinds` (a binary may link other kinds' handlers too).
pub struct Replica {
    /// The replica's name (its connections' `application_name`).
    pub name: String,
    /// The replica's pool; the application's own writes on this replica go through it.
    pub pool: PgPool,
    stop: Arc<Notify>,
    task: JoinHandle<Result<(), jobs::Error>>,
}

impl Replica {
    /// Opens the replica's pool and starts its runtime. `configure` adjusts the runtime
    /// (concurrency, for one).
    pub async fn start(
        base: &PgPool,
        name: &str,
        kinds: &[&str],
        configure: impl FnOnce(jobs::Runtime) -> jobs::Runtime,
    ) -> Result<Replica, BoxError> {
        let pool = replica_pool(base, name).await?;
        let runtime = jobs::Runtime::new(pool.clone())
            .kinds(kinds.iter().copied())
            .poll_interval(Duration::from_millis(100))
            .rescue_interval(Duration::from_millis(100))
            .shutdown_grace(Duration::from_secs(5));
        let runtime = configure(runtime);
        let stop = Arc::new(Notify::new());
        let signal = stop.clone();
        let task = tokio::spawn(runtime.run_until(async move { signal.notified().await }));
        Ok(Replica {
            name: name.to_owned(),
            pool,
            stop,
            task,
        })
    }

    /// Stops the runtime (running handlers get the grace period) and closes the pool.
    pub async fn stop(self) -> Result<(), BoxError> {
        self.stop.notify_one();
        self.task.await??;
        self.pool.close().await;
        Ok(())
    }
}

/// Waits until `check` says yes, polling. The limit only guards against a hang: it is
/// far above what any step needs, and nothing is concluded from how long it took.
pub async fn wait_until<F, Fut>(what: &str, mut check: F) -> Result<(), BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, sqlx::Error>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        if check().await? {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("gave up waiting for: {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Deletes every job of these kinds, whatever its state: each example starts clean.
pub async fn clean_kinds(pool: &PgPool, kinds: &[&str]) -> Result<u64, sqlx::Error> {
    let kinds: Vec<&str> = kinds.to_vec();
    Ok(sqlx::query("DELETE FROM jobs WHERE kind = ANY($1)")
        .bind(&kinds)
        .execute(pool)
        .await?
        .rows_affected())
}

/// Jobs of these kinds in a state.
pub async fn jobs_in_state(pool: &PgPool, kinds: &[&str], state: &str) -> Result<i64, sqlx::Error> {
    let kinds: Vec<&str> = kinds.to_vec();
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE kind = ANY($1) AND state = $2")
        .bind(&kinds)
        .bind(state)
        .fetch_one(pool)
        .await
}

/// Live (pending or running) jobs of these kinds.
pub async fn live_jobs(pool: &PgPool, kinds: &[&str]) -> Result<i64, sqlx::Error> {
    let kinds: Vec<&str> = kinds.to_vec();
    sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE kind = ANY($1) AND state IN ('pending', 'running')",
    )
    .bind(&kinds)
    .fetch_one(pool)
    .await
}

/// Counts enqueue outcomes: (inserted, coalesced, re-run marked).
pub fn tally(outcomes: &[jobs::Enqueued]) -> (usize, usize, usize) {
    let count = |o: jobs::EnqueueOutcome| outcomes.iter().filter(|e| e.outcome == o).count();
    (
        count(jobs::EnqueueOutcome::Inserted),
        count(jobs::EnqueueOutcome::Coalesced),
        count(jobs::EnqueueOutcome::RerunMarked),
    )
}
