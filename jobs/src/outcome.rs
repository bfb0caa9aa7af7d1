//! What a handler may return: `Result<T, JobError>`, and, with the `anyhow` or `eyre`
//! features, `anyhow::Result<T>` or `eyre::Result<T>`, so that `?` works on the errors
//! a Rust service already carries. `T` is `()`, or any `Serialize` value: the job's
//! output, which a kind that keeps done rows (`retain`) stores with the completion
//! ([`crate::admin::JobRow::output`]). A kind that keeps none does not serialize it.
//!
//! An `anyhow::Error` (or `eyre::Report`) becomes a retried failure whose message is the
//! error with its chain of causes ("outer: inner: root"). A [`JobError`] returned through
//! it (`Err(JobError::permanent("..."))?`, or a context method's error with `?`) keeps
//! its meaning: permanent stays permanent, a snooze stays a snooze.

use std::sync::Arc;

use serde::Serialize;

use crate::context::{Inner, JobContext};
use crate::{JobError, MAX_OUTPUT_BYTES};

/// The return types a `#[jobs::handler]` accepts. Not for implementing: used by the
/// code the attribute generates.
#[diagnostic::on_unimplemented(
    message = "a job handler returns `Result<T, jobs::JobError>` (`T`: `()` or a `Serialize` output), not `{Self}`",
    label = "the handler's return type",
    note = "with the `anyhow` or `eyre` feature of pgjobs, `anyhow::Result<T>` or `eyre::Result<T>` too"
)]
pub trait HandlerResult {
    /// The handler's result as the runtime reads it; its output goes to `output`.
    fn into_job_result(self, output: OutputSlot) -> Result<(), JobError>;
}

impl<T: Serialize> HandlerResult for Result<T, JobError> {
    fn into_job_result(self, output: OutputSlot) -> Result<(), JobError> {
        output.store(&self?)
    }
}

/// Where a run's output goes: its claim, if its kind keeps done rows. Not for use:
/// made by the code `#[jobs::handler]` generates, before the handler is called.
pub struct OutputSlot(Option<Arc<Inner>>);

impl OutputSlot {
    /// The slot of the run `ctx` belongs to.
    pub fn of(ctx: &JobContext) -> Self {
        OutputSlot(ctx.inner.config.retain.is_some().then(|| ctx.inner.clone()))
    }

    /// Keeps `value`, as JSON, for the completion to store; `null` (a `()`) is nothing.
    /// One that does not serialize, or serializes to more than [`MAX_OUTPUT_BYTES`],
    /// fails the run for good.
    fn store<T: Serialize>(self, value: &T) -> Result<(), JobError> {
        let Some(inner) = self.0 else {
            return Ok(());
        };
        let json = serde_json::to_string(value).map_err(|e| {
            JobError::permanent(format!("the handler's output does not serialize: {e}"))
        })?;
        if json == "null" {
            return Ok(());
        }
        // PostgreSQL's jsonb holds no NUL character: sent on, the cast in the completion
        // would fail its whole batch, other jobs' completions with it, at every retry.
        if escapes_nul(&json) {
            return Err(JobError::permanent(
                "the handler's output holds a NUL character (\\u0000), which PostgreSQL's jsonb cannot store",
            ));
        }
        if json.len() > MAX_OUTPUT_BYTES {
            return Err(JobError::permanent(format!(
                "the handler's output is {} bytes of JSON, more than jobs::MAX_OUTPUT_BYTES \
                 ({MAX_OUTPUT_BYTES}): store it in a table of your own and return its id",
                json.len()
            )));
        }
        if inner.completed.load(std::sync::atomic::Ordering::Acquire) {
            tracing::warn!(
                job.id = inner.id,
                job.kind = inner.kind,
                "the job completed with its fenced transaction's commit, before the handler returned: its output is not stored"
            );
            return Ok(());
        }
        *inner.output.lock().expect("lock poisoned") = Some(json);
        Ok(())
    }
}

/// Whether JSON text `json` holds the escape `\u0000` (a backslash that is not itself
/// escaped, then `u0000`).
fn escapes_nul(json: &str) -> bool {
    let bytes = json.as_bytes();
    json.match_indices("\\u0000").any(|(at, _)| {
        let backslashes = bytes[..at]
            .iter()
            .rev()
            .take_while(|b| **b == b'\\')
            .count();
        backslashes % 2 == 0
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_nul_escape_is_told_from_an_escaped_backslash() {
        let json = |s: &str| serde_json::to_string(s).unwrap();
        assert!(super::escapes_nul(&json("a\0b")));
        assert!(super::escapes_nul(&json("\\\0")));
        assert!(!super::escapes_nul(&json("\\u0000")));
        assert!(!super::escapes_nul(&json("plain")));
    }
}

#[cfg(feature = "anyhow")]
mod anyhow_support {
    use super::{HandlerResult, JobError, OutputSlot, Serialize};

    impl<T: Serialize> HandlerResult for Result<T, anyhow::Error> {
        fn into_job_result(self, output: OutputSlot) -> Result<(), JobError> {
            let value = self.map_err(|e| match e.downcast::<JobError>() {
                Ok(job_error) => job_error,
                Err(e) => JobError::retry(format!("{e:#}")),
            })?;
            output.store(&value)
        }
    }

    /// A [`JobError`] carried by `anyhow`, to come back as itself at the handler's end.
    impl From<JobError> for anyhow::Error {
        fn from(e: JobError) -> Self {
            anyhow::Error::msg(e)
        }
    }
}

#[cfg(feature = "eyre")]
mod eyre_support {
    use super::{HandlerResult, JobError, OutputSlot, Serialize};

    impl<T: Serialize> HandlerResult for Result<T, eyre::Report> {
        fn into_job_result(self, output: OutputSlot) -> Result<(), JobError> {
            let value = self.map_err(|e| match e.downcast::<JobError>() {
                Ok(job_error) => job_error,
                Err(e) => JobError::retry(format!("{e:#}")),
            })?;
            output.store(&value)
        }
    }

    /// A [`JobError`] carried by `eyre`, to come back as itself at the handler's end.
    impl From<JobError> for eyre::Report {
        fn from(e: JobError) -> Self {
            eyre::Report::msg(e)
        }
    }
}
