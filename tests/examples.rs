//! The consumer examples (`examples/*.rs`), each run against a fresh database and
//! checked by what it left there, not only by finishing.
//!
//! The example files are included as modules, so this binary links the handlers of all
//! four: each example's runtimes claim only its own kinds (`.kinds(KINDS)`), and the
//! kinds are distinct across the examples. The examples' `main` functions go unused here.

// Each example includes `examples/support/mod.rs` itself (it must build on its own), so
// this binary holds four copies of that module; they do not interact.
#![allow(clippy::duplicate_mod)]

#[path = "../examples/replay_watermark.rs"]
mod replay_watermark;
#[path = "../examples/segment_purge.rs"]
mod segment_purge;
#[path = "../examples/semantic_ingestion.rs"]
mod semantic_ingestion;
#[path = "../examples/session_lifecycle.rs"]
mod session_lifecycle;

use sqlx::PgPool;

fn init_tracing() {
    // RUST_LOG=jobs=debug shows the runtimes' events in a failing test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Rows of the job table of these kinds, in any state.
async fn jobs_of(pool: &PgPool, kinds: &[&str]) -> Vec<(String, String)> {
    let kinds: Vec<&str> = kinds.to_vec();
    sqlx::query_as("SELECT kind, state FROM jobs WHERE kind = ANY($1) ORDER BY kind")
        .bind(&kinds)
        .fetch_all(pool)
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn session_lifecycle_coalesces_triggers_and_ends_deleted(pool: PgPool) {
    init_tracing();
    let report = session_lifecycle::demo(&pool).await.unwrap();

    // Four creations and two boot fan-outs over four sessions: four jobs.
    assert_eq!(report.boot, (4, 8, 0));

    let session = |label: &str| {
        report
            .sessions
            .iter()
            .find(|s| s.label == label)
            .unwrap_or_else(|| panic!("no session {label}"))
            .clone()
    };
    let started = |label: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM sl_events e JOIN sl_sessions s USING (session_id) \
                 WHERE s.label = $1 AND e.what = 'provision started'",
            )
            .bind(label)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    for label in ["s2", "s3", "s4"] {
        let s = session(label);
        assert_eq!(s.state, "provisioned", "{label}");
        assert_eq!(s.provision_runs, 1, "{label} provisioned once");
        assert_eq!(
            started(label).await,
            1,
            "{label}: three triggers, one handler run"
        );
    }

    let s1 = session("s1");
    assert_eq!((s1.state.as_str(), s1.provision_runs), ("deleted", 1));
    let (inserted, coalesced, marked) = report.repeated_delete;
    assert_eq!(inserted + coalesced + marked, 6);
    assert!(inserted >= 1);
    // Each inserted job runs once; the re-run marks on one running claim add one run.
    let runs = usize::try_from(s1.delete_runs).unwrap();
    assert!(
        runs >= inserted && runs <= inserted + marked,
        "{runs} delete runs for {inserted} inserted and {marked} re-run marks"
    );

    // The race: whichever committed first, the session ends deleted.
    let s5 = session("s5");
    assert_eq!(s5.state, "deleted");
    assert!(s5.provision_runs <= 1);
    assert!(s5.delete_runs >= 1);

    // Deleted before the provision ran: the provision saw the tombstone.
    let s6 = session("s6");
    assert_eq!((s6.state.as_str(), s6.provision_runs), ("deleted", 0));
    let refused: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sl_events e JOIN sl_sessions s USING (session_id) \
         WHERE s.label = 's6' AND e.what = 'provision refused: session deleted'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(refused, 1);

    assert_eq!(
        jobs_of(&pool, &session_lifecycle::KINDS).await,
        [],
        "every job completed and was deleted; none failed"
    );
}

// ---------------------------------------------------------------------------------

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn semantic_ingestion_claims_sets_once_reruns_once_and_refuses_late_results(pool: PgPool) {
    use semantic_ingestion::{BUSY_SET, SETS, STALLED_SET};

    init_tracing();
    let report = semantic_ingestion::demo(&pool).await.unwrap();
    assert_eq!(report.initial, (6, 3, 0), "one job per dirty set");
    assert_eq!(
        report.during_run,
        (0, 0, 2),
        "changes during a run mark it for a re-run"
    );

    let calls = |set: i64| -> Vec<&semantic_ingestion::Call> {
        report.calls.iter().filter(|c| c.set_id == set).collect()
    };
    for set in SETS {
        let calls = calls(set);
        match set {
            BUSY_SET => {
                // Two more changes during the first round: exactly one more round, which
                // ingests them.
                let revisions: Vec<i64> = calls.iter().map(|c| c.revision).collect();
                assert_eq!(revisions, [1, 3], "set {set}");
                assert!(
                    calls
                        .iter()
                        .all(|c| c.outcome.as_deref() == Some("committed"))
                );
            }
            STALLED_SET => {
                let outcomes: Vec<(i32, Option<&str>)> = calls
                    .iter()
                    .map(|c| (c.attempt, c.outcome.as_deref()))
                    .collect();
                assert_eq!(
                    outcomes,
                    [(1, Some("refused: lease lost")), (2, Some("committed"))],
                    "the lost claim's late result is refused; the takeover's commits"
                );
                assert_eq!(calls[0].lease_moved_ms, None, "the first claim was gone");
            }
            _ => {
                // One round per set: the two replicas took disjoint sets.
                assert_eq!(calls.len(), 1, "set {set}: {calls:?}");
                assert_eq!(calls[0].outcome.as_deref(), Some("committed"));
            }
        }
    }
    // Every committed round outlasted the 500ms lease and kept its claim: the lease was
    // renewed while the round ran.
    for c in report
        .calls
        .iter()
        .filter(|c| c.outcome.as_deref() == Some("committed"))
    {
        assert!(c.lease_moved_ms.is_some_and(|ms| ms > 0.0), "{c:?}");
    }

    let (behind, stalled_by): (i64, String) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM si_sets WHERE ingested_revision <> revision), \
                (SELECT ingested_by FROM si_sets WHERE set_id = $1)",
    )
    .bind(STALLED_SET)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(behind, 0, "every set ingested at its latest revision");
    let takeover = calls(STALLED_SET)[1].replica.clone();
    assert_eq!(
        stalled_by, takeover,
        "set 3's result is the takeover's, not the late one"
    );
    // Each change was embedded once; the takeover of set 3 resumed after the lost
    // claim's checkpoint and embedded nothing again.
    let revisions: i64 = sqlx::query_scalar("SELECT count(*) FROM si_changes")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        report.embeddings.len() as i64,
        revisions,
        "every change embedded"
    );
    // The takeover of set 3 embedded nothing again. (Elsewhere a claim lost by
    // accident on a loaded machine, between an embedding and its checkpoint, may redo
    // that one change: at least once.)
    let stalled: Vec<(i32, i32)> = report
        .embeddings
        .iter()
        .filter(|(set, _, _, _)| *set == STALLED_SET)
        .map(|(_, _, attempt, times)| (*attempt, *times))
        .collect();
    assert!(!stalled.is_empty());
    assert!(
        stalled
            .iter()
            .all(|&(attempt, times)| attempt == 1 && times == 1),
        "{stalled:?}"
    );
    assert_eq!(jobs_of(&pool, &semantic_ingestion::KINDS).await, []);
}

// ---------------------------------------------------------------------------------

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn segment_purge_deletes_bounded_batches_each_row_once(pool: PgPool) {
    use segment_purge::{BATCH, EXPIRED_SEGMENTS, FRESH_ENTRIES, LIVE_SEGMENTS, STALE_ENTRIES};

    init_tracing();
    let report = segment_purge::demo(&pool).await.unwrap();
    let store = |name: &str| {
        report
            .iter()
            .find(|r| r.store == name)
            .unwrap_or_else(|| panic!("no store {name}"))
    };
    for (name, purged, kept) in [
        ("segments", EXPIRED_SEGMENTS, LIVE_SEGMENTS),
        ("registry", STALE_ENTRIES, FRESH_ENTRIES),
    ] {
        let r = store(name);
        assert_eq!(r.deleted, purged, "{name}: every purgeable row deleted");
        assert_eq!(r.deleted_twice, 0, "{name}: no row deleted twice");
        assert_eq!(r.left, kept, "{name}: the rows to keep are kept");
        assert!(r.largest_batch <= BATCH, "{name}: {r:?}");
        let fewest = purged / BATCH + i64::from(purged % BATCH != 0);
        assert!(r.batches >= fewest, "{name}: {r:?}");
    }
    let (expired_left, stale_left): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM sp_segments WHERE expires_at < now()), \
                (SELECT count(*) FROM sp_registry WHERE last_seen < now() - interval '1 hour')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((expired_left, stale_left), (0, 0));

    // Every deleted row was deleted by a committed step, and each step's count is its
    // transaction's: the step's record and its deletes committed together.
    let mismatched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sp_steps s \
         WHERE s.deleted <> (SELECT count(*) FROM sp_purge_log l WHERE l.xid = s.xid)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(mismatched, 0);
    let (steps_total, logged): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT sum(deleted)::bigint FROM sp_steps), (SELECT count(*) FROM sp_purge_log)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(steps_total, logged);

    // The periodic purges stay armed, one live job each; the continuation is gone.
    let mut jobs = jobs_of(&pool, &segment_purge::KINDS).await;
    jobs.sort();
    let states: Vec<(&str, &str)> = jobs.iter().map(|(k, s)| (k.as_str(), s.as_str())).collect();
    assert_eq!(
        states,
        [
            ("registry.purge", "pending"),
            ("segment_store.purge", "pending")
        ]
    );
}

// ---------------------------------------------------------------------------------

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn replay_watermark_processes_each_item_once_in_order_and_retries_from_the_watermark(
    pool: PgPool,
) {
    init_tracing();
    let report = replay_watermark::demo(&pool).await.unwrap();
    assert_eq!(report.initial, (6, 24, 0), "one replay job per stream");
    assert_eq!(report.streams.len(), 6);
    for s in &report.streams {
        assert_eq!(s.through_seq, s.last_seq, "{s:?}");
        assert_eq!(s.processed, s.last_seq, "every item processed once: {s:?}");
        assert_eq!(s.distinct_items, s.last_seq, "{s:?}");
        assert!(s.in_order, "{s:?}");
    }
    let b_memory = report
        .streams
        .iter()
        .find(|s| s.session == "B" && s.subsystem == "memory")
        .unwrap();
    assert_eq!(b_memory.last_seq, replay_watermark::INITIAL_ITEMS + 2);

    // A's search stream: the first batch committed, the second failed part-way and was
    // rolled back, recorded in last_error, and retried from the watermark.
    let notes: Vec<String> = sqlx::query_scalar(
        "SELECT note FROM rw_log WHERE session_id = $1 AND subsystem = 'search' ORDER BY id",
    )
    .bind(report.session_a)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        notes,
        [
            "attempt 1 from watermark 0: processed 3 item(s), watermark 3",
            "attempt 1 from watermark 3: failed at item 4",
            "attempt 2 from watermark 3, after: search rejected item 4: injected failure: \
             processed 2 item(s), watermark 5",
        ]
    );
    let faults: i64 = sqlx::query_scalar("SELECT count(*) FROM rw_faults")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(faults, 0, "the injected failure happened");
    assert_eq!(jobs_of(&pool, &replay_watermark::KINDS).await, []);
}
