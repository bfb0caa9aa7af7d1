//! Priority: among the due jobs of a kind, a lower number is claimed first, then the
//! earlier run-after.

mod common;

use std::time::Duration;

use common::{Running, runtime, wait_until};
use jobs::{EnqueueOptions, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pr.work", key = "n")]
struct Work {
    n: i64,
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pr.urgent", priority = 2)]
struct Urgent {}

#[jobs::handler]
async fn work(job: Work, ctx: JobContext) -> Result<(), JobError> {
    run(job.n, &ctx).await
}

/// Records the run of job `n` in `ran`, then works 5 ms.
async fn run(n: i64, ctx: &JobContext) -> Result<(), JobError> {
    sqlx::query("INSERT INTO ran (n, at) VALUES ($1, clock_timestamp())")
        .bind(n)
        .execute(ctx.pool())
        .await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(())
}

#[jobs::handler]
async fn urgent(_job: Urgent, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

/// How many recorded runs meet `condition` (SQL over `ran (n, at)`).
async fn ran(pool: &PgPool, condition: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM ran WHERE {condition}"
    )))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Enqueues `Work { n }` at `priority`, due `ago_ms` in the past.
async fn enqueue(pool: &PgPool, n: i64, priority: i16, ago_ms: i64) -> i64 {
    let id = Work { n }
        .enqueue_with(pool, EnqueueOptions::new().priority(priority))
        .await
        .unwrap()
        .id;
    sqlx::query("UPDATE jobs SET run_after = now() - $2 * interval '1 millisecond' WHERE id = $1")
        .bind(id)
        .bind(ago_ms)
        .execute(pool)
        .await
        .unwrap();
    id
}

/// The first six columns of a claim's row: id, kind, attempt, max attempts, token,
/// payload.
type Claimed = (
    Option<i64>,
    Option<String>,
    Option<i32>,
    Option<i32>,
    Option<uuid::Uuid>,
    Option<String>,
);

/// Claims up to `n` jobs of the kinds with the runtime's statement `sql`, each kind
/// allowed `n`, with no floors; the claimed payloads' `n`, sorted.
async fn claim(
    pool: &PgPool,
    sql: &'static str,
    kinds: &[&str],
    each: i32,
    total: i32,
) -> Vec<i64> {
    // A claim that takes nothing returns one row, its report alone (the job's columns
    // NULL): the payload is the sixth column.
    let rows: Vec<Claimed> = sqlx::query_as(sql)
        .bind(kinds)
        .bind(vec![each; kinds.len()])
        .bind(vec![60_000i64; kinds.len()])
        .bind(total)
        .bind(Vec::<f64>::new())
        .bind(uuid::Uuid::nil())
        .bind(Vec::<i64>::new())
        .bind(Vec::<f64>::new())
        .fetch_all(pool)
        .await
        .unwrap();
    let mut ns: Vec<i64> = rows
        .iter()
        .filter_map(|r| serde_json::from_str::<serde_json::Value>(r.5.as_deref()?).ok())
        .filter_map(|v| v["n"].as_i64())
        .collect();
    ns.sort_unstable();
    ns
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_claim_takes_the_lower_priority_first_then_the_earlier_run_after(pool: PgPool) {
    // Five long-due jobs at priority 5, three recent ones at 1, one at 0 scheduled later.
    for n in 1..=5 {
        enqueue(&pool, n, 5, 10_000 - n).await;
    }
    for n in 11..=13 {
        enqueue(&pool, n, 1, 100 - n).await;
    }
    Work { n: 99 }
        .enqueue_with(
            &pool,
            EnqueueOptions::new()
                .priority(0)
                .delay(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    let claim_sql = jobs::__private::CLAIM_SQL;
    assert_eq!(
        claim(&pool, claim_sql, &["pr.work"], 4, 4).await,
        [1, 11, 12, 13]
    );
    assert_eq!(claim(&pool, claim_sql, &["pr.work"], 2, 2).await, [2, 3]);
    // The split claim (kinds' limits above the total) orders each kind the same way.
    enqueue(&pool, 21, 3, 1).await;
    Urgent {}.enqueue(&pool).await.unwrap();
    let split = jobs::__private::CLAIM_SPLIT_SQL;
    let got = claim(&pool, split, &["pr.work", "pr.urgent"], 3, 3).await;
    assert!(
        got.contains(&21),
        "priority 3 before the priority-5 backlog: {got:?}"
    );
    assert!(!got.contains(&99), "not due");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_kinds_default_priority_an_override_and_coalescing(pool: PgPool) {
    let id = Urgent {}.enqueue(&pool).await.unwrap().id;
    assert_eq!(
        jobs::admin::get(&pool, id).await.unwrap().unwrap().priority,
        2
    );
    let id = Urgent {}
        .enqueue_with(&pool, EnqueueOptions::new().priority(7))
        .await
        .unwrap()
        .id;
    assert_eq!(
        jobs::admin::get(&pool, id).await.unwrap().unwrap().priority,
        7
    );

    // A trigger coalesced into a pending job gives it the more urgent priority.
    let id = Work { n: 1 }
        .enqueue_with(&pool, EnqueueOptions::new().priority(6))
        .await
        .unwrap()
        .id;
    Work { n: 1 }
        .enqueue_with(&pool, EnqueueOptions::new().priority(8))
        .await
        .unwrap();
    assert_eq!(
        jobs::admin::get(&pool, id).await.unwrap().unwrap().priority,
        6
    );
    Work { n: 1 }
        .enqueue_with(&pool, EnqueueOptions::new().priority(3))
        .await
        .unwrap();
    assert_eq!(
        jobs::admin::get(&pool, id).await.unwrap().unwrap().priority,
        3
    );

    for bad in [-1, 10] {
        let err = Work { n: 2 }
            .enqueue_with(&pool, EnqueueOptions::new().priority(bad))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("from 0 (first) to 9"), "{err}");
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_urgent_job_overtakes_a_running_backlog(pool: PgPool) {
    sqlx::query("CREATE TABLE ran (n bigint, at timestamptz)")
        .execute(&pool)
        .await
        .unwrap();
    for n in 1..=300 {
        enqueue(&pool, n, 9, 0).await;
    }
    let rt = Running::start(runtime(&pool, &["pr.work"]).concurrency(2));
    wait_until("the backlog started", || async {
        ran(&pool, "true").await >= 20
    })
    .await;
    Work { n: 1_000 }
        .enqueue_with(&pool, EnqueueOptions::new().priority(0))
        .await
        .unwrap();
    wait_until("the urgent job ran", || async {
        ran(&pool, "n = 1000").await == 1
    })
    .await;
    let before: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ran WHERE at < (SELECT at FROM ran WHERE n = 1000)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    rt.stop().await;
    // It ran long before the backlog was done: only what was claimed ahead of it (and
    // what started before it was enqueued) ran first.
    assert!(before < 200, "{before} backlog jobs ran before it");
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pr.other")]
struct Other {
    n: i64,
}

#[jobs::handler]
async fn other(job: Other, ctx: JobContext) -> Result<(), JobError> {
    run(job.n, &ctx).await
}

/// Two busy kinds at one priority share claims equally; once one of them has urgent
/// jobs, more than a claim's share of them, they run before the other kind's backlog,
/// not beside it.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn urgent_jobs_of_one_busy_kind_overtake_another_kinds_backlog(pool: PgPool) {
    sqlx::query("CREATE TABLE ran (n bigint, at timestamptz)")
        .execute(&pool)
        .await
        .unwrap();
    for n in 1..=400 {
        enqueue(&pool, n, 9, 0).await;
        Other { n: 10_000 + n }
            .enqueue_with(&pool, EnqueueOptions::new().priority(9))
            .await
            .unwrap();
    }
    let rt = Running::start(runtime(&pool, &["pr.work", "pr.other"]).concurrency(2));
    wait_until("both backlogs started", || async {
        ran(&pool, "n > 10000").await >= 20
    })
    .await;
    // In one statement: enqueued one by one, the urgent jobs trickle in about as fast
    // as they run, and backlog jobs run between them whatever the claims do.
    let mut batch = jobs::EnqueueBatch::new();
    for n in 0..200 {
        batch
            .push_with(&Other { n: 20_000 + n }, EnqueueOptions::new().priority(0))
            .unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    wait_until("the urgent jobs ran", || async {
        ran(&pool, "n >= 20000").await == 200
    })
    .await;
    // Backlog jobs of the other kind that started while urgent ones waited: after the
    // first urgent job started, before the last one did.
    let beside = ran(
        &pool,
        "n <= 400 AND at > (SELECT min(at) FROM ran WHERE n >= 20000)
           AND at < (SELECT max(at) FROM ran WHERE n >= 20000)",
    )
    .await;
    rt.stop().await;
    // What was claimed ahead before they came, and one claim's share at most.
    assert!(
        beside < 60,
        "{beside} jobs of the other kind's backlog ran beside the urgent ones"
    );
}

/// One kind's urgent jobs, more than a claim takes of it, are held by another
/// transaction (`FOR UPDATE`) while a less urgent backlog of another kind waits: the
/// backlog runs meanwhile. The split claim shares a claim by what it reads without
/// locks: the held kind took the whole claim and locked none of it, and the backlog
/// waited for as long as the rows were held (so before this test, and so when the
/// claim's cut to a kind at its limit was made on that unlocked read).
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_less_urgent_backlog_runs_while_another_kinds_urgent_jobs_are_held(pool: PgPool) {
    sqlx::query("CREATE TABLE ran (n bigint, at timestamptz)")
        .execute(&pool)
        .await
        .unwrap();
    let mut batch = jobs::EnqueueBatch::new();
    for n in 0..100 {
        batch
            .push_with(&Other { n: 20_000 + n }, EnqueueOptions::new().priority(0))
            .unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM jobs WHERE kind = 'pr.other' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    for n in 1..=20 {
        enqueue(&pool, n, 5, 0).await;
    }
    let rt = Running::start(runtime(&pool, &["pr.work", "pr.other"]).concurrency(2));
    wait_until(
        "the backlog ran while the urgent jobs were held",
        || async { ran(&pool, "n <= 20").await == 20 },
    )
    .await;
    holder.rollback().await.unwrap();
    wait_until("the urgent jobs ran once released", || async {
        ran(&pool, "n >= 20000").await == 100
    })
    .await;
    rt.stop().await;
}
