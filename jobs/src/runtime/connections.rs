//! What the runtime says when it has no connection: in the server's words, with what
//! it needs and the server's limits.

use std::time::Duration;

use sqlx::PgPool;

use super::Shared;

/// An error of a runtime statement in the server's words; for a wait for the runtime's
/// pool that ran out, why the pool could not open a connection.
pub(super) async fn why(shared: &Shared, e: &sqlx::Error) -> String {
    why_of(&shared.db, &shared.pool, e).await
}

/// [`why`], for the runtime's pool `db` beside the application's `pool`, before the
/// runtime's tasks share them (the check at start).
pub(super) async fn why_of(db: &PgPool, pool: &PgPool, e: &sqlx::Error) -> String {
    if matches!(e, sqlx::Error::PoolTimedOut) {
        refusal(db, pool).await
    } else {
        crate::error::server_message(e)
    }
}

/// Why the runtime's pool found no connection in time: the server's answer to a
/// connection with the pool's settings (sqlx reports only that the wait timed out),
/// what the runtime needs, and the server's limits.
async fn refusal(db: &PgPool, pool: &PgPool) -> String {
    use sqlx::{ConnectOptions, Connection};
    let options = db.connect_options();
    let why = match tokio::time::timeout(Duration::from_secs(1), options.connect()).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            "no connection of the runtime's pool in time, though the server accepts one now"
                .to_owned()
        }
        Ok(Err(e)) => crate::error::server_message(&e),
        Err(_) => "the server did not answer a new connection within 1s".to_owned(),
    };
    format!(
        "{why} (the runtime needs {} connections of its own besides the application's pool; {})",
        super::RUNTIME_CONNECTIONS,
        budget_of(pool).await
    )
}

/// The server's connection limits as the application's pool sees them (`max_connections`
/// and how many are open), or why they cannot be read.
pub(super) async fn budget(shared: &Shared) -> String {
    budget_of(&shared.pool).await
}

async fn budget_of(pool: &PgPool) -> String {
    let query = crate::pooler::query_as::<_, (String, i64)>(
        "SELECT current_setting('max_connections'), (SELECT count(*) FROM pg_stat_activity)",
    )
    .fetch_one(pool);
    match tokio::time::timeout(Duration::from_secs(1), query).await {
        Ok(Ok((max, open))) => format!("max_connections = {max}, {open} open"),
        Ok(Err(e)) => format!(
            "max_connections unknown: {}",
            crate::error::server_message(&e)
        ),
        Err(_) => {
            "max_connections unknown: the application's pool has no free connection".to_owned()
        }
    }
}
