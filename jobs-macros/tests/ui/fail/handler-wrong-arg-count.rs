use jobs::{Job, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "session.delete")]
struct SessionDelete {
    session_id: i64,
}

#[jobs::handler]
async fn delete_session(_job: SessionDelete) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
