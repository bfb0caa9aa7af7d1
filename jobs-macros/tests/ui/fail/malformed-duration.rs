use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "session.delete", lease = "30 Seconds")]
struct SessionDelete {
    session_id: i64,
}

fn main() {}
