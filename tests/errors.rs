//! Handlers that return `anyhow::Result<()>` or `eyre::Result<()>` (features `anyhow`
//! and `eyre`): `?` works on any error, and a `JobError` passed through keeps its
//! meaning.

use anyhow::Context as _;
use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "errors.anyhow")]
struct WithAnyhow {
    case: u8,
}

#[jobs::handler]
async fn with_anyhow(job: WithAnyhow, ctx: JobContext) -> anyhow::Result<()> {
    match job.case {
        // Any error, with context: retried, its chain as the message.
        0 => {
            let n: i32 = "forty-two".parse().context("reading the count")?;
            anyhow::ensure!(n > 0, "a positive count");
        }
        // A JobError through `?`: kept as it is.
        1 => Err(JobError::permanent("the invoice is void"))?,
        // The context's own methods, with `?`.
        _ => ctx.fenced_tx().await?.commit().await?,
    }
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "errors.eyre")]
struct WithEyre {
    case: u8,
}

#[jobs::handler]
async fn with_eyre(job: WithEyre, ctx: JobContext) -> eyre::Result<()> {
    use eyre::WrapErr as _;
    match job.case {
        0 => {
            let _: i32 = "forty-two".parse().wrap_err("reading the count")?;
        }
        1 => Err(JobError::permanent("the invoice is void"))?,
        _ => ctx.fenced_tx().await?.commit().await?,
    }
    Ok(())
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_anyhow_handler_is_retried_with_the_chain_and_keeps_a_job_error(pool: PgPool) {
    let e = jobs::testing::perform(&pool, &WithAnyhow { case: 0 })
        .await
        .unwrap_err();
    assert!(!e.is_permanent());
    assert_eq!(
        e.to_string(),
        "reading the count: invalid digit found in string"
    );
    let e = jobs::testing::perform(&pool, &WithAnyhow { case: 1 })
        .await
        .unwrap_err();
    assert!(e.is_permanent(), "{e:?}");
    assert!(e.to_string().contains("the invoice is void"), "{e}");
    jobs::testing::perform(&pool, &WithAnyhow { case: 2 })
        .await
        .unwrap();
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_eyre_handler_is_retried_with_the_chain_and_keeps_a_job_error(pool: PgPool) {
    let e = jobs::testing::perform(&pool, &WithEyre { case: 0 })
        .await
        .unwrap_err();
    assert!(!e.is_permanent());
    assert!(e.to_string().starts_with("reading the count"), "{e}");
    assert!(
        e.to_string().contains("invalid digit found in string"),
        "{e}"
    );
    let e = jobs::testing::perform(&pool, &WithEyre { case: 1 })
        .await
        .unwrap_err();
    assert!(e.is_permanent(), "{e:?}");
    jobs::testing::perform(&pool, &WithEyre { case: 2 })
        .await
        .unwrap();
}
