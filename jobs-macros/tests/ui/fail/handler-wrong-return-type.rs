use jobs::{Job, JobContext};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "session.delete")]
struct SessionDelete {
    session_id: i64,
}

#[jobs::handler]
async fn delete_session(_job: SessionDelete, _ctx: JobContext) -> Result<(), String> {
    Ok(())
}

fn main() {}
