//! A runtime the server refuses connections says why in the server's words, not
//! sqlx's "pool timed out".

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jobs::{Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "refusals.any")]
struct Any {}

#[jobs::handler]
async fn any(_job: Any, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

/// What the runtime logs, kept for the test to read.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A role the server allows no connection at all: the runtime's check at start waits
/// for the database and says, each time, the server's reason. (Before, it said "pool
/// timed out".)
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_refused_connection_is_reported_in_the_servers_words(
    pool_opts: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    let admin: PgPool = pool_opts.connect_with(opts.clone()).await.unwrap();
    let role = format!("jobs_refused_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN CONNECTION LIMIT 0"
    )))
    .execute(&admin)
    .await
    .unwrap();
    let refused = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy_with(opts.clone().username(&role));
    let runtime = Runtime::new(refused.clone()).kinds(["refusals.any"]);
    let ran = tokio::time::timeout(
        Duration::from_secs(3),
        runtime.run_until(std::future::pending()),
    )
    .await;
    assert!(ran.is_err(), "the runtime waits for the database");
    refused.close().await;
    let said = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(
        said.contains(&format!("too many connections for role \"{role}\"")),
        "{said}"
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE {role}")))
        .execute(&admin)
        .await
        .unwrap();
}
