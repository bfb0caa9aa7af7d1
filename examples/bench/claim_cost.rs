//! W9: the claim statement alone, beside the minimal claim that the ceiling measures
//! (`bench/pgbench/claim_complete.sql`'s first statement, with the `priority = 0` the
//! claim index needs), on one connection of a fresh database. The two take turns,
//! each from a kind of its own, so both read the same table as it changes.
//! Microseconds per claim from send to the last row received, medians; the first
//! claims of each (while the statements are new, and as the runtime's first runs on a
//! connection) are not counted.
//!
//! To try a change to the claim before making it: `JOBS_BENCH_CLAIM_OUT=<file>` writes
//! the runtime's claim as it is sent; `JOBS_BENCH_CLAIM_ALT=<file>` (a claim taking the
//! same eight parameters) is then measured beside the two, taking turns with them from
//! the runtime's kind, and reported as "alternative"; `JOBS_BENCH_W9_SIZES=500,1000`
//! limits the sizes; `JOBS_BENCH_W9_KINDS=10` has the runtime's claim (and the
//! alternative) take each size in equal shares of that many kinds, as a runtime claims
//! ten busy kinds.

use std::time::Instant;

use sqlx::{PgConnection, Row};

/// How many jobs each claim asks for.
const SIZES: &[i32] = &[1, 10, 100, 500, 1_000];

/// Claims of each statement per run, and how many of them are not counted.
const CLAIMS: usize = 60;
const WARM_UP: usize = 6;

/// The ceiling's claim, for the claim index of today's table (`priority = 0`).
const MINIMAL: &str = "WITH picked AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE state = 'pending' AND kind = 'bench.minimal' AND priority = 0
      AND run_after <= now()
    ORDER BY run_after, id
    LIMIT $1
    FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE jobs j SET state = 'running', attempts = j.attempts + 1,
        claimed_by = $2, claimed_until = now() + interval '30 seconds'
    FROM picked WHERE j.id = picked.id
    RETURNING j.id
)
SELECT coalesce(array_agg(id), '{}') AS ids FROM claimed";

pub async fn run(runs: usize) {
    let claim = jobs::__private::statements()
        .into_iter()
        .find(|(name, _)| *name == "CLAIM")
        .expect("the claim statement")
        .1;
    if let Ok(path) = std::env::var("JOBS_BENCH_CLAIM_OUT") {
        std::fs::write(path, claim).expect("JOBS_BENCH_CLAIM_OUT: a writable file");
    }
    let alternative: Option<&'static str> = std::env::var("JOBS_BENCH_CLAIM_ALT").ok().map(|p| {
        let text = std::fs::read_to_string(p).expect("JOBS_BENCH_CLAIM_ALT: a readable file");
        &*Box::leak(text.into_boxed_str())
    });
    let sizes: Vec<i32> = match std::env::var("JOBS_BENCH_W9_SIZES") {
        Ok(list) => list
            .split(',')
            .map(|n| n.trim().parse().expect("JOBS_BENCH_W9_SIZES: numbers"))
            .collect(),
        Err(_) => SIZES.to_vec(),
    };
    let kinds: usize = std::env::var("JOBS_BENCH_W9_KINDS")
        .map(|k| match k.parse() {
            Ok(k) if k > 0 => k,
            _ => panic!("JOBS_BENCH_W9_KINDS: a number of kinds, at least 1"),
        })
        .unwrap_or(1);
    let kinds: Vec<String> = if kinds == 1 {
        vec!["bench.noop".to_owned()]
    } else {
        (0..kinds).map(|k| format!("bench.k{k}")).collect()
    };
    for &n in &sizes {
        let (mut ours, mut minimal, mut alt) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let pool = super::fresh_database(2).await;
            // Every kind gets as many rows as the minimal one, interleaved, as a batch
            // spread over them enqueues them; twice as many with an alternative, which
            // claims from the runtime's kinds too.
            let rows = i64::from(n) * CLAIMS as i64 * if alternative.is_some() { 2 } else { 1 };
            let mut all = kinds.clone();
            all.push("bench.minimal".to_owned());
            sqlx::query(
                "INSERT INTO jobs (kind, payload, max_attempts)
                 SELECT k, jsonb_build_object('seq', g), 20
                 FROM generate_series(1, $1) g, unnest($2::text[]) k",
            )
            .bind(rows)
            .bind(&all)
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query("VACUUM ANALYZE jobs")
                .execute(&pool)
                .await
                .unwrap();
            let mut conn = pool.acquire().await.unwrap();
            let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..CLAIMS {
                let t = timed(&mut conn, claim, n, &kinds).await;
                let u = timed(&mut conn, MINIMAL, n, &kinds).await;
                let v = match alternative {
                    Some(statement) => Some(timed(&mut conn, statement, n, &kinds).await),
                    None => None,
                };
                if i >= WARM_UP {
                    a.push(t);
                    b.push(u);
                    c.extend(v);
                }
            }
            ours.push(super::median(a));
            minimal.push(super::median(b));
            if !c.is_empty() {
                alt.push(super::median(c));
            }
            drop(conn);
            pool.close().await;
        }
        let per_row = |v: &[f64]| super::median(v.to_vec()) / f64::from(n);
        super::report(
            &format!("W9 claim of {n}, the runtime's"),
            "us",
            ours.clone(),
            &[("us_per_row", per_row(&ours))],
        );
        if !alt.is_empty() {
            super::report(
                &format!("W9 claim of {n}, alternative"),
                "us",
                alt.clone(),
                &[("us_per_row", per_row(&alt))],
            );
        }
        super::report(
            &format!("W9 claim of {n}, minimal"),
            "us",
            minimal.clone(),
            &[("us_per_row", per_row(&minimal))],
        );
    }
}

/// One claim of `n` jobs by `statement` (the runtime's claim, an alternative, or
/// [`MINIMAL`]), the first two from `kinds` in equal shares:
/// microseconds from send to its last row. Panics if it took fewer than `n`.
async fn timed(conn: &mut PgConnection, statement: &'static str, n: i32, kinds: &[String]) -> f64 {
    let started = Instant::now();
    let taken = if statement == MINIMAL {
        let row = sqlx::query(MINIMAL)
            .bind(n)
            .bind(uuid::Uuid::new_v4())
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        row.get::<Vec<i64>, _>("ids").len()
    } else {
        let k = i32::try_from(kinds.len()).unwrap();
        let shares: Vec<i32> = (0..k).map(|i| n / k + i32::from(i < n % k)).collect();
        let rows = sqlx::query(statement)
            .bind(kinds)
            .bind(shares)
            .bind(vec![30_000_i64; kinds.len()])
            .bind(n)
            .bind(Vec::<f64>::new())
            .bind(uuid::Uuid::new_v4())
            .bind(Vec::<i64>::new())
            .bind(Vec::<f64>::new())
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        // The rows with a job (an alternative may report apart, on a row of its own).
        rows.iter()
            .filter(|row| matches!(row.try_get::<Option<i64>, _>("id"), Ok(Some(_))))
            .count()
    };
    let took = started.elapsed().as_secs_f64() * 1e6;
    assert_eq!(
        taken, n as usize,
        "a claim took fewer jobs than it asked for"
    );
    took
}
