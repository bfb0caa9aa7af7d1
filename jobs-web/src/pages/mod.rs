//! One file per page: its handler and its markup.

pub(crate) mod action;
pub(crate) mod job;
pub(crate) mod jobs;
pub(crate) mod login;
pub(crate) mod overview;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// The database's clock: every relative time on a page is measured against it, as the
/// jobs' times are written by it.
pub(crate) async fn db_now(pool: &PgPool) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar("SELECT now()").fetch_one(pool).await
}
