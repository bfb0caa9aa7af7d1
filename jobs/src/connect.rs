//! A pool that says at once, in words, why it cannot connect.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use crate::Error;

/// How long [`connect`] waits for the server's first answer.
const FIRST_ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Opens a pool to the database at `url` (a `postgres://` URL), after one connection
/// that checks the server takes it: a mistake is an [`Error::Connect`] at once, naming
/// the host, port, database and user (never the password) and the server's reason
/// ("password authentication failed", "database \"app\" does not exist", "too many
/// connections"), where `PgPool::connect` waits out its acquire timeout and says
/// "pool timed out".
///
/// The pool has sqlx's default settings; for others, build it from
/// [`PgPoolOptions`] as usual (the runtime takes any pool).
///
/// ```no_run
/// # async fn demo() -> Result<(), jobs::Error> {
/// let pool = jobs::connect("postgres://app@db.internal/app").await?;
/// jobs::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<PgPool, Error> {
    connect_with(url, PgPoolOptions::new()).await
}

/// [`connect`], with the pool's settings.
pub async fn connect_with(url: &str, pool: PgPoolOptions) -> Result<PgPool, Error> {
    let options = PgConnectOptions::from_str(url).map_err(|e| {
        Error::Connect(redact(
            url,
            format!("cannot connect to the database: not a PostgreSQL URL ({e})"),
        ))
    })?;
    let target = format!(
        "{}:{} (database `{}`, user `{}`)",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or(options.get_username()),
        options.get_username()
    );
    match tokio::time::timeout(FIRST_ANSWER_WITHIN, PgConnection::connect_with(&options)).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(pool.connect_lazy_with(options))
        }
        Ok(Err(e)) => Err(Error::Connect(redact(
            url,
            format!(
                "cannot connect to the database at {target}: {}",
                crate::error::server_message(&e)
            ),
        ))),
        Err(_) => Err(Error::Connect(format!(
            "cannot connect to the database at {target}: no answer within {FIRST_ANSWER_WITHIN:?}"
        ))),
    }
}

/// `text` without the URL's password, if it has one.
fn redact(url: &str, text: String) -> String {
    let password = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, password)| password)
        .filter(|p| !p.is_empty());
    match password {
        Some(secret) => text.replace(secret, "***"),
        None => text,
    }
}
