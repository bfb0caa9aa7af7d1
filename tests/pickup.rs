//! Pickup after commit, whatever path made a job pending: a job's transaction that
//! commits late, a row locked while claims passed it, an enqueue that waited for its
//! key's lock, an operator's retry inside a transaction. Each test runs a steady stream
//! of jobs of the same kind, so that the runtime's claims (and their floors) move past
//! the job while it cannot be seen or taken, and polls once an hour: the job must be
//! found by the claims themselves, not by the probe behind the floors, which runs once
//! at the start and then once per poll interval. One more has no stream: the runtime is
//! idle when the row it passed is freed.
//!
//! Also: jobs start in priority order over a backlog, and a runtime of several kinds
//! claims a busy kind's jobs as a one-kind runtime does.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Running, live_of, lock, runtime, wait_until};
use jobs::{EnqueueBatch, EnqueueOptions, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// A job that records when it started (`started (n, at)`).
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pk.job", key = "key")]
struct Work {
    n: i64,
    key: Option<String>,
}

#[jobs::handler]
async fn work(job: Work, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, job.n).await
}

/// Records that job `n` started (`started`).
async fn record(ctx: &JobContext, n: i64) -> Result<(), JobError> {
    sqlx::query("INSERT INTO started (n) VALUES ($1)")
        .bind(n)
        .execute(ctx.pool())
        .await?;
    Ok(())
}

/// Another kind, claimed by the same runtime.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pk.other")]
struct Other {}

#[jobs::handler]
async fn other(_job: Other, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

/// Other kinds of their own for the tests whose handlers enqueue one at the same moment
/// of their runs: a process sends one notification per kind every few milliseconds, and
/// under `cargo test` a file's tests share one process (one test's enqueue took the
/// other's notification, and its job waited for the hourly poll).
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pk.snooze_other")]
struct SnoozeOther {}

#[jobs::handler]
async fn snooze_other(_job: SnoozeOther, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pk.rerun_other")]
struct RerunOther {}

#[jobs::handler]
async fn rerun_other(_job: RerunOther, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

async fn setup(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE started (n bigint, at timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// How many runs of job `n` started.
async fn started(pool: &PgPool, n: i64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM started WHERE n = $1")
        .bind(n)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The runtime of these tests: polls (and probes behind its floors) once an hour.
fn hourly(pool: &PgPool, kinds: &[&str]) -> Running {
    Running::start(runtime(pool, kinds).poll_interval(Duration::from_secs(3600)))
}

/// Enqueues a job of `pk.job` every 5 ms (n from 1,000 on) until dropped.
struct Stream(Arc<AtomicBool>);

impl Stream {
    fn start(pool: &PgPool) -> Stream {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut n = 1_000;
            while !flag.load(Ordering::Relaxed) {
                Work { n, key: None }.enqueue(&pool).await.unwrap();
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        Stream(stop)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Lets the stream's claims move the floors well past what was enqueued until now.
async fn let_claims_pass() {
    tokio::time::sleep(Duration::from_millis(600)).await;
}

/// Job 1, enqueued in a transaction that commits after the stream's claims have passed
/// it for `passes` times `let_claims_pass`, starts.
async fn commit_late(pool: &PgPool, passes: usize) {
    let rt = hourly(pool, &["pk.job"]);
    let stream = Stream::start(pool);
    let_claims_pass().await;
    let mut tx = pool.begin().await.unwrap();
    Work { n: 1, key: None }.enqueue(&mut *tx).await.unwrap();
    for _ in 0..passes {
        let_claims_pass().await;
    }
    tx.commit().await.unwrap();
    wait_until("the late job starts", || async {
        started(pool, 1).await == 1
    })
    .await;
    drop(stream);
    rt.stop().await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_whose_transaction_commits_late_starts_at_its_commit(pool: PgPool) {
    setup(&pool).await;
    commit_late(&pool, 1).await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_locked_while_claims_passed_it_starts_when_released(pool: PgPool) {
    setup(&pool).await;
    // The backlog waits while its kind is paused; claims of another kind go on, so
    // that the locker's transaction begins after claims the runtime has dated.
    let rt = hourly(&pool, &["pk.job", "pk.other"]);
    jobs::admin::pause_forced(&pool, "pk.job").await.unwrap();
    let mut batch = EnqueueBatch::new();
    for n in 1..=100 {
        batch.push(&Work { n, key: None }).unwrap();
    }
    let ids = batch.enqueue(&pool).await.unwrap();
    for _ in 0..20 {
        Other {}.enqueue(&pool).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let locker = lock(&pool, ids[4].id).await;
    jobs::admin::resume(&pool, "pk.job").await.unwrap();
    let stream = Stream::start(&pool);
    wait_until("the backlog but the locked job runs", || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM started WHERE n <= 100")
            .fetch_one(&pool)
            .await
            .unwrap()
            == 99
    })
    .await;
    let_claims_pass().await;
    locker.rollback().await.unwrap();
    wait_until("the released job starts", || async {
        started(&pool, 5).await == 1
    })
    .await;
    drop(stream);
    rt.stop().await;
}

/// A keyed job scheduled an hour ahead at priority `from`; a transaction coalesces a
/// trigger into it and holds its row; an enqueue of the same key at priority 0 (the
/// stream's) waits for that lock while claims pass, then coalesces too when the
/// transaction commits.
async fn enqueue_that_waited(pool: PgPool, from: i16) {
    setup(&pool).await;
    let key = Some("k".to_owned());
    Work {
        n: 1,
        key: key.clone(),
    }
    .enqueue_with(
        &pool,
        EnqueueOptions::new()
            .delay(Duration::from_secs(3600))
            .priority(from),
    )
    .await
    .unwrap();
    let rt = hourly(&pool, &["pk.job"]);
    let stream = Stream::start(&pool);
    let_claims_pass().await;
    let mut tx = pool.begin().await.unwrap();
    Work {
        n: 1,
        key: key.clone(),
    }
    .enqueue_with(
        &mut *tx,
        EnqueueOptions::new()
            .delay(Duration::from_secs(3600))
            .priority(from),
    )
    .await
    .unwrap();
    let waiter = {
        let pool = pool.clone();
        let options = EnqueueOptions::new().priority(0);
        tokio::spawn(async move {
            Work {
                n: 2,
                key: Some("k".to_owned()),
            }
            .enqueue_with(&pool, options)
            .await
            .unwrap()
        })
    };
    let_claims_pass().await;
    assert!(
        !waiter.is_finished(),
        "the enqueue waits for the key's lock"
    );
    tx.commit().await.unwrap();
    assert!(
        !waiter.await.unwrap().inserted(),
        "coalesced into the key's job"
    );
    wait_until("the coalesced job starts", || async {
        started(&pool, 2).await == 1
    })
    .await;
    drop(stream);
    rt.stop().await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_enqueue_that_waited_for_its_keys_lock_starts_when_it_commits(pool: PgPool) {
    enqueue_that_waited(pool, 0).await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_enqueue_that_waited_and_raised_the_priority_starts_when_it_commits(pool: PgPool) {
    enqueue_that_waited(pool, 5).await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_operator_retry_inside_a_transaction_starts_at_its_commit(pool: PgPool) {
    setup(&pool).await;
    let id = Work { n: 1, key: None }.enqueue(&pool).await.unwrap().id;
    sqlx::query("UPDATE jobs SET state = 'failed', finished_at = now() WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    let rt = hourly(&pool, &["pk.job"]);
    let stream = Stream::start(&pool);
    let_claims_pass().await;
    let mut tx = pool.begin().await.unwrap();
    // Something else first: the transaction's start is older than its retry.
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    let_claims_pass().await;
    jobs::admin::retry(&mut *tx, id).await.unwrap();
    let_claims_pass().await;
    tx.commit().await.unwrap();
    wait_until("the retried job starts", || async {
        started(&pool, 1).await == 1
    })
    .await;
    drop(stream);
    rt.stop().await;
}

/// The run-after of job `id`, and the database's time now, in seconds since the epoch.
async fn run_after(pool: &PgPool, id: i64) -> (f64, f64) {
    sqlx::query_as(
        "SELECT extract(epoch FROM run_after)::float8, extract(epoch FROM clock_timestamp())::float8 \
         FROM jobs WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A transaction that commits late re-stamps what it made pending (migration 13): an
/// insert, a trigger coalesced into a pending job, an operator's retry. Its rows are then
/// not behind the floors the claims moved meanwhile, and no claim waits for a look back
/// over what was claimed since the transaction began. What commits on time, a delayed
/// job, and a statement on its own keep their run-afters.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_late_commit_restamps_what_it_made_pending(pool: PgPool) {
    let late = Duration::from_millis(300);
    let keyed = Work {
        n: 1,
        key: Some("k".to_owned()),
    }
    .enqueue(&pool)
    .await
    .unwrap()
    .id;
    let failed = Work { n: 2, key: None }.enqueue(&pool).await.unwrap().id;
    sqlx::query("UPDATE jobs SET state = 'failed', finished_at = now() WHERE id = $1")
        .bind(failed)
        .execute(&pool)
        .await
        .unwrap();

    let mut tx = pool.begin().await.unwrap();
    let inserted = Work { n: 3, key: None }.enqueue(&mut *tx).await.unwrap().id;
    let coalesced = Work {
        n: 4,
        key: Some("k".to_owned()),
    }
    .enqueue(&mut *tx)
    .await
    .unwrap();
    assert!(!coalesced.inserted());
    jobs::admin::retry(&mut *tx, failed).await.unwrap();
    let delayed = Work { n: 5, key: None }
        .enqueue_with(
            &mut *tx,
            EnqueueOptions::new().delay(Duration::from_secs(3600)),
        )
        .await
        .unwrap()
        .id;
    tokio::time::sleep(late).await;
    let on_time = Work { n: 6, key: None }.enqueue(&mut *tx).await.unwrap().id;
    let written = run_after(&pool, keyed).await.1;
    tx.commit().await.unwrap();

    for (what, id) in [
        ("an insert", inserted),
        ("a coalesced trigger", keyed),
        ("a retry", failed),
    ] {
        let (at, now) = run_after(&pool, id).await;
        assert!(
            at > written && at <= now,
            "{what}: run-after {at} not re-stamped at the commit (after {written})"
        );
    }
    let (on_time_at, _) = run_after(&pool, on_time).await;
    assert!(
        on_time_at <= written,
        "committed on time: kept its run-after"
    );
    let (delayed_at, now) = run_after(&pool, delayed).await;
    assert!(delayed_at > now + 3000.0, "a delayed job keeps its delay");

    // A statement on its own keeps its run-afters, however long it ran.
    let alone: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (kind, payload, max_attempts, run_after) \
         SELECT 'pk.job', '{\"n\": 7, \"key\": null}', 3, now() - interval '1 hour' \
         FROM pg_sleep(0.2) RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let (alone_at, now) = run_after(&pool, alone).await;
    assert!(
        alone_at < now - 3000.0,
        "a statement on its own: not re-stamped"
    );
}

/// The worst case left to the look back: a commit that becomes visible more than the
/// floors' lag after the re-stamp (here a deferred trigger of the application's that
/// sleeps after it, as a commit that waits for a synchronous standby would). The
/// claims pass its row meanwhile; the claim that sees its transaction end reports it,
/// and the probe looks behind the floors from that transaction's start at once, not at
/// the poll (once an hour here).
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_commit_visible_long_after_its_restamp_is_found_by_the_look_back(pool: PgPool) {
    setup(&pool).await;
    sqlx::raw_sql(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM pg_sleep(0.6); RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER zz_slow_commit AFTER INSERT ON jobs \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW \
         WHEN ((NEW.payload->>'n')::int = 1) EXECUTE FUNCTION slow_commit();",
    )
    .execute(&pool)
    .await
    .unwrap();
    // Longer than the claims look back themselves (a second): the probe does.
    commit_late(&pool, 2).await;
}

/// A statement on its own that wrote its row 0.5 s after it began (its run-after, the
/// statement's start, is behind the floors the stream's claims moved meanwhile) and is
/// not re-stamped: the claim that sees it end reports its time, within a second of the
/// floors, and the next claim looks back from there, though the claim that reported
/// it took rows of the same range (and moved that range's floor past the row).
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_slow_statement_on_its_own_is_found_by_the_next_claim(pool: PgPool) {
    setup(&pool).await;
    let rt = hourly(&pool, &["pk.job"]);
    let stream = Stream::start(&pool);
    let_claims_pass().await;
    sqlx::query(
        "WITH slow AS MATERIALIZED (SELECT pg_current_xact_id(), pg_sleep(0.5)) \
         INSERT INTO jobs (kind, payload, max_attempts, run_after) \
         SELECT 'pk.job', '{\"n\": 1, \"key\": null}', 3, statement_timestamp() FROM slow",
    )
    .execute(&pool)
    .await
    .unwrap();
    wait_until("the slow statement's job starts", || async {
        started(&pool, 1).await == 1
    })
    .await;
    drop(stream);
    rt.stop().await;
}

/// A row left behind the floors where no claim could report it (here a raw insert with
/// a run-after an hour old, as a claimer that died holding rows leaves them): the
/// probe, which runs every poll interval, finds it.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_probe_finds_a_row_behind_the_floors(pool: PgPool) {
    setup(&pool).await;
    let rt = Running::start(runtime(&pool, &["pk.job"]).poll_interval(Duration::from_millis(200)));
    let stream = Stream::start(&pool);
    let_claims_pass().await;
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts, run_after) \
         VALUES ('pk.job', '{\"n\": 1, \"key\": null}', 3, now() - interval '1 hour')",
    )
    .execute(&pool)
    .await
    .unwrap();
    wait_until("the job behind the floors starts", || async {
        started(&pool, 1).await == 1
    })
    .await;
    drop(stream);
    rt.stop().await;
}

// ---------------------------------------------------------------------------------
// Priority order over a backlog.

/// A job that records the order its runs started in (`order_seen (seq, priority)`).
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pk.ordered")]
struct Ordered {
    priority: i16,
}

#[jobs::handler]
async fn ordered(job: Ordered, ctx: JobContext) -> Result<(), JobError> {
    sqlx::query("INSERT INTO order_seen (priority) VALUES ($1)")
        .bind(job.priority)
        .execute(ctx.pool())
        .await?;
    tokio::time::sleep(Duration::from_millis(2)).await;
    Ok(())
}

/// Concurrency 1 over a backlog enqueued least urgent first (so that ids run against
/// priorities), with handlers short enough that the runtime soon claims ahead of its
/// slot, in claims that span priorities: every run starts in priority order.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_started_over_a_backlog_runs_it_in_priority_order(pool: PgPool) {
    sqlx::query("CREATE TABLE order_seen (seq bigserial, priority smallint)")
        .execute(&pool)
        .await
        .unwrap();
    for round in 0..3 {
        let mut batch = EnqueueBatch::new();
        for priority in [9, 9, 5, 5, 0, 0] {
            for _ in 0..10 {
                batch
                    .push_with(
                        &Ordered { priority },
                        EnqueueOptions::new().priority(priority),
                    )
                    .unwrap();
            }
        }
        batch.enqueue(&pool).await.unwrap();
        let rt = Running::start(runtime(&pool, &["pk.ordered"]).concurrency(1));
        wait_until("the backlog is done", || async {
            common::live(&pool).await == 0
        })
        .await;
        rt.stop().await;
        let seen: Vec<i16> = sqlx::query_scalar("SELECT priority FROM order_seen ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        assert_eq!(seen, sorted, "round {round}: runs in priority order");
        sqlx::query("TRUNCATE order_seen")
            .execute(&pool)
            .await
            .unwrap();
    }
}

// ---------------------------------------------------------------------------------
// Several kinds.

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pk.wide")]
struct Wide {
    n: u32,
}

#[jobs::handler]
async fn wide(_job: Wide, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

/// A claim over two kinds, one of them idle, takes up to 1,000 of the busy one, as a
/// one-kind claim does, and is read as full: the runtime claims again at once instead
/// of waiting for the poll (an hour here), as it did when it read "fewer than asked
/// over all kinds" as an empty queue.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_runtime_of_several_kinds_claims_a_busy_kind_without_waiting_for_the_poll(pool: PgPool) {
    let mut batch = EnqueueBatch::new();
    for n in 0..10_000 {
        batch.push(&Wide { n }).unwrap();
    }
    batch.enqueue(&pool).await.unwrap();
    let rt = Running::start(
        runtime(&pool, &["pk.wide", "pk.other"])
            .concurrency(2_500)
            .poll_interval(Duration::from_secs(3600)),
    );
    wait_until("all 10,000 jobs done without a poll", || async {
        common::live(&pool).await == 0
    })
    .await;
    rt.stop().await;
}

/// Ten kinds, each recording its completions in `finished (seq, kind)`.
macro_rules! fair_kinds {
    ($($module:ident = $kind:literal),* $(,)?) => {
        $(
            mod $module {
                use super::*;
                #[derive(Job, Serialize, Deserialize)]
                #[job(kind = $kind)]
                pub struct Fair {}
                #[jobs::handler]
                async fn handle(_job: Fair, ctx: JobContext) -> Result<(), JobError> {
                    sqlx::query("INSERT INTO finished (kind) VALUES ($1)")
                        .bind($kind)
                        .execute(ctx.pool())
                        .await?;
                    Ok(())
                }
            }
        )*
    };
}

fair_kinds!(
    f0 = "pk.f0",
    f1 = "pk.f1",
    f2 = "pk.f2",
    f3 = "pk.f3",
    f4 = "pk.f4",
    f5 = "pk.f5",
    f6 = "pk.f6",
    f7 = "pk.f7",
    f8 = "pk.f8",
    f9 = "pk.f9",
);

/// Ten busy kinds, enqueued one after another (each kind's backlog older than the
/// next one's): every window of 200 completions holds each kind's share within 2x of
/// any other's, so no kind waits for another's backlog to drain.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn busy_kinds_take_turns(pool: PgPool) {
    sqlx::query("CREATE TABLE finished (seq bigserial, kind text)")
        .execute(&pool)
        .await
        .unwrap();
    let kinds: Vec<String> = (0..10).map(|k| format!("pk.f{k}")).collect();
    for kind in &kinds {
        sqlx::query(
            "INSERT INTO jobs (kind, payload, max_attempts) SELECT $1, '{}', 3 FROM generate_series(1, 300)",
        )
        .bind(kind)
        .execute(&pool)
        .await
        .unwrap();
    }
    let names: Vec<&str> = kinds.iter().map(String::as_str).collect();
    let rt = Running::start(runtime(&pool, &names).concurrency(10));
    wait_until("every job done", || async {
        common::live(&pool).await == 0
    })
    .await;
    rt.stop().await;
    let order: Vec<String> = sqlx::query_scalar("SELECT kind FROM finished ORDER BY seq")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(order.len(), 3_000);
    // The first 2,400 completions, while every kind still has jobs.
    for (w, window) in order[..2_400].chunks(200).enumerate() {
        let counts: Vec<usize> = kinds
            .iter()
            .map(|k| window.iter().filter(|d| *d == k).count())
            .collect();
        let (least, most) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
        assert!(
            most <= 2 * least.max(1) && least > 0,
            "window {w}: completions per kind {counts:?}"
        );
    }
}

/// A kind that keeps the claims busy: each job takes 2 ms.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pk.busy")]
struct Busy {}

#[jobs::handler]
async fn busy(_job: Busy, _ctx: JobContext) -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_millis(2)).await;
    Ok(())
}

/// While a busy kind keeps the claims full (they then ask only for the kinds with
/// jobs), a job of a quiet kind that came without a notification (inserted by hand
/// here, as a scheduled job becomes due by its time) is found by the probe beside the
/// claims and starts long before the busy kind's backlog drains.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_quiet_kinds_job_without_a_notification_starts_while_another_kind_is_busy(pool: PgPool) {
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts) SELECT 'pk.busy', '{}', 3 FROM generate_series(1, 20000)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let rt = Running::start(
        runtime(&pool, &["pk.busy", "pk.other"])
            .concurrency(10)
            .poll_interval(Duration::from_secs(3600)),
    );
    wait_until("the busy kind under way", || async {
        live_of(&pool, "pk.busy").await < 19_500
    })
    .await;
    sqlx::query("INSERT INTO jobs (kind, payload, max_attempts) VALUES ('pk.other', '{}', 3)")
        .execute(&pool)
        .await
        .unwrap();
    wait_until("the quiet kind's job done", || async {
        live_of(&pool, "pk.other").await == 0
    })
    .await;
    let left = live_of(&pool, "pk.busy").await;
    rt.stop().await;
    assert!(
        left > 1_000,
        "the quiet kind's job waited for the busy kind's backlog: {left} jobs of it were left"
    );
}

/// Whether the snoozing job has snoozed once.
static SNOOZED: AtomicBool = AtomicBool::new(false);

/// A job that, on its first run, waits 20 ms (its kind turns quiet meanwhile: the
/// claim just after the enqueue's notification finds nothing more of it), enqueues a
/// job of another kind, and snoozes with no delay.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pk.snooze")]
struct SnoozeOnce {}

#[jobs::handler]
async fn snooze_once(_job: SnoozeOnce, ctx: JobContext) -> Result<(), JobError> {
    if !SNOOZED.swap(true, Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        SnoozeOther {}.enqueue(ctx.pool()).await?;
        return Err(JobError::snooze(Duration::ZERO));
    }
    Ok(())
}

/// A job made claimable again inside the runtime (here a snooze; also a retry, an
/// expired claim taken back, a periodic job armed) wakes the idle producer for its
/// kind. Here its kind has turned quiet, and the claims around the snooze ask for
/// another kind (its job, enqueued just before, is notified and then busy): each is
/// sent after the snooze, so the next-due query, which looks back only to the last
/// claim, does not see the snoozed job either. Unless the wake names the kind, the job
/// waits for the poll (an hour here); the claim just after a notification asked for
/// every kind and found it, until it asked only for the kinds named. (The probe of
/// quiet kinds, every 50 ms at most, also finds it when it runs: on a machine slow
/// enough that the handler ends 50 ms after its start, this test passes either way.)
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_snoozed_without_delay_runs_at_once_though_its_kind_turned_quiet(pool: PgPool) {
    // Room for more than the jobs: each claim comes back short, and the runtime idles.
    let rt = Running::start(
        runtime(&pool, &["pk.snooze", "pk.snooze_other"])
            .concurrency(10)
            .poll_interval(Duration::from_secs(3600)),
    );
    // The runtime's first claims, and the poll's first tick, are behind it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    SnoozeOnce {}.enqueue(&pool).await.unwrap();
    wait_until("the snoozed job run again", || async {
        SNOOZED.load(Ordering::SeqCst) && live_of(&pool, "pk.snooze").await == 0
    })
    .await;
    assert_eq!(
        live_of(&pool, "pk.snooze_other").await,
        0,
        "the other kind's job ran"
    );
    rt.stop().await;
}

/// How many times the re-run job has run.
static RERUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A keyed job that, on its first run, waits 20 ms, marks itself for a re-run (an
/// enqueue of its key while it runs), and enqueues a job of another kind.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pk.rerun", key = "key")]
struct RerunOnce {
    key: String,
}

#[jobs::handler]
async fn rerun_once(job: RerunOnce, ctx: JobContext) -> Result<(), JobError> {
    if RERUNS.fetch_add(1, Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        RerunOnce { key: job.key }.enqueue(ctx.pool()).await?;
        RerunOther {}.enqueue(ctx.pool()).await?;
    }
    Ok(())
}

/// As the snoozed job above, a job that its completion sends back to pending (a re-run
/// mark) runs again at once, though its kind turned quiet while it ran and the claims
/// around its completion asked for another kind: the completer's wake-up names the
/// kinds of what it wrote.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_marked_for_a_rerun_runs_again_at_once_though_its_kind_turned_quiet(pool: PgPool) {
    let rt = Running::start(
        runtime(&pool, &["pk.rerun", "pk.rerun_other"])
            .concurrency(10)
            .poll_interval(Duration::from_secs(3600)),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    RerunOnce { key: "k".into() }.enqueue(&pool).await.unwrap();
    wait_until("the re-run done", || async {
        RERUNS.load(Ordering::SeqCst) >= 2 && live_of(&pool, "pk.rerun").await == 0
    })
    .await;
    assert_eq!(RERUNS.load(Ordering::SeqCst), 2, "one run, one re-run");
    rt.stop().await;
}

/// Whether the held jobs may end.
static RELEASE: AtomicBool = AtomicBool::new(false);

/// A job that records its start, then runs until the test lets it end (so that no
/// completion writes to the table meanwhile).
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pk.hold")]
struct Hold {
    n: i64,
}

#[jobs::handler]
async fn hold(job: Hold, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, job.n).await?;
    while !RELEASE.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// An idle runtime's claim passes a row another transaction holds, and that
/// transaction ends just after the claim, before the runtime looks for what is due
/// next: no writer is left to see, and the row lies behind the claim's floor (it is
/// older than the claim). The runtime must still claim it at once, not at the poll.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_row_released_just_after_an_idle_runtimes_claim_passed_it_starts_at_once(pool: PgPool) {
    setup(&pool).await;
    // A first job: the runtime's floors, and its one look behind them, come and go
    // before the rest (the next look is an hour away).
    let rt = hourly(&pool, &["pk.hold"]);
    Hold { n: 0 }.enqueue(&pool).await.unwrap();
    wait_until("the first job starts", || async {
        started(&pool, 0).await == 1
    })
    .await;
    jobs::admin::pause_forced(&pool, "pk.hold").await.unwrap();
    let held = Hold { n: 1 }.enqueue(&pool).await.unwrap().id;
    let mut locker = pool.acquire().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT id FROM jobs WHERE id = {held} FOR UPDATE"
    )))
    .execute(&mut *locker)
    .await
    .unwrap();
    // Due in a moment: claimed by a claim of its own time, with no notification (and
    // so no follow-up claim after it).
    let due = Hold { n: 2 }
        .enqueue_with(
            &pool,
            EnqueueOptions::new().delay(Duration::from_millis(500)),
        )
        .await
        .unwrap()
        .id;
    jobs::admin::resume(&pool, "pk.hold").await.unwrap();
    // The locker ends as soon as the claim that takes job 2 has committed (it passed
    // job 1 on its way).
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DO $$ BEGIN
             WHILE NOT EXISTS (SELECT 1 FROM jobs WHERE id = {due} AND state = 'running') LOOP
             END LOOP;
         END $$;
         ROLLBACK"
    )))
    .execute(&mut *locker)
    .await
    .unwrap();
    wait_until("the released job starts", || async {
        started(&pool, 1).await == 1
    })
    .await;
    RELEASE.store(true, Ordering::SeqCst);
    rt.stop().await;
}

/// A kind with a limit across runtimes: its claims are transactions of their own.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pk.capped", global_concurrency = 5)]
struct Capped {
    n: i64,
}

#[jobs::handler]
async fn capped(job: Capped, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, job.n).await
}

/// The only job of a kind with a global limit is held by another transaction when the
/// kind is claimed (so that claim finds nothing it can take), and freed by a rollback,
/// which notifies no one. It starts then, not at the poll.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_limited_kinds_row_freed_while_the_runtime_idles_starts_at_once(pool: PgPool) {
    setup(&pool).await;
    let rt = hourly(&pool, &["pk.capped"]);
    jobs::admin::pause_forced(&pool, "pk.capped").await.unwrap();
    let held = Capped { n: 1 }.enqueue(&pool).await.unwrap().id;
    let locker = lock(&pool, held).await;
    jobs::admin::resume(&pool, "pk.capped").await.unwrap();
    let_claims_pass().await;
    assert_eq!(started(&pool, 1).await, 0, "held: not claimed");
    locker.rollback().await.unwrap();
    wait_until("the freed job starts", || async {
        started(&pool, 1).await == 1
    })
    .await;
    rt.stop().await;
}

/// A second kind with a limit: its claim, held up on its kind's lock, makes the window
/// in which another kind's job becomes due.
#[derive(Job, Serialize, Deserialize)]
#[job(kind = "pk.capped2", global_concurrency = 5)]
struct Capped2 {
    n: i64,
}

#[jobs::handler]
async fn capped2(job: Capped2, ctx: JobContext) -> Result<(), JobError> {
    record(&ctx, job.n).await
}

/// A scheduled job of a quiet kind with a limit becomes due while the runtime's claim
/// of another kind is held up (another transaction holds that kind's lock), and no
/// notification names it. The next-due query after that claim finds it due since the
/// claim looked and names its kind: it starts then, not at the poll.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_quiet_limited_kinds_job_due_during_a_claim_starts_after_it(pool: PgPool) {
    setup(&pool).await;
    let rt = hourly(&pool, &["pk.capped", "pk.capped2"]);
    // The first claims find both kinds empty: both are quiet.
    let_claims_pass().await;
    // Due in 150 ms, inserted without a notification.
    sqlx::query(
        "INSERT INTO jobs (kind, payload, max_attempts, run_after) \
         VALUES ('pk.capped', '{\"n\": 1}', 3, now() + interval '150 ms')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext('pk.capped2'))")
        .bind(0x6a6f_6273_i32)
        .execute(&mut *lock)
        .await
        .unwrap();
    // Its notification wakes the runtime, whose claim of pk.capped2 waits for the lock.
    Capped2 { n: 2 }.enqueue(&pool).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(started(&pool, 1).await, 0, "the runtime is in its claim");
    lock.commit().await.unwrap();
    wait_until("the job due during the claim starts", || async {
        started(&pool, 1).await == 1
    })
    .await;
    rt.stop().await;
}

/// Starts an hourly runtime of `pk.job` and `pk.other` and a stream of `pk.job`, lets
/// its claims pass, and enqueues a job of `pk.other` delayed by `delay` (with its
/// notification).
async fn delayed_while_streaming(pool: &PgPool, delay: Duration) -> (Running, Stream) {
    setup(pool).await;
    let rt = hourly(pool, &["pk.job", "pk.other"]);
    let stream = Stream::start(pool);
    let_claims_pass().await;
    Other {}
        .enqueue_with(pool, EnqueueOptions::new().delay(delay))
        .await
        .unwrap();
    (rt, stream)
}

/// While a stream of another kind's notifications keeps waking the runtime (its
/// next-due queries then ask only for the kinds the wake-ups named and the busy ones),
/// a delayed job of a quiet kind, enqueued with a notification just before the stream
/// ends, starts at its time, not at the hourly poll: the claim that its notification
/// named it to (which finds nothing due) names it to the next-due query after.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_delayed_job_enqueued_while_another_kind_wakes_the_runtime_starts_at_its_time(
    pool: PgPool,
) {
    let (rt, stream) = delayed_while_streaming(&pool, Duration::from_millis(300)).await;
    drop(stream);
    wait_until("the delayed job done", || async {
        live_of(&pool, "pk.other").await == 0
    })
    .await;
    rt.stop().await;
}

/// A job enqueued without a notification (the producer sent one for its kind a moment
/// before) starts though other kinds' notifications wake the runtime every few
/// milliseconds: the follow-up claim of its kind, 10 ms after that notification, asks
/// for it (other kinds' wake-ups used to put that claim off for good, leaving the job
/// to the quiet kinds' probe, which the runtime also runs while it idles). The first
/// job of the kind is delayed, so that the claim its notification brings finds nothing
/// and the kind turns quiet; the job due now is enqueued 2 ms later, most often after
/// that claim.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_job_enqueued_without_a_notification_starts_though_other_kinds_wake_the_runtime(
    pool: PgPool,
) {
    let (rt, stream) = delayed_while_streaming(&pool, Duration::from_secs(3600)).await;
    tokio::time::sleep(Duration::from_millis(2)).await;
    Other {}.enqueue(&pool).await.unwrap();
    wait_until("the job due now done", || async {
        live_of(&pool, "pk.other").await == 1
    })
    .await;
    drop(stream);
    rt.stop().await;
}
