//! The operators' API against a real database: list, get, retry, cancel, discard, stats
//! and prune, each fenced against the runtimes working at the same time.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use jobs::admin::{self, JobState, ListFilter, Order, Retried, RetriedKind};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use sqlx::types::chrono::{DateTime, Utc};

/// Inserts a job row: `run_in` seconds from now (negative: in the past), and for done
/// and failed rows finished `finished_ago` seconds ago.
async fn insert(
    pool: &PgPool,
    kind: &str,
    key: Option<&str>,
    state: &str,
    run_in: i64,
    finished_ago: Option<i64>,
) -> i64 {
    sqlx::query_scalar(
        r#"
        INSERT INTO jobs (kind, key, state, attempts, max_attempts, run_after, last_error,
                          payload, finished_at, claimed_by, claimed_until)
        VALUES ($1, $2, $3,
                CASE WHEN $3 = 'failed' THEN 3 WHEN $3 = 'pending' THEN 0 ELSE 1 END, 3,
                now() + $4 * interval '1 second',
                CASE WHEN $3 = 'failed' THEN 'boom: attempt 3 of 3' END,
                jsonb_build_object('kind', $1::text, 'key', $2::text),
                now() - $5 * interval '1 second',
                CASE WHEN $3 = 'running' THEN gen_random_uuid() END,
                CASE WHEN $3 = 'running' THEN now() + interval '5 minutes' END)
        RETURNING id
        "#,
    )
    .bind(kind)
    .bind(key)
    .bind(state)
    .bind(run_in)
    .bind(finished_ago)
    .fetch_one(pool)
    .await
    .expect("insert a job row")
}

async fn failed(pool: &PgPool, kind: &str, key: Option<&str>) -> i64 {
    insert(pool, kind, key, "failed", -60, Some(30)).await
}

async fn state_of(pool: &PgPool, id: i64) -> Option<String> {
    sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// Claims up to `n` jobs of `kind` with the runtime's own claim statement; the ids (a
/// claim that takes nothing returns one row with its report alone, its id NULL).
async fn claim(pool: &PgPool, kind: &str, n: i32) -> Vec<i64> {
    let rows: Vec<(Option<i64>,)> = sqlx::query_as(jobs::__private::CLAIM_SQL)
        .bind(vec![kind.to_owned()])
        .bind(vec![n])
        .bind(vec![Some(60_000_i64)])
        .bind(n)
        .bind(vec![f64::NEG_INFINITY])
        .bind(uuid::Uuid::nil())
        .bind(Vec::<i64>::new())
        .bind(Vec::<f64>::new())
        .fetch_all(pool)
        .await
        .expect("claim");
    rows.into_iter().filter_map(|r| r.0).collect()
}

/// Waits until some session of this test's database waits for a lock.
async fn until_someone_waits_for_a_lock(pool: &PgPool) {
    common::wait_until("a statement waiting for a lock", || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        waiting > 0
    })
    .await;
}

fn ids(rows: &[admin::JobRow]) -> Vec<i64> {
    rows.iter().map(|r| r.id).collect()
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn list_filters_by_state_and_kind(pool: PgPool) {
    let a_failed = failed(&pool, "a", None).await;
    let a_pending = insert(&pool, "a", Some("k"), "pending", 0, None).await;
    let b_failed = failed(&pool, "b", None).await;
    let b_done = insert(&pool, "b", None, "done", -10, Some(5)).await;

    let all = admin::list(&pool, &ListFilter::new()).await.unwrap();
    assert_eq!(
        ids(&all),
        [b_done, b_failed, a_pending, a_failed],
        "newest first"
    );

    let failed_rows = admin::list(&pool, &ListFilter::new().state(JobState::Failed))
        .await
        .unwrap();
    assert_eq!(ids(&failed_rows), [b_failed, a_failed]);
    assert!(
        failed_rows
            .iter()
            .all(|r| r.last_error.as_deref() == Some("boom: attempt 3 of 3"))
    );

    let of_a = admin::list(&pool, &ListFilter::new().kind("a").oldest_first())
        .await
        .unwrap();
    assert_eq!(ids(&of_a), [a_failed, a_pending]);

    let both = admin::list(&pool, &ListFilter::new().kind("b").state(JobState::Done))
        .await
        .unwrap();
    assert_eq!(ids(&both), [b_done]);
    assert!(
        admin::list(&pool, &ListFilter::new().kind("nope"))
            .await
            .unwrap()
            .is_empty()
    );

    let err = admin::list(&pool, &ListFilter::new().limit(0))
        .await
        .unwrap_err();
    assert!(matches!(err, jobs::Error::InvalidInput(_)), "{err:?}");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn list_pages_by_id_in_both_orders(pool: PgPool) {
    let mut all = Vec::new();
    for i in 0..23 {
        let state = if i % 3 == 0 { "failed" } else { "pending" };
        all.push(insert(&pool, "p", None, state, 0, Some(1)).await);
    }
    let failed_ids: Vec<i64> = all.iter().copied().step_by(3).collect();

    for (filter, expected) in [
        (ListFilter::new().oldest_first(), all.clone()),
        (
            ListFilter::new(),
            all.iter().rev().copied().collect::<Vec<_>>(),
        ),
        (
            ListFilter::new().state(JobState::Failed),
            failed_ids.iter().rev().copied().collect(),
        ),
    ] {
        let mut seen = Vec::new();
        let mut page_filter = filter.clone().limit(5);
        loop {
            let page = admin::list(&pool, &page_filter).await.unwrap();
            assert!(page.len() <= 5);
            seen.extend(ids(&page));
            if filter.order == Order::NewestFirst {
                // A job enqueued between pages has a higher id: it never shifts the
                // next page of a newest-first listing (as an offset would).
                insert(&pool, "p", None, "done", 0, Some(1)).await;
            }
            match page.last() {
                Some(last) if page.len() == 5 => page_filter = page_filter.after(last.id),
                _ => break,
            }
        }
        assert_eq!(seen, expected, "{filter:?}");
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn get_reads_every_column(pool: PgPool) {
    let id = failed(&pool, "g", Some("key-1")).await;
    let job = admin::get(&pool, id).await.unwrap().expect("the job");
    assert_eq!(job.id, id);
    assert_eq!(job.kind, "g");
    assert_eq!(job.key.as_deref(), Some("key-1"));
    assert_eq!(job.state, JobState::Failed);
    assert_eq!((job.attempts, job.max_attempts), (3, 3));
    assert_eq!(job.last_error.as_deref(), Some("boom: attempt 3 of 3"));
    assert_eq!(job.payload["key"], "key-1");
    assert!(job.finished_at.is_some());
    assert!(job.claimed_until.is_none());
    assert!(job.run_after < job.created_at);

    assert!(admin::get(&pool, id + 1000).await.unwrap().is_none());

    // A claim in transaction mode has no end: read as the latest instant, not an error.
    let running = insert(&pool, "g", None, "running", 0, None).await;
    sqlx::query("UPDATE jobs SET claimed_until = 'infinity' WHERE id = $1")
        .bind(running)
        .execute(&pool)
        .await
        .unwrap();
    let job = admin::get(&pool, running).await.unwrap().unwrap();
    assert_eq!(job.claimed_until, Some(DateTime::<Utc>::MAX_UTC));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn retried_failed_job_becomes_claimable_now(pool: PgPool) {
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen("jobs").await.unwrap();
    let id = insert(&pool, "r", Some("k"), "failed", 3600, Some(30)).await;
    assert!(claim(&pool, "r", 10).await.is_empty());

    assert_eq!(admin::retry(&pool, id).await.unwrap(), Retried::Pending);
    let job = admin::get(&pool, id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.attempts, 0, "a fresh attempt budget");
    assert_eq!(
        job.last_error.as_deref(),
        Some("boom: attempt 3 of 3"),
        "the error is kept"
    );
    assert!(job.finished_at.is_none());

    let notification = tokio::time::timeout(Duration::from_secs(30), listener.recv())
        .await
        .expect("a notification")
        .unwrap();
    assert_eq!(notification.payload(), "r");
    assert_eq!(claim(&pool, "r", 10).await, [id], "claimable now");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn retry_refuses_a_job_that_is_not_failed(pool: PgPool) {
    let pending = insert(&pool, "r", None, "pending", 600, None).await;
    let running = insert(&pool, "r", None, "running", 0, None).await;
    let done = insert(&pool, "r", None, "done", 0, Some(1)).await;
    let before = admin::list(&pool, &ListFilter::new()).await.unwrap();
    for id in [pending, running, done, done + 100] {
        let err = admin::retry(&pool, id).await.unwrap_err();
        assert!(
            matches!(err, jobs::Error::NotFound(n) if n == id),
            "{err:?}"
        );
    }
    assert_eq!(
        admin::list(&pool, &ListFilter::new()).await.unwrap(),
        before,
        "nothing changed"
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn retry_of_a_key_with_a_live_job_merges_into_it(pool: PgPool) {
    let old = failed(&pool, "m", Some("user:7")).await;
    let live = insert(&pool, "m", Some("user:7"), "running", 0, None).await;
    let before = admin::get(&pool, live).await.unwrap();

    assert_eq!(
        admin::retry(&pool, old).await.unwrap(),
        Retried::Merged { live_id: live }
    );
    assert_eq!(state_of(&pool, old).await, None, "the failed row is gone");
    assert_eq!(
        admin::get(&pool, live).await.unwrap(),
        before,
        "the live job is untouched"
    );

    // With no live job of its key, a keyed job is retried under its own id.
    let other = failed(&pool, "m", Some("user:8")).await;
    assert_eq!(admin::retry(&pool, other).await.unwrap(), Retried::Pending);
    assert_eq!(state_of(&pool, other).await.as_deref(), Some("pending"));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn retry_kind_retries_every_failed_job_of_the_kind(pool: PgPool) {
    let plain = [
        failed(&pool, "k", None).await,
        failed(&pool, "k", None).await,
    ];
    // A key with a live job: the failed one is covered by it.
    let covered = failed(&pool, "k", Some("live")).await;
    let live = insert(&pool, "k", Some("live"), "pending", 0, None).await;
    // Two failed jobs of one key and no live job: the newer one is retried.
    let older = failed(&pool, "k", Some("twice")).await;
    let newer = failed(&pool, "k", Some("twice")).await;
    let other_kind = failed(&pool, "other", None).await;
    let done = insert(&pool, "k", None, "done", 0, Some(1)).await;

    let outcome = admin::retry_kind(&pool, "k").await.unwrap();
    assert_eq!((outcome.retried, outcome.merged), (3, 2), "{outcome:?}");
    assert_eq!(outcome.total(), 5);
    for id in plain.into_iter().chain([newer, live]) {
        assert_eq!(
            state_of(&pool, id).await.as_deref(),
            Some("pending"),
            "{id}"
        );
    }
    assert_eq!(state_of(&pool, covered).await, None);
    assert_eq!(state_of(&pool, older).await, None);
    assert_eq!(state_of(&pool, other_kind).await.as_deref(), Some("failed"));
    assert_eq!(state_of(&pool, done).await.as_deref(), Some("done"));

    assert_eq!(
        admin::retry_kind(&pool, "k").await.unwrap(),
        RetriedKind::default(),
        "nothing failed is left"
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn cancel_ends_pending_and_running_jobs_and_nothing_else(pool: PgPool) {
    let pending = insert(&pool, "c", None, "pending", 600, None).await;
    assert_eq!(
        admin::cancel(&pool, pending).await.unwrap(),
        admin::Cancelled::Pending
    );
    assert_eq!(state_of(&pool, pending).await.as_deref(), Some("cancelled"));

    let running = insert(&pool, "c", None, "running", 0, None).await;
    assert_eq!(
        admin::cancel(&pool, running).await.unwrap(),
        admin::Cancelled::Running
    );
    let claim: (Option<uuid::Uuid>, Option<DateTime<Utc>>, String) =
        sqlx::query_as("SELECT claimed_by, claimed_until, state FROM jobs WHERE id = $1")
            .bind(running)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(claim, (None, None, "cancelled".into()), "the claim is gone");

    let failed_id = failed(&pool, "c", None).await;
    let done = insert(&pool, "c", None, "done", 0, Some(1)).await;
    for id in [failed_id, done, running, 999_999] {
        let err = admin::cancel(&pool, id).await.unwrap_err();
        assert!(
            matches!(err, jobs::Error::NotFound(n) if n == id),
            "{err:?}"
        );
    }
    assert_eq!(state_of(&pool, failed_id).await.as_deref(), Some("failed"));
    assert_eq!(state_of(&pool, done).await.as_deref(), Some("done"));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn cancel_racing_a_claim_waits_and_cancels_the_claimed_job(pool: PgPool) {
    let id = insert(&pool, "c", None, "pending", 0, None).await;
    // A runtime's claim, still uncommitted: the row is locked and running.
    let mut tx = pool.begin().await.unwrap();
    let claimed: Vec<(i64, String, i32, i32, uuid::Uuid, String)> =
        sqlx::query_as(jobs::__private::CLAIM_SQL)
            .bind(vec!["c".to_owned()])
            .bind(vec![1_i32])
            .bind(vec![Some(60_000_i64)])
            .bind(1_i32)
            .bind(vec![f64::NEG_INFINITY])
            .bind(uuid::Uuid::nil())
            .bind(Vec::<i64>::new())
            .bind(Vec::<f64>::new())
            .fetch_all(&mut *tx)
            .await
            .unwrap();
    assert_eq!(claimed.len(), 1);

    let cancel = tokio::spawn({
        let pool = pool.clone();
        async move { admin::cancel(&pool, id).await }
    });
    until_someone_waits_for_a_lock(&pool).await;
    assert!(
        !cancel.is_finished(),
        "the cancel waits for the claim's lock"
    );
    tx.commit().await.unwrap();

    // It reads the row as the claim left it: running, and cancels that.
    assert_eq!(cancel.await.unwrap().unwrap(), admin::Cancelled::Running);
    assert_eq!(state_of(&pool, id).await.as_deref(), Some("cancelled"));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn cancel_racing_a_completion_cancels_nothing(pool: PgPool) {
    let id = insert(&pool, "c", None, "running", 0, None).await;
    // A completion (a fenced transaction's), still uncommitted.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(
        "UPDATE jobs SET state = 'done', finished_at = now(), claimed_by = NULL, claimed_until = NULL WHERE id = $1",
    )
    .bind(id)
    .execute(&mut *tx)
    .await
    .unwrap();
    let cancel = tokio::spawn({
        let pool = pool.clone();
        async move { admin::cancel(&pool, id).await }
    });
    until_someone_waits_for_a_lock(&pool).await;
    tx.commit().await.unwrap();
    let err = cancel.await.unwrap().unwrap_err();
    assert!(matches!(err, jobs::Error::NotFound(_)), "{err:?}");
    assert_eq!(state_of(&pool, id).await.as_deref(), Some("done"));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn discard_deletes_only_failed_jobs(pool: PgPool) {
    let failed_id = failed(&pool, "d", None).await;
    let pending = insert(&pool, "d", None, "pending", 0, None).await;
    let done = insert(&pool, "d", None, "done", 0, Some(1)).await;
    admin::discard(&pool, failed_id).await.unwrap();
    assert_eq!(state_of(&pool, failed_id).await, None);
    for id in [failed_id, pending, done] {
        assert!(matches!(
            admin::discard(&pool, id).await,
            Err(jobs::Error::NotFound(n)) if n == id
        ));
    }
    assert_eq!(common::count_kind(&pool, "d").await, 2);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn stats_counts_each_state_per_kind_and_the_lag(pool: PgPool) {
    assert!(admin::stats(&pool).await.unwrap().is_empty());

    // Kind a: two ready (the oldest due 90 s ago), one scheduled, one running, two done,
    // one failed. Kind b: scheduled and failed only, so nothing is claimable.
    insert(&pool, "a", None, "pending", -90, None).await;
    insert(&pool, "a", None, "pending", -10, None).await;
    insert(&pool, "a", None, "pending", 3600, None).await;
    insert(&pool, "a", None, "running", -200, None).await;
    insert(&pool, "a", None, "done", -300, Some(100)).await;
    insert(&pool, "a", None, "done", -300, Some(100)).await;
    failed(&pool, "a", None).await;
    insert(&pool, "b", None, "pending", 60, None).await;
    failed(&pool, "b", None).await;

    let stats = admin::stats(&pool).await.unwrap();
    assert_eq!(stats.len(), 2);
    let (a, b) = (&stats[0], &stats[1]);
    assert_eq!(a.kind, "a");
    assert_eq!(
        (a.ready, a.scheduled, a.running, a.done, a.failed),
        (2, 1, 1, 2, 1)
    );
    assert_eq!(a.pending(), 3);
    let lag = a.lag.expect("kind a has claimable jobs");
    assert!(
        lag >= Duration::from_secs(90) && lag < Duration::from_secs(120),
        "{lag:?}"
    );
    assert_eq!(b.kind, "b");
    assert_eq!(
        (b.ready, b.scheduled, b.running, b.done, b.failed),
        (0, 1, 0, 0, 1)
    );
    assert_eq!(b.lag, None, "a scheduled job is not late");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn prune_deletes_old_done_rows_in_batches(pool: PgPool) {
    let day = 86_400;
    for _ in 0..25 {
        insert(&pool, "a", None, "done", -9 * day, Some(8 * day)).await;
    }
    for _ in 0..3 {
        insert(&pool, "b", None, "done", -9 * day, Some(8 * day)).await;
    }
    let young: Vec<i64> = [
        insert(&pool, "a", None, "done", 0, Some(60)).await,
        insert(&pool, "b", None, "done", 0, Some(60)).await,
    ]
    .into();
    let old_failed = insert(&pool, "a", None, "failed", -9 * day, Some(8 * day)).await;
    let week = Duration::from_secs(7 * day as u64);

    assert_eq!(admin::prune(&pool, Some("a"), week, 10).await.unwrap(), 25);
    assert_eq!(common::count_kind(&pool, "b").await, 4, "other kinds kept");
    assert_eq!(admin::prune(&pool, None, week, 10).await.unwrap(), 3);
    assert_eq!(admin::prune(&pool, None, week, 10).await.unwrap(), 0);
    for id in young {
        assert_eq!(state_of(&pool, id).await.as_deref(), Some("done"));
    }
    assert_eq!(state_of(&pool, old_failed).await.as_deref(), Some("failed"));

    // On one connection or in a transaction too.
    insert(&pool, "a", None, "done", -9 * day, Some(8 * day)).await;
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(admin::prune(&mut *tx, None, week, 1).await.unwrap(), 1);
    tx.rollback().await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(admin::prune(&mut *conn, None, week, 1).await.unwrap(), 1);

    let err = admin::prune(&pool, None, week, 0).await.unwrap_err();
    assert!(matches!(err, jobs::Error::InvalidInput(_)), "{err:?}");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn concurrent_pruners_delete_each_row_once(pool: PgPool) {
    let rows: i64 = 3000;
    sqlx::query(
        r#"
        INSERT INTO jobs (kind, state, max_attempts, payload, finished_at)
        SELECT 'kind' || (n % 3), 'done', 1, '{}', now() - interval '2 hours' - n * interval '1 second'
        FROM generate_series(1, $1) n
        "#,
    )
    .bind(rows)
    .execute(&pool)
    .await
    .unwrap();
    // Deletes recorded by a trigger: a row deleted twice would show up twice.
    sqlx::query("CREATE TABLE deleted (id bigint)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "CREATE FUNCTION record_delete() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN INSERT INTO deleted VALUES (OLD.id); RETURN OLD; END $$",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER record_delete AFTER DELETE ON jobs FOR EACH ROW EXECUTE FUNCTION record_delete()",
    )
    .execute(&pool)
    .await
    .unwrap();

    let pruners = (0..6).map(|i| {
        let pool = pool.clone();
        tokio::spawn(async move {
            let kind = (i % 2 == 0).then(|| format!("kind{}", i % 3));
            admin::prune(&pool, kind.as_deref(), Duration::from_secs(3600), 25).await
        })
    });
    let mut total = 0;
    for pruner in pruners {
        total += tokio::time::timeout(Duration::from_secs(60), pruner)
            .await
            .expect("no pruner hangs")
            .unwrap()
            .expect("no pruner fails (no deadlock)");
    }
    assert_eq!(total, rows as u64);
    // A pruner stops on a short batch only when every row it skipped was locked by
    // another pruner's batch, which deletes it: nothing is left behind.
    assert_eq!(
        admin::prune(&pool, None, Duration::from_secs(3600), 25)
            .await
            .unwrap(),
        0
    );
    assert_eq!(common::count(&pool, "done").await, 0);
    let deletes: Vec<i64> = sqlx::query_scalar("SELECT id FROM deleted")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(deletes.len() as i64, rows);
    assert_eq!(deletes.iter().collect::<HashSet<_>>().len() as i64, rows);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn retry_racing_an_enqueue_of_its_key_succeeds_when_run_again(pool: PgPool) {
    let old = failed(&pool, "race", Some("k")).await;
    // An enqueue of the same key, not yet committed when the retry starts.
    let mut tx = pool.begin().await.unwrap();
    let live: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (kind, key, max_attempts, payload) VALUES ('race', 'k', 3, '{}') RETURNING id",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let retry = tokio::spawn({
        let pool = pool.clone();
        async move { admin::retry(&pool, old).await }
    });
    until_someone_waits_for_a_lock(&pool).await;
    tx.commit().await.unwrap();

    match retry.await.unwrap() {
        // The retry saw the key free and waited on the index entry: refused.
        Err(e) => {
            assert!(admin::is_live_key_conflict(&e), "{e:?}");
            assert_eq!(state_of(&pool, old).await.as_deref(), Some("failed"));
            assert_eq!(
                admin::retry(&pool, old).await.unwrap(),
                Retried::Merged { live_id: live }
            );
        }
        Ok(outcome) => panic!("expected the documented conflict, got {outcome:?}"),
    }
    assert_eq!(common::live(&pool).await, 1);
}
