use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "price.update", key = "price")]
struct UpdatePrice {
    price: f64,
}

fn main() {}
