//! The crate's error type.

use std::fmt;

/// What can go wrong in the framework's own operations (enqueue, migrate, run, admin).
///
/// Handler failures are not this type: a handler returns a [`JobError`](crate::JobError).
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
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Database(e) => write!(f, "database error: {e}"),
            Error::Migrate(e) => write!(f, "migration failed: {e}"),
            Error::Serialize { kind, source } => {
                write!(f, "cannot serialize a job of kind `{kind}`: {source}")
            }
            Error::InvalidInput(msg) => f.write_str(msg),
            Error::Registry(msg) => f.write_str(msg),
            Error::NotFound(id) => write!(f, "no job with id {id}"),
            Error::Runtime(msg) => write!(f, "the jobs runtime stopped: {msg}"),
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
        Error::Database(e)
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        Error::Migrate(e)
    }
}
