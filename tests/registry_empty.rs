//! A binary with no handler linked in: the runtime refuses to start and says why.

use jobs::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "nobody.handles.me")]
struct Unhandled {}

#[tokio::test]
async fn no_handler_is_an_error_at_start() {
    let _ = Unhandled {};
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap();
    let err = jobs::run(pool).await.unwrap_err();
    assert!(matches!(err, jobs::Error::Registry(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("no job handler is linked into this binary"),
        "{err}"
    );
    assert!(err.to_string().contains("use that_crate as _;"), "{err}");
}
