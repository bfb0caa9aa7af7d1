use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "webhook.deliver", partition = "tenant")]
struct NoLimit {
    tenant: String,
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "webhook.retry", global_concurrency = 1, partition = "tenant_id")]
struct NoSuchField {
    tenant: String,
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "webhook.wide", rate = "10/1s", partition = ["a", "b", "c", "d", "e"])]
struct TooMany {
    a: u32,
    b: u32,
    c: u32,
    d: u32,
    e: u32,
}

fn main() {}
