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

fn main() {}
