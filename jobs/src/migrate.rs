//! The project's migrations, kept in their own history table.

use std::borrow::Cow;
use std::sync::LazyLock;

use sqlx::migrate::{Migration, MigrationType, Migrator};

use crate::error::Error;

/// The history table of this crate's migrations. An application that runs its own sqlx
/// migrations in the same database keeps its history in `_sqlx_migrations`; with one
/// shared table each migrator would reject the other's versions as unknown.
pub const MIGRATIONS_TABLE: &str = "_jobs_migrations";

/// Every migration: version, description and SQL, from the files of `migrations/`
/// (`jobs/migrations` is a link to the workspace's `migrations/`: a package carries only
/// files under its own directory, and `cargo package` copies the linked files in).
/// `build.rs` lists them.
const MIGRATIONS: &[(i64, &str, &str)] = include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// The project's migrations (`migrations/`, compiled in), recording their history in
/// [`MIGRATIONS_TABLE`].
///
/// They are the migrations sqlx's `migrate!("./migrations")` would compile in (the
/// same versions, descriptions, SQL and checksums; a test compares them), built without
/// sqlx's macros, so that neither this library nor an application using it compiles
/// them for it.
///
/// Use it with `#[sqlx::test(migrator = "jobs::MIGRATOR")]` to get a test database with
/// the job table in place.
pub static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| {
    let mut migrator = Migrator::with_migrations(
        MIGRATIONS
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    Cow::Borrowed(description),
                    MigrationType::Simple,
                    sqlx::SqlStr::from_static(sql),
                    // As sqlx reads it: a first line `-- no-transaction` runs the
                    // migration outside a transaction.
                    sql.starts_with("-- no-transaction"),
                )
            })
            .collect(),
    );
    migrator.dangerous_set_table_name(Cow::Borrowed(MIGRATIONS_TABLE));
    migrator
});

/// Creates or upgrades the job table.
///
/// Safe to call from every replica at start: sqlx takes a database-wide advisory lock
/// around the run (the same lock an application's own sqlx migrator takes), so
/// concurrent calls run one after the other and the later ones find nothing to do.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = jobs::sqlx::PgPool::connect("postgres://app@localhost/app").await?;
/// jobs::migrate(&pool).await?; // at deploy time, or at every start
/// # Ok(()) }
/// ```
pub async fn migrate(pool: &sqlx::PgPool) -> Result<(), Error> {
    let mut conn = pool.acquire().await?;
    // sqlx creates its history table with `CREATE TABLE IF NOT EXISTS`, and logs the
    // server's NOTICE ("relation \"_jobs_migrations\" already exists, skipping") at
    // every start: this session hears only warnings and errors while it migrates.
    sqlx::query("SET client_min_messages = warning")
        .execute(&mut *conn)
        .await?;
    let migrated = MIGRATOR.run_direct(None, &mut *conn, false).await;
    let reset = sqlx::query("RESET client_min_messages")
        .execute(&mut *conn)
        .await;
    if migrated.is_err() || reset.is_err() {
        // Never hand the pool a connection in an unknown state.
        conn.close_on_drop();
    }
    migrated?;
    Ok(())
}

/// Whether `e` may pass by itself (the database unreachable, restarting, or out of
/// connections), as opposed to a mistake that retrying cannot fix.
pub(crate) fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            ["08", "53", "57"]
                .iter()
                .any(|class| code.starts_with(class))
        }),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::Protocol(_) => true,
        _ => false,
    }
}

/// Checks, before a runtime starts, that the job table exists at the version of this
/// library's migrations, and says what to do when it does not.
pub(crate) async fn check(db: &sqlx::PgPool) -> Result<(), Error> {
    let (database, has_table, has_history): (String, bool, bool) = crate::pooler::alone!(
        db,
        crate::pooler::query_as(
            "SELECT current_database()::text, to_regclass('jobs') IS NOT NULL, \
             to_regclass('_jobs_migrations') IS NOT NULL"
        ),
        fetch_one
    )
    .await?;
    if !has_table || !has_history {
        return Err(crate::error::no_job_table(Some(&database)));
    }
    let applied: Option<i64> = match crate::pooler::alone!(
        db,
        crate::pooler::query_scalar("SELECT max(version) FROM _jobs_migrations WHERE success"),
        fetch_one
    )
    .await
    {
        Ok(applied) => applied,
        // A runtime with only the documented grants (on `jobs`) cannot read the
        // history: the table is there, and its version goes unchecked.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => {
            tracing::debug!(
                "cannot read {MIGRATIONS_TABLE} (no SELECT on it): the job table's version is not checked"
            );
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let needed = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied = applied.unwrap_or(0);
    if applied < needed {
        return Err(Error::Schema(format!(
            "the job table in database `{database}` is at migration {applied}, and this library needs migration {needed}: run `jobs::migrate(&pool)` at start, or `jobsctl migrate` against that database"
        )));
    }
    if applied > needed {
        return Err(Error::Schema(format!(
            "the job table in database `{database}` is at migration {applied}, newer than this library knows (migration {needed}): another binary with a newer pgjobs migrated it; upgrade pgjobs in this one"
        )));
    }
    Ok(())
}

/// Every privilege a runtime needs, table by table: the README's "Privileges" list
/// for a runtime (and an application that enqueues). `jobs_starts` is written by the
/// claims of kinds with a rate; `jobs_limits` and `jobs_paused` are read at every poll.
pub(crate) const RUNTIME_GRANTS: &[(&str, &str)] = &[
    ("jobs", "SELECT, INSERT, UPDATE, DELETE"),
    ("jobs_paused", "SELECT"),
    ("jobs_limits", "SELECT"),
    ("jobs_starts", "SELECT, INSERT, DELETE"),
    ("jobs_runtimes", "SELECT, INSERT, UPDATE, DELETE"),
    ("jobs_throughput", "SELECT, INSERT, UPDATE, DELETE"),
];

/// The grants of [`RUNTIME_GRANTS`] that the connection's role lacks, as the `GRANT`
/// statements that would give them (one per table). Index: none; it reads the
/// catalogs once, at start.
const MISSING_GRANTS: &str = r#"
SELECT format('GRANT %s ON %s TO %s', string_agg(p.privilege, ', ' ORDER BY p.ord),
              g.tab, quote_ident(current_user))
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS g(tab, privileges, n)
CROSS JOIN LATERAL unnest(string_to_array(g.privileges, ', ')) WITH ORDINALITY AS p(privilege, ord)
WHERE to_regclass(g.tab) IS NOT NULL AND NOT has_table_privilege(g.tab, p.privilege)
GROUP BY g.n, g.tab
ORDER BY g.n
"#;

/// Checks, before a runtime starts, that its role has every grant it needs
/// ([`RUNTIME_GRANTS`]): a role that lacks one would run some kinds and not others
/// (a rate's claims fail, a pause goes unread), so it refuses to start, naming the
/// `GRANT` statements to run.
pub(crate) async fn check_grants(db: &sqlx::PgPool) -> Result<(), Error> {
    let (tables, privileges): (Vec<&str>, Vec<&str>) = RUNTIME_GRANTS.iter().copied().unzip();
    let missing: Vec<String> = crate::pooler::alone!(
        db,
        crate::pooler::query_scalar(MISSING_GRANTS)
            .bind(&tables)
            .bind(&privileges),
        fetch_all
    )
    .await?;
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::Schema(format!(
        "the database role lacks privileges the runtime needs (see the README's \"Privileges\"); run, as the owner of the job tables: {}",
        missing.join("; ")
    )))
}
