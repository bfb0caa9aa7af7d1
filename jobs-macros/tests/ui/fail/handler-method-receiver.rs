use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "session.delete")]
struct SessionDelete {
    session_id: i64,
}

impl SessionDelete {
    #[jobs::handler]
    async fn run(self, _ctx: JobContext) -> Result<(), JobError> {
        Ok(())
    }
}

fn main() {}
