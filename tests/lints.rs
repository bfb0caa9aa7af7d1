//! The code that `#[derive(Job)]` and `#[jobs::handler]` generate compiles cleanly
//! under strict lints: a user crate that denies them can use the macros.
//!
//! The handlers do not await on purpose: the registration must not make
//! `clippy::unused_async` fire on a handler that the macro requires to be async.

#![deny(
    warnings,
    future_incompatible,
    let_underscore,
    nonstandard_style,
    rust_2018_idioms,
    rust_2024_compatibility,
    unused,
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    unused_qualifications,
    unused_results,
    unused_import_braces,
    unused_lifetimes,
    trivial_casts,
    trivial_numeric_casts,
    single_use_lifetimes,
    variant_size_differences,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    clippy::as_conversions,
    clippy::clone_on_ref_ptr,
    clippy::dbg_macro,
    clippy::default_numeric_fallback,
    clippy::missing_docs_in_private_items,
    clippy::panic,
    clippy::print_stdout,
    clippy::todo,
    clippy::unimplemented,
    clippy::unwrap_used,
    clippy::use_debug
)]

use std::time::Duration;

use jobs::{Job, JobConfig, JobContext, JobError, Lease};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Deletes one session; at most one live job per session.
#[derive(Debug, Job, Serialize, Deserialize)]
#[job(kind = "session.delete", key = "session_id")]
pub struct SessionDelete {
    /// The session to delete.
    pub session_id: Uuid,
}

/// Builds a report; every setting, and a key over two fields, one of them optional.
#[derive(Debug, Job, Serialize, Deserialize)]
#[job(
    kind = "report.build",
    key = ["tenant", "report_id"],
    max_attempts = 5,
    backoff = "250ms",
    max_backoff = "1h",
    lease = "2m",
    cancel_on_lease_loss = false,
    timeout = "5m",
    concurrency = 4,
    retain = "7d"
)]
pub struct BuildReport {
    /// The tenant the report belongs to.
    pub tenant: String,
    /// The report, if it exists yet.
    pub report_id: Option<i64>,
}

/// Posts a ledger entry in the claim's transaction.
#[derive(Debug, Job, Serialize, Deserialize)]
#[job(kind = "ledger.post", lease = "transaction")]
pub enum PostEntry {
    /// A credit of this many cents.
    Credit(i64),
    /// A debit of this many cents.
    Debit(i64),
}

/// Sweeps expired sessions every ten minutes.
#[derive(Debug, Default, Job, Serialize, Deserialize)]
#[job(kind = "sessions.sweep", every = "10m")]
pub struct SweepSessions;

/// Deletes the session of `job`.
///
/// # Errors
///
/// Never; a real handler would fail with the database's error.
#[jobs::handler]
pub async fn delete_session(job: SessionDelete, ctx: JobContext) -> Result<(), JobError> {
    if job.session_id.is_nil() || ctx.is_lease_lost() {
        return Err(JobError::permanent("no session"));
    }
    Ok(())
}

/// Builds the report of `job`.
///
/// # Errors
///
/// A permanent error for a report that does not exist yet.
#[jobs::handler]
async fn build_report(job: BuildReport, _ctx: JobContext) -> Result<(), JobError> {
    job.report_id
        .map(drop)
        .ok_or_else(|| JobError::permanent(format!("no report for {}", job.tenant)))
}

/// Posts the entry of `job`.
///
/// # Errors
///
/// Never.
#[jobs::handler]
async fn post_entry(job: PostEntry, _ctx: JobContext) -> Result<(), JobError> {
    match job {
        PostEntry::Credit(_) | PostEntry::Debit(_) => Ok(()),
    }
}

/// Sweeps the sessions.
///
/// # Errors
///
/// Never.
#[jobs::handler]
async fn sweep_sessions(_job: SweepSessions, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[test]
fn kinds_settings_and_keys() {
    assert_eq!(SessionDelete::KIND, "session.delete");
    assert_eq!(SessionDelete::CONFIG, JobConfig::DEFAULT);
    let id = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    assert_eq!(
        SessionDelete { session_id: id }.key().as_deref(),
        Some("01234567-89ab-cdef-0123-456789abcdef")
    );

    let c = BuildReport::CONFIG;
    assert_eq!(BuildReport::KIND, "report.build");
    assert_eq!(c.max_attempts, 5);
    assert_eq!(c.backoff, Duration::from_millis(250));
    assert_eq!(c.max_backoff, Duration::from_hours(1));
    assert_eq!(c.lease, Lease::Heartbeat(Duration::from_mins(2)));
    assert!(!c.cancel_on_lease_loss);
    assert_eq!(c.timeout, Some(Duration::from_mins(5)));
    assert_eq!(c.concurrency, Some(4));
    assert_eq!(c.retain, Some(Duration::from_hours(7 * 24)));
    assert_eq!(c.every, None);
    let report = BuildReport {
        tenant: "acme:eu".to_owned(),
        report_id: Some(7),
    };
    assert_eq!(report.key().as_deref(), Some("acme\\:eu:7"));
    let draft = BuildReport {
        tenant: "acme".to_owned(),
        report_id: None,
    };
    assert_eq!(draft.key(), None);

    assert_eq!(PostEntry::KIND, "ledger.post");
    assert_eq!(PostEntry::CONFIG.lease, Lease::Transaction);
    assert_eq!(PostEntry::Credit(5).key(), None);

    assert_eq!(SweepSessions::KIND, "sessions.sweep");
    assert_eq!(SweepSessions::CONFIG.every, Some(Duration::from_mins(10)));
    assert_eq!(
        SweepSessions.key().as_deref(),
        Some("every"),
        "one live job per periodic kind"
    );
}
