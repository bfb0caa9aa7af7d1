//! Two types declaring one kind, and two handlers for one kind, stop the runtime at
//! start with an error that names them. (A binary of its own: the registry is global.)

use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "dup.kind")]
struct First {}

mod other {
    use super::*;

    #[derive(Job, Serialize, Deserialize)]
    #[job(kind = "dup.kind")]
    pub struct Second {}
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "dup.handled")]
struct Handled {}

#[jobs::handler]
async fn first(_job: First, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[jobs::handler]
async fn handled_once(_job: Handled, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[jobs::handler]
async fn handled_twice(_job: Handled, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[tokio::test]
async fn duplicates_are_an_error_at_start() {
    let _ = other::Second {};
    // Never connected: the check happens before the runtime touches the database.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap();
    let err = jobs::Runtime::new(pool)
        .run_until(async {})
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, jobs::Error::Registry(_)), "{err:?}");
    assert!(
        text.contains("kind `dup.kind` is declared by more than one type"),
        "{text}"
    );
    assert!(
        text.contains("registry_duplicate::First")
            && text.contains("registry_duplicate::other::Second"),
        "{text}"
    );
    assert!(
        text.contains("kind `dup.handled` has more than one handler"),
        "{text}"
    );
    assert!(
        text.contains("handled_once") && text.contains("handled_twice"),
        "{text}"
    );
}

/// A binary that only enqueues learns of a kind declared twice at its first enqueue of
/// either type, before anything is written. (Before, it enqueued both without a word.)
#[tokio::test]
async fn an_enqueue_of_a_kind_declared_twice_is_refused() {
    // Never connected: the check happens before the enqueue touches the database.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_millis(200))
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap();
    for err in [
        First {}.enqueue(&pool).await.unwrap_err(),
        other::Second {}.enqueue(&pool).await.unwrap_err(),
    ] {
        assert!(matches!(err, jobs::Error::Registry(_)), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("kind `dup.kind` is declared by more than one type")
                && text.contains("registry_duplicate::other::Second"),
            "{text}"
        );
    }
    // A kind declared once enqueues (here: fails to connect, past the check).
    let err = Handled {}.enqueue(&pool).await.unwrap_err();
    assert!(!matches!(err, jobs::Error::Registry(_)), "{err:?}");
}
