// The README's example: a kind with a dedup key, and its handler.
#![deny(warnings)]

use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "session.delete", key = "session_id")]
pub struct SessionDelete {
    pub session_id: Uuid,
}

#[jobs::handler]
async fn delete_session(job: SessionDelete, ctx: JobContext) -> Result<(), JobError> {
    // ... idempotent work ...
    let _ = (job.session_id, ctx.id());
    Ok(())
}

#[test]
fn the_readme_example_expands() {
    let id = Uuid::nil();
    assert_eq!(SessionDelete::KIND, "session.delete");
    assert_eq!(SessionDelete { session_id: id }.key(), Some(id.to_string()));
    assert_eq!(SessionDelete::CONFIG, jobs::JobConfig::DEFAULT);
}
