use jobs::Job;
use serde::{Deserialize, Serialize};

// A periodic kind's job is built with Default::default(), which this type lacks.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "sessions.sweep", every = "10m")]
struct SweepSessions {
    older_than_days: u32,
}

fn main() {}
