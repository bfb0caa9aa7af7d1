use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "llm.embed", rate = "600")]
struct NoWindow {
    set_id: i64,
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "llm.embed.zero", rate = "0/1m")]
struct NoStarts {
    set_id: i64,
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "llm.embed.unit", rate = "600/m")]
struct NoNumber {
    set_id: i64,
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "llm.embed.instant", rate = "600/0s")]
struct Instant {
    set_id: i64,
}

fn main() {}
