//! The runtime's plans follow the table's size: a runtime started on an empty table,
//! which then grows without a vacuum (autovacuum off, or before its first pass), never
//! reads the whole table.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Running, runtime, wait_until};
use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pl.job")]
struct Plain {
    n: i64,
    /// The test that enqueued it (its place in [`RUNS`]).
    case: usize,
}

/// Handler runs, per test that enqueues `pl.job` (the tests of a binary share it).
static RUNS: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

#[jobs::handler]
async fn plain(job: Plain, _ctx: JobContext) -> Result<(), JobError> {
    RUNS[job.case].fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Enqueues `n` jobs one at a time for the test `case`, each once the one before has
/// run: a claim each.
async fn one_by_one(pool: &PgPool, case: usize, n: i64) {
    for i in 0..n {
        let before = RUNS[case].load(Ordering::SeqCst);
        Plain { n: i, case }.enqueue(pool).await.unwrap();
        wait_until("the job ran", || async {
            RUNS[case].load(Ordering::SeqCst) > before
        })
        .await;
    }
}

/// The rows read by sequential scans of `jobs` so far (as the statistics hold them).
async fn seq_tup_read(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables WHERE relname = 'jobs'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Started on an empty table, the runtime prepares its statements there; PostgreSQL
/// keeps a plan made at a prepared statement's sixth run until the table's statistics
/// change. Before the claims planned their first runs without sequential scans, the
/// claim's update of the rows it took kept a plan that read the whole table (an empty
/// table counts as ten pages, which a sequential scan reads more cheaply than ten
/// primary key probes): here every claim after the table grew read its 100,000 rows.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_started_on_an_empty_table_never_reads_it_whole(
    pool_opts: PgPoolOptions,
    opts: PgConnectOptions,
) {
    never_reads_it_whole(pool_opts, opts, 0).await;
}

/// As above, on a table vacuumed while it was still empty, as autovacuum does when its
/// first visit to a new database comes before any job: the statistics then say the
/// table is empty (no ten-page floor), and a plan made on them lasts until the next
/// vacuum or analyze. With only the claims' first runs planned without sequential
/// scans, the runtime read 32.7 million rows here: the idle runtime's next-due read
/// scanned the table once per kind and priority on each call (8 ms), and each rescue
/// joined the expired claims to a scan of the whole table.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_started_on_a_table_vacuumed_empty_never_reads_it_whole(
    pool_opts: PgPoolOptions,
    opts: PgConnectOptions,
) {
    never_reads_it_whole(pool_opts, opts, 1).await;
}

/// As above, with the vacuum of the still-empty table after the runtime's first runs
/// (autovacuum's first visit can come at any moment): every statement PostgreSQL kept a
/// plan for is planned again at its next run, on statistics that say the table is
/// empty. Planned there with sequential scans allowed (only a statement's first runs
/// on a connection were planned without), the runtime read 57.7 million rows here.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_whose_table_is_vacuumed_empty_after_its_first_runs_never_reads_it_whole(
    pool_opts: PgPoolOptions,
    opts: PgConnectOptions,
) {
    never_reads_it_whole(pool_opts, opts, 2).await;
}

/// The test above for the test `case` (0: the table never vacuumed, 1: vacuumed empty,
/// 2: vacuumed empty once the runtime's statements kept their plans).
async fn never_reads_it_whole(pool_opts: PgPoolOptions, opts: PgConnectOptions, case: usize) {
    let admin: PgPool = pool_opts.connect_with(opts.clone()).await.unwrap();
    sqlx::query("ALTER TABLE jobs SET (autovacuum_enabled = false)")
        .execute(&admin)
        .await
        .unwrap();
    if case == 1 {
        sqlx::query("VACUUM jobs").execute(&admin).await.unwrap();
    }
    // The runtime's own pool: closed at the end, so that its sessions' statistics are
    // written (a session writes them at most once a second, and when it ends).
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(opts.application_name("pl-runtime"))
        .await
        .unwrap();
    let running = Running::start(runtime(&pool, &["pl.job"]));
    // Every statement of the runtime runs more than six times on the small table: the
    // claims (one per job, and the empty ones of its polls every 50 ms), the completions,
    // the next-due reads, the rescues.
    one_by_one(&admin, case, 10).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    if case == 2 {
        // The runtime's statements have kept their plans; the statistics now change.
        sqlx::query("VACUUM jobs").execute(&admin).await.unwrap();
        one_by_one(&admin, case, 10).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let before = seq_tup_read(&admin).await;

    sqlx::query(
        "INSERT INTO jobs (kind, payload, state, finished_at, max_attempts)
         SELECT 'pl.other', '{}', 'done', now(), 1 FROM generate_series(1, 100000)",
    )
    .execute(&admin)
    .await
    .unwrap();
    one_by_one(&admin, case, 20).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    running.stop().await;
    pool.close().await;
    wait_until("the runtime's sessions ended", || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'pl-runtime'",
        )
        .fetch_one(&admin)
        .await
        .unwrap()
            == 0
    })
    .await;
    // The sessions wrote their statistics as they ended.
    let read = seq_tup_read(&admin).await - before;
    assert!(
        read < 100_000,
        "the runtime read {read} rows by sequential scans of a table of 100,030 rows"
    );
}

/// The plan nodes of `plan` (EXPLAIN's JSON), each with its children.
fn nodes(plan: &serde_json::Value, out: &mut Vec<(String, String)>) {
    let field = |name: &str| plan[name].as_str().unwrap_or_default().to_owned();
    out.push((field("Node Type"), field("Index Name")));
    for child in plan["Plans"].as_array().into_iter().flatten() {
        nodes(child, out);
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_hand_off_counts_the_running_jobs_without_a_bitmap_scan(pool: PgPool) {
    // A bitmap scan marks none of the dead index entries it reads: with every ended
    // job of the kind a dead entry of `jobs_running`, each hand-off would read them
    // all again (7 ms per hand-off after 50,000 ended jobs, where a plain scan read
    // them once). The plan PostgreSQL keeps for the statement is the generic one.
    let mut conn = pool.acquire().await.unwrap();
    // A table never analyzed (autovacuum off, or before its first pass): 20,000 jobs
    // of the kind ended (deleted), three run, and a backlog waits.
    for statement in [
        "INSERT INTO jobs (kind, payload, max_attempts, state) \
         SELECT 'pl.limited', '{}', 3, 'running' FROM generate_series(1, 20000)",
        "DELETE FROM jobs WHERE kind = 'pl.limited'",
        "INSERT INTO jobs (kind, payload, max_attempts, state) \
         SELECT 'pl.limited', '{}', 3, 'running' FROM generate_series(1, 3)",
        "INSERT INTO jobs (kind, payload, max_attempts) \
         SELECT 'pl.limited', '{}', 3 FROM generate_series(1, 200000)",
    ] {
        sqlx::query(statement).execute(&mut *conn).await.unwrap();
    }
    common::prepare_generic(
        &mut conn,
        "HAND_OFF_ONE",
        "h",
        "text, int, bigint, bigint, uuid, uuid",
    )
    .await;
    let (plan,): (serde_json::Value,) = sqlx::query_as(
        "EXPLAIN (FORMAT JSON) EXECUTE h('pl.limited', 8, 60000, 1, gen_random_uuid(), gen_random_uuid())",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let mut all = Vec::new();
    nodes(&plan[0]["Plan"], &mut all);
    let running: Vec<&(String, String)> = all
        .iter()
        .filter(|(_, index)| index == "jobs_running")
        .collect();
    assert!(!running.is_empty(), "the count reads jobs_running: {all:?}");
    assert!(
        running.iter().all(|(node, _)| !node.starts_with("Bitmap")),
        "a bitmap scan of jobs_running: {all:?}"
    );
}
