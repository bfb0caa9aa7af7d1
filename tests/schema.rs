//! The job table's design promises: lease columns outside every index, so that a lease
//! renewal is a HOT update.

use sqlx::PgPool;

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn lease_columns_are_in_no_index_or_predicate(pool: PgPool) {
    let defs: Vec<String> = sqlx::query_scalar(
        "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'jobs'::regclass",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(defs.len() >= 5, "{defs:?}");
    for def in &defs {
        assert!(
            !def.contains("claimed_by") && !def.contains("claimed_until"),
            "an index names a lease column: {def}"
        );
    }
}

async fn update_counts(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'jobs'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn renew_all(conn: &mut sqlx::PgConnection) {
    sqlx::query("UPDATE jobs SET claimed_until = now() + interval '30 seconds'")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn lease_renewals_are_hot_updates(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    // Claims sit side by side (inserted together, claimed together), and the heartbeat
    // renews every claim of a runtime in one statement: every row of a page gets a new
    // version at once. The fillfactor must leave room for all of them on the page.
    sqlx::query(
        "INSERT INTO jobs (kind, key, payload, max_attempts, state, claimed_by, claimed_until) \
         SELECT 'schema.hot', g::text, jsonb_build_object('session_id', gen_random_uuid()), 3, \
                'running', gen_random_uuid(), now() \
         FROM generate_series(1, 300) g",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    renew_all(&mut conn).await;
    let (updates, hot) = update_counts(&pool).await;
    assert_eq!(updates, 300);
    assert_eq!(hot, updates, "every renewal was a HOT update");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn autoanalyze_is_spaced_on_the_job_table(pool: PgPool) {
    // A busy queue changes thousands of rows a second: at PostgreSQL's default
    // threshold (50) autovacuum analyzed the table every naptime, which under a held
    // xmin horizon read an ever larger table each second (BENCHMARKS.md).
    let options: Vec<String> =
        sqlx::query_scalar("SELECT unnest(reloptions) FROM pg_class WHERE oid = 'jobs'::regclass")
            .fetch_all(&pool)
            .await
            .unwrap();
    let threshold: i64 = options
        .iter()
        .find_map(|o| o.strip_prefix("autovacuum_analyze_threshold="))
        .unwrap_or_else(|| panic!("no analyze threshold among {options:?}"))
        .parse()
        .unwrap();
    assert!(threshold >= 100_000, "{threshold}");
}
