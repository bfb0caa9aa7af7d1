use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "session.delete", key = "sesion_id")]
struct SessionDelete {
    session_id: i64,
}

fn main() {}
