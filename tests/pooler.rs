//! Behind PgBouncer in transaction mode (Debian's `pgbouncer`, started here in front of
//! the test's database with two server connections for many clients): after
//! `jobs::behind_transaction_pooler()` a runtime runs every job, retries and
//! transaction-mode jobs included, exactly as often as it should, and enqueues and
//! operators' calls in transactions work through it.
//!
//! Without PgBouncer the tests pass as skipped, saying so, unless `JOBS_REQUIRE_ALL_TESTS`
//! is set (as `.ci/run` does): then they fail.
//!
//! PgBouncer 1.18 does not track prepared statements, so the named statements sqlx
//! prepares by default would reach server connections that never saw them.

mod common;

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Running, live, runtime, wait_until};
use jobs::{EnqueueBatch, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};

/// How many server connections PgBouncer opens to the test's database: far fewer than
/// the clients (the runtime's own connections and the application's pool).
const SERVER_CONNECTIONS: usize = 2;

/// A PgBouncer in transaction mode in front of the server of `upstream`, on a port of
/// its own; stopped and its files removed when dropped.
struct Bouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Bouncer {
    /// PgBouncer's binary: `JOBS_PGBOUNCER`, or Debian's, or `pgbouncer` on the `PATH`.
    /// `None` when it is missing and the test is to be skipped: it says so and how to
    /// install it. Under `JOBS_REQUIRE_ALL_TESTS` (which `.ci/run` sets) a missing
    /// binary fails the test instead, so that nothing is skipped there.
    fn binary() -> Option<PathBuf> {
        let found = match std::env::var_os("JOBS_PGBOUNCER") {
            Some(named) => Some(PathBuf::from(named)).filter(|p| p.exists()),
            None => ["/usr/sbin", "/usr/bin"]
                .into_iter()
                .map(PathBuf::from)
                .chain(std::env::split_paths(
                    &std::env::var_os("PATH").unwrap_or_default(),
                ))
                .map(|dir| dir.join("pgbouncer"))
                .find(|p| p.exists()),
        };
        if found.is_none() {
            let why = format!(
                "PgBouncer is missing ({}): the tests behind a pooler need it \
                 (`apt-get install pgbouncer`; .ci/run installs it), or JOBS_PGBOUNCER naming it",
                std::env::var("JOBS_PGBOUNCER")
                    .unwrap_or_else(|_| "not in /usr/sbin, /usr/bin or the PATH".to_owned())
            );
            if std::env::var("JOBS_REQUIRE_ALL_TESTS").is_ok_and(|v| !v.is_empty() && v != "0") {
                panic!("{why} (JOBS_REQUIRE_ALL_TESTS is set: nothing may be skipped)");
            }
            println!("skipped: {why}");
        }
        found
    }

    fn start(binary: &std::path::Path, upstream: &PgConnectOptions) -> Bouncer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("jobs-pgbouncer-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("PgBouncer's directory");
        // PgBouncer refuses to run as root; as root it is started as `postgres`, which
        // must be able to read its files.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(
            dir.join("users.txt"),
            format!("\"{}\" \"\"\n", upstream.get_username()),
        )
        .unwrap();
        let config = dir.join("pgbouncer.ini");
        std::fs::write(
            &config,
            format!(
                "[databases]\n\
                 * = host={host} port={upstream_port}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {users}\n\
                 pool_mode = transaction\n\
                 default_pool_size = {SERVER_CONNECTIONS}\n\
                 max_client_conn = 500\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 log_connections = 0\n\
                 log_disconnections = 0\n",
                host = upstream.get_host(),
                upstream_port = upstream.get_port(),
                users = dir.join("users.txt").display(),
            ),
        )
        .unwrap();
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let mut command = Command::new(binary);
        if root {
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {} ({e}): install Debian's `pgbouncer` package, or name the binary in JOBS_PGBOUNCER", binary.display())
            });
        Bouncer { child, dir, port }
    }

    /// The options of `upstream`, through this PgBouncer.
    fn options(&self, upstream: &PgConnectOptions) -> PgConnectOptions {
        upstream.clone().host("127.0.0.1").port(self.port)
    }

    /// Waits until PgBouncer accepts connections to `upstream`'s database.
    async fn ready(&self, upstream: &PgConnectOptions) {
        let options = self.options(upstream);
        wait_until("PgBouncer accepts connections", || async {
            sqlx::PgConnection::connect_with(&options).await.is_ok()
        })
        .await;
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A pool of `clients` connections through a started PgBouncer to the test's database.
async fn through(bouncer: &Bouncer, direct: &PgPool, clients: u32) -> PgPool {
    let upstream = direct.connect_options();
    bouncer.ready(&upstream).await;
    PgPoolOptions::new()
        .max_connections(clients)
        .connect_with(bouncer.options(&upstream))
        .await
        .expect("a pool through PgBouncer")
}

/// Warnings and errors the library logged in this process.
static TROUBLE: AtomicUsize = AtomicUsize::new(0);

/// Counts the library's warnings and errors, but for the failures the flaky handler
/// returns on purpose: an error the runtime retries (a statement bound on another
/// server connection than the one that parsed it) must not pass unseen because the
/// retry succeeded.
struct CountTrouble;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountTrouble {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0 += &format!(" {}={value:?}", field.name());
            }
        }
        let meta = event.metadata();
        if *meta.level() <= tracing::Level::WARN && meta.target().starts_with("jobs") {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            if !fields.0.contains("the first attempt fails") {
                eprintln!("{}:{}", meta.target(), fields.0);
                TROUBLE.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

/// Records a run in `runs`, as a handler behind such a pooler must write: unnamed, in a
/// transaction.
async fn record(ctx: &JobContext, note: &str) -> Result<(), JobError> {
    let mut tx = ctx.pool().begin().await?;
    sqlx::query("INSERT INTO runs (job_id, attempt, note) VALUES ($1, $2, $3)")
        .bind(ctx.id())
        .bind(ctx.attempt() as i32)
        .bind(note)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pb.plain")]
struct Plain {
    n: u32,
}

#[jobs::handler]
async fn plain(_job: Plain, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "plain").await
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pb.flaky", backoff = "10ms")]
struct Flaky {
    n: u32,
}

#[jobs::handler]
async fn flaky(_job: Flaky, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "flaky").await?;
    if ctx.attempt() == 1 {
        return Err(JobError::retry("the first attempt fails"));
    }
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pb.tx", lease = "transaction")]
struct InTx {
    n: u32,
}

#[jobs::handler]
async fn in_tx(_job: InTx, ctx: JobContext) -> Result<(), JobError> {
    let mut tx = ctx.tx().await?;
    sqlx::query("INSERT INTO runs (job_id, attempt, note) VALUES ($1, $2, 'tx')")
        .bind(ctx.id())
        .bind(ctx.attempt() as i32)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// A kind of two shares across runtimes: each completion hands its share on.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pb.limited", global_concurrency = 2)]
struct Limited {
    n: u32,
}

#[jobs::handler]
async fn limited(_job: Limited, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, "limited").await
}

async fn runs_table(direct: &PgPool) {
    sqlx::query("CREATE TABLE runs (job_id bigint, attempt int, note text)")
        .execute(direct)
        .await
        .unwrap();
}

/// Job ids of `note` whose runs are not exactly `attempts` (1, 2, ...).
async fn off(direct: &PgPool, note: &str, attempts: i32) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT job_id FROM runs WHERE note = $1 GROUP BY job_id \
         HAVING array_agg(attempt ORDER BY attempt) <> (SELECT array_agg(g) FROM generate_series(1, $2) g)",
    )
    .bind(note)
    .bind(attempts)
    .fetch_all(direct)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_behind_pgbouncer_in_transaction_mode_runs_every_job_as_often_as_it_should(
    direct: PgPool,
) {
    let Some(binary) = Bouncer::binary() else {
        return;
    };
    use tracing_subscriber::layer::SubscriberExt;
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(CountTrouble))
        .expect("the first subscriber of this test");
    runs_table(&direct).await;
    jobs::behind_transaction_pooler();
    let bouncer = Bouncer::start(&binary, &direct.connect_options());
    let pool = through(&bouncer, &direct, 10).await;

    // The pooler multiplexes: ten clients in transactions at once share two servers.
    let mut clients = Vec::new();
    for _ in 0..10 {
        clients.push(pool.acquire().await.unwrap());
    }
    let pids = futures_util::future::join_all(clients.iter_mut().map(|c| async move {
        let mut tx = c.begin().await.unwrap();
        let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid() FROM pg_sleep(0.02)")
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        pid
    }))
    .await;
    drop(clients);
    let servers: HashSet<i32> = pids.into_iter().collect();
    assert!(
        servers.len() <= SERVER_CONNECTIONS,
        "ten clients, {} server connections: not a pooler in transaction mode",
        servers.len()
    );

    // Enqueued through the pooler, each in a transaction: one at a time, and batches.
    for n in 0..100 {
        let mut tx = pool.begin().await.unwrap();
        Plain { n }.enqueue(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
    }
    let mut tx = pool.begin().await.unwrap();
    let mut batch = EnqueueBatch::new();
    for n in 100..300 {
        batch.push(&Plain { n }).unwrap();
    }
    for n in 0..30 {
        batch.push(&Flaky { n }).unwrap();
        batch.push(&InTx { n }).unwrap();
        batch.push(&Limited { n }).unwrap();
    }
    batch.enqueue(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();

    let rt = Running::start(
        runtime(&pool, &["pb.plain", "pb.flaky", "pb.tx", "pb.limited"]).concurrency(10),
    );
    wait_until("every job done", || async { live(&direct).await == 0 }).await;
    rt.stop().await;

    let count = |note: &'static str| {
        let direct = direct.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(DISTINCT job_id) FROM runs WHERE note = $1")
                .bind(note)
                .fetch_one(&direct)
                .await
                .unwrap()
        }
    };
    assert_eq!(count("plain").await, 300);
    assert_eq!(count("flaky").await, 30);
    assert_eq!(count("tx").await, 30);
    assert_eq!(count("limited").await, 30);
    assert_eq!(
        off(&direct, "plain", 1).await,
        Vec::<i64>::new(),
        "run once each"
    );
    assert_eq!(
        off(&direct, "flaky", 2).await,
        Vec::<i64>::new(),
        "failed once, then ran once"
    );
    assert_eq!(
        off(&direct, "tx", 1).await,
        Vec::<i64>::new(),
        "committed once each"
    );
    assert_eq!(
        off(&direct, "limited", 1).await,
        Vec::<i64>::new(),
        "handed on, run once each"
    );
    let failed: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'failed'")
        .fetch_one(&direct)
        .await
        .unwrap();
    assert_eq!(failed, 0);
    assert_eq!(
        TROUBLE.load(Ordering::SeqCst),
        0,
        "the runtime met errors behind the pooler (above)"
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn enqueues_and_operators_calls_in_transactions_work_through_pgbouncer(direct: PgPool) {
    let Some(binary) = Bouncer::binary() else {
        return;
    };
    jobs::behind_transaction_pooler();
    let bouncer = Bouncer::start(&binary, &direct.connect_options());
    let pool = through(&bouncer, &direct, 4).await;

    // Many clients at once, each enqueueing and reading in its own transactions.
    let ids = futures_util::future::join_all((0..8u32).map(|w| {
        let pool = pool.clone();
        async move {
            let mut ids = Vec::new();
            for i in 0..25 {
                let mut tx = pool.begin().await.unwrap();
                let id = Plain { n: w * 100 + i }.enqueue(&mut *tx).await.unwrap().id;
                let row = jobs::admin::get(&mut *tx, id).await.unwrap().unwrap();
                assert_eq!(row.kind, "pb.plain");
                tx.commit().await.unwrap();
                ids.push(id);
            }
            ids
        }
    }))
    .await;
    let ids: Vec<i64> = ids.into_iter().flatten().collect();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 200);

    let mut tx = pool.begin().await.unwrap();
    assert!(jobs::admin::pause(&mut *tx, "pb.plain").await.unwrap());
    tx.commit().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let paused = jobs::admin::paused(&mut *tx).await.unwrap();
    assert_eq!(paused.len(), 1);
    jobs::admin::cancel(&mut *tx, ids[0]).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(jobs::admin::resume(&mut *tx, "pb.plain").await.unwrap());
    let stats = jobs::admin::stats(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let plain = stats.iter().find(|s| s.kind == "pb.plain").unwrap();
    assert_eq!(plain.pending(), 199, "{stats:?}");

    let state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1")
        .bind(ids[0])
        .fetch_one(&direct)
        .await
        .unwrap();
    assert_eq!(state, "cancelled");
}
