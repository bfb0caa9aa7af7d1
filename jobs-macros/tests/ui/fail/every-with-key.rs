use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "tenant.sweep", key = "tenant", every = "10m")]
struct SweepTenant {
    tenant: String,
}

fn main() {}
