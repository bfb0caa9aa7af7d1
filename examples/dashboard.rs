//! The dashboard mounted in an application's own axum server, next to a runtime at
//! work: a stream of jobs of three kinds, some failing, so that every page has
//! something to show.
//!
//! ```sh
//! cargo run --example dashboard
//! # then open http://127.0.0.1:3000/admin/jobs
//! ```
//!
//! Uses `JOBS_DATABASE_URL`, or `postgres://postgres@127.0.0.1:5432/jobs_dashboard`,
//! and creates that database if it is missing. `JOBS_LISTEN` changes the address.

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use jobs::{EnqueueBatch, EnqueueOptions, Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::migrate::MigrateDatabase;
use sqlx::{PgPool, Postgres};

/// Sends a receipt; one in twenty mail servers refuses, and some never recover.
#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "demo.receipt",
    key = "order_id",
    backoff = "2s",
    max_attempts = 3
)]
struct Receipt {
    order_id: i64,
    email: String,
}

/// Builds a report, slowly.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "demo.report", timeout = "1m")]
struct Report {
    account: i64,
}

/// Cleans up expired sessions, on a schedule.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "demo.cleanup")]
struct Cleanup {
    older_than_days: u32,
}

#[jobs::handler]
async fn receipt(job: Receipt, ctx: JobContext) -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_millis(20)).await;
    if job.order_id % 20 == 0 {
        return Err(JobError::retry(format!(
            "smtp: 451 4.7.1 greylisted, try again later ({} on attempt {})",
            job.email,
            ctx.attempt()
        )));
    }
    Ok(())
}

#[jobs::handler]
async fn report(_job: Report, _ctx: JobContext) -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_millis(400)).await;
    Ok(())
}

#[jobs::handler]
async fn cleanup(_job: Cleanup, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

/// A few jobs every second: receipts now, reports now and later, a cleanup later.
async fn produce(pool: PgPool) -> Result<(), jobs::Error> {
    let mut order = 1i64;
    loop {
        let mut batch = EnqueueBatch::new();
        for _ in 0..8 {
            batch.push(&Receipt {
                order_id: order,
                email: format!("customer{order}@example.com"),
            })?;
            order += 1;
        }
        batch.push(&Report { account: order % 7 })?;
        batch.push_with(
            &Report { account: order },
            EnqueueOptions::new().delay(Duration::from_secs(120)),
        )?;
        batch.push_with(
            &Cleanup {
                older_than_days: 30,
            },
            EnqueueOptions::new()
                .delay(Duration::from_secs(600))
                .priority(5),
        )?;
        batch.enqueue(&pool).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // The failing receipts are on purpose: only errors are printed.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        // Colours only on a terminal: not in a file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let url = std::env::var("JOBS_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/jobs_dashboard".to_owned());
    if !Postgres::database_exists(&url).await? {
        Postgres::create_database(&url).await?;
    }
    // Handlers here use no connection, but the dashboard and the producer do.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(24)
        .connect(&url)
        .await?;
    jobs::migrate(&pool).await?;

    // The application's router, with the dashboard under a path of its choice. A real
    // application puts its own authentication layer in front of that path (or gives
    // the dashboard an access token with `.token(..)`).
    let app = Router::new()
        .route(
            "/",
            get(|| async { "the application; the dashboard is at /admin/jobs" }),
        )
        .nest(
            "/admin/jobs",
            jobs_web::Dashboard::new(pool.clone()).router(),
        );
    let listen = std::env::var("JOBS_LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("dashboard at http://{}/admin/jobs", listener.local_addr()?);

    tokio::spawn(produce(pool.clone()));
    // The runtime stops on Ctrl-C or SIGTERM, after its running jobs; the server then
    // stops with it.
    let runtime = Runtime::new(pool.clone())
        .name("dashboard-demo")
        .concurrency(20)
        .run();
    tokio::select! {
        served = axum::serve(listener, app) => served?,
        ran = runtime => ran?,
    }
    Ok(())
}
