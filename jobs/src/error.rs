//! The crate's error type.

use std::fmt;

/// What can go wrong in the framework's own operations (enqueue, migrate, run, admin).
///
/// Handler failures are not this type: a handler returns a [`JobError`](crate::JobError).
///
/// ```no_run
/// # async fn f(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// match jobs::admin::retry(&pool, 42).await {
///     Ok(_) => println!("retried"),
///     Err(jobs::Error::NotFound(id)) => println!("no failed job {id}"),
///     Err(e @ jobs::Error::Database(_)) => return Err(e), // the database is out of reach
///     Err(e) => println!("{e}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A statement failed or the database could not be reached.
    Database(sqlx::Error),
    /// Applying the migrations failed.
    Migrate(sqlx::migrate::MigrateError),
    /// A job's payload could not be serialized.
    Serialize {
        /// The job's kind.
        kind: &'static str,
        /// What serde_json said.
        source: serde_json::Error,
    },
    /// A key, kind or payload that PostgreSQL cannot store (a NUL character, for one).
    InvalidInput(String),
    /// The handlers linked into this binary cannot be run: duplicate kinds or handlers,
    /// or none at all.
    Registry(String),
    /// No job has this id (in the state the operation needs).
    NotFound(i64),
    /// The runtime stopped because one of its own tasks failed (a panic in the claim
    /// loop); its running jobs were handed back first.
    Runtime(String),
    /// The database could not be reached, or refused the connection ([`connect`]):
    /// the message names the host, port, database and user (never the password) and
    /// gives the server's reason.
    ///
    /// [`connect`]: crate::connect
    Connect(String),
    /// The database has no job table (or not the version this library needs, or a
    /// newer one), or the role lacks a grant the runtime needs. The message names the
    /// database and says what to run (the missing `GRANT` statements).
    Schema(String),
}

/// What to say when the job table is missing, in `database` if known.
pub(crate) fn no_job_table(database: Option<&str>) -> Error {
    let place = match database {
        Some(db) => format!("database `{db}`"),
        None => "the database this connection uses".to_owned(),
    };
    Error::Schema(format!(
        "the job table does not exist in {place}: create it with `jobs::migrate(&pool)` at start, or run `jobsctl migrate` against that database"
    ))
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // sqlx appends PostgreSQL's own source line ("at line 1392"), which says
            // nothing to a user: the message alone.
            Error::Database(sqlx::Error::Database(e)) => {
                write!(f, "database error: {}", e.message())
            }
            Error::Database(e) => write!(f, "database error: {e}"),
            Error::Migrate(e) => write!(f, "migration failed: {e}"),
            Error::Serialize { kind, source } => {
                write!(f, "cannot serialize a job of kind `{kind}`: {source}")
            }
            Error::InvalidInput(msg) => f.write_str(msg),
            Error::Registry(msg) => f.write_str(msg),
            Error::NotFound(id) => write!(f, "no job with id {id}"),
            Error::Runtime(msg) => write!(f, "the jobs runtime stopped: {msg}"),
            Error::Schema(msg) | Error::Connect(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Database(e) => Some(e),
            Error::Migrate(e) => Some(e),
            Error::Serialize { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        if is_missing_job_table(&e) {
            return no_job_table(None);
        }
        if let sqlx::Error::Database(db) = &e
            && db.code().as_deref() == Some("42P01")
            && let Some(table) = LATER_TABLES
                .iter()
                .find(|t| db.message().contains(&format!("\"{t}\"")))
        {
            return Error::Schema(format!(
                "the job table in the database this connection uses is older than this library \
                 (it has no `{table}`): upgrade it with `jobs::migrate(&pool)` or `jobsctl migrate`"
            ));
        }
        Error::Database(e)
    }
}

/// The tables that migrations after the first add: a database that lacks one is older
/// than this library.
const LATER_TABLES: &[&str] = &[
    "jobs_paused",
    "jobs_runtimes",
    "jobs_throughput",
    "jobs_limits",
    "jobs_starts",
];

/// Whether `e` says that the job table (or the migrations' history) does not exist.
pub(crate) fn is_missing_job_table(e: &sqlx::Error) -> bool {
    match e {
        // undefined_table, about one of this library's tables
        sqlx::Error::Database(db) => {
            db.code().as_deref() == Some("42P01")
                && (db.message().contains("\"jobs\"")
                    || db.message().contains(crate::migrate::MIGRATIONS_TABLE))
        }
        _ => false,
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        Error::Migrate(e)
    }
}

/// What to log of a database error: the server's own message, without the source line
/// of PostgreSQL that sqlx appends to it ("... at line 384"); any other error as it is.
pub(crate) fn server_message(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => db.message().to_owned(),
        other => other.to_string(),
    }
}
