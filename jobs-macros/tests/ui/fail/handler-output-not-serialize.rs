use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "video.transcode")]
struct Transcode {
    height: u32,
}

/// Not `Serialize`: it cannot be a job's output.
struct Rendition {
    url: String,
}

#[jobs::handler]
async fn transcode(_job: Transcode, _ctx: JobContext) -> Result<Rendition, JobError> {
    Ok(Rendition { url: String::new() })
}

fn main() {}
