use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "session.delete", backoff = "10m", max_backoff = "1m")]
struct SessionDelete {
    session_id: i64,
}

// The message names the default when only the cap is written.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "session.purge", max_backoff = "500ms")]
struct SessionPurge {
    session_id: i64,
}

fn main() {}
