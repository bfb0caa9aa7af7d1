// A handler cannot be an associated function: the registration calls it by its bare name.
use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "session.delete")]
struct SessionDelete {
    session_id: i64,
}

impl SessionDelete {
    #[jobs::handler]
    async fn run(job: SessionDelete, _ctx: JobContext) -> Result<(), JobError> {
        let _ = job.session_id;
        Ok(())
    }
}

fn main() {}
