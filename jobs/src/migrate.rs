//! The project's migrations, kept in their own history table.

use std::borrow::Cow;
use std::sync::LazyLock;

use sqlx::migrate::Migrator;

use crate::error::Error;

/// The history table of this crate's migrations. An application that runs its own sqlx
/// migrations in the same database keeps its history in `_sqlx_migrations`; with one
/// shared table each migrator would reject the other's versions as unknown.
pub const MIGRATIONS_TABLE: &str = "_jobs_migrations";

/// The migrations of `jobs/migrations/`, recording their history in [`MIGRATIONS_TABLE`].
///
/// Use it with `#[sqlx::test(migrator = "jobs::MIGRATOR")]` to get a test database with
/// the job table in place.
pub static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.dangerous_set_table_name(Cow::Borrowed(MIGRATIONS_TABLE));
    migrator
});

/// Creates or upgrades the job table.
///
/// Safe to call from every replica at start: sqlx takes a database-wide advisory lock
/// around the run (the same lock an application's own sqlx migrator takes), so
/// concurrent calls run one after the other and the later ones find nothing to do.
pub async fn migrate(pool: &sqlx::PgPool) -> Result<(), Error> {
    MIGRATOR.run(pool).await?;
    Ok(())
}
