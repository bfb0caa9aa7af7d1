//! Helpers shared by the integration tests.
#![allow(dead_code, missing_docs)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use jobs::{JobContext, JobError, Runtime};
use sqlx::PgPool;
use tokio::sync::Notify;

/// Waits until `check` returns true, polling; panics with `what` after a generous
/// limit. The limit guards against a hung test, it asserts nothing about speed.
pub async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Rows of the job table in a state.
pub async fn count(pool: &PgPool, state: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = $1")
        .bind(state)
        .fetch_one(pool)
        .await
        .expect("count jobs")
}

/// Live (pending or running) jobs of `kind`.
pub async fn live_of(pool: &PgPool, kind: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE kind = $1 AND state IN ('pending', 'running')",
    )
    .bind(kind)
    .fetch_one(pool)
    .await
    .expect("count live jobs")
}

/// Rows of the job table of a kind.
pub async fn count_kind(pool: &PgPool, kind: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE kind = $1")
        .bind(kind)
        .fetch_one(pool)
        .await
        .expect("count jobs")
}

/// Live (pending or running) rows.
pub async fn live(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state IN ('pending', 'running')")
        .fetch_one(pool)
        .await
        .expect("count jobs")
}

/// A runtime running in the background; [`Running::stop`] shuts it down.
pub struct Running {
    stop: Arc<Notify>,
    task: tokio::task::JoinHandle<Result<(), jobs::Error>>,
}

impl Running {
    pub fn start(runtime: Runtime) -> Running {
        let stop = Arc::new(Notify::new());
        let signal = stop.clone();
        let task = tokio::spawn(runtime.run_until(async move { signal.notified().await }));
        Running { stop, task }
    }

    /// Shuts the runtime down and checks that it ended cleanly.
    pub async fn stop(self) {
        self.stop.notify_one();
        self.task
            .await
            .expect("runtime task")
            .expect("runtime ends cleanly");
    }
}

/// A runtime for `kinds` that polls and rescues every 50 ms. `RUST_LOG=jobs=debug` shows
/// its events in a failing test's output.
pub fn runtime(pool: &PgPool, kinds: &[&str]) -> Runtime {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    Runtime::new(pool.clone())
        .kinds(kinds.iter().copied())
        .poll_interval(Duration::from_millis(50))
        .rescue_interval(Duration::from_millis(50))
        .shutdown_grace(Duration::from_secs(5))
}

/// Waits until job `id` is in `state`.
pub async fn wait_state(pool: &PgPool, id: i64, state: jobs::admin::JobState) {
    wait_until(&format!("job {id} {state}"), || async {
        jobs::admin::get(pool, id)
            .await
            .unwrap()
            .is_some_and(|j| j.state == state)
    })
    .await;
}

/// Locks job `id` (`FOR UPDATE`) in a transaction of its own, and returns the
/// transaction: another transaction holding the row while claims pass it.
pub async fn lock(pool: &PgPool, id: i64) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

/// Records a run of a handler in the test's `runs (job_id, attempt, note)` table.
pub async fn record(ctx: &JobContext, note: &str) -> Result<(), JobError> {
    sqlx::query("INSERT INTO runs (job_id, attempt, note) VALUES ($1, $2, $3)")
        .bind(ctx.id())
        .bind(ctx.attempt() as i32)
        .bind(note)
        .execute(ctx.pool())
        .await?;
    Ok(())
}

/// How many runs were recorded with `note`.
pub async fn runs(pool: &PgPool, note: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM runs WHERE note = $1")
        .bind(note)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The crate's SQL statement `name` (`jobs::__private::statements()`).
pub fn statement(name: &str) -> &'static str {
    jobs::__private::statements()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no statement {name}"))
        .1
}

/// Prepares the crate's statement `name` as `as_name` (with the parameter types
/// `types`) on `conn`, and makes the session plan it as PostgreSQL keeps a statement
/// the runtime runs often: with the generic plan.
pub async fn prepare_generic(
    conn: &mut sqlx::PgConnection,
    name: &str,
    as_name: &str,
    types: &str,
) {
    // The crate's own statement text, not input: safe to prepare as it stands.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "PREPARE {as_name}({types}) AS {}",
        statement(name)
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
}

/// Waits until a session of `pool`'s database waits for an advisory lock (`what` says
/// whose).
pub async fn wait_for_advisory_lock(pool: &PgPool, what: &str) {
    wait_until(what, || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
        )
        .fetch_one(pool)
        .await
        .unwrap()
            > 0
    })
    .await;
}

/// A TCP proxy to PostgreSQL that the test can cut (dropping every connection and
/// refusing new ones), silence (dropping every connection, and holding each new one
/// open without a word, for good) and restore; started with a delay, it passes every
/// byte on that much later each way, as a distant database's network would.
pub struct Proxy {
    pub port: u16,
    up: Arc<tokio::sync::watch::Sender<bool>>,
    silent: Arc<AtomicBool>,
}

impl Proxy {
    pub async fn start(target: (String, u16)) -> Proxy {
        Proxy::delayed(target, Duration::ZERO).await
    }

    pub async fn delayed(target: (String, u16), delay: Duration) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (up, _) = tokio::sync::watch::channel(true);
        let up = Arc::new(up);
        let state = up.clone();
        let silent = Arc::new(AtomicBool::new(false));
        let hush = silent.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if hush.load(Ordering::SeqCst) {
                    held.push(inbound);
                    continue;
                }
                if !*state.borrow() {
                    let _ = tokio::io::AsyncWriteExt::shutdown(&mut inbound).await;
                    continue;
                }
                let target = target.clone();
                let mut down = state.subscribe();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let (from_client, to_client) = inbound.into_split();
                    let (from_server, to_server) = outbound.into_split();
                    tokio::select! {
                        _ = async {
                            tokio::join!(
                                relay(from_client, to_server, delay),
                                relay(from_server, to_client, delay)
                            )
                        } => {}
                        _ = down.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Proxy { port, up, silent }
    }

    /// A proxy to the database of `opts` whose network takes `delay` each way, and a
    /// pool of five connections through it.
    pub async fn pool_delayed(
        opts: &sqlx::postgres::PgConnectOptions,
        delay: Duration,
    ) -> (Proxy, PgPool) {
        let proxy = Proxy::delayed((opts.get_host().to_owned(), opts.get_port()), delay).await;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(5)
            .connect_with(opts.clone().host("127.0.0.1").port(proxy.port))
            .await
            .unwrap();
        (proxy, pool)
    }

    /// A proxy to the database of `opts`, and a pool of five connections through it
    /// that waits a second at most for one.
    pub async fn pool(opts: &sqlx::postgres::PgConnectOptions) -> (Proxy, PgPool) {
        let proxy = Proxy::start((opts.get_host().to_owned(), opts.get_port())).await;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(5)
            .acquire_timeout(Duration::from_secs(1))
            .connect_with(opts.clone().host("127.0.0.1").port(proxy.port))
            .await
            .unwrap();
        (proxy, pool)
    }

    pub fn cut(&self) {
        self.up.send_replace(false);
    }

    pub fn silence(&self) {
        self.silent.store(true, Ordering::SeqCst);
        self.up.send_replace(false);
    }

    pub fn restore(&self) {
        self.silent.store(false, Ordering::SeqCst);
        self.up.send_replace(true);
    }
}

/// Passes what `from` reads on to `to`, each chunk `delay` after it arrived, in order.
async fn relay(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (chunks, mut due) = tokio::sync::mpsc::unbounded_channel();
    let read = async move {
        let mut buf = vec![0; 16 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let at = tokio::time::Instant::now() + delay;
            if chunks.send((at, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let write = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

/// The SQL blocks of the README's "Privileges" section, in order: the runtime's grants
/// (to `app_runtime`), then the operators' (to `app_operator`).
pub fn readme_grants() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let section = readme
        .split("\n## Privileges\n")
        .nth(1)
        .expect("the README has a Privileges section");
    let section = section.split("\n## ").next().unwrap();
    section
        .split("```sql\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap().to_owned())
        .collect()
}

/// A URL of the database `pool` connects to, for a child process.
pub async fn url_of(pool: &PgPool) -> String {
    let options = pool.connect_options();
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    format!(
        "postgres://{}@{}:{}/{db}",
        options.get_username(),
        options.get_host(),
        options.get_port()
    )
}
