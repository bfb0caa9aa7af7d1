//! The grants the README's "Privileges" section lists are exactly enough: every feature
//! runs under roles made from its SQL blocks (read from the README itself, so the two
//! cannot drift apart), and a runtime whose role lacks one refuses to start, naming it.

mod common;

use std::time::Duration;

use common::{Running, live_of, readme_grants, wait_until};
use jobs::admin::{self, KindLimits};
use jobs::{Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "priv.work", key = "n", retain = "1h")]
struct Work {
    n: i32,
}

#[jobs::handler]
async fn work(job: Work, ctx: JobContext) -> Result<(), JobError> {
    if job.n == 0 {
        return Err(JobError::permanent("zero is not work"));
    }
    ctx.fenced_tx().await?.commit().await
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "priv.limited", global_concurrency = 2)]
struct Limited {
    n: i32,
}

#[jobs::handler]
async fn limited(_job: Limited, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "priv.rated", rate = "50/1s")]
struct Rated {
    n: i32,
}

#[jobs::handler]
async fn rated(_job: Rated, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "priv.tenant",
    global_concurrency = 1,
    rate = "50/1s",
    partition = "tenant"
)]
struct Tenant {
    tenant: i32,
    n: i32,
}

#[jobs::handler]
async fn tenant(_job: Tenant, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "priv.held")]
struct Held {
    n: i32,
}

#[jobs::handler]
async fn held(_job: Held, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "priv.tick", every = "100ms", retain = "1h")]
struct Tick {}

static TICKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[jobs::handler]
async fn tick(_job: Tick, _ctx: JobContext) -> Result<(), JobError> {
    TICKS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

const KINDS: [&str; 6] = [
    "priv.work",
    "priv.limited",
    "priv.rated",
    "priv.tenant",
    "priv.held",
    "priv.tick",
];

/// A login role of this test's own (roles are cluster-wide), given `grants` with the
/// README's role names replaced by it, and a pool that connects as it.
struct Role {
    name: String,
    pool: PgPool,
}

impl Role {
    async fn new(admin: &PgPool, opts: &PgConnectOptions, grants: &[&str]) -> Role {
        let name = format!("jobs_priv_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE ROLE {name} LOGIN")))
            .execute(admin)
            .await
            .unwrap();
        for sql in grants {
            let sql = sql
                .replace("app_runtime", &name)
                .replace("app_operator", &name);
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(admin)
                .await
                .unwrap();
        }
        let pool = PgPoolOptions::new()
            .max_connections(5)
            .connect_with(opts.clone().username(&name))
            .await
            .unwrap();
        Role { name, pool }
    }

    async fn drop(self, admin: &PgPool) {
        self.pool.close().await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP OWNED BY {0}; DROP ROLE {0}",
            self.name
        )))
        .execute(admin)
        .await
        .unwrap();
    }
}

async fn connect_admin(pool_opts: PgPoolOptions, opts: &PgConnectOptions) -> PgPool {
    let admin: PgPool = pool_opts.connect_with(opts.clone()).await.unwrap();
    // Only what is granted: nothing through PUBLIC.
    sqlx::query("REVOKE ALL ON SCHEMA public FROM PUBLIC")
        .execute(&admin)
        .await
        .unwrap();
    admin
}

fn runtime(pool: &PgPool) -> Runtime {
    Runtime::new(pool.clone())
        .kinds(KINDS)
        .poll_interval(Duration::from_millis(50))
}

/// Every kind of the runtime's features runs under the runtime's grants alone, and
/// the operators' grants pause, resume and limit kinds while it runs. Before, a role
/// with the listed grants ran no job at all once a kind had a limit (no grant on
/// `jobs_starts`), and a paused kind ran (no grant on `jobs_limits`, read with the
/// pauses).
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn every_feature_runs_with_only_the_documented_grants(
    pool_opts: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let admin = connect_admin(pool_opts, &opts).await;
    let blocks = readme_grants();
    assert_eq!(
        blocks.len(),
        2,
        "a block for the runtime, one for operators"
    );
    let runtime_role = Role::new(&admin, &opts, &[&blocks[0]]).await;
    let operator = Role::new(&admin, &opts, &[&blocks[0], &blocks[1]]).await;
    let (rt, op) = (&runtime_role.pool, &operator.pool);

    // The operator pauses a kind and limits another before anything runs.
    assert!(admin::pause_forced(op, "priv.held").await.unwrap());
    admin::set_limits(op, "priv.limited", KindLimits::default().concurrency(1))
        .await
        .unwrap();

    // The runtime's role enqueues every kind, one at a time and in bulk.
    for n in 1..=10 {
        Work { n }.enqueue(rt).await.unwrap();
        Limited { n }.enqueue(rt).await.unwrap();
        Rated { n }.enqueue(rt).await.unwrap();
        Tenant { tenant: n % 3, n }.enqueue(rt).await.unwrap();
        Held { n }.enqueue(rt).await.unwrap();
    }
    jobs::enqueue_all(rt, &[Work { n: 0 }, Work { n: 21 }])
        .await
        .unwrap();
    // It cannot migrate, or create anything.
    assert!(jobs::migrate(rt).await.is_err());

    let running = Running::start(runtime(rt));
    for kind in ["priv.work", "priv.limited", "priv.rated", "priv.tenant"] {
        wait_until(&format!("every {kind} job done"), || async {
            live_of(&admin, kind).await == 0
        })
        .await;
    }
    wait_until("the periodic kind ran twice", || async {
        TICKS.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    // The paused kind waited the whole time; resumed, it runs.
    assert_eq!(live_of(&admin, "priv.held").await, 10);
    assert!(admin::resume(op, "priv.held").await.unwrap());
    wait_until("the resumed kind's jobs done", || async {
        live_of(&admin, "priv.held").await == 0
    })
    .await;

    // The operator's reads and actions.
    let failed = admin::list(op, &admin::ListFilter::new().state(admin::JobState::Failed))
        .await
        .unwrap();
    assert_eq!(failed.len(), 1);
    admin::retry(op, failed[0].id).await.unwrap();
    assert!(!admin::stats(op).await.unwrap().is_empty());
    assert!(!admin::runtimes(op).await.unwrap().is_empty());
    assert_eq!(admin::limits(op).await.unwrap().len(), 1);
    assert!(admin::clear_limits(op, "priv.limited").await.unwrap());
    let id = Held { n: 99 }
        .enqueue_in(rt, Duration::from_secs(3600))
        .await
        .unwrap()
        .id;
    admin::cancel(op, id).await.unwrap();

    running.stop().await;
    let states: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, count(*) FROM jobs WHERE kind = 'priv.work' GROUP BY state ORDER BY state",
    )
    .fetch_all(&admin)
    .await
    .unwrap();
    // The job retried fails again (permanently, at its next run).
    assert_eq!(states, [("done".to_owned(), 11), ("failed".to_owned(), 1)]);
    runtime_role.drop(&admin).await;
    operator.drop(&admin).await;
}

/// A role without one of the runtime's grants: the runtime refuses to start, and says
/// which `GRANT` would let it.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_missing_a_grant_refuses_to_start_naming_it(
    pool_opts: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let admin = connect_admin(pool_opts, &opts).await;
    let blocks = readme_grants();
    let without_starts: String = blocks[0]
        .lines()
        .filter(|line| !line.contains("jobs_starts"))
        .collect::<Vec<_>>()
        .join("\n");
    let role = Role::new(&admin, &opts, &[&without_starts]).await;
    let e = runtime(&role.pool)
        .run_until(std::future::pending())
        .await
        .unwrap_err();
    let said = e.to_string();
    assert!(
        said.contains(&format!(
            "GRANT SELECT, INSERT, DELETE ON jobs_starts TO {}",
            role.name
        )),
        "{said}"
    );
    role.drop(&admin).await;
}

/// The pause state cannot be read (its grant revoked while the runtime runs): no
/// kind is claimed until it can be read again. Before, the failed read was logged at
/// DEBUG and every kind ran, paused or not.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_that_cannot_read_the_pauses_claims_nothing(
    pool_opts: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let admin = connect_admin(pool_opts, &opts).await;
    let blocks = readme_grants();
    let role = Role::new(&admin, &opts, &[&blocks[0]]).await;
    let running = Running::start(runtime(&role.pool));
    Work { n: 1 }.enqueue(&role.pool).await.unwrap();
    wait_until("the first job done", || async {
        live_of(&admin, "priv.work").await == 0
    })
    .await;

    let revoke = format!("REVOKE SELECT ON jobs_paused FROM {}", role.name);
    sqlx::query(sqlx::AssertSqlSafe(revoke))
        .execute(&admin)
        .await
        .unwrap();
    // An operator pauses the kind; the runtime cannot read it.
    sqlx::query("INSERT INTO jobs_paused (kind) VALUES ('priv.held')")
        .execute(&admin)
        .await
        .unwrap();
    // Past a poll interval, so that the runtime has failed to read the pauses.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in 1..=5 {
        Held { n }.enqueue(&role.pool).await.unwrap();
        Work { n: 10 + n }.enqueue(&role.pool).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(live_of(&admin, "priv.held").await, 5, "a paused kind ran");
    assert_eq!(
        live_of(&admin, "priv.work").await,
        5,
        "claims went on unread"
    );

    let grant = format!("GRANT SELECT ON jobs_paused TO {}", role.name);
    sqlx::query(sqlx::AssertSqlSafe(grant))
        .execute(&admin)
        .await
        .unwrap();
    wait_until("the kinds not paused run again", || async {
        live_of(&admin, "priv.work").await == 0
    })
    .await;
    assert_eq!(
        live_of(&admin, "priv.held").await,
        5,
        "the paused kind waits"
    );
    running.stop().await;
    role.drop(&admin).await;
}
