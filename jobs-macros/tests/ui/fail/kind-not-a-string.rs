use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = session.delete)]
struct SessionDelete {
    session_id: i64,
}

fn main() {}
