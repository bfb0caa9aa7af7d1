// A periodic kind: a unit struct with Default, re-armed every ten minutes.
#![deny(warnings)]

use std::time::Duration;

use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "sessions.sweep", every = "10m")]
struct SweepSessions;

#[jobs::handler]
async fn sweep_sessions(_job: SweepSessions, ctx: JobContext) -> Result<(), JobError> {
    jobs::sqlx::query("DELETE FROM sessions WHERE expires_at < now()")
        .execute(ctx.pool())
        .await?;
    Ok(())
}

#[test]
fn a_periodic_kind_expands() {
    assert_eq!(SweepSessions::KIND, "sessions.sweep");
    assert_eq!(SweepSessions::CONFIG.every, Some(Duration::from_secs(600)));
    assert_eq!(
        SweepSessions.key().as_deref(),
        Some(jobs::__private::PERIODIC_KEY)
    );
}
