use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "item.process")]
struct Process<T> {
    item: T,
}

fn main() {}
