//! What operators set per kind, as the producer last read it: the paused kinds, and the
//! kinds' global limits.

use std::time::Instant;

use super::Shared;
use crate::sql;

/// The kinds an operator has paused (`jobs::admin::pause`), as last read. The limits
/// read with them go to [`Shared`]'s `limits`, where the executors read them too.
///
/// Fails closed: until a reading succeeds, and after one fails for any reason but an
/// outage (a revoked grant, say), every kind counts as paused, so that no kind an
/// operator paused runs because its pause could not be read. An outage keeps the last
/// reading: the claims cannot reach the database either.
#[derive(Default)]
pub(super) struct Paused {
    kinds: std::collections::HashSet<String>,
    pub(super) read_at: Option<Instant>,
    /// Whether `kinds` holds a reading that still stands.
    known: bool,
}

impl Paused {
    /// Whether `kind` is not to be claimed: paused, or its pause state unknown.
    pub(super) fn holds(&self, kind: &str) -> bool {
        !self.known || self.kinds.contains(kind)
    }

    /// Whether some kind is not to be claimed for that reason.
    pub(super) fn holds_any(&self) -> bool {
        !self.known || !self.kinds.is_empty()
    }

    /// Reads the paused kinds and the limits again; keeps the last reading if the
    /// database does not answer (the claim that follows reports the outage).
    pub(super) async fn read(&mut self, shared: &Shared, conn: &mut Option<super::HeldConn>) {
        let query = async {
            let held = super::HeldConn::get(conn, &shared.db).await?;
            crate::pooler::alone!(
                &mut *held.conn,
                crate::pooler::query_as::<_, (String, bool, Option<i32>, Option<i32>, Option<i64>)>(
                    sql::KIND_SETTINGS,
                ),
                fetch_all
            )
            .await
        };
        let first = self.read_at.is_none();
        self.read_at = Some(Instant::now());
        match super::answer_within(shared.answer_within, "the paused kinds", query).await {
            Ok(rows) => {
                let kinds: std::collections::HashSet<String> = rows
                    .iter()
                    .filter(|(_, paused, ..)| *paused)
                    .map(|(kind, ..)| kind.clone())
                    .collect();
                for kind in kinds.difference(&self.kinds) {
                    tracing::info!(job.kind = %kind, "kind paused: not claiming it");
                }
                for kind in self.kinds.difference(&kinds) {
                    tracing::info!(job.kind = %kind, "kind resumed");
                    // Its jobs came without a wake-up that asked for it: the next
                    // claim asks for it, quiet or not.
                    if let Some((&kind, _)) = shared.handlers.get_key_value(kind.as_str()) {
                        shared.wake.named().insert(kind);
                    }
                }
                if !self.known && self.read_at.is_some() {
                    tracing::info!("the paused kinds are read again: claiming");
                }
                self.kinds = kinds;
                self.known = true;
                let set: Vec<super::global::Set> = rows
                    .into_iter()
                    .filter(|(_, paused, ..)| !*paused)
                    .map(|(kind, _, n, starts, ms)| (kind, n, starts, ms))
                    .collect();
                shared.set_limits(super::global::effective(&shared.handlers, &set));
            }
            Err(e) => {
                *conn = None;
                let outage = crate::migrate::is_transient(&e);
                if self.known && outage {
                    tracing::debug!(error = %crate::error::server_message(&e), "cannot read the paused kinds; keeping the last reading");
                } else if self.known || first {
                    // Once per change from known to unknown, not at every poll.
                    tracing::warn!(
                        error = %crate::error::server_message(&e),
                        "cannot read which kinds are paused (jobs_paused, jobs_limits): claiming no kind until they can be read"
                    );
                    self.known = false;
                } else {
                    tracing::debug!(error = %crate::error::server_message(&e), "still cannot read the paused kinds");
                }
            }
        }
    }
}
