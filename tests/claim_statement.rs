//! The claim statements read alone: what they report of the rows their locking scans
//! passed while another transaction held them, and that they count nothing when their
//! scans passed none (the count reads every row taken once more); and the kinds a claim
//! of kinds with a limit marks as holding a due job it could not take.

mod common;

use serde_json::Value;
use sqlx::{PgConnection, PgPool, Row};

/// The parameters of both claims, as `PREPARE` lists them.
const PARAMETERS: &str = "text[], int[], bigint[], int, float8[], uuid, bigint[], float8[]";

/// The arguments of a claim of `per_kind` jobs of each of `kinds`, `total` in all, from
/// the start of every range (no floors, no writers).
fn arguments(kinds: &[&str], per_kind: i32, total: i32) -> String {
    let n = vec![per_kind.to_string(); kinds.len()].join(",");
    let lease = vec!["60000"; kinds.len()].join(",");
    format!(
        "('{{{}}}', '{{{n}}}', '{{{lease}}}', {total}, '{{}}', gen_random_uuid(), '{{}}', '{{}}')",
        kinds.join(",")
    )
}

/// Claims as `c` does, and returns the ids taken and each one's `held_back`.
async fn claim(conn: &mut PgConnection, args: &str) -> Vec<(i64, Option<f64>)> {
    sqlx::query(sqlx::AssertSqlSafe(format!("EXECUTE c{args}")))
        .fetch_all(&mut *conn)
        .await
        .unwrap()
        .iter()
        .filter_map(|row| {
            let id: Option<i64> = row.get("id");
            id.map(|id| (id, row.get("held_back")))
        })
        .collect()
}

/// Claims as `c` does under `EXPLAIN ANALYZE`: whether any index scan of the CTE
/// `passed` ran, and whether the locking scans read `jobs_claim`.
async fn claim_explained(conn: &mut PgConnection, args: &str) -> (bool, bool) {
    let (plan,): (Value,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE c{args}"
    )))
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let mut passed = None;
    find(&plan[0]["Plan"], "CTE passed", &mut passed);
    let passed = passed.expect("the plan has the CTE passed");
    let mut scans_ran = false;
    each(passed, &mut |node| {
        let kind = node["Node Type"].as_str().unwrap_or_default();
        if kind.starts_with("Index") && node["Actual Loops"].as_u64().unwrap_or(0) > 0 {
            scans_ran = true;
        }
    });
    let mut claim_index = false;
    each(&plan[0]["Plan"], &mut |node| {
        if node["Node Type"] == "LockRows" {
            each(node, &mut |scan| {
                claim_index |= scan["Index Name"] == "jobs_claim"
            });
        }
    });
    (scans_ran, claim_index)
}

/// [`claim_explained`] under each plan PostgreSQL may run `c` with: a custom plan (the
/// runtime's first runs of a statement), then the generic one it keeps. Whether
/// `passed`'s scans ran, for each; asserts that the locking scans read `jobs_claim`.
async fn counted_under_both_plans(conn: &mut PgConnection, args: &str) -> [bool; 2] {
    let mut counted = [false; 2];
    for (mode, slot) in ["force_custom_plan", "force_generic_plan"]
        .into_iter()
        .zip(&mut counted)
    {
        sqlx::query(sqlx::AssertSqlSafe(format!("SET plan_cache_mode = {mode}")))
            .execute(&mut *conn)
            .await
            .unwrap();
        let (ran, claim_index) = claim_explained(conn, args).await;
        assert!(claim_index, "the locking scans read jobs_claim ({mode})");
        *slot = ran;
    }
    counted
}

/// Locks the `nth` pending job of `kind` (see [`lock_nth`]) and claims past it: the
/// claim takes all it asked for (`want`), the held job not among them. Returns the
/// rows taken, the locking transaction, and the held job's id and run-after.
async fn claim_past_held(
    pool: &PgPool,
    conn: &mut PgConnection,
    args: &str,
    (kind, nth): (&str, i64),
    want: usize,
) -> (
    Vec<(i64, Option<f64>)>,
    sqlx::Transaction<'static, sqlx::Postgres>,
    i64,
    f64,
) {
    let (held, held_id, held_at) = lock_nth(pool, kind, nth).await;
    let taken = claim(conn, args).await;
    assert_eq!(taken.len(), want);
    assert!(taken.iter().all(|(id, _)| *id != held_id));
    (taken, held, held_id, held_at)
}

/// The node of `plan` whose subplan name is `name`.
fn find<'a>(plan: &'a Value, name: &str, out: &mut Option<&'a Value>) {
    if plan["Subplan Name"] == name {
        *out = Some(plan);
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        find(child, name, out);
    }
}

/// Calls `f` on `plan` and every node under it.
fn each(plan: &Value, f: &mut dyn FnMut(&Value)) {
    f(plan);
    for child in plan["Plans"].as_array().into_iter().flatten() {
        each(child, f);
    }
}

/// Enqueues `n` jobs of each of `kinds`, in one statement per kind.
async fn backlog(pool: &PgPool, kinds: &[&str], n: i64) {
    for kind in kinds {
        sqlx::query(
            "INSERT INTO jobs (kind, payload, max_attempts)
             SELECT $1, jsonb_build_object('n', g), 3 FROM generate_series(1, $2) g",
        )
        .bind(kind)
        .bind(n)
        .execute(pool)
        .await
        .unwrap();
    }
}

/// Locks, in a transaction of its own, the pending job of `kind` that comes `nth` in
/// claim order; returns the transaction, the job's id and its run-after.
async fn lock_nth(
    pool: &PgPool,
    kind: &str,
    nth: i64,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, i64, f64) {
    let (id, run_after): (i64, f64) = sqlx::query_as(
        "SELECT id, extract(epoch FROM run_after)::float8 FROM jobs
         WHERE kind = $1 AND state = 'pending'
         ORDER BY priority, run_after, id OFFSET $2 - 1 LIMIT 1",
    )
    .bind(kind)
    .bind(nth)
    .fetch_one(pool)
    .await
    .unwrap();
    // Locked by its id alone: a locking read with an offset locks the rows it skips too.
    (common::lock(pool, id).await, id, run_after)
}

/// One kind, so [`CLAIM`]: a claim whose scan passed no row counts nothing; one that
/// passed a held row reports it on every row it took of the range.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_claim_counts_the_rows_it_passed_only_when_it_passed_one(pool: PgPool) {
    backlog(&pool, &["cs.one"], 1_000).await;
    let mut conn = pool.acquire().await.unwrap();
    common::prepare_generic(&mut conn, "CLAIM", "c", PARAMETERS).await;
    let args = arguments(&["cs.one"], 100, 100);
    assert_eq!(
        counted_under_both_plans(&mut conn, &args).await,
        [false, false],
        "a claim that passed no row counted the rows it passed (custom, generic plan)"
    );

    let (taken, held, held_id, held_at) =
        claim_past_held(&pool, &mut conn, &args, ("cs.one", 10), 100).await;
    assert!(
        taken.iter().all(|(_, back)| *back == Some(held_at)),
        "every row of the range reports the held row's run-after: {taken:?}"
    );
    assert_eq!(
        counted_under_both_plans(&mut conn, &args).await,
        [true, true],
        "a claim that passed a held row did not count (custom, generic plan)"
    );

    held.rollback().await.unwrap();
    let taken = claim(&mut conn, &args).await;
    let first = taken.iter().map(|(id, _)| *id).min();
    assert_eq!(first, Some(held_id), "the released row is taken first");
    assert!(taken.iter().all(|(_, back)| back.is_none()));
}

/// Two kinds whose limits add up to more than the claim takes, so [`CLAIM_SPLIT`],
/// whose unlocked first pass reads the same index before the locking scans: it is not
/// counted as rows they passed.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_split_claim_counts_the_rows_it_passed_only_when_it_passed_one(pool: PgPool) {
    let kinds = ["cs.a", "cs.b"];
    backlog(&pool, &kinds, 300).await;
    let mut conn = pool.acquire().await.unwrap();
    common::prepare_generic(&mut conn, "CLAIM_SPLIT", "c", PARAMETERS).await;
    let args = arguments(&kinds, 100, 100);
    assert_eq!(
        counted_under_both_plans(&mut conn, &args).await,
        [false, false],
        "a claim that passed no row counted the rows it passed (custom, generic plan)"
    );

    let (taken, held, _, held_at) =
        claim_past_held(&pool, &mut conn, &args, ("cs.a", 5), 100).await;
    assert!(
        taken.iter().any(|(_, back)| *back == Some(held_at)),
        "the rows of the held row's range report it: {taken:?}"
    );
    held.rollback().await.unwrap();
}

/// The claim reports each row's run-after by `date_part` (a `float8`), while the probe,
/// `held_back` and the tests read it by `extract(...)::float8` (a `numeric`, rounded
/// once): the floors are built from the one and compared with the other, so the two
/// must agree to the last bit. For due run-afters at random microseconds over 35 years
/// in the claim's own output, and for instants over 57 years in the functions
/// themselves.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_claimed_run_after_is_the_same_float_as_extract_gives(pool: PgPool) {
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts, run_after)
         SELECT 'cs.times', '{}', 3,
                timestamptz '1990-01-01' + floor(random() * 1.1e15) * interval '1 microsecond'
         FROM generate_series(1, 1000)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let expected: std::collections::HashMap<i64, f64> =
        sqlx::query_as("SELECT id, extract(epoch FROM run_after)::float8 FROM jobs")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let rows = sqlx::query(common::statement("CLAIM"))
        .bind(vec!["cs.times"])
        .bind(vec![1_000_i32])
        .bind(vec![60_000_i64])
        .bind(1_000_i32)
        .bind(Vec::<f64>::new())
        .bind(uuid::Uuid::new_v4())
        .bind(Vec::<i64>::new())
        .bind(Vec::<f64>::new())
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1_000, "the claim took every job");
    for row in &rows {
        let (id, run_after): (i64, f64) = (row.get("id"), row.get("run_after"));
        assert_eq!(
            run_after.to_bits(),
            expected[&id].to_bits(),
            "job {id}: the claim reports {run_after}, extract gives {}",
            expected[&id]
        );
    }

    let differ: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (
             SELECT timestamptz '1990-01-01' + floor(random() * 1.8e15) * interval '1 microsecond' AS t
             FROM generate_series(1, 200000)) s
         WHERE date_part('epoch', t) IS DISTINCT FROM extract(epoch FROM t)::float8",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(differ, 0, "date_part and extract disagree on some instants");
}

/// Claims as `c` does, in a transaction it rolls back: the kinds of the rows taken, and
/// the claim's `found`, sorted.
async fn split_found(conn: &mut PgConnection, args: &str) -> (Vec<String>, Option<Vec<i64>>) {
    sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!("EXECUTE c{args}")))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    sqlx::query("ROLLBACK").execute(&mut *conn).await.unwrap();
    let taken = rows
        .iter()
        .filter_map(|r| r.get::<Option<String>, _>("kind"))
        .collect();
    let found: Option<Vec<i64>> = rows[0].get("found");
    (
        taken,
        found.map(|mut f| {
            f.sort_unstable();
            f
        }),
    )
}

/// What a split claim's `found` says: the kinds (places in its first argument, from 1)
/// of which its unlocked pass found a job due, taken or not. Not a kind with jobs only
/// in the future, nor one with none; but a kind whose jobs another transaction holds,
/// and one the claim's total cut off before its turn. With nothing due anywhere it is
/// empty, not NULL: the runtime counts every kind asked quiet then, and none on NULL.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_split_claim_reports_the_kinds_it_found_a_job_due_of(pool: PgPool) {
    backlog(&pool, &["cs.busy", "cs.held", "cs.cut"], 3).await;
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts, run_after)
         SELECT 'cs.later', '{}', 3, now() + interval '1 hour' FROM generate_series(1, 3)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM jobs WHERE kind = 'cs.held' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    common::prepare_generic(&mut conn, "CLAIM_SPLIT", "c", PARAMETERS).await;
    // A turn of two: the busy kind's first job, and the held kind's (whose scan then
    // locks nothing); the cut kind's comes third. Each kind may take three.
    let kinds = ["cs.busy", "cs.later", "cs.none", "cs.held", "cs.cut"];
    let (taken, found) = split_found(&mut conn, &arguments(&kinds, 3, 2)).await;
    assert_eq!(taken, ["cs.busy"], "what the claim took");
    assert_eq!(found, Some(vec![1, 4, 5]), "the kinds found");
    let (taken, found) = split_found(&mut conn, &arguments(&["cs.later", "cs.none"], 3, 2)).await;
    assert!(taken.is_empty(), "nothing due: {taken:?}");
    assert_eq!(found, Some(vec![]), "nothing due: found is empty");
    holder.rollback().await.unwrap();
}

/// The marks of a claim of kinds with a limit (`CLAIM_LIMITED`), by kind, and how
/// many jobs it took of each; run in a transaction rolled back after.
async fn limited_marks(
    pool: &PgPool,
    kinds: &[&str],
    asked: i32,
    limit: i32,
) -> (Vec<(String, String)>, Vec<String>) {
    let mut tx = pool.begin().await.unwrap();
    let n = vec![asked; kinds.len()];
    let lease = vec![60_000_i64; kinds.len()];
    let lim = vec![limit; kinds.len()];
    let none_i32: Vec<Option<i32>> = vec![None; kinds.len()];
    let none_i64: Vec<Option<i64>> = vec![None; kinds.len()];
    let rows = sqlx::query(common::statement("CLAIM_LIMITED"))
        .bind(kinds)
        .bind(&n)
        .bind(&lease)
        .bind(&lim)
        .bind(uuid::Uuid::new_v4())
        .bind(&none_i32)
        .bind(&none_i64)
        .bind(&none_i32)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut marks = Vec::new();
    let mut taken = Vec::new();
    for row in rows {
        let kind: String = row.get("kind");
        match row.get::<Option<String>, _>("mark") {
            Some(mark) => marks.push((kind, mark)),
            None => taken.push(kind),
        }
    }
    marks.sort();
    taken.sort();
    (marks, taken)
}

/// A claim of kinds with a limit that takes less than the limits allow, while a due job
/// of the kind is held by another transaction, marks the kind `held` (the runtime asks
/// it again shortly: the rollback that frees the row notifies no one), in place of
/// `cut` (the limit did not hold it back). A kind that simply had fewer due jobs, or
/// whose held job is not due yet, is not marked; one the limit held back is `cut`.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_limited_claim_marks_a_kind_whose_due_job_another_transaction_holds(pool: PgPool) {
    backlog(&pool, &["a", "b", "c"], 2).await;
    // A job of "d" not due yet, held.
    let future: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (kind, payload, max_attempts, run_after)
         VALUES ('d', '{}', 3, now() + interval '1 hour') RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let (held_a, _, _) = lock_nth(&pool, "a", 1).await;
    let (held_c, _, _) = lock_nth(&pool, "c", 2).await;
    let held_d = common::lock(&pool, future).await;
    // Room for 5 of each: "a" takes 1 and passed 1 (held), "b" takes both (fewer
    // than it could: no mark), "c" takes 1 and passed 1, "d" has nothing due.
    let (marks, taken) = limited_marks(&pool, &["a", "b", "c", "d"], 5, 5).await;
    assert_eq!(
        marks,
        [
            ("a".to_owned(), "held".to_owned()),
            ("c".to_owned(), "held".to_owned())
        ]
    );
    assert_eq!(taken, ["a", "b", "b", "c"]);
    // More slots than the limit: the limit did not hold "a" back (it took 1 of 5).
    let (marks, _) = limited_marks(&pool, &["a"], 10, 5).await;
    assert_eq!(marks, [("a".to_owned(), "held".to_owned())]);
    // A limit of 1: "a" and "c" take their one free job and the limit holds them back
    // (cut), their held jobs notwithstanding. "d" has no job due: the limit held
    // nothing back, so it is not cut (quiet, its next claim comes with its job).
    let (marks, _) = limited_marks(&pool, &["a", "b", "c", "d"], 5, 1).await;
    assert_eq!(
        marks
            .iter()
            .map(|(k, m)| format!("{k}:{m}"))
            .collect::<Vec<_>>(),
        ["a:cut", "b:cut", "c:cut"]
    );
    // Released: nothing is held.
    held_a.rollback().await.unwrap();
    held_c.rollback().await.unwrap();
    held_d.rollback().await.unwrap();
    let (marks, taken) = limited_marks(&pool, &["a", "b", "c", "d"], 5, 5).await;
    assert_eq!(marks, []);
    assert_eq!(taken.len(), 6);
}

/// `CLAIM_PARTITIONED`'s mark, and the jobs it took, for a claim of up to 5 jobs of
/// kind "p" (partitioned by `tenant`, at most 5 running each), rolled back after.
async fn partitioned_mark(pool: &PgPool) -> (Option<String>, usize) {
    let mut tx = pool.begin().await.unwrap();
    let rows = sqlx::query(common::statement("CLAIM_PARTITIONED"))
        .bind("p")
        .bind(5_i32)
        .bind(60_000_i64)
        .bind(5_i32)
        .bind(uuid::Uuid::new_v4())
        .bind(vec!["tenant"])
        .bind(None::<i32>)
        .bind(None::<i64>)
        .bind(None::<i32>)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mark = rows.iter().find_map(|r| r.get::<Option<String>, _>("mark"));
    let taken = rows
        .iter()
        .filter(|r| r.get::<Option<i64>, _>("id").is_some())
        .count();
    (mark, taken)
}

/// The same for a kind whose limits hold per partition: a job it chose but could not
/// lock marks it `held`.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_partitioned_claim_marks_a_kind_whose_chosen_job_another_transaction_holds(pool: PgPool) {
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts)
         SELECT 'p', jsonb_build_object('tenant', 't' || g), 3 FROM generate_series(1, 2) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(partitioned_mark(&pool).await, (None, 2));
    let (held, _, _) = lock_nth(&pool, "p", 1).await;
    assert_eq!(partitioned_mark(&pool).await, (Some("held".to_owned()), 1));
    held.rollback().await.unwrap();
    assert_eq!(partitioned_mark(&pool).await, (None, 2));
}
