use jobs::{JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct SessionDelete {
    session_id: i64,
}

#[jobs::handler]
async fn delete_session(_job: SessionDelete, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
