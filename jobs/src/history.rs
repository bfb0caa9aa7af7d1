//! Attempt history: what each failed attempt of a job came to.

use sqlx::types::chrono::{DateTime, Utc};
use uuid::Uuid;

/// What kind of failure ended an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// The handler returned an error (retried while attempts remain).
    Error,
    /// The handler returned [`JobError::permanent`](crate::JobError::permanent).
    Permanent,
    /// The handler panicked.
    Panic,
    /// The handler ran past the kind's `timeout`.
    Timeout,
    /// The runtime running it stopped renewing its claim (it died, stalled or lost the
    /// database), and a rescuer took the job back.
    LeaseExpired,
    /// The payload does not deserialize into the job's type.
    Payload,
    /// The attempt was cancelled.
    Cancelled,
    /// A kind this version of the library does not know (written by a newer one).
    Other,
}

impl FailureKind {
    /// The name stored in the job's `errors` (`error`, `permanent`, `panic`, `timeout`,
    /// `lease_expired`, `payload`, `cancelled`).
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Error => "error",
            FailureKind::Permanent => "permanent",
            FailureKind::Panic => "panic",
            FailureKind::Timeout => "timeout",
            FailureKind::LeaseExpired => "lease_expired",
            FailureKind::Payload => "payload",
            FailureKind::Cancelled => "cancelled",
            FailureKind::Other => "other",
        }
    }

    /// Parses a stored name; unknown names are [`FailureKind::Other`].
    pub fn from_name(name: &str) -> Self {
        match name {
            "error" => FailureKind::Error,
            "permanent" => FailureKind::Permanent,
            "panic" => FailureKind::Panic,
            "timeout" => FailureKind::Timeout,
            "lease_expired" => FailureKind::LeaseExpired,
            "payload" => FailureKind::Payload,
            "cancelled" => FailureKind::Cancelled,
            _ => FailureKind::Other,
        }
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One failed attempt of a job, as its history keeps it (the last 20 attempts).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AttemptError {
    /// Which attempt it was (1 for the first claim).
    pub attempt: u32,
    /// When it failed, on the database clock.
    pub at: DateTime<Utc>,
    /// What kind of failure it was.
    pub kind: FailureKind,
    /// The error message.
    pub message: String,
    /// The id of the runtime that ran the attempt (see `jobs::admin::get`), when known.
    pub runtime: Option<Uuid>,
}

/// The columns a job's history is read through: `errors` unnested into arrays, oldest
/// first (`jsonb` holds the times as text; the cast reads them back).
macro_rules! history_columns {
    () => {
        "ARRAY(SELECT (e->>'attempt')::int FROM jsonb_array_elements(errors) e) AS error_attempts, \
         ARRAY(SELECT (e->>'at')::timestamptz FROM jsonb_array_elements(errors) e) AS error_ats, \
         ARRAY(SELECT e->>'kind' FROM jsonb_array_elements(errors) e) AS error_kinds, \
         ARRAY(SELECT e->>'message' FROM jsonb_array_elements(errors) e) AS error_messages, \
         ARRAY(SELECT (e->>'runtime')::uuid FROM jsonb_array_elements(errors) e) AS error_runtimes"
    };
}
pub(crate) use history_columns;

/// The history of job `$1` (a handler's `ctx.previous_errors()`). Index: primary key.
pub(crate) const HISTORY: &str = concat!("SELECT ", history_columns!(), " FROM jobs WHERE id = $1");

/// Reads the history columns of a row.
pub(crate) fn from_row(row: &sqlx::postgres::PgRow) -> Result<Vec<AttemptError>, sqlx::Error> {
    use sqlx::Row;
    let attempts: Vec<Option<i32>> = row.try_get("error_attempts")?;
    let ats: Vec<Option<DateTime<Utc>>> = row.try_get("error_ats")?;
    let kinds: Vec<Option<String>> = row.try_get("error_kinds")?;
    let messages: Vec<Option<String>> = row.try_get("error_messages")?;
    let runtimes: Vec<Option<Uuid>> = row.try_get("error_runtimes")?;
    Ok(attempts
        .into_iter()
        .zip(ats)
        .zip(kinds)
        .zip(messages)
        .zip(runtimes)
        .map(|((((attempt, at), kind), message), runtime)| AttemptError {
            attempt: attempt.and_then(|a| u32::try_from(a).ok()).unwrap_or(0),
            at: at.unwrap_or_default(),
            kind: FailureKind::from_name(kind.as_deref().unwrap_or("")),
            message: message.unwrap_or_default(),
            runtime,
        })
        .collect())
}
