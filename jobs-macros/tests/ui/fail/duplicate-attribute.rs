use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "session.delete", max_attempts = 5)]
#[job(max_attempts = 10)]
struct SessionDelete {
    session_id: i64,
}

fn main() {}
