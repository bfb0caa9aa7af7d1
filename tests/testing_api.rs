//! `jobs::testing` against rows that no longer fit their type.
//!
//! That such a job fails permanently when a runtime claims it, while good jobs of its
//! kind complete, is `bad_payload_fails_that_job_only` in tests/runtime.rs.

use jobs::Job;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// The payload type as it is now: `to` was called `address` once (the alias keeps old
/// rows readable), and `cc` is new (the default fills it in for old rows).
#[derive(Job, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[job(kind = "testing.mail")]
struct Mail {
    #[serde(alias = "address")]
    to: String,
    #[serde(default)]
    cc: Vec<String>,
}

async fn insert(pool: &PgPool, kind: &str, payload: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO jobs (kind, payload, max_attempts) VALUES ($1, $2::jsonb, 5) RETURNING id",
    )
    .bind(kind)
    .bind(payload)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn enqueued_rows_reports_the_rows_that_do_not_deserialize(pool: PgPool) {
    let good = Mail {
        to: "a@example.com".into(),
        cc: vec!["b@example.com".into()],
    };
    good.enqueue(&pool).await.unwrap();
    // An older version of the type wrote `address` and had no `cc`: still readable.
    insert(&pool, "testing.mail", r#"{"address": "old@example.com"}"#).await;
    // Neither `to` nor its alias: this one does not fit.
    let missing = insert(&pool, "testing.mail", r#"{"recipient": "x@example.com"}"#).await;
    // A field of the wrong type.
    let wrong = insert(&pool, "testing.mail", r#"{"to": 42}"#).await;
    // Rows of other kinds, and rows that are not live, are not listed.
    insert(&pool, "testing.other", r#"{"to": 42}"#).await;
    let failed = insert(&pool, "testing.mail", r#"{"to": 43}"#).await;
    sqlx::query("UPDATE jobs SET state = 'failed', finished_at = now() WHERE id = $1")
        .bind(failed)
        .execute(&pool)
        .await
        .unwrap();

    let rows = jobs::testing::enqueued_rows::<Mail>(&pool).await.unwrap();
    assert_eq!(
        rows.jobs,
        vec![
            good.clone(),
            Mail {
                to: "old@example.com".into(),
                cc: vec![],
            },
        ]
    );
    let bad: Vec<i64> = rows.undeserializable.iter().map(|u| u.id).collect();
    assert_eq!(bad, vec![missing, wrong], "oldest first, live rows only");
    let first = &rows.undeserializable[0];
    assert!(first.error.contains("missing field `to`"), "{first:?}");
    let payload: serde_json::Value = serde_json::from_str(&first.payload).unwrap();
    assert_eq!(payload["recipient"], "x@example.com");
    assert!(
        rows.undeserializable[1].error.contains("invalid type"),
        "{:?}",
        rows.undeserializable[1]
    );

    // `enqueued` refuses, naming the first bad row and serde's error.
    let err = jobs::testing::enqueued::<Mail>(&pool)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("testing.mail")
            && err.contains(&format!("job {missing} "))
            && err.contains("missing field `to`")
            && err.contains("1 more row"),
        "{err}"
    );

    // Once the bad rows are gone, `enqueued` lists the rest.
    sqlx::query("DELETE FROM jobs WHERE id IN ($1, $2)")
        .bind(missing)
        .bind(wrong)
        .execute(&pool)
        .await
        .unwrap();
    let jobs = jobs::testing::enqueued::<Mail>(&pool).await.unwrap();
    assert_eq!(jobs, rows.jobs);
    jobs::testing::assert_enqueued(&pool, |m: &Mail| m.to == "old@example.com").await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn enqueued_rows_of_an_empty_kind(pool: PgPool) {
    let rows = jobs::testing::enqueued_rows::<Mail>(&pool).await.unwrap();
    assert!(rows.jobs.is_empty() && rows.undeserializable.is_empty());
    assert!(
        jobs::testing::enqueued::<Mail>(&pool)
            .await
            .unwrap()
            .is_empty()
    );
}
