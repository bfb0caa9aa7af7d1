//! Quickstart: define two kinds of job, enqueue a few, run the runtime until they are
//! done, and print what happened.
//!
//! ```sh
//! cargo run --example quickstart
//! ```
//!
//! Uses `JOBS_DATABASE_URL`, or `postgres://postgres@127.0.0.1:5432/jobs_examples`,
//! and creates that database if it is missing.

use std::time::Duration;

use jobs::{EnqueueBatch, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::migrate::MigrateDatabase;
use sqlx::{PgPool, Postgres};

/// Sends a welcome mail; one live job per user.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "quickstart.welcome", key = "user_id")]
struct Welcome {
    user_id: i64,
    name: String,
}

/// Resizes an image; fails on its first attempt to show a retry.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "quickstart.resize", backoff = "200ms", max_attempts = 3)]
struct Resize {
    image: String,
}

#[jobs::handler]
async fn welcome(job: Welcome, ctx: JobContext) -> Result<(), JobError> {
    println!(
        "  job {}: welcome mail to {} (user {})",
        ctx.id(),
        job.name,
        job.user_id
    );
    Ok(())
}

#[jobs::handler]
async fn resize(job: Resize, ctx: JobContext) -> Result<(), JobError> {
    if ctx.attempt() == 1 {
        println!(
            "  job {}: resizing {} failed on attempt 1, will retry",
            ctx.id(),
            job.image
        );
        return Err(JobError::retry("image service unavailable"));
    }
    println!(
        "  job {}: resized {} on attempt {}",
        ctx.id(),
        job.image,
        ctx.attempt()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The runtime's warnings and errors (an outage, a failed job) go to stderr;
    // RUST_LOG=jobs=info shows more.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: not in a file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let url = std::env::var("JOBS_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/jobs_examples".to_owned());
    let options: sqlx::postgres::PgConnectOptions = url.parse()?;
    let where_ = format!(
        "database `{}` on {}:{}",
        options.get_database().unwrap_or("(default)"),
        options.get_host(),
        options.get_port()
    );
    if Postgres::database_exists(&url).await? {
        println!("using {where_} (JOBS_DATABASE_URL chooses another)");
    } else {
        Postgres::create_database(&url).await?;
        println!("created and using {where_} (JOBS_DATABASE_URL chooses another)");
    }
    let pool = PgPool::connect(&url).await?;
    jobs::migrate(&pool).await?;
    sqlx::query("DELETE FROM jobs WHERE kind LIKE 'quickstart.%'")
        .execute(&pool)
        .await?;

    println!("enqueueing:");
    let first = Welcome {
        user_id: 1,
        name: "Ada".into(),
    }
    .enqueue(&pool)
    .await?;
    println!(
        "  welcome for user 1: job {} ({:?})",
        first.id, first.outcome
    );
    let again = Welcome {
        user_id: 1,
        name: "Ada Lovelace".into(),
    }
    .enqueue(&pool)
    .await?;
    println!(
        "  welcome for user 1 again: job {} ({:?}, one live job per key)",
        again.id, again.outcome
    );
    let mut batch = EnqueueBatch::new();
    batch.push(&Welcome {
        user_id: 2,
        name: "Grace".into(),
    })?;
    for image in ["cat.png", "dog.png"] {
        batch.push(&Resize {
            image: image.into(),
        })?;
    }
    let ids: Vec<i64> = batch.enqueue(&pool).await?.iter().map(|e| e.id).collect();
    println!("  a batch of three in one round trip: jobs {ids:?}");

    println!("running:");
    let watcher = pool.clone();
    jobs::Runtime::new(pool.clone())
        .poll_interval(Duration::from_millis(100))
        .run_until(async move {
            loop {
                let live: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM jobs WHERE kind LIKE 'quickstart.%' AND state IN ('pending', 'running')",
                )
                .fetch_one(&watcher)
                .await
                .unwrap_or(1);
                if live == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await?;

    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE kind LIKE 'quickstart.%'")
        .fetch_one(&pool)
        .await?;
    println!("done: every job completed, {left} rows left in the job table");
    Ok(())
}
