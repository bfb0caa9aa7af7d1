//! The operator's actions and what each says it did: the dashboard's buttons and the
//! command-line tool's subcommands run them both, so both say the same thing.

use jobs::admin::{self, Cancelled, Retried};
use sqlx::PgConnection;

/// A change an operator makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Make the failed job pending again ([`admin::retry`]).
    Retry(i64),
    /// Make every failed job of the kind pending again ([`admin::retry_kind`]).
    RetryKind(String),
    /// Cancel the pending or running job ([`admin::cancel`]).
    Cancel(i64),
    /// Delete the failed job ([`admin::discard`]).
    Discard(i64),
    /// Stop claiming the kind ([`admin::pause`]: refused for a kind no runtime has
    /// declared and no job carries).
    Pause(String),
    /// Claim the kind again ([`admin::resume`]).
    Resume(String),
}

impl Action {
    /// Whether the action loses or stops something, so that the dashboard asks first.
    pub fn is_destructive(&self) -> bool {
        !matches!(self, Action::Resume(_))
    }

    /// The question the dashboard asks before a destructive action.
    pub fn question(&self) -> String {
        match self {
            Action::Retry(id) => format!(
                "Retry job {id}? It becomes pending, claimable now, with a fresh attempt budget."
            ),
            Action::RetryKind(kind) => format!(
                "Retry every failed job of kind `{kind}`? Each becomes pending, claimable now."
            ),
            Action::Cancel(id) => {
                format!("Cancel job {id}? It will never run (again); a running handler is stopped.")
            }
            Action::Discard(id) => format!("Discard job {id}? Its row and its error are deleted."),
            Action::Pause(kind) => {
                format!("Pause kind `{kind}`? Runtimes stop claiming it until it is resumed.")
            }
            Action::Resume(kind) => format!("Resume kind `{kind}`?"),
        }
    }

    /// The button's label.
    pub fn label(&self) -> &'static str {
        match self {
            Action::Retry(_) => "Retry",
            Action::RetryKind(_) => "Retry all failed",
            Action::Cancel(_) => "Cancel",
            Action::Discard(_) => "Discard",
            Action::Pause(_) => "Pause",
            Action::Resume(_) => "Resume",
        }
    }
}

/// Why an action did nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum ActionError {
    /// The job is not in a state the action applies to (or does not exist): the message
    /// says which state it is in.
    Refused(String),
    /// The database failed.
    Database(jobs::Error),
}

impl std::fmt::Display for ActionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ActionError::Refused(message) => f.write_str(message),
            ActionError::Database(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ActionError {}

impl From<jobs::Error> for ActionError {
    fn from(e: jobs::Error) -> Self {
        ActionError::Database(e)
    }
}

/// Runs `action` and says what it did, in one line (no trailing newline).
pub async fn perform(conn: &mut PgConnection, action: &Action) -> Result<String, ActionError> {
    Ok(match action {
        Action::Retry(id) => {
            let id = *id;
            let mut outcome = admin::retry(&mut *conn, id).await;
            if outcome.as_ref().is_err_and(admin::is_live_key_conflict) {
                // An enqueue of the same key committed meanwhile: the second run merges.
                outcome = admin::retry(&mut *conn, id).await;
            }
            match outcome {
                Ok(Retried::Merged { live_id }) => format!(
                    "job {id} not requeued: job {live_id} of the same key is live and covers it; removed the failed row"
                ),
                Ok(_) => format!("job {id} is pending again, claimable now"),
                Err(jobs::Error::NotFound(_)) => return Err(not_found(conn, id, "failed").await),
                Err(e) => return Err(e.into()),
            }
        }
        Action::RetryKind(kind) => {
            let mut outcome = admin::retry_kind(&mut *conn, kind).await;
            if outcome.as_ref().is_err_and(admin::is_live_key_conflict) {
                outcome = admin::retry_kind(&mut *conn, kind).await;
            }
            let done = outcome?;
            let mut message = format!(
                "{} failed job{} of kind `{kind}` pending again",
                done.retried,
                plural(done.retried)
            );
            if done.merged > 0 {
                message.push_str(&format!(
                    "; {} removed, covered by a job of the same key",
                    done.merged
                ));
            }
            message
        }
        Action::Cancel(id) => {
            let id = *id;
            match admin::cancel(&mut *conn, id).await {
                Ok(Cancelled::Running) => format!(
                    "job {id} cancelled while running: its runtime drops the handler and refuses its results"
                ),
                Ok(_) => format!("job {id} cancelled before it ran"),
                Err(jobs::Error::NotFound(_)) => return Err(not_found(conn, id, "live").await),
                Err(e) => return Err(e.into()),
            }
        }
        Action::Discard(id) => {
            let id = *id;
            match admin::discard(&mut *conn, id).await {
                Ok(()) => format!("job {id} discarded"),
                Err(jobs::Error::NotFound(_)) => return Err(not_found(conn, id, "failed").await),
                Err(e) => return Err(e.into()),
            }
        }
        Action::Pause(kind) => match admin::pause(&mut *conn, kind).await {
            Ok(running) => pause_outcome(kind, running),
            // A kind no runtime declared and no job carries (a typo, most likely).
            Err(jobs::Error::InvalidInput(message)) => return Err(ActionError::Refused(message)),
            Err(e) => return Err(e.into()),
        },
        Action::Resume(kind) => {
            if admin::resume(&mut *conn, kind).await? {
                format!("kind `{kind}` resumed")
            } else {
                format!("kind `{kind}` was not paused")
            }
        }
    })
}

/// What a pause of `kind` says it did (`running`: whether the kind was running before),
/// in the words the dashboard and `jobsctl` share.
pub fn pause_outcome(kind: &str, running: bool) -> String {
    if running {
        format!("kind `{kind}` paused: runtimes stop claiming it within their poll interval")
    } else {
        format!("kind `{kind}` was already paused")
    }
}

/// "no `wanted` job with id N", and what the job is instead, if it exists.
async fn not_found(conn: &mut PgConnection, id: i64, wanted: &str) -> ActionError {
    let mut message = format!("no {wanted} job with id {id}");
    if let Ok(Some(job)) = admin::get(&mut *conn, id).await {
        message.push_str(&format!(" (job {id} is {})", job.state));
    }
    ActionError::Refused(message)
}

/// The plural ending of a count's noun.
pub(crate) fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}
