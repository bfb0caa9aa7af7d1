//! Why does this job wait? `jobs::admin::explain` gives each reason, made to happen here
//! with real runtimes where one can hold it (a limit's shares, a rate's window, a claim),
//! and from the runtimes' reports where a runtime would not leave the job waiting (a
//! runtime alive between two claims).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Running, runtime, wait_until};
use jobs::admin::{self, JobState, Wait};
use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// Runs until its runtime stops (its handler is dropped then).
async fn hold() -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_secs(3600)).await;
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "why.limited", global_concurrency = 1)]
struct Limited {
    n: u32,
}

#[jobs::handler]
async fn limited(_job: Limited, _ctx: JobContext) -> Result<(), JobError> {
    hold().await
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "why.tenant", global_concurrency = 1, partition = "tenant")]
struct PerTenant {
    tenant: String,
}

#[jobs::handler]
async fn per_tenant(_job: PerTenant, _ctx: JobContext) -> Result<(), JobError> {
    hold().await
}

static RATED_RUNS: AtomicUsize = AtomicUsize::new(0);

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "why.rated", rate = "1/1h")]
struct Rated {
    n: u32,
}

#[jobs::handler]
async fn rated(_job: Rated, _ctx: JobContext) -> Result<(), JobError> {
    RATED_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "why.plain")]
struct Plain {
    n: u32,
}

#[jobs::handler]
async fn plain(_job: Plain, _ctx: JobContext) -> Result<(), JobError> {
    hold().await
}

async fn reasons(pool: &PgPool, id: i64) -> Vec<Wait> {
    admin::explain(pool, id)
        .await
        .unwrap()
        .expect("the job exists")
        .reasons
}

async fn running(pool: &PgPool, kind: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE kind = $1 AND state = 'running'")
        .bind(kind)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Registers a runtime alive now that claims `kinds`, as a runtime reports itself
/// between two claims.
async fn register(pool: &PgPool, name: &str, kinds: &[&str]) -> uuid::Uuid {
    let id = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO jobs_runtimes (id, name, host, pid, version, kinds, concurrency) \
         VALUES ($1, $2, 'host-1', 1, '0', $3, 10)",
    )
    .bind(id)
    .bind(name)
    .bind(kinds)
    .execute(pool)
    .await
    .unwrap();
    id
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn no_such_job_has_no_explanation(pool: PgPool) {
    assert_eq!(admin::explain(&pool, 4242).await.unwrap(), None);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_due_later_of_a_paused_kind_with_no_runtime_has_all_three(pool: PgPool) {
    let id = Plain { n: 1 }
        .enqueue_in(&pool, Duration::from_secs(3600))
        .await
        .unwrap()
        .id;
    admin::pause(&pool, "why.plain").await.unwrap();
    let why = admin::explain(&pool, id).await.unwrap().unwrap();
    assert_eq!(
        (why.kind.as_str(), why.state),
        ("why.plain", JobState::Pending)
    );
    let [
        Wait::Scheduled { at },
        Wait::Paused { .. },
        Wait::NoRuntime { alive },
    ] = why.reasons.as_slice()
    else {
        panic!("{:?}", why.reasons)
    };
    let ahead = *at - why.at;
    assert!(ahead > chrono::Duration::minutes(59), "{ahead}");
    assert!(alive.is_empty());
    assert_eq!(
        why.reasons[2].to_string(),
        "no runtime claims its kind: none is alive"
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_due_job_names_the_runtimes_alive_when_none_claims_its_kind(pool: PgPool) {
    let id = Plain { n: 1 }.enqueue(&pool).await.unwrap().id;
    register(&pool, "mailer", &["mail.send", "mail.bounce"]).await;
    let reasons = reasons(&pool, id).await;
    let [Wait::NoRuntime { alive }] = reasons.as_slice() else {
        panic!("{reasons:?}")
    };
    assert_eq!(alive.len(), 1);
    assert_eq!(alive[0].name.as_deref(), Some("mailer"));
    assert!(
        reasons[0]
            .to_string()
            .ends_with("on host-1) with mail.send, mail.bounce"),
        "{}",
        reasons[0]
    );

    // A runtime of its kind, alive between two claims: nothing holds it up.
    register(&pool, "worker", &["why.plain"]).await;
    assert_eq!(reasons_of(&pool, id).await, [Wait::Ready]);
}

async fn reasons_of(pool: &PgPool, id: i64) -> Vec<Wait> {
    reasons(pool, id).await
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_behind_others_says_how_many_come_first(pool: PgPool) {
    register(&pool, "worker", &["why.plain"]).await;
    let opts = |priority| jobs::EnqueueOptions::new().priority(priority);
    let last = Plain { n: 1 }
        .enqueue_with(&pool, opts(5))
        .await
        .unwrap()
        .id;
    Plain { n: 2 }.enqueue_with(&pool, opts(0)).await.unwrap();
    Plain { n: 3 }.enqueue_with(&pool, opts(0)).await.unwrap();
    // Later in claim order than `last` (same priority, later run-after): not ahead.
    Plain { n: 4 }.enqueue_with(&pool, opts(5)).await.unwrap();
    assert_eq!(reasons(&pool, last).await, [Wait::Behind { ahead: 2 }]);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_of_a_kind_at_its_limit_names_the_runtime_that_holds_the_share(pool: PgPool) {
    let first = Limited { n: 1 }.enqueue(&pool).await.unwrap().id;
    let second = Limited { n: 2 }.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["why.limited"]).name("worker-a"));
    wait_until("one job runs", || async {
        running(&pool, "why.limited").await == 1
    })
    .await;
    let state = |id| {
        let pool = pool.clone();
        async move { admin::get(&pool, id).await.unwrap().unwrap().state }
    };
    let (held, waiting) = if state(first).await == JobState::Running {
        (first, second)
    } else {
        (second, first)
    };
    let reasons = reasons(&pool, waiting).await;
    let [
        Wait::AtLimit {
            limit: 1,
            partition: None,
            holders,
        },
    ] = reasons.as_slice()
    else {
        panic!("{reasons:?}")
    };
    let [(Some(holder), 1)] = holders.as_slice() else {
        panic!("{holders:?}")
    };
    assert_eq!(holder.name.as_deref(), Some("worker-a"));
    assert!(
        reasons[0].to_string().starts_with(
            "its kind is at its global concurrency: 1 running of 1, held by 1 by runtime worker-a ("
        ),
        "{}",
        reasons[0]
    );

    // The job that holds the share is claimed, by that runtime, under a lease.
    let claimed = reasons_of(&pool, held).await;
    let [
        Wait::Claimed {
            runtime: Some(by),
            until: Some(_),
        },
    ] = claimed.as_slice()
    else {
        panic!("{claimed:?}")
    };
    assert_eq!(by.name.as_deref(), Some("worker-a"));

    // An operator's limit wins over the attribute: with room, nothing holds it up.
    admin::set_limits(
        &pool,
        "why.limited",
        admin::KindLimits::default().concurrency(2),
    )
    .await
    .unwrap();
    let reasons = reasons_of(&pool, waiting).await;
    assert!(
        !reasons.iter().any(|r| matches!(r, Wait::AtLimit { .. })),
        "{reasons:?}"
    );
    rt.stop().await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_of_a_partition_at_its_limit_says_which_partition(pool: PgPool) {
    let tenant = |t: &str| PerTenant { tenant: t.into() };
    tenant("acme").enqueue(&pool).await.unwrap();
    let waiting = tenant("acme").enqueue(&pool).await.unwrap().id;
    let other = tenant("globex").enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["why.tenant"]));
    wait_until("a job of each tenant runs", || async {
        running(&pool, "why.tenant").await == 2
    })
    .await;
    let reasons = reasons(&pool, waiting).await;
    let [
        Wait::AtLimit {
            limit: 1,
            partition: Some(p),
            holders,
        },
    ] = reasons.as_slice()
    else {
        panic!("{reasons:?}")
    };
    assert_eq!(p, &serde_json::json!(["acme"]));
    assert_eq!(
        holders.iter().map(|(_, n)| n).sum::<u64>(),
        1,
        "acme's alone"
    );
    assert!(reasons[0].to_string().contains("(partition [\"acme\"])"));
    assert!(matches!(
        reasons_of(&pool, other).await.as_slice(),
        [Wait::Claimed { .. }]
    ));
    rt.stop().await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_of_a_kind_whose_rate_is_full_says_until_when(pool: PgPool) {
    Rated { n: 1 }.enqueue(&pool).await.unwrap();
    let second = Rated { n: 2 }.enqueue(&pool).await.unwrap().id;
    let rt = Running::start(runtime(&pool, &["why.rated"]));
    wait_until("one job ran", || async {
        RATED_RUNS.load(Ordering::SeqCst) == 1
    })
    .await;
    let why = admin::explain(&pool, second).await.unwrap().unwrap();
    let [
        Wait::RateFull {
            limit: 1,
            per,
            starts: 1,
            partition: None,
            until: Some(until),
        },
    ] = why.reasons.as_slice()
    else {
        panic!("{:?}", why.reasons)
    };
    assert_eq!(*per, Duration::from_secs(3600));
    // The window, and the margin within which the claim's runtime could have started
    // it (a second for a window of an hour, plus its round trips), counted as the
    // claims count it.
    let left = *until - why.at;
    assert!(
        left > chrono::Duration::minutes(59) && left <= chrono::Duration::seconds(3610),
        "{left}"
    );
    rt.stop().await;
    assert_eq!(RATED_RUNS.load(Ordering::SeqCst), 1);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_ended_job_is_not_waiting(pool: PgPool) {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (kind, state, max_attempts, payload, finished_at, last_error) \
         VALUES ('why.plain', 'failed', 1, '{\"n\": 1}', now(), 'boom') RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let reasons = reasons(&pool, id).await;
    assert_eq!(reasons, [Wait::Ended(JobState::Failed)]);
    assert_eq!(reasons[0].to_string(), "not waiting: it is failed");
}
