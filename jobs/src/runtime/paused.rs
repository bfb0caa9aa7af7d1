//! The kinds an operator has paused, as the producer last read them.

use std::time::Instant;

use sqlx::Postgres;
use sqlx::pool::PoolConnection;

use super::Shared;
use crate::sql;

/// The kinds an operator has paused (`jobs::admin::pause`), as last read.
#[derive(Default)]
pub(super) struct Paused {
    pub(super) kinds: std::collections::HashSet<String>,
    pub(super) read_at: Option<Instant>,
}

impl Paused {
    /// Reads the paused kinds again; keeps the last reading if the database does not
    /// answer (the claim that follows reports the outage).
    pub(super) async fn read(
        &mut self,
        shared: &Shared,
        conn: &mut Option<PoolConnection<Postgres>>,
    ) {
        let query = async {
            let c = super::held(conn, &shared.db).await?;
            crate::pooler::alone!(
                &mut **c,
                crate::pooler::query_scalar::<_, String>(sql::PAUSED_KINDS),
                fetch_all
            )
            .await
        };
        self.read_at = Some(Instant::now());
        match super::answer_within(shared.answer_within, "the paused kinds", query).await {
            Ok(kinds) => {
                let kinds: std::collections::HashSet<String> = kinds.into_iter().collect();
                for kind in kinds.difference(&self.kinds) {
                    tracing::info!(job.kind = %kind, "kind paused: not claiming it");
                }
                for kind in self.kinds.difference(&kinds) {
                    tracing::info!(job.kind = %kind, "kind resumed");
                }
                self.kinds = kinds;
            }
            Err(e) => {
                *conn = None;
                tracing::debug!(error = %crate::error::server_message(&e), "cannot read the paused kinds");
            }
        }
    }
}
