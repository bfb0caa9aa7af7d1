use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "session.delete", lease = "100ms")]
struct SessionDelete {
    session_id: i64,
}

fn main() {}
