use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "llm.embed", global_concurrency = 0)]
struct Embed {
    set_id: i64,
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "llm.embed.many", global_concurrency = "8")]
struct EmbedMany {
    set_id: i64,
}

fn main() {}
