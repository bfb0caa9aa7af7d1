use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "mail.send", priority = 10)]
struct SendMail {}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "mail.digest", priority = "high")]
struct Digest {}

fn main() {}
