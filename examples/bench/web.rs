//! `bench -- web`: the dashboard's pages against a table of two million rows.
//!
//! Fills a fresh database (`JOBS_BENCH_DATABASE_URL`) with `--rows` jobs (2,000,000
//! unless given) as a busy production table holds them: 20 kinds, 95 % done, 3 % failed
//! with an error history, 1.5 % pending (a third due, the rest scheduled, priorities 0
//! to 9), 0.5 % cancelled and 200 running; a week of throughput history (the most
//! it keeps: 200,000 rows); one
//! registered runtime. Then `VACUUM ANALYZE` (what autovacuum would have done on a
//! server that runs it) and, per page, one warm-up request and `--runs` timed requests
//! through the dashboard's router in process (no network): the median and the slowest.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use sqlx::PgPool;
use tower::ServiceExt as _;

const KINDS: i64 = 20;

async fn fill(pool: &PgPool, rows: i64) {
    let started = Instant::now();
    // In slices, so that one statement's memory and WAL stay modest.
    let slice = 250_000;
    let mut from = 1;
    while from <= rows {
        let to = (from + slice - 1).min(rows);
        sqlx::query(
            r#"
INSERT INTO jobs (kind, key, state, attempts, max_attempts, payload, priority, run_after,
                  created_at, finished_at, last_error, errors, claimed_by, claimed_until)
SELECT 'kind.' || (i % $3),
       CASE WHEN i % 4 = 0 THEN 'key-' || i END,
       s.state,
       CASE WHEN s.state = 'pending' THEN 0 ELSE 1 + i % 3 END,
       3,
       jsonb_build_object('user', i, 'note', 'a payload of a typical size, with some text'),
       (i % 10)::smallint,
       CASE WHEN s.state = 'pending' AND i % 3 <> 0 THEN now() + (i % 3600) * interval '1 second'
            ELSE now() - (($2 - i) * interval '10 milliseconds') END,
       now() - (($2 - i) * interval '10 milliseconds'),
       CASE WHEN s.state IN ('done', 'failed', 'cancelled') THEN now() - (($2 - i) * interval '10 milliseconds') END,
       CASE WHEN s.state = 'failed' THEN 'connection refused: upstream 10.0.0.' || (i % 250) || ':443' END,
       CASE WHEN s.state = 'failed' THEN jsonb_build_array(
           jsonb_build_object('attempt', 1, 'at', now(), 'kind', 'error', 'message', 'timeout after 30s'),
           jsonb_build_object('attempt', 2, 'at', now(), 'kind', 'error', 'message', 'connection refused'))
            ELSE '[]'::jsonb END,
       CASE WHEN s.state = 'running' THEN gen_random_uuid() END,
       CASE WHEN s.state = 'running' THEN now() + interval '1 hour' END
FROM generate_series($1::bigint, $4::bigint) AS i
CROSS JOIN LATERAL (SELECT CASE
    WHEN i % 1000 < 950 THEN 'done'
    WHEN i % 1000 < 980 THEN 'failed'
    WHEN i % 1000 < 995 AND i % 10000 <> 994 THEN 'pending'
    WHEN i % 10000 = 994 AND i <= 2000000 THEN 'running'
    ELSE 'cancelled' END AS state) s
"#,
        )
        .bind(from)
        .bind(rows)
        .bind(KINDS)
        .bind(to)
        .execute(pool)
        .await
        .unwrap();
        from = to + 1;
    }
    sqlx::query(
        r#"
INSERT INTO jobs_throughput (kind, minute, succeeded, failed, retried, cancelled, run_time_buckets)
SELECT 'kind.' || k, date_trunc('minute', now()) - m * interval '1 minute',
       1000 + (m * 37 + k * 11) % 400, (m + k) % 7, (m + k) % 3, 0, '{}'
FROM generate_series(0, $1 - 1) k, generate_series(0, 10079) m
"#,
    )
    .bind(KINDS)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO jobs_runtimes (id, name, host, pid, version, kinds, concurrency)
         VALUES (gen_random_uuid(), 'bench', 'localhost', 1, '0.1.0', ARRAY['kind.1'], 100)",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE jobs, jobs_throughput")
        .execute(pool)
        .await
        .unwrap();
    println!(
        "filled {rows} rows in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// Runs the web workload: `args` are `--rows N` and `--runs N`.
pub async fn run(args: &[String]) {
    let mut rows: i64 = 2_000_000;
    let mut runs = 9;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--rows" => rows = it.next().and_then(|v| v.parse().ok()).expect("--rows N"),
            "--runs" => runs = it.next().and_then(|v| v.parse().ok()).expect("--runs N"),
            other => panic!("unknown argument to web: {other}"),
        }
    }
    let pool = super::fresh_database(8).await;
    fill(&pool, rows).await;
    let failed_id: i64 =
        sqlx::query_scalar("SELECT max(id) FROM jobs WHERE state = 'failed' AND kind = 'kind.7'")
            .fetch_one(&pool)
            .await
            .unwrap();
    let app = jobs_web::Dashboard::new(pool.clone()).router();
    let pages = [
        ("overview", "/".to_owned()),
        ("overview, chart of 6 hours", "/?hours=6".to_owned()),
        ("overview, chart of a day", "/?hours=24".to_owned()),
        ("jobs, newest", "/jobs".to_owned()),
        ("jobs, failed", "/jobs?state=failed".to_owned()),
        (
            "jobs, failed of a kind",
            "/jobs?state=failed&kind=kind.7".to_owned(),
        ),
        (
            "jobs, pending by run time",
            "/jobs?state=pending&order=run".to_owned(),
        ),
        (
            "jobs, done of a kind (window)",
            "/jobs?state=done&kind=kind.3".to_owned(),
        ),
        (
            "jobs, key search, absent",
            "/jobs?key=no-such-key".to_owned(),
        ),
        (
            "jobs, key search, present",
            format!("/jobs?key=key-{}", rows - rows % 4),
        ),
        ("job, failed, with history", format!("/jobs/{failed_id}")),
    ];
    println!(
        "{:<34} {:>10} {:>10}  ({} rows, {runs} runs)",
        "page", "median ms", "max ms", rows
    );
    for (name, path) in pages {
        let mut times = Vec::new();
        for i in 0..=runs {
            let request = Request::get(path.as_str()).body(Body::empty()).unwrap();
            let started = Instant::now();
            let response = app.clone().oneshot(request).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let took = started.elapsed();
            assert_eq!(
                status,
                StatusCode::OK,
                "{path}: {}",
                String::from_utf8_lossy(&body)
            );
            if i > 0 {
                times.push(took);
            }
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{name:<34} {:>10.1} {:>10.1}",
            ms(times[times.len() / 2]),
            ms(*times.last().unwrap())
        );
    }
}
