//! Presence: the runtime's row in `jobs_runtimes`, seen again every few seconds, and
//! the removal of rows of runtimes not seen for a while.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::Shared;
use crate::enqueue::millis;
use crate::sql;

/// How often a runtime marks itself seen.
const SEEN_EVERY: Duration = Duration::from_secs(5);

/// A runtime seen within this long is live, for the announcements of free shares
/// (`global::announce`): three rounds.
const LIVE_WITHIN: Duration = Duration::from_secs(15);

/// Rows of runtimes not seen for this long are removed.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(600);

/// How often a runtime removes stale rows.
const STALE_EVERY: Duration = Duration::from_secs(60);

/// What a runtime says of itself.
pub(super) struct Registration {
    id: Uuid,
    name: Option<String>,
    host: String,
    pid: i32,
    kinds: Vec<String>,
    concurrency: i32,
    /// Its kinds' declared limits across runtimes (migration 15), for operators.
    limits: serde_json::Value,
}

impl Registration {
    pub(super) fn new(name: Option<String>, shared: &Shared, concurrency: usize) -> Self {
        Registration {
            id: shared.runtime_id,
            name,
            host: host(),
            pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
            kinds: shared.handlers.keys().map(|k| (*k).to_owned()).collect(),
            concurrency: i32::try_from(concurrency).unwrap_or(i32::MAX),
            limits: declared_limits(shared),
        }
    }
}

/// The limits its kinds declare (`global_concurrency`, `rate`, `partition`), by kind;
/// kinds without any are left out.
fn declared_limits(shared: &Shared) -> serde_json::Value {
    let kinds = shared.handlers.values().filter_map(|h| {
        let c = &h.config;
        (c.global_concurrency.is_some() || c.rate.is_some()).then(|| {
            let limits = serde_json::json!({
                "concurrency": c.global_concurrency,
                "rate_starts": c.rate.map(|r| r.starts),
                "rate_ms": c.rate.map(|r| millis(r.per)),
                "partition": c.partition,
            });
            (h.kind.to_owned(), limits)
        })
    });
    serde_json::Value::Object(kinds.collect())
}

/// The machine's host name, where the system says it (Linux), else `HOSTNAME`.
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default()
}

/// Registers, then marks the runtime seen every `SEEN_EVERY` and removes stale rows
/// every `STALE_EVERY`, until aborted. Errors are logged and retried at the next round:
/// presence is for operators, never a reason to stop.
pub(super) async fn run(shared: Arc<Shared>, me: Registration) {
    let mut last_stale: Option<std::time::Instant> = None;
    loop {
        let seen = crate::pooler::alone!(
            &shared.db,
            crate::pooler::query_scalar::<_, Vec<String>>(sql::RUNTIME_SEEN)
                .bind(me.id)
                .bind(me.name.as_deref())
                .bind(&me.host)
                .bind(me.pid)
                .bind(env!("CARGO_PKG_VERSION"))
                .bind(&me.kinds)
                .bind(me.concurrency)
                .bind(&me.limits)
                .bind(millis(LIVE_WITHIN)),
            fetch_one
        );
        match super::answer_within(shared.answer_within, "the runtime's presence", seen).await {
            Ok(kinds) => {
                *shared
                    .freed
                    .claimed_elsewhere
                    .lock()
                    .expect("lock poisoned") = Some(kinds.into_iter().collect());
            }
            Err(e) => {
                tracing::debug!(error = %crate::error::server_message(&e), "cannot mark this runtime seen");
            }
        }
        if last_stale.is_none_or(|at| at.elapsed() >= STALE_EVERY) {
            last_stale = Some(std::time::Instant::now());
            let stale = crate::pooler::alone!(
                &shared.db,
                crate::pooler::query(sql::RUNTIMES_STALE).bind(millis(STALE_AFTER)),
                execute
            );
            match super::answer_within(shared.answer_within, "the stale runtimes", stale).await {
                Ok(r) if r.rows_affected() > 0 => {
                    tracing::info!(
                        removed = r.rows_affected(),
                        "removed runtimes not seen for 10 minutes"
                    );
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %crate::error::server_message(&e), "cannot remove stale runtimes")
                }
            }
        }
        tokio::time::sleep(SEEN_EVERY).await;
    }
}

/// Removes the runtime's row at a clean shutdown (best effort, bounded).
pub(super) async fn gone(db: &PgPool, id: Uuid) {
    let delete = crate::pooler::alone!(
        db,
        crate::pooler::query(sql::RUNTIME_GONE).bind(id),
        execute
    );
    if let Err(e) =
        super::answer_within(Duration::from_secs(5), "the runtime's removal", delete).await
    {
        tracing::debug!(error = %crate::error::server_message(&e), "cannot remove this runtime's row; it goes once stale");
    }
}
