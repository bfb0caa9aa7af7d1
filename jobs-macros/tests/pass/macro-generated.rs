// Jobs and handlers written by a macro_rules macro: values passed as `expr` fragments
// reach the derive wrapped in invisible groups, and tokens passed as `ident` or `ty`
// fragments have the hygiene of the macro's caller.
#![deny(warnings)]

use std::time::Duration;

use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

macro_rules! job {
    (
        $ty:ident, $handler:ident, $ctx:ident, $ret:ty,
        $kind:expr, $attempts:expr, $lease:expr, $cancel:expr
    ) => {
        #[derive(Job, Serialize, Deserialize)]
        #[job(kind = $kind, key = "id", max_attempts = $attempts, lease = $lease)]
        #[job(cancel_on_lease_loss = $cancel)]
        struct $ty {
            id: i64,
        }

        #[jobs::handler]
        async fn $handler(job: $ty, ctx: $ctx) -> $ret {
            let _ = (job.id, ctx.id());
            Ok(())
        }
    };
}

job!(
    Archive,
    archive,
    JobContext,
    Result<(), JobError>,
    "macro.archive",
    3,
    "1m",
    false
);

#[test]
fn jobs_written_by_a_macro_expand() {
    assert_eq!(Archive::KIND, "macro.archive");
    assert_eq!(Archive::CONFIG.max_attempts, 3);
    assert_eq!(
        Archive::CONFIG.lease,
        jobs::Lease::Heartbeat(Duration::from_secs(60))
    );
    const { assert!(!Archive::CONFIG.cancel_on_lease_loss) };
    assert_eq!(Archive { id: 4 }.key().as_deref(), Some("4"));
}
