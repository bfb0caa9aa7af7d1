// A kind whose claim, writes and completion are one transaction.
#![deny(warnings)]

use jobs::{Job, JobContext, JobError, Lease};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "ledger.post", key = "entry_id", lease = "transaction")]
struct PostEntry {
    entry_id: i64,
    amount: i64,
}

#[jobs::handler]
async fn post_entry(job: PostEntry, ctx: JobContext) -> Result<(), JobError> {
    let mut tx = ctx.tx().await?;
    jobs::sqlx::query("UPDATE ledger SET balance = balance + $1 WHERE id = $2")
        .bind(job.amount)
        .bind(job.entry_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

#[test]
fn a_transaction_mode_kind_expands() {
    assert_eq!(PostEntry::CONFIG.lease, Lease::Transaction);
    assert_eq!(
        PostEntry {
            entry_id: 3,
            amount: 10
        }
        .key()
        .as_deref(),
        Some("3")
    );
}
