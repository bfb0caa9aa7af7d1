//! `jobs::migrate` beside an application's own sqlx migrations.

use sqlx::PgPool;
use sqlx::migrate::{Migration, MigrationType, Migrator};

fn app_migrator() -> Migrator {
    Migrator::with_migrations(vec![Migration::new(
        1,
        "app users".into(),
        MigrationType::Simple,
        sqlx::SqlSafeStr::into_sql_str("CREATE TABLE app_users (id bigint PRIMARY KEY)"),
        false,
    )])
}

async fn tables(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn coexists_with_application_migrations_in_either_order(pool: PgPool) {
    let app = app_migrator();
    jobs::migrate(&pool).await.unwrap();
    app.run(&pool).await.unwrap();
    jobs::migrate(&pool).await.unwrap();
    app.run(&pool).await.unwrap();
    assert_eq!(
        tables(&pool).await,
        [
            "_jobs_migrations",
            "_sqlx_migrations",
            "app_users",
            "jobs",
            "jobs_limits",
            "jobs_paused",
            "jobs_runtimes",
            "jobs_starts",
            "jobs_throughput"
        ]
    );
}

#[sqlx::test(migrations = false)]
async fn application_first_then_jobs(pool: PgPool) {
    let app = app_migrator();
    app.run(&pool).await.unwrap();
    jobs::migrate(&pool).await.unwrap();
    app.run(&pool).await.unwrap();
    jobs::migrate(&pool).await.unwrap();
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _jobs_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    let all: Vec<i64> = jobs::MIGRATOR.iter().map(|m| m.version).collect();
    assert_eq!(versions, all);
    assert_eq!(versions, (1..=all.len() as i64).collect::<Vec<_>>());
}

#[sqlx::test(migrations = false)]
async fn concurrent_migrations_do_not_race(pool: PgPool) {
    let runs = (0..8).map(|_| {
        let pool = pool.clone();
        tokio::spawn(async move { jobs::migrate(&pool).await })
    });
    for r in futures_util::future::join_all(runs).await {
        r.unwrap().expect("every concurrent migrate succeeds");
    }
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _jobs_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        applied,
        jobs::MIGRATOR.iter().count() as i64,
        "each migration applied once"
    );
}

// ---------------------------------------------------------------------------------
// A missing or mismatched job table is a clear error that says what to run.

use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "migrate.probe")]
struct Probe {}

#[jobs::handler]
async fn probe(_job: Probe, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn enqueue_without_the_job_table_says_what_to_run(pool: PgPool) {
    let err = Probe {}.enqueue(&pool).await.unwrap_err();
    assert!(matches!(err, jobs::Error::Schema(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with("the job table does not exist"), "{text}");
    assert!(text.contains("jobs::migrate(&pool)"), "{text}");
    assert!(text.contains("jobsctl migrate"), "{text}");
    assert!(!text.contains("at line"), "{text}");
}

#[sqlx::test(migrations = false)]
async fn runtime_without_the_job_table_stops_naming_the_database(pool: PgPool) {
    let database = pool.connect_options().get_database().unwrap().to_owned();
    let err = jobs::Runtime::new(pool)
        .kinds(["migrate.probe"])
        .run_until(std::future::pending())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "the job table does not exist in database `{database}`"
        )),
        "{text}"
    );
    assert!(text.contains("jobsctl migrate"), "{text}");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn runtime_on_a_newer_job_table_says_to_upgrade(pool: PgPool) {
    sqlx::query(
        "INSERT INTO _jobs_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', true, '\\x00', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let err = jobs::Runtime::new(pool)
        .kinds(["migrate.probe"])
        .run_until(std::future::pending())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("at migration 9999, newer than this library knows"),
        "{text}"
    );
}

#[test]
fn database_errors_do_not_carry_postgres_source_lines() {
    // A database error's text is PostgreSQL's message, without the " at line N" of
    // PostgreSQL's own source file that sqlx's Display appends.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let url = std::env::var("DATABASE_URL").unwrap();
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let e = sqlx::query("SELECT 1/0").execute(&pool).await.unwrap_err();
        let err = jobs::Error::from(e);
        assert_eq!(err.to_string(), "database error: division by zero");
    });
}

#[sqlx::test(migrations = false)]
async fn migration_2_ends_the_unbounded_claims_of_the_old_transaction_mode(pool: PgPool) {
    // The database as the earlier version left it: migration 1 only, and a job stuck
    // running with a claim that never expires.
    let mut conn = pool.acquire().await.unwrap();
    let first = jobs::MIGRATOR
        .iter()
        .next()
        .unwrap()
        .sql
        .as_str()
        .to_owned();
    sqlx::raw_sql(sqlx::AssertSqlSafe(first))
        .execute(&mut *conn)
        .await
        .unwrap();
    let stuck: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (kind, payload, max_attempts, state, attempts, claimed_by, claimed_until)
         VALUES ('old.tx', '{}', 3, 'running', 1, gen_random_uuid(), 'infinity') RETURNING id",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let sql = jobs::MIGRATOR
        .iter()
        .find(|m| m.version == 2)
        .unwrap()
        .sql
        .as_str()
        .to_owned();
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await
        .unwrap();
    let expired: bool = sqlx::query_scalar("SELECT claimed_until <= now() FROM jobs WHERE id = $1")
        .bind(stuck)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert!(expired, "the rescuer can take it back now");
}

/// The migrations live in the workspace's `migrations/`, and the library compiles in
/// exactly those: `jobs/migrations` is a link to them (so that the published package
/// carries them as files), not a second copy that could drift.
#[test]
fn the_library_compiles_in_the_workspace_migrations() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<String> = std::fs::read_dir(root.join("migrations"))
        .expect("a top-level migrations/ folder")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".sql"))
        .collect();
    files.sort();
    let link = std::fs::read_link(root.join("jobs/migrations")).expect("jobs/migrations is a link");
    assert_eq!(link, std::path::Path::new("../migrations"));
    let compiled: Vec<String> = jobs::MIGRATOR
        .iter()
        .map(|m| format!("{:04}_{}.sql", m.version, m.description.replace(' ', "_")))
        .collect();
    assert_eq!(compiled, files);
}

/// Counts the server notices sqlx logs (target `sqlx::postgres::notice`) in this thread.
#[derive(Clone, Default)]
struct Notices(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Notices {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "sqlx::postgres::notice" {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// A start on a migrated database logs nothing: sqlx's `CREATE TABLE IF NOT EXISTS` of
/// the history table made the server say "relation \"_jobs_migrations\" already exists,
/// skipping" at every start.
#[sqlx::test(migrations = false)]
async fn migrating_a_migrated_database_logs_no_notice(pool: PgPool) {
    use tracing_subscriber::layer::SubscriberExt;
    jobs::migrate(&pool).await.unwrap();
    let notices = Notices::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(notices.clone()));
    jobs::migrate(&pool).await.unwrap();
    jobs::migrate(&pool).await.unwrap();
    assert_eq!(notices.0.load(std::sync::atomic::Ordering::Relaxed), 0);
    // The pool's connections hear notices again afterwards.
    let level: String = sqlx::query_scalar("SHOW client_min_messages")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(level, "notice");
}

/// The library builds its migrator without sqlx's macros; it is the one sqlx's
/// `migrate!` builds from the same files: versions, descriptions, SQL and checksums
/// (a changed checksum would make every database that applied a migration refuse it).
#[test]
fn the_migrator_is_the_one_sqlx_migrate_builds() {
    let ours: Vec<_> = jobs::MIGRATOR.iter().collect();
    let macro_built = sqlx::migrate!("./migrations");
    let theirs: Vec<_> = macro_built.iter().collect();
    assert_eq!(ours.len(), theirs.len());
    for (a, b) in ours.iter().zip(&theirs) {
        assert_eq!(
            (a.version, &a.description, a.migration_type, a.no_tx),
            (b.version, &b.description, b.migration_type, b.no_tx)
        );
        assert_eq!(a.sql.as_str(), b.sql.as_str(), "{}", a.version);
        assert_eq!(a.checksum, b.checksum, "{}", a.version);
    }
    assert!(
        jobs::MIGRATOR.locking,
        "concurrent migrations take sqlx's lock"
    );
}
