#![doc = include_str!("../../README.md")]
#![forbid(unsafe_code)]

pub mod admin;
mod context;
mod enqueue;
mod error;
mod job;
mod migrate;
mod registry;
mod runtime;
mod sql;
pub mod testing;

pub use context::{FencedTx, JobContext, JobError, TxGuard};
pub use enqueue::{EnqueueBatch, EnqueueOutcome, Enqueued, enqueue_all};
pub use error::Error;
pub use job::{Job, JobConfig, KeyPart, Lease};
pub use jobs_macros::{Job, handler};
pub use migrate::{MIGRATIONS_TABLE, MIGRATOR, migrate};
pub use runtime::{RUNTIME_CONNECTIONS, RunCounts, Runtime, run};

/// Not public API: used by the code that `#[derive(Job)]` and `#[jobs::handler]`
/// generate. May change in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::registry::{HandlerFuture, HandlerInfo, HandlerInput, KindInfo, dispatch};
    pub use inventory;

    /// The key of a periodic kind's one live job.
    pub const PERIODIC_KEY: &str = crate::sql::PERIODIC_KEY;

    /// The claim statement, for tests that read its plan.
    pub const CLAIM_SQL: &str = crate::sql::CLAIM;

    /// Every SQL statement the crate runs, by name, for tests that check them all.
    pub fn statements() -> Vec<(&'static str, &'static str)> {
        crate::sql::all()
    }

    /// Joins the parts of a key over several fields.
    pub fn join_key_parts(parts: &[Option<String>]) -> Option<String> {
        crate::job::join_key_parts(parts)
    }
}
