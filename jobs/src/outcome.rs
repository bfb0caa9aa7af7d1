//! What a handler may return: `Result<(), JobError>`, and, with the `anyhow` or `eyre`
//! features, `anyhow::Result<()>` or `eyre::Result<()>`, so that `?` works on the errors
//! a Rust service already carries.
//!
//! An `anyhow::Error` (or `eyre::Report`) becomes a retried failure whose message is the
//! error with its chain of causes ("outer: inner: root"). A [`JobError`] returned through
//! it (`Err(JobError::permanent("..."))?`, or a context method's error with `?`) keeps
//! its meaning: permanent stays permanent, a snooze stays a snooze.

use crate::JobError;

/// The return types a `#[jobs::handler]` accepts. Not for implementing: used by the
/// code the attribute generates.
#[diagnostic::on_unimplemented(
    message = "a job handler returns `Result<(), jobs::JobError>`, not `{Self}`",
    label = "the handler's return type",
    note = "with the `anyhow` or `eyre` feature of pgjobs, `anyhow::Result<()>` or `eyre::Result<()>` too"
)]
pub trait HandlerResult {
    /// The handler's result as the runtime reads it.
    fn into_job_result(self) -> Result<(), JobError>;
}

impl HandlerResult for Result<(), JobError> {
    fn into_job_result(self) -> Result<(), JobError> {
        self
    }
}

#[cfg(feature = "anyhow")]
mod anyhow_support {
    use super::{HandlerResult, JobError};

    impl HandlerResult for Result<(), anyhow::Error> {
        fn into_job_result(self) -> Result<(), JobError> {
            self.map_err(|e| match e.downcast::<JobError>() {
                Ok(job_error) => job_error,
                Err(e) => JobError::retry(format!("{e:#}")),
            })
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
    use super::{HandlerResult, JobError};

    impl HandlerResult for Result<(), eyre::Report> {
        fn into_job_result(self) -> Result<(), JobError> {
            self.map_err(|e| match e.downcast::<JobError>() {
                Ok(job_error) => job_error,
                Err(e) => JobError::retry(format!("{e:#}")),
            })
        }
    }

    /// A [`JobError`] carried by `eyre`, to come back as itself at the handler's end.
    impl From<JobError> for eyre::Report {
        fn from(e: JobError) -> Self {
            eyre::Report::msg(e)
        }
    }
}
