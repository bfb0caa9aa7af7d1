// Every mistake in one attribute is reported by one compile, each at its own token.
use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(
    key = "sesion_id",
    max_attempts = 0,
    backoff = "1 Second",
    retries = 3,
    lease = 30,
    concurrency = "4",
    cancel_on_lease_loss = "no"
)]
struct SessionDelete {
    session_id: i64,
}

fn main() {}
