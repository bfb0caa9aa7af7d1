use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "session.delete", key = "0")]
struct SessionDelete(i64);

fn main() {}
