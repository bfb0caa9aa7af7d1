use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(key = "session_id")]
struct SessionDelete {
    session_id: i64,
}

fn main() {}
