//! Reaching PostgreSQL through a connection pooler in transaction mode.
//!
//! A pooler in transaction mode (PgBouncer's `pool_mode = transaction`) lends a server
//! connection to a client for one transaction at a time. Two things the library does
//! by default do not survive that:
//!
//! - `LISTEN`: notifications go to whichever server connection listened, which the
//!   pooler has lent to someone else since. Behind a pooler the runtime does not listen;
//!   it polls every [`Runtime::poll_interval`](crate::Runtime::poll_interval).
//! - Prepared statements. sqlx prepares every statement: by default under a name it
//!   caches per connection, and a pooler that does not track prepared statements
//!   (PgBouncer before 1.21, or with `max_prepared_statements = 0`) may send the next
//!   use of that name to a server connection where it does not exist, or where another
//!   client prepared another statement under it. Unnamed statements are no cure by
//!   themselves: sqlx parses one in one round trip and binds it in the next, and outside
//!   a transaction the pooler may send those two round trips to two server connections.
//!
//! After [`behind_transaction_pooler`], every statement of this library is unnamed, and
//! every statement of the runtime runs in an explicit transaction (of its own, or a
//! completion round's two in one), which keeps its two round trips on one server
//! connection. That costs two more round trips per transaction; the job table's
//! protocol is unchanged.

use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::{Query, QueryAs, QueryScalar};

static BEHIND: AtomicBool = AtomicBool::new(false);

/// Tells this process that it reaches PostgreSQL through a pooler in transaction mode
/// (PgBouncer's `pool_mode = transaction`). Call it once, at the start of every process
/// that enqueues or runs jobs through such a pooler, before it does either.
///
/// From then on:
///
/// - runtimes do not `LISTEN` (notifications do not cross such a pooler): they poll
///   every [`poll_interval`](crate::Runtime::poll_interval), so set it to the pickup
///   delay you accept (100 ms costs an idle replica ten small queries a second);
/// - every statement of this library is sent unnamed, and every statement of a runtime
///   runs in a transaction (of its own, or a completion round's two in one), so that
///   they work whether or not the pooler tracks prepared statements.
///
/// Your own calls of [`Job::enqueue`](crate::Job::enqueue),
/// [`EnqueueBatch::enqueue`](crate::EnqueueBatch::enqueue) and the
/// [`admin`](crate::admin) functions run on the executor you give them. Behind a pooler
/// that does not track prepared statements (PgBouncer before 1.21), give them a
/// transaction (`&mut *tx`), never the pool: outside a transaction the pooler may bind
/// an unnamed statement on another server connection than the one that parsed it. The
/// same holds for your own sqlx queries there (`.persistent(false)`, in a transaction).
/// With PgBouncer 1.21 or later and `max_prepared_statements` set, any executor works.
///
/// The pooler must accept sqlx's startup parameters: PgBouncer needs
/// `ignore_startup_parameters = extra_float_digits`. Session settings do not cross it
/// either: give the database role its `search_path` (`ALTER ROLE ... SET search_path`)
/// rather than a connect hook. Run [`migrate`](crate::migrate) on a direct connection:
/// its lock is a session's advisory lock.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// jobs::behind_transaction_pooler();
/// let pool = jobs::sqlx::PgPool::connect("postgres://app@pgbouncer:6432/app").await?;
/// jobs::Runtime::new(pool)
///     .poll_interval(std::time::Duration::from_millis(100))
///     .run()
///     .await?;
/// # Ok(()) }
/// ```
pub fn behind_transaction_pooler() {
    BEHIND.store(true, Ordering::Relaxed);
}

/// Whether [`behind_transaction_pooler`] was called in this process.
pub(crate) fn behind() -> bool {
    BEHIND.load(Ordering::Relaxed)
}

/// [`sqlx::query`], unnamed behind a transaction pooler.
pub(crate) fn query<'q, S: sqlx::SqlSafeStr>(sql: S) -> Query<'q, Postgres, PgArguments> {
    sqlx::query(sql).persistent(!behind())
}

/// [`sqlx::query_as`], unnamed behind a transaction pooler.
pub(crate) fn query_as<'q, S: sqlx::SqlSafeStr, O>(sql: S) -> QueryAs<'q, Postgres, O, PgArguments>
where
    O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    sqlx::query_as(sql).persistent(!behind())
}

/// [`sqlx::query_scalar`], unnamed behind a transaction pooler.
pub(crate) fn query_scalar<'q, S: sqlx::SqlSafeStr, O>(
    sql: S,
) -> QueryScalar<'q, Postgres, O, PgArguments>
where
    (O,): for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    sqlx::query_scalar(sql).persistent(!behind())
}

/// `$query.$run(executor)`, where `executor` is a `&mut PgConnection` or a `&PgPool`:
/// as it is, or behind a transaction pooler, in a transaction of its own (see the
/// module's documentation). A future of `Result<_, sqlx::Error>`.
macro_rules! alone {
    ($executor:expr, $query:expr, $run:ident) => {
        async {
            let executor = $executor;
            if $crate::pooler::behind() {
                let mut tx = sqlx::Acquire::begin(executor).await?;
                let out = $query.$run(&mut *tx).await?;
                tx.commit().await?;
                Ok(out)
            } else {
                $query.$run(executor).await
            }
        }
    };
}
pub(crate) use alone;
