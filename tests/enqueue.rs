//! Enqueue: transactional, coalescing, bulk, notifications, bad input.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use jobs::{EnqueueBatch, EnqueueOutcome, Job};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgListener;

#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(kind = "test.keyed", key = "id")]
struct Keyed {
    id: i64,
    note: String,
}

#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(kind = "test.plain")]
struct Plain {
    n: i32,
}

#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(kind = "test.two_keys", key = ["tenant", "item"])]
struct TwoKeys {
    tenant: String,
    item: Option<u32>,
}

#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(kind = "test.text_key", key = "name")]
struct TextKey {
    name: String,
    blob: String,
}

async fn row(pool: &PgPool, id: i64) -> (String, Option<String>, String, serde_json::Value, bool) {
    sqlx::query_as(
        "SELECT kind, key, state, payload, run_after > now() + interval '1 minute' FROM jobs WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn enqueue_inserts_a_pending_row(pool: PgPool) {
    let e = Keyed {
        id: 1,
        note: "a".into(),
    }
    .enqueue(&pool)
    .await
    .unwrap();
    assert_eq!(e.outcome, EnqueueOutcome::Inserted);
    let (kind, key, state, payload, _) = row(&pool, e.id).await;
    assert_eq!(kind, "test.keyed");
    assert_eq!(key.as_deref(), Some("1"));
    assert_eq!(state, "pending");
    assert_eq!(payload["note"], "a");
    let max: i32 = sqlx::query_scalar("SELECT max_attempts FROM jobs WHERE id = $1")
        .bind(e.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(max, 20);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn enqueue_in_rolled_back_transaction_leaves_no_row(pool: PgPool) {
    let mut tx = pool.begin().await.unwrap();
    Plain { n: 1 }.enqueue(&mut *tx).await.unwrap();
    Keyed {
        id: 9,
        note: "x".into(),
    }
    .enqueue(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(common::count_kind(&pool, "test.plain").await, 0);
    assert_eq!(common::count_kind(&pool, "test.keyed").await, 0);

    let mut tx = pool.begin().await.unwrap();
    Plain { n: 2 }.enqueue(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(common::count_kind(&pool, "test.plain").await, 1);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn enqueue_on_a_connection(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    Plain { n: 1 }.enqueue(&mut *conn).await.unwrap();
    assert_eq!(common::count_kind(&pool, "test.plain").await, 1);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn repeated_trigger_coalesces_into_pending_job(pool: PgPool) {
    let first = Keyed {
        id: 5,
        note: "old".into(),
    }
    .enqueue_in(&pool, Duration::from_secs(3600))
    .await
    .unwrap();
    assert!(row(&pool, first.id).await.4, "scheduled an hour ahead");
    let second = Keyed {
        id: 5,
        note: "new".into(),
    }
    .enqueue(&pool)
    .await
    .unwrap();
    assert_eq!(second.outcome, EnqueueOutcome::Coalesced);
    assert_eq!(second.id, first.id);
    let (_, _, state, payload, later) = row(&pool, first.id).await;
    assert_eq!(state, "pending");
    assert_eq!(payload["note"], "new", "takes the newer payload");
    assert!(!later, "run_after reset to the new trigger's");
    assert_eq!(common::count_kind(&pool, "test.keyed").await, 1);
    // Another key is another job; unkeyed jobs never coalesce.
    assert!(
        Keyed {
            id: 6,
            note: "".into()
        }
        .enqueue(&pool)
        .await
        .unwrap()
        .inserted()
    );
    assert!(Plain { n: 1 }.enqueue(&pool).await.unwrap().inserted());
    assert!(Plain { n: 1 }.enqueue(&pool).await.unwrap().inserted());
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn trigger_while_running_marks_a_rerun(pool: PgPool) {
    let first = Keyed {
        id: 5,
        note: "v1".into(),
    }
    .enqueue(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE jobs SET state = 'running', claimed_by = gen_random_uuid(), claimed_until = now() + interval '1 minute' WHERE id = $1")
        .bind(first.id)
        .execute(&pool)
        .await
        .unwrap();
    let again = Keyed {
        id: 5,
        note: "v2".into(),
    }
    .enqueue(&pool)
    .await
    .unwrap();
    assert_eq!(again.outcome, EnqueueOutcome::RerunMarked);
    assert_eq!(again.id, first.id);
    let (state, rerun, payload): (String, bool, serde_json::Value) =
        sqlx::query_as("SELECT state, rerun_after IS NOT NULL, payload FROM jobs WHERE id = $1")
            .bind(first.id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(state, "running");
    assert!(rerun);
    assert_eq!(payload["note"], "v2");
    assert_eq!(common::count_kind(&pool, "test.keyed").await, 1);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn concurrent_enqueues_of_one_key_all_succeed_with_one_live_row(pool: PgPool) {
    let tasks = (0..100).map(|i| {
        let pool = pool.clone();
        tokio::spawn(async move {
            Keyed {
                id: 42,
                note: format!("{i}"),
            }
            .enqueue(&pool)
            .await
        })
    });
    let results = join_all(tasks).await;
    let mut ids = std::collections::HashSet::new();
    let mut inserted = 0;
    for r in results {
        let e = r.expect("task").expect("every enqueue succeeds");
        ids.insert(e.id);
        if e.inserted() {
            inserted += 1;
        }
    }
    assert_eq!(ids.len(), 1, "every enqueue names the same job");
    assert_eq!(inserted, 1, "exactly one inserted the row");
    assert_eq!(common::live(&pool).await, 1);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn bulk_enqueue_merges_jobs_of_one_key(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    batch
        .push(&Keyed {
            id: 1,
            note: "first".into(),
        })
        .unwrap();
    batch.push(&Plain { n: 1 }).unwrap();
    batch
        .push(&Keyed {
            id: 1,
            note: "second".into(),
        })
        .unwrap();
    batch
        .push(&Keyed {
            id: 2,
            note: "other".into(),
        })
        .unwrap();
    batch.push(&Plain { n: 2 }).unwrap();
    let results = batch.enqueue(&pool).await.unwrap();
    assert_eq!(results.len(), 5);
    assert_eq!(results[0].id, results[2].id, "one key, one job");
    assert_eq!(results[0].outcome, EnqueueOutcome::Coalesced);
    assert_eq!(results[2].outcome, EnqueueOutcome::Inserted);
    assert_ne!(results[1].id, results[4].id);
    assert_eq!(common::count_kind(&pool, "test.keyed").await, 2);
    assert_eq!(common::count_kind(&pool, "test.plain").await, 2);
    let (_, _, _, payload, _) = row(&pool, results[2].id).await;
    assert_eq!(payload["note"], "second", "the last push wins");
    // Results come back in push order: each id's row holds that push's payload.
    let n: i32 = sqlx::query_scalar("SELECT (payload->>'n')::int FROM jobs WHERE id = $1")
        .bind(results[4].id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 2);

    // A second batch coalesces into the live rows instead of failing.
    let again = jobs::enqueue_all(
        &pool,
        &[
            Keyed {
                id: 1,
                note: "third".into(),
            },
            Keyed {
                id: 3,
                note: "new".into(),
            },
        ],
    )
    .await
    .unwrap();
    assert_eq!(again[0].outcome, EnqueueOutcome::Coalesced);
    assert_eq!(again[0].id, results[2].id);
    assert_eq!(again[1].outcome, EnqueueOutcome::Inserted);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn bulk_enqueue_of_many_rows_keeps_push_order(pool: PgPool) {
    let jobs: Vec<Plain> = (0..1000).map(|n| Plain { n }).collect();
    let results = jobs::enqueue_all(&pool, &jobs).await.unwrap();
    assert_eq!(results.len(), 1000);
    for (n, e) in results.iter().enumerate().step_by(97) {
        let stored: i32 = sqlx::query_scalar("SELECT (payload->>'n')::int FROM jobs WHERE id = $1")
            .bind(e.id)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(stored as usize, n);
    }
    assert!(
        jobs::enqueue_all::<Plain, _>(&pool, &[])
            .await
            .unwrap()
            .is_empty()
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn multi_field_key_and_none_key(pool: PgPool) {
    let a = TwoKeys {
        tenant: "t:1".into(),
        item: Some(2),
    }
    .enqueue(&pool)
    .await
    .unwrap();
    let key: Option<String> = sqlx::query_scalar("SELECT key FROM jobs WHERE id = $1")
        .bind(a.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(key.as_deref(), Some("t\\:1:2"));
    // A None part means no key: such jobs never coalesce.
    let b = TwoKeys {
        tenant: "t".into(),
        item: None,
    }
    .enqueue(&pool)
    .await
    .unwrap();
    let c = TwoKeys {
        tenant: "t".into(),
        item: None,
    }
    .enqueue(&pool)
    .await
    .unwrap();
    assert!(b.inserted() && c.inserted());
    assert_ne!(b.id, c.id);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn key_or_payload_postgres_cannot_store_is_a_clear_error(pool: PgPool) {
    let err = TextKey {
        name: "a\0b".into(),
        blob: "".into(),
    }
    .enqueue(&pool)
    .await
    .unwrap_err();
    assert!(matches!(err, jobs::Error::InvalidInput(_)), "{err:?}");
    assert!(err.to_string().contains("key"), "{err}");

    let err = TextKey {
        name: "ok".into(),
        blob: "nul \0 inside".into(),
    }
    .enqueue(&pool)
    .await
    .unwrap_err();
    assert!(matches!(err, jobs::Error::InvalidInput(_)), "{err:?}");
    assert!(err.to_string().contains("payload"), "{err}");

    let mut batch = EnqueueBatch::new();
    assert!(
        batch
            .push(&TextKey {
                name: "\0".into(),
                blob: "".into()
            })
            .is_err()
    );
    assert!(batch.is_empty());
    assert_eq!(common::live(&pool).await, 0, "nothing was written");

    // Unusual but storable text goes through unchanged.
    let odd = "ключ 🔑 'quote' \"dq\" \\ ; DROP TABLE jobs; --";
    let e = TextKey {
        name: odd.into(),
        blob: odd.into(),
    }
    .enqueue(&pool)
    .await
    .unwrap();
    let (_, key, _, payload, _) = row(&pool, e.id).await;
    assert_eq!(key.as_deref(), Some(odd));
    assert_eq!(payload["blob"], odd);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn delayed_enqueue_uses_the_database_clock(pool: PgPool) {
    let e = Plain { n: 1 }
        .enqueue_in(&pool, Duration::from_secs(90))
        .await
        .unwrap();
    let secs: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM run_after - created_at)::float8 FROM jobs WHERE id = $1",
    )
    .bind(e.id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!((secs - 90.0).abs() < 0.01, "{secs}");
}

/// The kinds of `one_notification_per_kind_per_transaction` alone: a process sends at
/// most one notification per kind every few milliseconds, and the tests of this file
/// may share one process.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(kind = "notify.keyed", key = "id")]
struct NotifyKeyed {
    id: i64,
    note: String,
}

#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(kind = "notify.plain")]
struct NotifyPlain {
    n: i32,
}

#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(kind = "notify.two_keys", key = ["tenant", "item"])]
struct NotifyTwoKeys {
    tenant: String,
    item: Option<u32>,
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn one_notification_per_kind_per_transaction(pool: PgPool) {
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen("jobs").await.unwrap();

    let mut batch = EnqueueBatch::new();
    for n in 0..50 {
        batch.push(&NotifyPlain { n }).unwrap();
        batch
            .push(&NotifyKeyed {
                id: n.into(),
                note: "".into(),
            })
            .unwrap();
    }
    // A scheduled job notifies too: an idle runtime then sleeps until it is due.
    batch
        .push_in(
            &NotifyTwoKeys {
                tenant: "x".into(),
                item: Some(1),
            },
            Duration::from_secs(60),
        )
        .unwrap();
    batch.enqueue(&pool).await.unwrap();
    // One process sends at most one notification per kind every 5 ms: wait that out,
    // so the transaction below sends its own.
    tokio::time::sleep(Duration::from_millis(20)).await;

    let mut tx = pool.begin().await.unwrap();
    for n in 0..20 {
        NotifyPlain { n }.enqueue(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    // A batch of keyed jobs only (its unkeyed part empty) notifies too, and so does
    // one of unkeyed jobs only.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let keyed: Vec<NotifyKeyed> = (100..110)
        .map(|id| NotifyKeyed {
            id,
            note: "".into(),
        })
        .collect();
    jobs::enqueue_all(&pool, &keyed).await.unwrap();
    let plain: Vec<NotifyPlain> = (100..110).map(|n| NotifyPlain { n }).collect();
    jobs::enqueue_all(&pool, &plain).await.unwrap();
    // A marker on a channel of its own: everything before it has been delivered.
    sqlx::query("SELECT pg_notify('jobs', 'end')")
        .execute(&pool)
        .await
        .unwrap();

    let mut got = Vec::new();
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), listener.recv())
            .await
            .expect("notifications arrive")
            .unwrap();
        if n.payload() == "end" {
            break;
        }
        got.push(n.payload().to_owned());
    }
    got.sort();
    assert_eq!(
        got,
        [
            "notify.keyed",
            "notify.keyed",
            "notify.plain",
            "notify.plain",
            "notify.plain",
            "notify.two_keys"
        ]
    );
}

// ---------------------------------------------------------------------------------
// Per-enqueue options.

/// The job's run-after less its row's creation, in seconds, and its max_attempts.
async fn scheduled(pool: &PgPool, id: i64) -> (f64, i32) {
    sqlx::query_as(
        "SELECT extract(epoch FROM run_after - created_at)::float8, max_attempts FROM jobs WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn enqueue_with_sets_delay_instant_and_attempts(pool: PgPool) {
    use jobs::EnqueueOptions;
    use sqlx::types::chrono::{DateTime, Utc};

    let delayed = Plain { n: 1 }
        .enqueue_with(
            &pool,
            EnqueueOptions::new()
                .delay(Duration::from_secs(600))
                .max_attempts(3),
        )
        .await
        .unwrap();
    let (ahead, max_attempts) = scheduled(&pool, delayed.id).await;
    assert!((600.0..601.0).contains(&ahead), "{ahead}");
    assert_eq!(max_attempts, 3);

    // An instant chosen by the application, here an hour ahead of the database's clock:
    // stored as given.
    let at: DateTime<Utc> =
        sqlx::query_scalar("SELECT date_trunc('second', now()) + interval '1 hour'")
            .fetch_one(&pool)
            .await
            .unwrap();
    let timed = Keyed {
        id: 1,
        note: "at".into(),
    }
    .enqueue_with(&pool, EnqueueOptions::new().at(at))
    .await
    .unwrap();
    let row = jobs::admin::get(&pool, timed.id).await.unwrap().unwrap();
    assert_eq!(row.run_after, at);
    assert_eq!(row.max_attempts, 20, "the kind's default");

    // The same for a job without a key (a statement of its own), with a priority.
    let plain = Plain { n: 4 }
        .enqueue_with(&pool, EnqueueOptions::new().at(at).priority(3))
        .await
        .unwrap();
    assert!(plain.inserted());
    let row = jobs::admin::get(&pool, plain.id).await.unwrap().unwrap();
    assert_eq!((row.run_after, row.priority, row.key), (at, 3, None));
    assert_eq!(row.payload, serde_json::json!({ "n": 4 }));

    // An instant already past counts as now: the job is due, never behind the
    // enqueue's own time.
    let past = Plain { n: 2 }
        .enqueue_with(&pool, EnqueueOptions::new().at(DateTime::<Utc>::MIN_UTC))
        .await
        .unwrap();
    let (ahead, _) = scheduled(&pool, past.id).await;
    assert!((0.0..1.0).contains(&ahead), "{ahead}");

    // The last of delay and at wins.
    let last = Plain { n: 3 }
        .enqueue_with(&pool, EnqueueOptions::new().at(at).delay(Duration::ZERO))
        .await
        .unwrap();
    let (ahead, _) = scheduled(&pool, last.id).await;
    assert!((0.0..1.0).contains(&ahead), "{ahead}");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn enqueue_with_refuses_options_the_database_cannot_keep(pool: PgPool) {
    use jobs::EnqueueOptions;
    use sqlx::types::chrono::{DateTime, Utc};

    let err = Plain { n: 1 }
        .enqueue_with(&pool, EnqueueOptions::new().max_attempts(0))
        .await
        .unwrap_err();
    assert!(matches!(err, jobs::Error::InvalidInput(_)), "{err}");
    assert!(err.to_string().contains("at least one attempt"), "{err}");

    let err = Plain { n: 1 }
        .enqueue_with(&pool, EnqueueOptions::new().at(DateTime::<Utc>::MAX_UTC))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("after the year 9999"), "{err}");

    let mut batch = EnqueueBatch::new();
    assert!(
        batch
            .push_with(&Plain { n: 1 }, EnqueueOptions::new().max_attempts(0))
            .is_err()
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "nothing was written");
}

/// A whole second two hours ahead on the database clock: an instant a job can be
/// scheduled at and read back equal.
async fn two_hours_ahead(pool: &PgPool) -> sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc> {
    sqlx::query_scalar("SELECT date_trunc('second', now()) + interval '2 hours'")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn batches_take_options_per_job(pool: PgPool) {
    use jobs::EnqueueOptions;

    let at = two_hours_ahead(&pool).await;
    let mut batch = EnqueueBatch::new();
    batch
        .push_with(
            &Plain { n: 1 },
            EnqueueOptions::new().at(at).max_attempts(2),
        )
        .unwrap()
        .push_with(
            &Keyed {
                id: 5,
                note: "later".into(),
            },
            EnqueueOptions::new().delay(Duration::from_secs(60)),
        )
        .unwrap()
        .push(&Plain { n: 2 })
        .unwrap();
    let done = batch.enqueue(&pool).await.unwrap();

    let first = jobs::admin::get(&pool, done[0].id).await.unwrap().unwrap();
    assert_eq!((first.run_after, first.max_attempts), (at, 2));
    let (ahead, max_attempts) = scheduled(&pool, done[1].id).await;
    assert!((60.0..61.0).contains(&ahead), "{ahead}");
    assert_eq!(max_attempts, 20);
    let (ahead, _) = scheduled(&pool, done[2].id).await;
    assert!((0.0..1.0).contains(&ahead), "{ahead}");

    // Coalescing into the pending job of a key takes the new trigger's settings.
    let again = Keyed {
        id: 5,
        note: "sooner".into(),
    }
    .enqueue_with(&pool, EnqueueOptions::new().at(at).max_attempts(4))
    .await
    .unwrap();
    assert_eq!(again.outcome, EnqueueOutcome::Coalesced);
    let row = jobs::admin::get(&pool, again.id).await.unwrap().unwrap();
    assert_eq!((row.run_after, row.max_attempts), (at, 4));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn unkeyed_batches_take_options_per_job_and_return_ids_in_push_order(pool: PgPool) {
    use jobs::EnqueueOptions;

    // No job has a key: the batch takes the unkeyed statement, which returns its ids
    // as one array. Each job's own options must still reach its own row.
    let at = two_hours_ahead(&pool).await;
    let mut batch = EnqueueBatch::new();
    batch
        .push(&Plain { n: 0 })
        .unwrap()
        .push_with(
            &Plain { n: 1 },
            EnqueueOptions::new().at(at).max_attempts(2),
        )
        .unwrap()
        .push_with(
            &TwoKeys {
                tenant: "t".into(),
                item: None,
            },
            EnqueueOptions::new()
                .delay(Duration::from_secs(60))
                .priority(3),
        )
        .unwrap()
        .push_with(&Plain { n: 3 }, EnqueueOptions::new().priority(7))
        .unwrap();
    let done = batch.enqueue(&pool).await.unwrap();
    assert_eq!(done.len(), 4);
    assert!(done.iter().all(|e| e.outcome == EnqueueOutcome::Inserted));
    assert!(done.windows(2).all(|w| w[0].id < w[1].id), "{done:?}");

    let rows: Vec<_> = {
        let mut rows = Vec::new();
        for e in &done {
            rows.push(jobs::admin::get(&pool, e.id).await.unwrap().unwrap());
        }
        rows
    };
    let kinds: Vec<&str> = rows.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["test.plain", "test.plain", "test.two_keys", "test.plain"]
    );
    assert_eq!(rows[0].payload["n"], 0);
    assert_eq!(rows[3].payload["n"], 3);
    assert_eq!((rows[1].run_after, rows[1].max_attempts), (at, 2));
    assert_eq!(
        rows.iter().map(|r| r.priority).collect::<Vec<_>>(),
        [0, 0, 3, 7]
    );
    let (ahead, max_attempts) = scheduled(&pool, done[2].id).await;
    assert!((60.0..61.0).contains(&ahead), "{ahead}");
    assert_eq!(max_attempts, 20);
    let (ahead, _) = scheduled(&pool, done[0].id).await;
    assert!((0.0..1.0).contains(&ahead), "{ahead}");
    assert!(rows.iter().all(|r| r.key.is_none()));
}

/// Two unkeyed batches at the same instant draw their ids from one sequence, interleaved
/// when their inserts overlap; each batch's ids must still name its own jobs, in push
/// order (the statement returns them as one array, mapped back by position).
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn concurrent_unkeyed_batches_map_each_id_to_its_own_job(pool: PgPool) {
    for round in 0..4 {
        let tasks: Vec<_> = (0..2)
            .map(|b| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let jobs: Vec<Plain> = (0..2_000)
                        .map(|i| Plain {
                            n: round * 1_000_000 + b * 100_000 + i,
                        })
                        .collect();
                    let results = jobs::enqueue_all(&pool, &jobs).await.unwrap();
                    (jobs, results)
                })
            })
            .collect();
        for task in tasks {
            let (jobs, results) = task.await.unwrap();
            let ids: Vec<i64> = results.iter().map(|e| e.id).collect();
            let stored: HashMap<i64, i32> = sqlx::query_as::<_, (i64, i32)>(
                "SELECT id, (payload->>'n')::int FROM jobs WHERE id = ANY($1)",
            )
            .bind(&ids)
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
            assert_eq!(stored.len(), jobs.len(), "round {round}: every id is a row");
            for (job, id) in jobs.iter().zip(&ids) {
                assert_eq!(stored[id], job.n, "round {round}: id {id}");
            }
        }
    }
}

/// `n` printable ASCII characters that pglz cannot compress (a xorshift sequence).
fn incompressible(n: usize, seed: u64) -> String {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'!' + (x % 94) as u8)
        })
        .collect()
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_key_longer_than_the_index_holds_is_refused_before_the_database(pool: PgPool) {
    // The longest key allowed fits the unique index, even when it does not compress.
    let longest = TextKey {
        name: incompressible(jobs::MAX_KEY_BYTES, 7),
        blob: String::new(),
    };
    longest.enqueue(&pool).await.unwrap();
    // One that PostgreSQL refused with "index row size 3216 exceeds btree version 4
    // maximum 2704" is refused here, naming the limit, and nothing is written.
    for len in [jobs::MAX_KEY_BYTES + 1, 3_200] {
        let err = TextKey {
            name: incompressible(len, 11),
            blob: String::new(),
        }
        .enqueue(&pool)
        .await
        .unwrap_err();
        assert!(matches!(err, jobs::Error::InvalidInput(_)), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("{len} bytes long")) && text.contains("up to 2000 bytes"),
            "{text}"
        );
    }
    let mut batch = EnqueueBatch::new();
    let err = batch
        .push(&TextKey {
            name: incompressible(3_200, 13),
            blob: String::new(),
        })
        .map(drop)
        .unwrap_err();
    assert!(matches!(err, jobs::Error::InvalidInput(_)), "{err:?}");
    assert_eq!(common::count_kind(&pool, "test.text_key").await, 1);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_payload_over_the_limit_is_refused_at_enqueue(pool: PgPool) {
    assert_eq!(jobs::max_payload_bytes(), 16 * 1024 * 1024, "the default");
    let big = TextKey {
        name: "big".into(),
        blob: "x".repeat(jobs::DEFAULT_MAX_PAYLOAD_BYTES),
    };
    let err = big.enqueue(&pool).await.unwrap_err();
    assert!(matches!(err, jobs::Error::InvalidInput(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("over the limit of 16777216 bytes")
            && text.contains("jobs::set_max_payload_bytes"),
        "{text}"
    );
    assert_eq!(common::count_kind(&pool, "test.text_key").await, 0);
    // Just under the limit goes in.
    let fits = TextKey {
        name: "fits".into(),
        blob: "x".repeat(jobs::DEFAULT_MAX_PAYLOAD_BYTES - 100),
    };
    fits.enqueue(&pool).await.unwrap();
}
