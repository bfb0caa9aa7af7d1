//! Every statement that touches the `jobs` table, with the index each one relies on.
//!
//! Times are compared only against the database clock (`now()`); durations come in as
//! milliseconds computed in Rust. Every write the framework makes for a claim is fenced
//! with the claim's token and `claimed_until > now()`.

/// Inserts one job, or coalesces it into the live job of its key.
///
/// Its run-after counts from the statement's start, not the transaction's (`now()`):
/// a job enqueued late in a long transaction is then not older, in claim order, than
/// jobs committed while that transaction ran, and a claim that starts at its floor
/// ([`CLAIM`]) finds it at once. A transaction that commits more than 50 ms after
/// the enqueue re-stamps the row's run-after at its commit (migration 13,
/// `jobs_late_commit`), so that it is not behind the floors then either.
///
/// `$1` kind, `$2` key, `$3` payload (JSON text), `$4` max_attempts, `$5` delay in ms,
/// `$6` whether to notify, `$7` an absolute run-after instead of the delay (or NULL):
/// one already past counts as now, so no row is made pending behind the claims' floor
/// ([`CLAIM_FLOOR_LAG`]); `$8` the priority; `$9` the enqueuer's trace context (a W3C
/// `traceparent`, or NULL). A trigger coalesced into the live job of its key gives it
/// the more urgent (lower) of the two priorities, and its own payload and trace context.
/// Index: `jobs_live_key` is the arbiter of `ON CONFLICT` (the predicate is repeated so
/// PostgreSQL can infer the partial index). Concurrent enqueues of one key serialize on
/// that index entry: the second waits for the first to commit and then updates its row,
/// so none fails with a unique violation. A pending job takes the new payload, the new
/// run-after (the newest trigger's time wins; no earlier than the update itself, which
/// follows any wait for that lock: a run-after from before the wait could lie behind
/// the claims' floors, [`CLAIM_FLOOR_LAG`]) and a fresh attempt budget (attempts back
/// to 0, the new `max_attempts`); a running one takes the new payload and a re-run mark,
/// and gets its fresh budget when its claim ends. One notification when the job is
/// pending, claimable now or later (an idle runtime then learns when it becomes due,
/// [`NEXT_DUE`]), delivered at commit (PostgreSQL folds identical notifications of one
/// transaction into one), unless `$6` is false: a notification takes a database-wide
/// lock held through the commit, so the caller sends at most one per kind every few
/// milliseconds (`enqueue::notify_now`), and concurrent producers' commits are not
/// serialized on it.
pub(crate) const ENQUEUE_ONE: &str = r#"
WITH ins AS (
    INSERT INTO jobs AS j (kind, key, payload, max_attempts, priority, trace, run_after)
    VALUES ($1, $2, $3::jsonb, $4, $8, $9,
            CASE WHEN $7::timestamptz IS NULL
                 THEN statement_timestamp() + $5 * interval '1 millisecond'
                 ELSE greatest($7, statement_timestamp()) END)
    ON CONFLICT (kind, key) WHERE state IN ('pending', 'running') AND key IS NOT NULL DO UPDATE SET
        payload = EXCLUDED.payload,
        trace = EXCLUDED.trace,
        max_attempts = EXCLUDED.max_attempts,
        attempts = CASE WHEN j.state = 'pending' THEN 0 ELSE j.attempts END,
        priority = least(j.priority, EXCLUDED.priority),
        checkpoint = CASE WHEN j.state = 'pending' THEN NULL ELSE j.checkpoint END,
        run_after = CASE WHEN j.state = 'pending' THEN greatest(EXCLUDED.run_after, clock_timestamp())
                         ELSE j.run_after END,
        rerun_after = CASE WHEN j.state = 'running' THEN EXCLUDED.run_after ELSE j.rerun_after END
    RETURNING j.id, (j.xmax = 0) AS inserted, j.state, j.kind
)
SELECT id, inserted, state
FROM ins
CROSS JOIN LATERAL (
    SELECT count(*) AS notified
    FROM (SELECT pg_notify('jobs', ins.kind) WHERE $6 AND ins.state = 'pending') n
) notify
"#;

/// [`ENQUEUE_ONE`] for a job without a key: a plain `INSERT`, with no `ON CONFLICT`
/// arbiter to consult and no speculative insertion (in `pgbench`, one client, 13 to
/// 15 % more enqueues a second, about 0.1 ms less each).
///
/// `$1` kind, `$2` payload (JSON text), `$3` max_attempts, `$4` delay in ms, `$5`
/// whether to notify, `$6` an absolute run-after (or NULL), `$7` the priority, `$8` the
/// trace context, each as in [`ENQUEUE_ONE`]. The row is always new and pending. No lock is taken that another
/// statement waits for; no index is read.
pub(crate) const ENQUEUE_ONE_UNKEYED: &str = r#"
WITH ins AS (
    INSERT INTO jobs AS j (kind, payload, max_attempts, priority, trace, run_after)
    VALUES ($1, $2::jsonb, $3, $7, $8,
            CASE WHEN $6::timestamptz IS NULL
                 THEN statement_timestamp() + $4 * interval '1 millisecond'
                 ELSE greatest($6, statement_timestamp()) END)
    RETURNING j.id, j.kind
)
SELECT id
FROM ins
CROSS JOIN LATERAL (
    SELECT count(*) AS notified
    FROM (SELECT pg_notify('jobs', ins.kind) WHERE $5) n
) notify
"#;

/// The run-after of a row `u` of a bulk enqueue ([`ENQUEUE_MANY`], [`ENQUEUE_UNKEYED`]):
/// its instant `u.at` if it has one (now, if that has passed: no row is made pending
/// behind the claims' floor, [`CLAIM_FLOOR_LAG`]), else now plus its delay `u.delay_ms`
/// (none when NULL), counted from the statement's start as in [`ENQUEUE_ONE`].
macro_rules! bulk_run_after {
    () => {
        "CASE WHEN u.at IS NULL
                THEN statement_timestamp() + coalesce(u.delay_ms, 0) * interval '1 millisecond'
                ELSE greatest(u.at, statement_timestamp()) END"
    };
}

/// Inserts many jobs in one statement; the caller has merged jobs of one key already
/// (one statement may not update one row twice).
///
/// `$1..$5` are arrays of kind, key, payload, max_attempts, delay_ms; `$6` the kinds to
/// notify (see [`ENQUEUE_ONE`]); `$7` the absolute run-afters (NULL for a delay) and
/// `$8` the priorities, as there; `$9` the trace context of every row (one enqueuer's). The caller sends the keys, delays, run-afters and
/// priorities as empty arrays when every row has the default (no key, no delay, no
/// instant, priority 0): `unnest` pads a shorter array with NULLs, read here as those
/// defaults, and the server decodes 400 fewer elements per 100 rows.
///
/// Rows without a key never conflict: a plain `INSERT` (`plain`) spares them the
/// speculative insertion of `ON CONFLICT` (about a sixth of the statement's server time
/// for unkeyed rows), takes no lock another inserter waits for, and returns their ids
/// only. Keyed rows go through `ON CONFLICT` (`keyed`) as in [`ENQUEUE_ONE`]. Rows are
/// fed in array order, and the caller sorts keyed rows by `(kind, key)`: every batch
/// then takes its row locks (and waits for another inserter of the same key) in one
/// global order, so two batches of overlapping keys never deadlock. The ids of unkeyed
/// rows rise in array order; each keyed row comes back with its kind and key, which
/// name its input. Index: `jobs_live_key`, as [`ENQUEUE_ONE`], for keyed rows. One
/// notification per kind that has a pending job, as [`ENQUEUE_ONE`].
pub(crate) const ENQUEUE_MANY: &str = concat!(
    r#"
WITH u AS (
    SELECT u.kind, u.key, u.payload::jsonb AS payload, u.max_attempts,
           coalesce(u.priority, 0) AS priority,
           "#,
    bulk_run_after!(),
    r#" AS run_after,
           u.ord
    FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::bigint[], $7::timestamptz[],
                $8::smallint[])
         WITH ORDINALITY AS u(kind, key, payload, max_attempts, delay_ms, at, priority, ord)
),
plain AS (
    INSERT INTO jobs AS j (kind, payload, max_attempts, priority, trace, run_after)
    SELECT kind, payload, max_attempts, priority, $9::text, run_after FROM u
    WHERE key IS NULL
    ORDER BY ord
    RETURNING j.id, j.kind
),
keyed AS (
    INSERT INTO jobs AS j (kind, key, payload, max_attempts, priority, trace, run_after)
    SELECT kind, key, payload, max_attempts, priority, $9::text, run_after FROM u
    WHERE key IS NOT NULL
    ORDER BY ord
    ON CONFLICT (kind, key) WHERE state IN ('pending', 'running') AND key IS NOT NULL DO UPDATE SET
        payload = EXCLUDED.payload,
        trace = EXCLUDED.trace,
        max_attempts = EXCLUDED.max_attempts,
        attempts = CASE WHEN j.state = 'pending' THEN 0 ELSE j.attempts END,
        priority = least(j.priority, EXCLUDED.priority),
        checkpoint = CASE WHEN j.state = 'pending' THEN NULL ELSE j.checkpoint END,
        run_after = CASE WHEN j.state = 'pending' THEN greatest(EXCLUDED.run_after, clock_timestamp())
                         ELSE j.run_after END,
        rerun_after = CASE WHEN j.state = 'running' THEN EXCLUDED.run_after ELSE j.rerun_after END
    RETURNING j.id, j.kind, j.key, (j.xmax = 0) AS inserted, j.state
),
notify AS (
    SELECT count(pg_notify('jobs', k.kind)) AS notified
    FROM (SELECT kind FROM plain
          UNION
          SELECT kind FROM keyed WHERE state = 'pending') k
    WHERE k.kind = ANY($6)
)
SELECT plain.id, NULL::text AS kind, NULL::text AS key, true AS inserted, NULL::text AS state
FROM plain CROSS JOIN notify
UNION ALL
SELECT keyed.id, keyed.kind, keyed.key, keyed.inserted, keyed.state
FROM keyed CROSS JOIN notify
"#
);

/// [`ENQUEUE_MANY`] for a batch in which no row has a key: its plain `INSERT` alone,
/// and the ids as one array, in array order (they rise in the order the rows are fed),
/// instead of a row per job. Without the keyed insert, its `UNION ALL` and the
/// materialized input it shares, a batch of 100 rows runs about 15 % more statements a
/// second than [`ENQUEUE_MANY`] (8 clients, notifications off), within a few per cent
/// of a bare `INSERT ... SELECT FROM unnest`.
///
/// `$1..$4` are arrays of kind, payload, max_attempts and delay_ms; `$5` the kinds to
/// notify; `$6` the absolute run-afters and `$7` the priorities; `$8` the trace
/// context of every row. Defaults and empty
/// arrays as [`ENQUEUE_MANY`]. Every row is inserted and pending, so every kind of `$5`
/// is notified (the caller lists only the batch's own kinds). No lock is taken that
/// another statement waits for; no index is read.
pub(crate) const ENQUEUE_UNKEYED: &str = concat!(
    r#"
WITH plain AS (
    INSERT INTO jobs AS j (kind, payload, max_attempts, priority, trace, run_after)
    SELECT u.kind, u.payload::jsonb, u.max_attempts, coalesce(u.priority, 0), $8::text,
           "#,
    bulk_run_after!(),
    r#"
    FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[], $6::timestamptz[],
                $7::smallint[])
         WITH ORDINALITY AS u(kind, payload, max_attempts, delay_ms, at, priority, ord)
    ORDER BY u.ord
    RETURNING j.id
)
SELECT coalesce((SELECT array_agg(id ORDER BY id) FROM plain), '{}'::bigint[]),
       (SELECT count(pg_notify('jobs', k)) FROM unnest($5::text[]) AS k)
"#
);

/// Whether another session holds a write or row lock on `jobs` in this database: a
/// transaction that may yet make a job pending and commit (an enqueue inside the
/// application's transaction, an operator's retry, a row locked while claims passed it).
/// Such a commit sends no notification when the producer's enqueue skipped it (one per
/// kind every few milliseconds), and a rollback that frees a locked row sends none: an
/// idle runtime looks again within a few milliseconds while one is open (`producer`).
/// Reads `pg_locks` (about 0.1 ms).
macro_rules! writers {
    () => {
        concat!(
            "EXISTS (SELECT 1 FROM pg_locks l WHERE ",
            write_lock_on_jobs!(),
            " AND l.pid <> pg_backend_pid())"
        )
    };
}

/// The condition on a row `l` of `pg_locks` that it is a write or row lock on `jobs` in
/// this database, the mark of a writer in [`NEXT_DUE`] and in the claims' report.
macro_rules! write_lock_on_jobs {
    () => {
        "(l.locktype = 'relation' AND l.relation = 'jobs'::regclass
          AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
          AND l.mode IN ('RowExclusiveLock', 'RowShareLock'))"
    };
}

/// How far behind a floor (seconds) a claim looks back itself from the time of a writer
/// it sees ended (`since`, [`claim_head!`]); further behind, the runtime's probe does
/// ([`LOOK_BACK_IN_CLAIMS`]).
macro_rules! look_back_in_claims {
    () => {
        "1.0"
    };
}

/// [`look_back_in_claims!`] for the runtime, which lowers its floors as the claim read
/// (`runtime::floors`). Every claim sees some writer end (the runtime's own completions,
/// other runtimes' claims), a few milliseconds behind the floors: a probe for each (a
/// round trip beside every claim) cost W2 3 to 7 % of its drain. A long transaction's
/// time lies far behind: a claim from there would walk every entry claimed since (21 ms
/// for a minute at 2,000 jobs/s, under the horizon that transaction holds), and what it
/// committed is re-stamped anyway (migration 13); the probe looks there.
pub(crate) const LOOK_BACK_IN_CLAIMS: f64 = 1.0;

/// The floor of kind `w` at priority `$p` in a claim: `$5[(kind's position - 1) * 10 +
/// priority + 1]`, seconds since the epoch (none, or NULL, where no floor is set).
macro_rules! floor_at {
    ($w:literal, $p:literal) => {
        concat!($w, ".floors[(", $w, ".ord - 1) * 10 + ", $p, " + 1]")
    };
}

/// The start of the scan of kind `w` at priority `$p` in a claim: its floor
/// ([`floor_at!`]; none is the start of the range), or `since` where that is at most
/// [`look_back_in_claims!`] behind it.
macro_rules! floor_of {
    ($w:literal, $p:literal) => {
        concat!(
            "coalesce(to_timestamp(least(",
            floor_at!($w, $p),
            ", CASE WHEN ",
            $w,
            ".since >= ",
            floor_at!($w, $p),
            " - ",
            look_back_in_claims!(),
            " THEN ",
            $w,
            ".since END)), '-infinity')"
        )
    };
}

/// What both claims start with: the statement's snapshot, and `wanted`, one row per
/// kind (`kind, n, lease_ms, ord`) with its floors.
///
/// `$7` and `$8` are the writers the runtime's earlier claims reported in progress
/// (xids), each with the time its rows may date from, less the lag: when one of them
/// has completed by this snapshot (`pg_visible_in_snapshot`), its rows are visible now,
/// perhaps behind the floors. The claim reports the earliest such time (`since`), and
/// starts its scans there where that is at most a second behind a floor (a few
/// milliseconds, for the writers every claim sees end: completions, other claims);
/// further behind, the runtime looks behind its floors from there with its probe
/// ([`PROBE`]), beside the claims: a look back over a long transaction's time walks the entries of every job
/// claimed meanwhile, which that transaction kept from being marked dead (21 ms for a
/// minute at 2,000 jobs/s in W7, BENCHMARKS.md), and the claims do not wait for it. What an application's
/// transaction makes pending it rarely needs: a late commit re-stamps its rows
/// (migration 13, `jobs_late_commit`), so they are not behind the floors.
macro_rules! claim_head {
    () => {
        r#"
WITH snap AS MATERIALIZED (
    SELECT pg_current_snapshot() AS s, extract(epoch FROM now())::float8 AS at
),
ended AS MATERIALIZED (
    SELECT min(e.since) AS since
    FROM snap, unnest($7::bigint[], $8::float8[]) AS e(xid, since)
    WHERE pg_visible_in_snapshot(e.xid::text::xid8, snap.s)
),
wanted AS (
    SELECT w.*, $5::float8[] AS floors, (SELECT since FROM ended) AS since
    FROM unnest($1::text[], $2::int[], $3::bigint[]) WITH ORDINALITY AS w(kind, n, lease_ms, ord)
),"#
    };
}

/// The locking scan of a claim, for each row `w` of `wanted`: its first `$limit` jobs,
/// one range of `jobs_claim` per priority in priority order from the floor, the rows
/// another transaction holds skipped (`c`: `id, run_after, priority, ord`).
macro_rules! locking_scan {
    ($limit:literal) => {
        concat!(
            r#"CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT j.id, j.run_after, p.priority, w.ord
            FROM generate_series(0, 9) AS p(priority)
            CROSS JOIN LATERAL (
                SELECT id, run_after
                FROM jobs
                WHERE state = 'pending' AND kind = w.kind AND priority = p.priority::smallint
                  AND run_after <= now()
                  AND run_after >= "#,
            floor_of!("w", "p.priority"),
            r#"
                ORDER BY run_after, id
                LIMIT "#,
            $limit,
            r#"
                FOR NO KEY UPDATE SKIP LOCKED
            ) j
            LIMIT "#,
            $limit,
            r#"
        ) one_kind
        LIMIT 1000
    ) c"#
        )
    };
}

/// The update that claims the rows of the CTE `picked`: the CTE `claimed`, with the
/// columns every claim returns. `$runtime` is the parameter of the claiming runtime's
/// id, `$from` the time the lease runs from. Each row's lease is `$3[i]` ms for the kind
/// `$1[i]` (looked up in the arrays themselves: a subquery on `wanted` per row rescanned
/// that CTE for each, a few per cent of a claim of ten kinds); with `partitioned` (one
/// kind, `$1` and `$3` scalars), `$3`, and the claim also stamps each row's partition
/// (`part`, [`partition_of!`]), which its run counts in from then on, whatever a
/// coalescing enqueue does to its payload meanwhile.
///
/// Each row's token (`claimed_by`) is 8 random bytes drawn once per statement, then the
/// job's id: unique within the claim (the ids are), and between two claims of a row
/// unless their 64 random bits match. A `gen_random_uuid()` per row cost a claim of 500
/// a tenth of its time (bench W9, three alternations: 1.61 to 1.80 times the minimal
/// claim before, 1.51 to 1.55 after). The times per row are `date_part`'s `float8`:
/// `extract` computes a `numeric`, and its two per row cost a claim 1.6 to 2.9 % (W9,
/// claims of 500 and 1,000, two alternations). A run-after comes out as the same
/// `float8` either way (both round its exact microseconds once: no difference in a
/// million random instants; `tests/claim_statement.rs` checks the claim's output), so it
/// meets the floors, the probe and `held_back`, which use `extract`, exactly; a wait may
/// differ in its last bit (it is only reported).
macro_rules! claimed {
    ($runtime:literal, $from:literal) => {
        claimed!(
            $runtime,
            $from,
            "",
            "$3[array_position($1::text[], j.kind)]"
        )
    };
    ($runtime:literal, $from:literal, partitioned) => {
        claimed!(
            $runtime,
            $from,
            concat!("\n        part = ", partition_of!(), ","),
            "$3"
        )
    };
    ($runtime:literal, $from:literal, $set:expr, $lease:literal) => {
        concat!(
            r#"claimed AS (
    UPDATE jobs j SET
        state = 'running',"#,
            $set,
            r#"
        attempts = j.attempts + 1,
        claimed_by = encode((SELECT substr(uuid_send(gen_random_uuid()), 1, 8))
                            || int8send(j.id), 'hex')::uuid,
        runtime_id = "#,
            $runtime,
            r#",
        claimed_until = "#,
            $from,
            r#"
            + "#,
            $lease,
            r#" * interval '1 millisecond'
    WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING j.id, j.kind, j.attempts, j.max_attempts, j.claimed_by, j.payload::text AS payload,
              date_part('epoch', now() - j.run_after) AS waited,
              date_part('epoch', j.run_after) AS run_after,
              j.priority, j.trace
)"#
        )
    };
}

/// How many visible rows index scans of `jobs_claim` have returned in this session so
/// far: PostgreSQL counts each as the scan fetches it (`pgstat_count_heap_fetch`,
/// whatever the row lock then does) in the session's own statistics, which it sends
/// only between statements, so two reads in one statement count the rows fetched
/// between them. A locking scan whose count grew by exactly the rows it locked passed
/// no visible row, held or not: then `passed` ([`claim_tail!`]) is not counted. The
/// count only grows, and every row locked was fetched, so anything else (statistics
/// off, a plan on another index, a row changed under the scan) counts `passed` as
/// before. The first read must come before the scans' first row: read after a row they
/// passed, it would cancel that row out. `tests/claim_statement.rs` checks both claims'
/// plans for it.
macro_rules! visited {
    () => {
        "pg_stat_get_xact_tuples_fetched('jobs_claim'::regclass)"
    };
}

/// The CTE `visits`: [`visited!`] before a claim's locking scans, which wait for it (a
/// one-time filter on `(SELECT before FROM visits)`); `$from` is what it must read
/// first (the claim's unlocked pass, which reads the same index).
macro_rules! visits {
    ($from:literal) => {
        concat!(
            "
visits AS MATERIALIZED (
    SELECT ",
            visited!(),
            " AS before",
            $from,
            "
),"
        )
    };
}

/// What both claims share after their CTE `picked` (`id, run_after, priority, ord` of
/// each row locked): the rows the scans passed without taking them, the snapshot's
/// writers, and the update.
///
/// `passed`: for each (kind, priority) range a claim took rows from, it counts the
/// pending rows its snapshot sees from the floor up to the last row taken
/// (`(run_after, id)` order). More than it took means the scan skipped rows another
/// transaction held locked (an application's `FOR UPDATE`, another claim in flight,
/// an operator's retry): the earliest run-after there (`held_back`) is where the next
/// claim of that range starts, so a row that was locked while claims passed it is
/// claimed as soon as it is free. The count
/// reads the range backward from the last row taken, and stops one row past what the
/// claim took (all it needs to know); read forward, bounded by `(run_after, id) <=
/// (..)`, PostgreSQL does not end the scan inside rows that share a run-after, and one
/// statement's enqueue gives all its rows one: each claim read on to the end of such a
/// batch (4 ms per 10,000 rows on a slow database). `held_back`, for the ranges where
/// the claim passed rows, is the first pending row from the floor (one index probe).
/// Both are read only when the locking scans fetched more visible rows from the claim
/// index than they locked (`skipped`, [`visited!`]); otherwise no range has a row to
/// report, and the count, which read every row taken once more, is not made.
///
/// `writers`: the transactions (xids) in progress at this statement's snapshot that
/// hold a write or row lock on `jobs` (each may commit a pending row this claim could
/// not see), or that have ended since (each may have done so). Every statement that
/// makes a row pending sets a run-after no earlier than its own start, so such a row's
/// run-after is no earlier than the time its transaction got its xid, which the runtime
/// dates by the `xmax` of its earlier claims' snapshots; the next claim after one of
/// them completes reports that time (`since`, [`claim_head!`]), and the runtime's probe
/// looks behind the floors from there. Floors are not held back while a writer runs,
/// only looked behind once when it ends. A transaction
/// that holds the vacuum horizon without touching `jobs` (an idle session, a report) is
/// not a writer. And `waiting`: when the longest wait for a lock began among the
/// statements on `jobs` (an enqueue waiting for its key's lock, say): such a statement
/// has no xid yet, and its run-after dates from before the wait, so floors stay below
/// that while it waits. `pg_locks` is read once per claim (about 0.1 ms), and a claim
/// that takes nothing still returns one row, its id NULL, with this report: an idle
/// runtime learns of a writer's end too. `waitstart` needs PostgreSQL 14.
///
/// `$locked` is the CTE of every row the locking scans locked, which they started only
/// after the CTE `visits` read the claim index's count ([`visits!`]); `passed` is
/// counted only where that count grew by more than `$locked` holds. `$found` is the
/// claim's `found` column ([`CLAIM_SPLIT`]; NULL in [`CLAIM`]).
macro_rules! claim_tail {
    ($locked:literal, $found:literal) => {
        concat!(
            r#"
skipped AS MATERIALIZED (
    SELECT "#,
            visited!(),
            r#" - (SELECT before FROM visits) <> count(*) AS seen
    FROM "#,
            $locked,
            r#"
),
edge AS (
    SELECT DISTINCT ON (ord, priority) ord, priority, run_after, id,
           count(*) OVER (PARTITION BY ord, priority) AS taken
    FROM picked
    ORDER BY ord, priority, run_after DESC, id DESC
),
passed AS MATERIALIZED (
    SELECT w.kind, e.priority,
           (SELECT j.run_after
            FROM jobs j
            WHERE j.state = 'pending' AND j.kind = w.kind AND j.priority = e.priority::smallint
              AND j.run_after >= "#,
            floor_of!("w", "e.priority"),
            r#"
            ORDER BY j.run_after, j.id
            LIMIT 1) AS first
    FROM edge e
    JOIN wanted w ON w.ord = e.ord
    WHERE (SELECT seen FROM skipped)
      AND (SELECT count(*)
           FROM (SELECT 1
                 FROM jobs j
                 WHERE j.state = 'pending' AND j.kind = w.kind
                   AND j.priority = e.priority::smallint
                   AND j.run_after >= "#,
            floor_of!("w", "e.priority"),
            r#"
                   AND (j.run_after, j.id) <= (e.run_after, e.id)
                 ORDER BY j.run_after DESC, j.id DESC
                 LIMIT e.taken + 1) b) > e.taken
),
locks AS MATERIALIZED (
    SELECT l.locktype, l.virtualtransaction, l.transactionid::text::bigint AS xid,
           l.granted, l.waitstart
    FROM pg_locks l
    WHERE NOT l.granted
       OR l.locktype = 'transactionid'
       OR "#,
            write_lock_on_jobs!(),
            r#"
),
writers AS MATERIALIZED (
    SELECT sn.at, pg_snapshot_xmax(sn.s)::text::bigint AS xmax,
           (SELECT coalesce(array_agg(x::text::bigint), '{}')
            FROM pg_snapshot_xip(sn.s) AS x
            WHERE NOT EXISTS (SELECT 1 FROM locks t
                              WHERE t.locktype = 'transactionid' AND t.granted
                                AND t.xid = x::text::bigint % 4294967296)
               OR EXISTS (SELECT 1 FROM locks t JOIN locks r
                            ON r.virtualtransaction = t.virtualtransaction
                          WHERE t.locktype = 'transactionid' AND t.granted
                            AND t.xid = x::text::bigint % 4294967296
                            AND r.locktype = 'relation' AND r.granted)) AS writers,
           (SELECT extract(epoch FROM min(coalesce(w.waitstart, now())))::float8
            FROM locks w
            WHERE NOT w.granted
              AND EXISTS (SELECT 1 FROM locks r
                          WHERE r.virtualtransaction = w.virtualtransaction
                            AND r.locktype = 'relation')) AS waiting
    FROM snap sn
),
"#,
            claimed!("$6", "now()"),
            r#"
SELECT c.id, c.kind, c.attempts, c.max_attempts, c.claimed_by, c.payload, c.waited,
       c.run_after, c.priority, c.trace,
       (SELECT extract(epoch FROM p.first)::float8 FROM passed p
        WHERE p.kind = c.kind AND p.priority = c.priority) AS held_back,
       wr.at, wr.xmax, wr.writers, wr.waiting, (SELECT since FROM ended) AS since,
       "#,
            $found,
            r#" AS found
FROM writers wr LEFT JOIN claimed c ON true
"#
        )
    };
}

/// The most jobs of one kind a claim takes (the constant `LIMIT 1000` of [`CLAIM`]).
pub(crate) const CLAIM_MAX_PER_KIND: usize = 1_000;

/// Claims up to `$4` claimable jobs of the kinds in `$1`, at most `$2[i]` of kind
/// `$1[i]`, each with a lease of `$3[i]` ms (every lease mode claims under a lease),
/// when the kinds' limits add up to no more than `$4` (always so for one kind): each
/// kind's scan then locks only rows the claim takes. [`CLAIM_SPLIT`] is the claim for
/// the other case. `$5` holds each kind's floors, ten per kind by priority in the order
/// of `$1` (seconds since the epoch; a missing or NULL one is the start of the range):
/// each (kind, priority) scan starts there ([`CLAIM_FLOOR_LAG`]). `$6` is the claiming
/// runtime's id (`runtime_id`); `$7` and `$8` the writers earlier claims reported, with
/// their times ([`claim_head!`]).
///
/// Each kind's jobs are taken by priority (0 first, to 9), then `run_after, id`: for
/// each kind, one range scan per priority, in priority order, until the kind's limit is
/// filled (the outer `LIMIT w.n` stops pulling, so the scans of later priorities never
/// run, and lock nothing, once it is). A backlog at the default priority costs one scan;
/// an idle claim probes the ten priorities, each an empty range.
///
/// Index: `jobs_claim (kind, priority, run_after, id) WHERE state = 'pending'`, a range
/// scan per (kind, priority) from its floor to `now()`, so a backlog of other kinds or
/// of future jobs is never read; the same ranges again, backward from the last row taken
/// to at most one row before what it took, for `passed` ([`claim_tail!`]), only when a
/// scan passed a row.
/// The locking select runs once, in a materialized CTE (a `WHERE id IN (subquery)` may
/// be re-evaluated and claim more than asked); `SKIP LOCKED` lets concurrent claimers
/// take disjoint rows, each kind's scan reading on down its range past rows other
/// claimers hold, so they get full batches; `FOR NO KEY UPDATE` does not block foreign
/// keys pointing at jobs.
///
/// The rows are then updated through `id = ANY(array)`, probes of the primary key:
/// joined to the CTE instead, a cached generic plan (which cannot see the limit)
/// estimated tens of thousands of rows and merge-joined along the whole primary key,
/// 550 ms per claim over two million rows. The constant `LIMIT 1000` per kind (a claim
/// round takes at most that many jobs of one kind) keeps the generic plan's estimate,
/// and so its cost, small: above `jit_above_cost` PostgreSQL compiled the plan on every
/// execution, 17 ms each. The attempt is counted here, at claim time, and commits with
/// the claim in every lease mode.
///
/// Returns, per job: its id, kind, attempt, max_attempts, token, payload, how long it
/// waited past its run-after (database clock), the run-after and priority (the
/// runtime's floors), `held_back` (see [`claim_tail!`]), and, the same on every row,
/// the claim's `now()`, its snapshot's `xmax`, the writers in progress, the longest
/// wait, `since` ([`claim_head!`]) and `found` (NULL here; [`CLAIM_SPLIT`]); when it
/// takes nothing, one row of these alone.
pub(crate) const CLAIM: &str = concat!(
    claim_head!(),
    visits!(""),
    r#"
picked AS MATERIALIZED (
    SELECT c.id, c.run_after, c.priority, c.ord
    FROM wanted w
    "#,
    locking_scan!("w.n"),
    r#"
    WHERE (SELECT before FROM visits) IS NOT NULL
    LIMIT $4
),"#,
    claim_tail!("picked", "NULL::bigint[]")
);

/// The first int of the advisory lock [`LIMIT_LOCK`] takes per kind (`'jobs'` in
/// ASCII); the second is `hashtext(kind)`.
pub(crate) const LIMIT_LOCK_CLASS: i32 = 0x6a6f_6273;

/// Takes, for the kinds `$1` that have a global concurrency limit, the advisory lock
/// of each (`LIMIT_LOCK_CLASS`, `hashtext(kind)`), in the order of that key, in the
/// transaction of a claim of those kinds; [`CLAIM_LIMITED`] follows in the same
/// transaction, and the commit releases the locks. It waits while another runtime's
/// claim of the kind holds its lock (one short transaction), but no longer than
/// [`LIMIT_LOCK_WAIT`] (`lock_timeout`, for this transaction only, set before any lock
/// is taken: the subquery's sort needs all its rows first): a holder that stalls with
/// its transaction open (a frozen process, a paused VM) would otherwise hold up every
/// other runtime's claims, of every kind, for as long as it stalls. Bitmap scans are
/// off for the rest of the transaction: the planner chose them for the counts of
/// running rows (few estimated), and a bitmap scan marks none of the dead index entries
/// it reads, so every claim read them all again (24,766 entries of `jobs_running` in a
/// claim of 10 after one W8p run); a plain index scan marks them, and the next claim
/// passes them by (W8p: 1,079 to 2,103 jobs/s at concurrency 10). Sequential scans are
/// off as well, as for the other claims (`runtime::HeldConn`): planned while the
/// table was small, the update of the rows taken read the whole table. Every claimer takes
/// the locks in one order, so two claims of overlapping kinds never deadlock; two
/// kinds whose names hash alike share a lock, which only serializes their claims.
pub(crate) const LIMIT_LOCK: &str = r#"
SELECT count(pg_advisory_xact_lock($2, k.h))::int
FROM (SELECT DISTINCT hashtext(kind) AS h
      FROM unnest($1::text[]) AS kind
      WHERE set_config('lock_timeout', $3, true) IS NOT NULL
        AND set_config('enable_bitmapscan', 'off', true) IS NOT NULL
        AND set_config('enable_seqscan', 'off', true) IS NOT NULL
      ORDER BY 1) k
"#;

/// How long [`LIMIT_LOCK`] waits for a kind's lock. Other runtimes' claims hold it a
/// few milliseconds each (a commit's flush included); a claim that waits longer leaves
/// the kind for its poll interval or the next notification naming it, and the runtime
/// claims its other kinds meanwhile.
pub(crate) const LIMIT_LOCK_WAIT: &str = "250ms";

/// The CTEs `picked` (the first `n` due jobs of each kind of `wanted`, locked: `id,
/// ord`) and `claimed` (their update, for runtime `$runtime`, each row's lease
/// `$lease` ms from `statement_timestamp()`) of the claims that keep no floors: those
/// of kinds with a limit, and the hand-offs.
macro_rules! claims_without_floors {
    ($runtime:literal, $lease:literal) => {
        concat!(
            r#"picked AS MATERIALIZED (
    SELECT c.id, c.ord
    FROM wanted w
    "#,
            locking_scan!("w.n"),
            r#"
),
"#,
            claimed!($runtime, "statement_timestamp()", "", $lease)
        )
    };
}

/// The most a runtime's margin for starting a claim of a kind with a rate may be, in
/// ms (`global::MAX_START_MARGIN`): the claims read the rate's log this far before
/// their window, and count the rows whose margin reaches into it.
macro_rules! max_start_margin_ms {
    () => {
        "10000"
    };
}

/// Claims jobs of the kinds `$1` that have a limit across runtimes: up to `$2[i]` (the
/// runtime's free slots for the kind, at most [`CLAIM_MAX_PER_KIND`], which is all the
/// scans take: asked for more, a kind would be marked `held` below while it took all
/// it could), with a lease of `$3[i]` ms; no more than the
/// global concurrency `$4[i]` less the jobs of the kind running now; and no more than
/// the rate's `$6[i]` starts less those counted in the window of `$7[i]` ms before it
/// (NULL: no such limit), where the claiming runtime starts what it takes within
/// `$8[i]` ms of this statement or hands it back. `$5` is the claiming runtime's id.
/// Runs after [`LIMIT_LOCK`], in its transaction.
///
/// Why that holds: the running jobs are counted, not kept in a counter that every
/// statement that ends a run would have to keep right (a completion, a failure, a
/// snooze, a rescue, a cancel, a crash). Under READ COMMITTED this statement's snapshot
/// is taken when it starts, after the lock was granted, so it sees every claim of the
/// kind that an earlier holder of the lock committed; a claim still in progress holds
/// the lock, so there is none. A job that stops running after this snapshot is still
/// counted: the claim takes less, never more. Claims of a kind with a limit come only
/// through here (the producer leaves such kinds out of [`CLAIM`]). A job whose runtime
/// died stays `running`, and counted, until [`RESCUE`] takes it back after its lease.
///
/// The rate is a sliding window: `jobs_starts` holds a row per claim of the kind (how
/// many it took, at this statement's `statement_timestamp()`, which is after the lock
/// was granted, so the rows of one kind are in the order of its claims, and the margin
/// within which its runtime starts them, `margin_ms`); the claim sums the rows whose
/// latest start (`at + margin_ms`) falls in the window before it, adds its own, and
/// deletes those whose latest start left the window. Two starts of claims at `a <= b`
/// fall in one window of the rate's length only if `a + margin_a` is within it of `b`,
/// so no such window holds more handler starts than the rate, each runtime with the
/// margin its own round trips need (`global::start_margin`). The rows are read from
/// the window less the largest margin allowed (`max_start_margin_ms!`).
///
/// The lease runs from `statement_timestamp()`: `now()` is the transaction's start,
/// before the wait for the lock. The transaction is READ COMMITTED whatever the role's
/// default (`global::claim`): at REPEATABLE READ its snapshot would date from the
/// lock's statement, taken before the lock was granted.
///
/// Each kind's jobs are taken as [`CLAIM`] takes them (by priority, then `run_after,
/// id`), from the start of each range: these claims are few (the limits bound them),
/// so they keep no floors. Returns the claimed rows, with the columns of [`CLAIM`]
/// (the floors' columns NULL), and one row without an id for each kind that a limit
/// held to less than it asked for, having taken all the limit allowed (`mark` = `cut`;
/// a kind with fewer jobs due than that is not cut, but quiet: marked `cut`, a kind
/// without jobs waited aside until a poll interval had passed, and a job scheduled for
/// it with it; `wait`, when the rate held it, the
/// seconds until its window has room again; otherwise its next claim waits for one of
/// its jobs to end), or that took all it asked for while the limits had room for more
/// (`spare`: another runtime may take the rest), or that took less than its limits
/// allowed while a job of it was due that the scans passed, another transaction
/// holding its row (`held`, in place of `cut`: the limits did not hold it back; the
/// runtime claims the kind again shortly, for as long as it reports so, since a
/// rollback that frees the row notifies no one).
///
/// Index: `jobs_running (kind, id) WHERE state = 'running'` for the count (at most the
/// limit's rows); `jobs_starts_kind_at` for the window's sum and the delete (a range
/// each); `jobs_claim` for the scans, one range per (kind, priority), and again for
/// `held`, only for a kind that took less than it could: the first due entry of each
/// priority not taken; the primary key for the update.
pub(crate) const CLAIM_LIMITED: &str = concat!(
    r#"
WITH wanted AS MATERIALIZED (
    SELECT w.kind, w.lease_ms, w.ord, w.n AS asked, '{}'::float8[] AS floors,
           NULL::float8 AS since, w.rate_ms, w.margin_ms,
           w.lim - r.running AS shares, w.rate_n - s.started AS starts, s.oldest,
           greatest(least(w.n, w.lim - r.running, w.rate_n - s.started), 0)::int AS n
    FROM unnest($1::text[], $2::int[], $3::bigint[], $4::int[], $6::int[], $7::bigint[],
                $8::int[])
        WITH ORDINALITY AS w(kind, n, lease_ms, lim, rate_n, rate_ms, margin_ms, ord)
    CROSS JOIN LATERAL (
        SELECT count(*) AS running FROM jobs r
        WHERE r.state = 'running' AND r.kind = w.kind AND w.lim IS NOT NULL
    ) r
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(s.n), 0) AS started,
               min(s.at + s.margin_ms * interval '1 millisecond') AS oldest
        FROM jobs_starts s
        WHERE w.rate_ms IS NOT NULL AND s.kind = w.kind
          AND s.at > statement_timestamp() - (w.rate_ms + "#,
    max_start_margin_ms!(),
    r#") * interval '1 millisecond'
          AND s.at + s.margin_ms * interval '1 millisecond'
              > statement_timestamp() - w.rate_ms * interval '1 millisecond'
    ) s
),
"#,
    claims_without_floors!("$5", "$3[array_position($1::text[], j.kind)]"),
    r#",
logged AS (
    INSERT INTO jobs_starts (kind, at, n, margin_ms)
    SELECT w.kind, statement_timestamp(), count(*), w.margin_ms
    FROM picked p JOIN wanted w ON w.ord = p.ord
    WHERE w.rate_ms IS NOT NULL
    GROUP BY w.kind, w.margin_ms
),
expired AS (
    DELETE FROM jobs_starts s
    USING wanted w
    WHERE w.rate_ms IS NOT NULL AND s.kind = w.kind
      AND s.at <= statement_timestamp() - w.rate_ms * interval '1 millisecond'
      AND s.at + s.margin_ms * interval '1 millisecond'
          <= statement_timestamp() - w.rate_ms * interval '1 millisecond'
),
held AS MATERIALIZED (
    SELECT w.ord
    FROM wanted w
    WHERE (SELECT count(*) FROM picked p WHERE p.ord = w.ord) < w.n
      AND EXISTS (
          SELECT 1
          FROM generate_series(0, 9) AS p(priority)
          CROSS JOIN LATERAL (
              SELECT 1 FROM jobs j
              WHERE j.state = 'pending' AND j.kind = w.kind
                AND j.priority = p.priority::smallint AND j.run_after <= now()
                AND j.id <> ALL (ARRAY(SELECT id FROM picked))
              ORDER BY j.run_after, j.id
              LIMIT 1
          ) h)
)
SELECT c.id, c.kind, c.attempts, c.max_attempts, c.claimed_by, c.payload, c.waited,
       c.run_after, c.priority, c.trace, NULL AS mark, NULL::float8 AS wait
FROM claimed c
UNION ALL
SELECT NULL, w.kind, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       CASE WHEN w.ord IN (SELECT ord FROM held) THEN 'held'
            WHEN w.n < w.asked AND t.took = w.n THEN 'cut'
            ELSE 'spare' END,
       CASE WHEN w.n < w.asked AND w.starts <= coalesce(w.shares, w.starts)
            THEN extract(epoch FROM coalesce(w.oldest, statement_timestamp())
                                    + w.rate_ms * interval '1 millisecond'
                                    - statement_timestamp())::float8
       END
FROM wanted w
CROSS JOIN LATERAL (SELECT count(*) AS took FROM picked p WHERE p.ord = w.ord) t
WHERE (w.n < w.asked AND t.took = w.n)
   OR w.ord IN (SELECT ord FROM held)
   OR (least(w.shares, w.starts) > w.asked AND t.took = w.asked)
"#
);

/// The partition of the job row `j`: the values of the payload's fields `$6` (one to
/// four: `JobConfig::with_partition`), as one JSON array of four (a missing field, or a
/// place past the last field, is `null`). Never NULL itself, so it compares with
/// `=` and hashes. Built from a subquery over the fields instead, it took a quarter of
/// a claim's time.
macro_rules! partition_of {
    () => {
        "jsonb_build_array(j.payload -> ($6::text[])[1], j.payload -> ($6::text[])[2], \
                           j.payload -> ($6::text[])[3], j.payload -> ($6::text[])[4])"
    };
}

/// The walk of [`CLAIM_PARTITIONED`]: the kind's due jobs in claim order, passing
/// those of partitions at a limit (and those `$filter` excludes), up to `$2` * 2 + 100:
/// from where `$from` says (a condition on the row `j`), reading at most what `$read`
/// allows (a `LIMIT` on the rows read), each empty for the whole kind.
macro_rules! partition_walk {
    ($filter:literal, $from:literal, $read:literal) => {
        concat!(
            r#"
    SELECT x.id, x.part, x.priority, x.run_after
    FROM (
        SELECT j.id, j.priority, j.run_after, "#,
            partition_of!(),
            r#" AS part
        FROM jobs j
        WHERE j.state = 'pending' AND j.kind = $1 AND j.run_after <= now()
          "#,
            $from,
            r#"
        ORDER BY j.priority, j.run_after, j.id
        "#,
            $read,
            r#"
    ) x
    WHERE x.part NOT IN (SELECT r.part FROM running r WHERE r.c >= $4)
      AND x.part NOT IN (SELECT s.part FROM started s WHERE s.c >= $7)
      "#,
            $filter,
            r#"
    LIMIT $2 * 2 + 100"#
        )
    };
}

/// The ranking of [`CLAIM_PARTITIONED`]: each row of `$walk` ranked within its
/// partition after the partition's running jobs and its starts in the window, `fits`
/// when both stay within the limits.
macro_rules! partition_rank {
    ($walk:literal) => {
        concat!(
            r#"
    SELECT u.id, u.priority, u.run_after, u.part,
           sum(u.runs) OVER w <= $4 AND (sum(u.starts) OVER w <= $7 OR $7 IS NULL) AS fits
    FROM (
        SELECT NULL::bigint AS id, NULL::smallint AS priority,
               NULL::timestamptz AS run_after, r.part, r.c AS runs, 0 AS starts
        FROM running r WHERE r.c < $4
        UNION ALL
        SELECT NULL, NULL, NULL, s.part, 0, s.c FROM started s WHERE s.c < $7
        UNION ALL
        SELECT w.id, w.priority, w.run_after, w.part, 1, 1 FROM "#,
            $walk,
            r#" w
    ) u
    WINDOW w AS (PARTITION BY u.part ORDER BY u.id IS NOT NULL, u.priority, u.run_after, u.id
                 ROWS UNBOUNDED PRECEDING)"#
        )
    };
}

/// [`CLAIM_LIMITED`] for a kind `$1` whose limits hold per partition (`partition =
/// "tenant"`: per distinct value of the payload's fields `$6`): at most `$4` running
/// (`i32::MAX` for none), and, with a rate (`$7` starts per `$8` ms, both NULL for
/// none), at most `$7` starts in any window of `$8` ms, each claim's counted until its
/// margin (`$9` ms for this one) has passed as [`CLAIM_LIMITED`] counts them; up to `$2`
/// jobs with a lease of `$3` ms, for runtime `$5`. Runs after [`LIMIT_LOCK`], in its transaction, with the
/// same reasoning: the running rows and the window's starts are counted per partition
/// in a snapshot taken after the lock.
///
/// It walks the kind's due jobs in claim order (priority, then `run_after, id`),
/// passing those of partitions at a limit (hashed sets of the partitions at their
/// concurrency and at their rate, looked up once per row), until it has `$2` * 2 + 100
/// of the others; ranks them within their partition after its running jobs and after
/// its starts in the window (one sort of the walk and the counts of the partitions
/// below their limits, no join); and takes the first `$2` that fit both. A walk that
/// ends at its length among rows that do not fit (a partition's backlog longer than
/// the walk, of a partition this claim fills) is followed by a second (`again`, only
/// then: `second`), from where the first ended, which passes those partitions too and
/// reads at most twenty times a walk's length (past a longer backlog, the next claim,
/// which counts the partitions filled here as running, passes them); the ranking is
/// then of both walks' rows. Without a second walk the first ranking stands (a
/// one-time filter on `second` skips the other): ranked again, a claim of 126 of
/// 10,000 partitions of one job took 10.5 ms instead of 8.9 (medians of three sittings
/// of 200 claims, `force_generic_plan`). Without it, one tenant's backlog ahead of the
/// others held the kind to about a job per claim (issue 48: 10,000 small tenants behind
/// 2,000 jobs of one started at p99 25.4 s, against 4.1 s without limits). It logs its
/// starts per partition (`jobs_starts`, with
/// `part`) and deletes those that left the window. A partition with a backlog never
/// holds up another's jobs, but every claim walks past the backlog of each partition
/// at a limit that comes first (a row and its payload each), and reads the partition
/// of every running row and every start in the window: the cost of a claim grows with
/// both. Looked up row by row in the running partitions instead (a scan of them per
/// row walked, which is what a join of the two becomes in the generic plan of a
/// prepared statement, whose estimates of a CTE are a row or two), a claim of 100 with
/// 100 running took 11 ms, and of 450 with 260 running 55 ms, where they now take 2
/// and 6.
///
/// A running job counts in the partition its claim stamped on it (`part`): a trigger
/// that coalesces into it gives its row the next run's payload, perhaps of another
/// partition, while it still runs for the first (counted by the payload, the first
/// partition looked free, and a second job of it started). A row taken is locked only
/// if it is still due and of the partition it was ranked in (a trigger may have
/// changed either after the snapshot; the check is made again on the version locked).
/// The partitions ranked are looked up by id in one JSON object: written as `(id,
/// partition) IN (..)`, the check became a join that probed `jobs_claim` once per row
/// (25 ms for a claim of 689, where the claim took 8 ms). The check that the row is
/// still pending and due is written so that no index can answer it (`(state =
/// 'pending') IS TRUE`, `now() - run_after >= 0`): written plainly, the generic plan
/// read it from `jobs_claim`, every kind's pending entries, and intersected that with
/// the primary key's probes (a bitmap AND over 68,000 entries: 5.8 ms for a kind with
/// no jobs, against 0.6 ms; 30 to 45 ms under a held horizon, where a runtime of every
/// kind ran it at its wake-ups).
///
/// Returns what [`CLAIM_LIMITED`] returns: the rows, and `cut` when it took less than
/// `$2` while some partition was at a limit (the next claim waits for a job of the kind
/// to end, or, with `wait`, until the first partition at its rate has room again), or
/// `spare` when it took all `$2`, or `held` when it took less than `$2` and less than
/// it chose: a row chosen was locked by another transaction (`CLAIM_LIMITED` says why
/// that matters), or `more` when it took less than `$2` because its second walk also
/// ended at its length (the backlogs of several partitions ahead of the others): the
/// runtime claims the kind again at once, and that claim, counting what this one
/// took as running, passes those partitions by. Each such claim takes at least a row
/// (the first row of each partition in a walk fits), so they end.
///
/// Index: `jobs_running` for the count per partition (reading each running row's
/// `part`, or its payload where an older runtime claimed it); `jobs_starts_kind_at`
/// for the window's starts and the delete (a range each); `jobs_claim` for the walk,
/// in its order, reading each row's payload, and for the second walk, from the first
/// one's last `(priority, run_after, id)` (a row comparison on its columns); the
/// primary key for the lock and the update.
pub(crate) const CLAIM_PARTITIONED: &str = concat!(
    r#"
WITH wanted AS MATERIALIZED (
    SELECT $1::text AS kind, $3::bigint AS lease_ms
),
running AS MATERIALIZED (
    SELECT coalesce(j.part, "#,
    partition_of!(),
    r#") AS part, count(*) AS c
    FROM jobs j
    WHERE j.state = 'running' AND j.kind = $1
    GROUP BY 1
),
started AS MATERIALIZED (
    SELECT s.part, sum(s.n) AS c, min(s.at + s.margin_ms * interval '1 millisecond') AS oldest
    FROM jobs_starts s
    WHERE $8::bigint IS NOT NULL AND s.kind = $1 AND s.part IS NOT NULL
      AND s.at > statement_timestamp() - ($8 + "#,
    max_start_margin_ms!(),
    r#") * interval '1 millisecond'
      AND s.at + s.margin_ms * interval '1 millisecond'
          > statement_timestamp() - $8 * interval '1 millisecond'
    GROUP BY 1
),
walk AS MATERIALIZED ("#,
    partition_walk!("", "", ""),
    r#"
),
first_ranked AS MATERIALIZED ("#,
    partition_rank!("walk"),
    r#"
),
filled AS MATERIALIZED (
    SELECT DISTINCT r.part FROM first_ranked r WHERE r.id IS NOT NULL AND NOT r.fits
),
second AS MATERIALIZED (
    SELECT (SELECT count(*) FROM walk) >= $2 * 2 + 100 AND EXISTS (SELECT 1 FROM filled) AS go
),
again AS MATERIALIZED ("#,
    partition_walk!(
        "AND x.part NOT IN (SELECT f.part FROM filled f)
      AND (SELECT go FROM second)",
        "AND (j.priority, j.run_after, j.id) > (
              SELECT l.priority, l.run_after, l.id FROM walk l
              ORDER BY l.priority DESC, l.run_after DESC, l.id DESC LIMIT 1)",
        "LIMIT ($2 * 2 + 100) * 20"
    ),
    r#"
),
walked AS MATERIALIZED (
    SELECT w.id, w.part, w.priority, w.run_after FROM walk w
    UNION ALL
    SELECT a.id, a.part, a.priority, a.run_after FROM again a
),
ranked AS MATERIALIZED (
    SELECT * FROM first_ranked WHERE NOT (SELECT go FROM second)
    UNION ALL
    SELECT * FROM ("#,
    partition_rank!("walked"),
    r#"
    ) r WHERE (SELECT go FROM second)
),
chosen AS MATERIALIZED (
    SELECT r.id, r.part FROM ranked r WHERE r.id IS NOT NULL AND r.fits
    ORDER BY r.priority, r.run_after, r.id LIMIT $2
),
picked AS MATERIALIZED (
    SELECT j.id, "#,
    partition_of!(),
    r#" AS part
    FROM jobs j
    WHERE j.id = ANY (ARRAY(SELECT id FROM chosen))
      AND (j.state = 'pending') IS TRUE AND now() - j.run_after >= interval '0'
      AND "#,
    partition_of!(),
    r#" = (SELECT jsonb_object_agg(c.id, c.part) FROM chosen c) -> j.id::text
    FOR NO KEY UPDATE SKIP LOCKED
),
"#,
    claimed!("$5", "statement_timestamp()", partitioned),
    r#",
logged AS (
    INSERT INTO jobs_starts (kind, at, n, part, margin_ms)
    SELECT $1, statement_timestamp(), count(*), p.part, $9::int
    FROM picked p
    WHERE $8::bigint IS NOT NULL
    GROUP BY p.part
),
expired AS (
    DELETE FROM jobs_starts s
    WHERE $8::bigint IS NOT NULL AND s.kind = $1
      AND s.at <= statement_timestamp() - $8 * interval '1 millisecond'
      AND s.at + s.margin_ms * interval '1 millisecond'
          <= statement_timestamp() - $8 * interval '1 millisecond'
)
SELECT c.id, c.kind, c.attempts, c.max_attempts, c.claimed_by, c.payload, c.waited,
       c.run_after, c.priority, c.trace, NULL AS mark, NULL::float8 AS wait
FROM claimed c
UNION ALL
SELECT NULL, $1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       CASE WHEN (SELECT count(*) FROM picked) >= $2 THEN 'spare'
            WHEN (SELECT count(*) FROM picked) < (SELECT count(*) FROM chosen) THEN 'held'
            WHEN (SELECT count(*) FROM again) >= $2 * 2 + 100 THEN 'more'
            ELSE 'cut' END,
       CASE WHEN (SELECT count(*) FROM picked) < $2 THEN
           (SELECT extract(epoch FROM min(s.oldest) + $8 * interval '1 millisecond'
                                      - statement_timestamp())::float8
            FROM started s WHERE s.c >= $7)
       END
WHERE (SELECT count(*) FROM picked) >= $2
   OR (SELECT count(*) FROM picked) < (SELECT count(*) FROM chosen)
   OR EXISTS (SELECT 1 FROM running WHERE c >= $4)
   OR EXISTS (SELECT 1 FROM started WHERE c >= $7)
   OR EXISTS (SELECT 1 FROM ranked WHERE id IS NOT NULL AND NOT fits)
"#
);

/// [`HAND_OFF`] and [`HAND_OFF_ONE`], from where they read the claims (`id, token`), the
/// kinds (`kind, lim, lease_ms, ord`) and each row's lease.
macro_rules! hand_off {
    ($claims:literal, $kinds:literal, $lease:literal) => {
        concat!(
            r#"
WITH mine AS MATERIALIZED (
    SELECT l.id, l.kind
    FROM "#,
            $claims,
            r#"
    CROSS JOIN LATERAL (
        SELECT j.id, j.kind FROM jobs j
        WHERE j.id = c.id AND j.claimed_by = c.token
          AND j.claimed_until > statement_timestamp() AND j.rerun_after IS NULL
        FOR UPDATE SKIP LOCKED
    ) l
),
ended AS (
    DELETE FROM jobs j
    WHERE j.id = ANY(ARRAY(SELECT id FROM mine))
    RETURNING j.id
),
wanted AS MATERIALIZED (
    SELECT w.kind, w.lease_ms, w.ord, '{}'::float8[] AS floors, NULL::float8 AS since,
           greatest(least(m.n, w.lim - r.running + m.n), 0)::int AS n
    FROM "#,
            $kinds,
            r#"
    CROSS JOIN LATERAL (SELECT count(*) AS n FROM mine WHERE mine.kind = w.kind) m
    CROSS JOIN LATERAL (
        SELECT count(*) AS running FROM (
            SELECT FROM jobs r
            WHERE r.state = 'running' AND r.kind = w.kind
            ORDER BY r.id
            LIMIT w.lim + m.n
        ) r
    ) r
    WHERE m.n > 0 AND NOT EXISTS (SELECT FROM jobs_paused p WHERE p.kind = w.kind)
),
"#,
            claims_without_floors!("$6", $lease),
            r#"
SELECT c.id, c.kind, c.attempts, c.max_attempts, c.claimed_by, c.payload, c.waited,
       c.run_after, c.priority, c.trace, false AS ended
FROM claimed c
UNION ALL
SELECT e.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, true
FROM ended e
"#
        )
    };
}

/// Completes the claims `($4[i], $5[i])` of kinds whose one limit is a global
/// concurrency for the kind as a whole (`$1[k]`, limit `$2[k]`, lease `$3[k]` ms) and,
/// in the same statement, hands each freed share on: claims as many of the kind's next
/// jobs for runtime `$6` as it completed of the kind, fewer when the kind runs above
/// its limit (an operator lowered it), none while it is paused (`jobs_paused`). The
/// completion is [`COMPLETE_DELETE`]'s: a claim that is not current, has a re-run mark
/// or whose row another transaction holds is left alone (the completer completes it
/// the ordinary way), and hands nothing on. Returns the claimed rows (the columns of
/// [`CLAIM`], `ended` false) and the ids completed (`ended` true, the rest NULL).
///
/// Why it needs no lock: a share changes hands inside one statement, so the jobs of
/// the kind running never grow: it takes `least(ended, limit - running + ended)`,
/// where `running`, counted in its snapshot, includes the claims it ends. A
/// [`CLAIM_LIMITED`] under the kind's lock counts the ended job as running if this
/// commits after its snapshot (and then cannot take the successor: the row is locked
/// here, SKIP LOCKED, or running when it is rechecked), or the successor as running if
/// before: its count is exact either way. Two hand-offs at once each take no more than
/// they end. A rate counts starts in a window under the lock, so a kind with a rate is
/// never handed on this way, nor one limited per partition.
///
/// Saves a kind at its limit, per ended job, the claim transaction's four round trips
/// and the wait for the kind's lock: W8 (BENCHMARKS.md).
///
/// Index: primary key for the completions; `jobs_running (kind, id)` for the count (at
/// most the limit's rows), read in its order and no further than the count matters
/// (`limit + ended`), so that PostgreSQL scans it plainly: a bitmap scan, which it chose
/// for a table never analyzed with a backlog of the kind, marks none of the dead
/// entries it reads, and every ended job leaves one (7 ms per hand-off after 50,000
/// ended, in the lab; a plain scan marks them the first time, 0.4 ms after);
/// `jobs_claim`, one range per priority, for the scan; the
/// primary key for the update. Prepared, as the claims are, and planned without
/// sequential scans (`runtime::plan_by_index`): sent unnamed, its
/// parse and plan took 0.8 ms of the 1 ms it spent on the server in W8. Its plan for
/// any arrays costs more than one for arrays of one, so PostgreSQL plans it again at
/// every run (0.4 ms): a hand-off of one claim goes as [`HAND_OFF_ONE`].
pub(crate) const HAND_OFF: &str = hand_off!(
    "unnest($4::bigint[], $5::uuid[]) AS c(id, token)",
    "unnest($1::text[], $2::int[], $3::bigint[]) WITH ORDINALITY AS w(kind, lim, lease_ms, ord)",
    "$3[array_position($1::text[], j.kind)]"
);

/// [`HAND_OFF`] for one claim: each parameter a value, not an array, so that PostgreSQL
/// keeps one plan for it (in W8 nearly every hand-off comes alone).
pub(crate) const HAND_OFF_ONE: &str = hand_off!(
    "(SELECT $4::bigint AS id, $5::uuid AS token) c",
    "(SELECT $1::text AS kind, $2::int AS lim, $3::bigint AS lease_ms, 1::bigint AS ord) w",
    "$3"
);

/// Tells every listening runtime that a share of each kind in `$1` (kinds with a global
/// limit) is free: a claim of the kind that found no free share waits for this, not
/// for the poll interval. Sent only for kinds another live runtime claims
/// ([`RUNTIME_SEEN`]): a runtime alone with its kinds woke only itself, at most of its
/// claims of a limited kind (69 of these statements in a run of W8b, each taking the
/// database's notification lock at its commit).
pub(crate) const NOTIFY_FREED: &str =
    "SELECT count(pg_notify('jobs', k))::int FROM unnest($1::text[]) AS k";

/// How far behind the latest run-after a runtime has claimed of a kind its next claim
/// of that kind starts ([`CLAIM`]).
///
/// A claim scans `jobs_claim` in `(run_after, id)` order. Every claimed or finished row
/// leaves a dead entry at the front of that range, which the scan walks past. Normally
/// the scan itself marks them dead in the index (and vacuum removes them), so the walk
/// stays short. But while any transaction holds the xmin horizon back (an idle session
/// in a transaction, a long report, a replica's query with `hot_standby_feedback`), no
/// entry can be marked or removed: every claim from the start of the range walked all
/// the jobs finished since, and the claim's time grew without bound, at 1,000 jobs/s
/// from 0.2 ms to 8 ms within a minute (BENCHMARKS.md, `horizon`).
///
/// So a runtime starts each claim at a floor: the latest run-after it has claimed of
/// the kind at that priority, less this lag. Every statement that makes a row pending
/// sets a run-after no earlier than its own start (enqueue, FAIL, RELEASE, RESCUE,
/// COMPLETE_KEEP, the operator's retry), and a transaction block that commits late
/// re-stamps the rows it made pending at its commit (migration 13), so the rows behind
/// a floor are claimed rows, except three kinds, each of which the claims themselves
/// report ([`claim_tail!`]): a row whose transaction was still in progress and that
/// its commit did not re-stamp (a statement on its own that ran longer than this lag, a
/// commit that became visible longer than this lag after its re-stamp: when the
/// transaction ends, the probe looks behind the floors from the time it began
/// writing), a row that was locked
/// while the claim passed it (the floor stays at it), and a row whose statement waited
/// for a lock before it wrote (floors stay below the wait meanwhile). A probe beside
/// the claims ([`PROBE`]) finds what is left behind anyway (a claimer killed while
/// it held rows, a statement that ran longer than this lag before it wrote): at least
/// every poll interval, and, while it is slow, no more than 0.1 % of the time.
pub(crate) const CLAIM_FLOOR_LAG: std::time::Duration = std::time::Duration::from_millis(100);

/// [`CLAIM`] for kinds whose limits add up to more than `$4`: locking each kind's first
/// `$2[i]` rows and cutting the lot to `$4` afterwards would lock rows the claim then
/// lets go (a claim of 100 over 10 kinds locked 1,006 rows), and other claimers would
/// skip them. So an unlocked first pass (`top`) shares the `$4` jobs among the kinds,
/// and each kind's locking scan stops at its share: the claim locks at most `$4` rows,
/// every one of which it takes.
///
/// The share: the most urgent priority first, across kinds; within a priority the kinds
/// take turns, each kind's jobs in `run_after, id` order (the `n`-th job of every kind
/// before the `n + 1`-th of any). Ten busy kinds get a tenth each; a kind with a
/// backlog never starves one that has a few jobs. A kind whose locking scan took its whole
/// limit (it may have more) lets the claim keep none less urgent than its own
/// (`at_limit`): the claim then takes less than `$4` rather than fill up, ahead of the
/// handlers, with jobs that would start before the rest of that kind's more urgent
/// ones; the rows it lets go were locked for the statement only, and the kind's full
/// limit makes the next claim follow at once. The cut follows what the locking scans
/// took, not the unlocked pass: a kind whose urgent jobs another transaction holds takes
/// less than its limit, and the other kinds' jobs are claimed meanwhile (cut on the
/// unlocked pass, they waited for as long as that transaction held the rows).
///
/// The unlocked pass (`firsts`, before the cut) also says which kinds it found a job
/// due of: `found`, their places in `$1` (from 1), on every row as the claim's report.
/// A kind it found nothing of had none due from its floors, whether or not the cut
/// would have given it a turn, and the runtime counts it quiet: a runtime of every
/// kind starting on ten busy ones (claims of ten, one job of each) otherwise asked
/// for every kind again, in split claims over all of them, until its claims grew past
/// a job of each (W2 over ten busy kinds, every kind claimed: 35 such claims of 1.2 ms
/// each, in the drain's first 90 ms, where a one-kind runtime made 80 claims of ten).
///
/// Index: `jobs_claim`, two range scans per kind (the first one reads at most `$2[i]`
/// entries and locks nothing). Otherwise as [`CLAIM`].
pub(crate) const CLAIM_SPLIT: &str = concat!(
    claim_head!(),
    r#"
firsts AS MATERIALIZED (
    SELECT c.ord, c.priority, c.turn
    FROM wanted w
    CROSS JOIN LATERAL (
        SELECT one_kind.priority, w.ord,
               row_number() OVER (PARTITION BY one_kind.priority
                                  ORDER BY one_kind.run_after, one_kind.id) AS turn
        FROM (
            SELECT j.priority, j.run_after, j.id
            FROM generate_series(0, 9) AS p(priority)
            CROSS JOIN LATERAL (
                SELECT priority, run_after, id
                FROM jobs
                WHERE state = 'pending' AND kind = w.kind AND priority = p.priority::smallint
                  AND run_after <= now()
                  AND run_after >= "#,
    floor_of!("w", "p.priority"),
    r#"
                ORDER BY run_after, id
                LIMIT w.n
            ) j
            LIMIT w.n
        ) one_kind
        LIMIT 1000
    ) c
),
top AS MATERIALIZED (
    SELECT f.ord FROM firsts f
    ORDER BY f.priority, f.turn, f.ord
    LIMIT $4
),
share AS (
    SELECT t.ord, count(*) AS n FROM top t GROUP BY t.ord
),
"#,
    visits!(" FROM (SELECT count(*) FROM top) t"),
    r#"
locked AS MATERIALIZED (
    SELECT c.id, c.run_after, c.priority, c.ord
    FROM share s
    JOIN wanted w ON w.ord = s.ord
    "#,
    locking_scan!("s.n"),
    r#"
    WHERE (SELECT before FROM visits) IS NOT NULL
),
at_limit AS (
    SELECT max(l.priority) AS deepest
    FROM locked l
    JOIN share s ON s.ord = l.ord
    JOIN wanted w ON w.ord = l.ord
    WHERE s.n >= w.n
    GROUP BY l.ord, s.n
    HAVING count(*) >= s.n
),
picked AS MATERIALIZED (
    SELECT l.id, l.run_after, l.priority, l.ord
    FROM locked l
    WHERE l.priority <= coalesce((SELECT min(deepest) FROM at_limit), 9)
),"#,
    claim_tail!(
        "locked",
        "(SELECT coalesce(array_agg(DISTINCT f.ord), '{}') FROM firsts f)"
    )
);

/// The probe beside the claims: for each kind `$1[i]` (a kind may be listed twice) and
/// each priority, the earliest due job between `$2` and `$3` (ten bounds per listing, by
/// priority, as [`CLAIM`]'s `$5`, in seconds since the epoch; a NULL upper bound reads
/// nothing), as `(kind, priority, run_after)`. The runtime lists a kind for two
/// questions:
///
/// - **Behind the floors** (from the start of the range up to the floor): the backstop
///   behind the claims' floors. The runtime lowers the floor to what it finds, and its
///   next claim takes the job. It finds what the claims' own reports cannot: a row a
///   claimer held locked when it died, or one whose statement ran longer than
///   [`CLAIM_FLOOR_LAG`] before it wrote. A range with no floor has nothing behind it
///   (upper bound NULL) and is not read.
/// - **A quiet kind's due job** (from the floor on): a busy runtime's claims ask only
///   for the kinds with jobs, and a quiet kind's job that came without a notification
///   (one that became due by its time, say) is found here; the next claim asks for
///   its kind.
///
/// Index: `jobs_claim`, the first entry of each (kind, priority) range between the
/// bounds. Under a held horizon the look behind a floor walks every dead entry there
/// (about as long as a claim from the start of the range: 200 ms past a million), so
/// the runtime runs the probe beside its claims, on a connection of its own, and spaces
/// that question by its duration; the other starts at the floor, as claims do.
pub(crate) const PROBE: &str = r#"
SELECT w.kind, p.priority::smallint, extract(epoch FROM b.run_after)::float8
FROM unnest($1::text[]) WITH ORDINALITY AS w(kind, ord)
CROSS JOIN generate_series(0, 9) AS p(priority)
CROSS JOIN LATERAL (
    SELECT run_after FROM jobs
    WHERE state = 'pending' AND kind = w.kind AND priority = p.priority::smallint
      AND run_after <= now()
      AND run_after >= to_timestamp(($2::float8[])[(w.ord - 1) * 10 + p.priority + 1])
      AND run_after < to_timestamp(($3::float8[])[(w.ord - 1) * 10 + p.priority + 1])
    ORDER BY run_after, id
    LIMIT 1
) b
"#;
/// How long until the next job of the kinds `$1` becomes due (seconds, on the database
/// clock; NULL when none is scheduled; the runtime asks for every kind at most every
/// 100 ms, and in between for fewer, `runtime::due`): an idle runtime sleeps until
/// then, so a retry, a snooze or a scheduled job starts on time rather than at the next
/// poll. And whether
/// another transaction holds a write or row lock on `jobs` (`writers!`), and `ended`:
/// which of the writers `$3` (xids, those the runtime's last claim saw in progress) have
/// ended since. Such a writer may have committed rows the claim could not see, or freed
/// a row the claim passed while it held it, and no other writer may be left to say so:
/// the runtime claims again shortly (the claim's floor stayed at the row it passed), and
/// that claim, given the writer, looks behind the floors from its time.
///
/// The locks are read first (`w`, materialized, scanned before the rest is computed),
/// and `ended` asks each writer's status when it is computed (`pg_xact_status`), not
/// against the statement's snapshot: a writer that ends while the query runs is then
/// either still holding its locks when they are read, or ended when its status is. With
/// the locks read last and the status taken from the snapshot, one that ended in
/// between was neither, and the idle runtime slept until the poll
/// (`a_writer_ending_while_the_next_due_query_runs_is_reported`, `tests/runtime.rs`).
///
/// `$2` is how long ago (seconds) the claim before it was sent, plus a margin: a job
/// that became due in that window came after that claim's `now()`, so the claim could
/// not take it, and the answer is negative (claim at once); `due_now` names the kinds
/// of such jobs, so that the claim asks for them and not for every quiet kind (with
/// several replicas at a light load, each saw this after most claims, and claimed
/// every kind with a limit in a transaction of its own: W10, BENCHMARKS.md). A due job
/// older than the window was the claim's to take; one it left (its row locked by another transaction)
/// is not counted, so the runtime does not spin on it: such a job is inside the window
/// for the margin at most. The window is a duration measured by the runtime; every time
/// it is compared with is the database's, and it decides only when the next claim runs.
///
/// Index: `jobs_claim (kind, priority, run_after, id) WHERE state = 'pending'`, one
/// probe per kind and priority at the first entry past the window's start.
///
/// The kinds are read through a scalar subquery, which hides the array's length from
/// the planner: seen, a plan made for each call's array looked cheaper than the kept
/// generic plan for a runtime of one or a few kinds, and PostgreSQL planned every call
/// (W3 with one kind, `pg_stat_statements`: 411 plans in 410 calls, 0.25 ms of
/// planning against 0.06 ms of execution; now 6 plans in 412 calls). The generic plan
/// is the same nested loop of index probes. It is planned without sequential scans, as
/// the claims are (`runtime::plan_by_index`): on a table vacuumed while empty, the plan
/// kept read the whole table for each kind and priority (8 ms a call at 100,000 rows,
/// `tests/plans.rs`).
pub(crate) const NEXT_DUE: &str = concat!(
    r#"
WITH w AS MATERIALIZED (
    SELECT "#,
    writers!(),
    r#" AS writers
),
n AS MATERIALIZED (
    SELECT k.kind, min(n.run_after) AS run_after
    FROM unnest((SELECT $1::text[])) AS k(kind)
    CROSS JOIN generate_series(0, 9) AS p(priority)
    CROSS JOIN LATERAL (
        SELECT run_after FROM jobs
        WHERE state = 'pending' AND kind = k.kind AND priority = p.priority::smallint
          AND run_after > now() - make_interval(secs => $2::float8)
        ORDER BY run_after
        LIMIT 1
    ) n
    GROUP BY k.kind
)
SELECT (SELECT extract(epoch FROM min(run_after) - now())::float8 FROM n) AS due,
       w.writers,
       ARRAY(SELECT x FROM unnest($3::bigint[]) AS x
             WHERE pg_xact_status(x::text::xid8) IS DISTINCT FROM 'in progress') AS ended,
       ARRAY(SELECT kind FROM n WHERE run_after <= now() ORDER BY kind) AS due_now
FROM w
"#
);

/// Renews the leases of the claims `($1[i], $2[i])` to `$3[i]` ms from now, for those
/// still held. Returns, per claim token, whether it was renewed, whether it is still
/// held, and whether an operator cancelled the job (`jobs::admin::cancel`: the
/// runtime then drops the handler): a claim neither renewed nor held is lost; one held
/// but not renewed has its row
/// locked by another transaction (a fenced transaction, or an application's transaction
/// that marked the job for a re-run) and is tried again at the next beat.
///
/// `SKIP LOCKED`, so that one locked row never stalls the renewal of every other claim
/// of the runtime until their leases run out; it never waits for a lock, so it cannot
/// deadlock. Index: primary key, probed for each claim (to lock it, to renew it, to
/// report on it). Only `claimed_until` changes: a HOT update.
///
/// Sent unnamed, planned for each batch (why: [`COMPLETE_DELETE`]).
pub(crate) const RENEW: &str = r#"
WITH c AS MATERIALIZED (
    SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::bigint[]) AS c(id, token, lease_ms)
),
free AS MATERIALIZED (
    SELECT l.id, c.token, c.lease_ms
    FROM c
    CROSS JOIN LATERAL (
        SELECT j.id FROM jobs j
        WHERE j.id = c.id AND j.claimed_by = c.token AND j.claimed_until > now()
        FOR NO KEY UPDATE SKIP LOCKED
    ) l
),
renewed AS (
    UPDATE jobs j SET claimed_until = now() + f.lease_ms * interval '1 millisecond'
    FROM free f
    WHERE j.id = ANY(ARRAY(SELECT id FROM free)) AND j.id = f.id
      AND j.claimed_by = f.token AND j.claimed_until > now()
    RETURNING j.id
)
SELECT c.token,
       c.id = ANY(ARRAY(SELECT id FROM renewed)) AS renewed,
       coalesce((SELECT j.claimed_by = c.token AND j.claimed_until > now()
                 FROM jobs j WHERE j.id = c.id), false) AS held,
       coalesce((SELECT j.state = 'cancelled' FROM jobs j WHERE j.id = c.id), false) AS cancelled
FROM c
"#;

/// Completes the claims `($1[i], $2[i])` of kinds that keep no history, by deleting
/// them. A job marked for a re-run is left for [`COMPLETE_KEEP`]; a claim that is no
/// longer current deletes nothing, nor does one whose row another transaction has
/// locked (`SKIP LOCKED`: the completer tries it again, and keeps renewing its lease
/// meanwhile, so one locked row never holds up another job's completion). Returns the
/// ids deleted.
///
/// Index: primary key. The re-run mark is re-checked on the row version that is locked,
/// so a trigger that commits while this runs is never deleted with the job. Times are
/// `statement_timestamp()`: this also runs inside a fenced transaction, where `now()`
/// is the transaction's start.
///
/// Every claim is looked up by its id (a lateral probe of the primary key, locked there),
/// and the delete takes the locked ids as one array: no plan can join the whole table to
/// the batch, whatever the statistics say. [`COMPLETE_KEEP`] and [`RENEW`] are built the
/// same way, and all three are sent unnamed, planned for each batch and the table's
/// size at that moment. As named statements that joined `jobs` to the batch they ran
/// on a generic plan made while the table was nearly empty (10 rows counted for any
/// array, one row for the table after its filters): a nested loop that read the whole
/// table and scanned the batch again for each of its rows. One completion of 2,000 jobs
/// among 35,600 rows took 9.5 s (67 million comparisons); planned each time, the same
/// join still took 0.6 to 0.9 s when the statistics said the table held no running
/// row. Completions fell behind, the table grew, and the rate stalled for seconds
/// (BENCHMARKS.md, "The sawtooth's cause").
pub(crate) const COMPLETE_DELETE: &str = r#"
WITH mine AS MATERIALIZED (
    SELECT l.id
    FROM unnest($1::bigint[], $2::uuid[]) AS c(id, token)
    CROSS JOIN LATERAL (
        SELECT j.id FROM jobs j
        WHERE j.id = c.id AND j.claimed_by = c.token
          AND j.claimed_until > statement_timestamp() AND j.rerun_after IS NULL
        FOR UPDATE SKIP LOCKED
    ) l
)
DELETE FROM jobs j
WHERE j.id = ANY(ARRAY(SELECT id FROM mine))
RETURNING j.id
"#;

/// Completes the claims `($1[i], $2[i])` without deleting them: a job marked for a
/// re-run goes back to pending at its trigger's run-after (or now, if that has passed:
/// never behind the claims' floor, [`CLAIM_FLOOR_LAG`]) with a fresh attempt budget,
/// a periodic one (`$3[i]` its period in ms) is re-armed one period from now, any other
/// becomes `done`. Returns, per claim, whether it was completed and, if not, whether it
/// is still held (its row is locked by another transaction: try again later) or gone
/// (expired, taken over or completed: refused).
///
/// `SKIP LOCKED`, as [`COMPLETE_DELETE`]: it never waits for a lock. Index: primary
/// key. Times are `statement_timestamp()`, as there.
///
/// `$5[i]` is the handler's output (JSON text, or NULL; an empty array for none at
/// all), stored with the completion: the last completed run's.
///
/// `$4[i]` says whether the kind keeps done rows. A claim of a kind that keeps none
/// comes here only when [`COMPLETE_DELETE`] skipped it: for a re-run mark, or because
/// its row was locked. Only the first is completed here; the second is left (reported
/// held, so the completer tries the delete again), or it would stay behind as a `done`
/// row no retention ever prunes (a renewal holding the row between the delete and this
/// statement was enough).
///
/// Sent unnamed, planned for each batch (why: [`COMPLETE_DELETE`]).
pub(crate) const COMPLETE_KEEP: &str = r#"
WITH c AS MATERIALIZED (
    SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::bigint[], $4::bool[], $5::text[])
        AS c(id, token, every_ms, keep, output)
),
mine AS MATERIALIZED (
    SELECT l.id, c.every_ms, c.output
    FROM c
    CROSS JOIN LATERAL (
        SELECT j.id FROM jobs j
        WHERE j.id = c.id AND j.claimed_by = c.token
          AND j.claimed_until > statement_timestamp()
          AND (c.keep OR c.every_ms IS NOT NULL OR j.rerun_after IS NOT NULL)
        FOR NO KEY UPDATE SKIP LOCKED
    ) l
),
done AS (
    UPDATE jobs j SET
        state = CASE WHEN j.rerun_after IS NOT NULL OR m.every_ms IS NOT NULL
                     THEN 'pending' ELSE 'done' END,
        run_after = CASE WHEN j.rerun_after IS NOT NULL
                         THEN greatest(j.rerun_after, statement_timestamp())
                         WHEN m.every_ms IS NOT NULL
                         THEN statement_timestamp() + m.every_ms * interval '1 millisecond'
                         ELSE j.run_after END,
        attempts = CASE WHEN j.rerun_after IS NOT NULL OR m.every_ms IS NOT NULL
                        THEN 0 ELSE j.attempts END,
        finished_at = CASE WHEN j.rerun_after IS NULL AND m.every_ms IS NULL
                           THEN statement_timestamp() END,
        last_error = NULL,
        checkpoint = CASE WHEN j.rerun_after IS NULL AND m.every_ms IS NULL
                          THEN j.checkpoint END,
        rerun_after = NULL,
        claimed_by = NULL,
        claimed_until = NULL,
        output = m.output::jsonb
    FROM mine m
    WHERE j.id = ANY(ARRAY(SELECT id FROM mine)) AND j.id = m.id
    RETURNING j.id
)
SELECT c.id,
       c.id = ANY(ARRAY(SELECT id FROM done)) AS done,
       coalesce((SELECT j.claimed_by = c.token AND j.claimed_until > statement_timestamp()
                 FROM jobs j WHERE j.id = c.id), false) AS held
FROM c
"#;

/// Stores `$3` (JSON text) as the checkpoint of claim `($1, $2)`, if the claim is still
/// current; returns the id then. Index: primary key. The column is in no index: a HOT
/// update. It waits for the row's lock like any single-row update (a fenced
/// transaction of the same claim is refused before this runs, so it never waits for
/// its own handler).
pub(crate) const CHECKPOINT: &str = r#"
UPDATE jobs SET checkpoint = $3::jsonb
WHERE id = $1 AND claimed_by = $2 AND claimed_until > statement_timestamp()
RETURNING id
"#;

/// Claims the pending job `$1` whatever its run-after, with a lease of `$2` ms, for
/// `jobs::testing::perform`, which runs its handler inline. As [`CLAIM`] for one row
/// (attempt counted, fresh token); no runtime holds it (`runtime_id` NULL). Index:
/// primary key. It waits for the row's lock if another transaction holds it.
pub(crate) const CLAIM_ID: &str = r#"
UPDATE jobs SET
    state = 'running',
    attempts = attempts + 1,
    claimed_by = gen_random_uuid(),
    runtime_id = NULL,
    claimed_until = now() + $2 * interval '1 millisecond'
WHERE id = $1 AND state = 'pending'
RETURNING attempts, max_attempts, claimed_by, payload::text, trace,
          (extract(epoch FROM now()) * 1000000)::bigint AS now_us
"#;

/// Makes every scheduled job of the kinds `$1` due now (`jobs::testing::drain_with`
/// and `Drain::with_scheduled`): delayed enqueues, retries waiting out their backoff,
/// snoozes. Index: `jobs_claim`, the kinds' ranges past `now()`. For tests: it moves
/// run-afters without a claim.
pub(crate) const MAKE_DUE: &str = r#"
UPDATE jobs SET run_after = now()
WHERE kind = ANY($1) AND state = 'pending' AND run_after > now()
"#;

/// The jobs of the kinds `$1` with a failed attempt since `$2` (seconds since the
/// epoch, a time the database gave), with their history (`jobs::testing::drain_with`).
/// Reads every row of the kinds: for a test's table.
pub(crate) const FAILED_SINCE: &str = concat!(
    "SELECT id, kind, state, ",
    crate::history::history_columns!(),
    r#"
FROM jobs
WHERE kind = ANY($1)
  AND EXISTS (SELECT 1 FROM jsonb_array_elements(errors) e
              WHERE (e->>'at')::timestamptz >= to_timestamp($2::float8))
ORDER BY id
"#
);

/// The checkpoint of job `$1`, if it has one. Index: primary key.
pub(crate) const LAST_CHECKPOINT: &str = "SELECT checkpoint FROM jobs WHERE id = $1";

/// Records a failed attempt of claim `($1, $2)`: `$3` the error message, `$4` whether
/// it is permanent, `$5` the backoff in ms before jitter, `$6` the kind's period in ms
/// (NULL unless periodic). Jitter keeps between half and all of the backoff. The job
/// becomes `failed` when permanent or out of attempts, unless a trigger arrived while
/// it ran: then it goes back to pending with a fresh attempt budget, since that trigger
/// has not been handled yet. A periodic kind's job is never parked: out of attempts it
/// waits one period, with a fresh budget and its last error kept, so a failing periodic
/// kind runs at its own pace and leaves no pile of failed rows. `$7` is the kind of
/// failure, which the attempt's entry in `errors` records with the message (the last
/// 20 attempts are kept). A handler's cancel (`$7` = `cancelled`, with `$4`) ends the
/// job `cancelled` instead of `failed`, on the same terms. The checkpoint stays for the
/// next attempt of the same request, and goes with a trigger that arrived meanwhile: a
/// checkpoint never outlives the request that wrote it (so in [`RELEASE`], [`RESCUE`]
/// and [`COMPLETE_KEEP`] too). Returns the new state.
///
/// Index: primary key. Runs on its own (never inside a handler's transaction), so
/// `now()` is the time of the failure.
pub(crate) const FAIL: &str = r#"
UPDATE jobs j SET
    state = CASE WHEN j.rerun_after IS NOT NULL THEN 'pending'
                 WHEN $7 = 'cancelled' AND $6::bigint IS NULL THEN 'cancelled'
                 WHEN ($4 OR j.attempts >= j.max_attempts) AND $6::bigint IS NULL THEN 'failed'
                 ELSE 'pending' END,
    run_after = CASE
        WHEN j.rerun_after IS NOT NULL THEN greatest(j.rerun_after, now())
        WHEN $4 OR j.attempts >= j.max_attempts
            THEN coalesce(now() + $6::bigint * interval '1 millisecond', j.run_after)
        ELSE now() + ($5 * (0.5 + random() / 2)) * interval '1 millisecond' END,
    attempts = CASE WHEN j.rerun_after IS NOT NULL THEN 0
                    WHEN ($4 OR j.attempts >= j.max_attempts) AND $6::bigint IS NOT NULL THEN 0
                    ELSE j.attempts END,
    finished_at = CASE WHEN j.rerun_after IS NULL AND ($4 OR j.attempts >= j.max_attempts)
                            AND $6::bigint IS NULL
                       THEN now() END,
    last_error = $3,
    checkpoint = CASE WHEN j.rerun_after IS NOT NULL THEN NULL ELSE j.checkpoint END,
    errors = jsonb_path_query_array(
        j.errors || jsonb_build_object('attempt', j.attempts, 'at', now(), 'kind', $7::text,
                                       'message', $3::text, 'runtime', j.runtime_id),
        '$[last - 19 to last]'),
    rerun_after = NULL,
    claimed_by = NULL,
    claimed_until = NULL
WHERE j.id = $1 AND j.claimed_by = $2 AND j.claimed_until > now()
RETURNING j.state
"#;

/// Gives claim `($1, $2)` back without spending its attempt: snooze (`$3` ms), the
/// hand-back at shutdown and of a claim held ahead that found no slot (`$3` = 0). A
/// trigger that arrived meanwhile keeps its earlier run-after, but never one before
/// now: a row put back behind the claims' floor ([`CLAIM_FLOOR_LAG`]) would wait for
/// the next full claim.
///
/// Index: primary key.
pub(crate) const RELEASE: &str = r#"
UPDATE jobs j SET
    state = 'pending',
    attempts = greatest(j.attempts - 1, 0),
    run_after = greatest(
        least(coalesce(j.rerun_after, 'infinity'), now() + $3 * interval '1 millisecond'),
        now()),
    checkpoint = CASE WHEN j.rerun_after IS NOT NULL THEN NULL ELSE j.checkpoint END,
    rerun_after = NULL,
    claimed_by = NULL,
    claimed_until = NULL
WHERE j.id = $1 AND j.claimed_by = $2 AND j.claimed_until > now()
RETURNING j.id
"#;

/// Takes back up to `$1` claims whose lease expired: pending again, claimable now, or
/// `failed` when the expired attempt was the last. The expiry is re-checked in this same
/// statement, on the row version it locks, so a claim renewed or completed at the same
/// instant is left alone; a row another transaction holds is skipped, never waited for.
/// The expired attempt gets an entry `lease_expired` in `errors`, naming the runtime
/// that held it.
///
/// Index: `jobs_running (kind, id) WHERE state = 'running'`, which holds only the
/// running rows (at most the runtimes' total concurrency), then the primary key for the
/// update. Sent unnamed, planned for each run at the table's size then: as a named
/// statement its plan, made on a table autovacuum had vacuumed while it was still empty
/// (its statistics then say so, with no ten-page floor), joined the expired rows to a
/// sequential scan of the whole table, and PostgreSQL kept it until the next vacuum or
/// analyze (`tests/plans.rs`). A rescue runs every few seconds at most: planning it
/// each time costs nothing the claims feel.
pub(crate) const RESCUE: &str = r#"
WITH expired AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE state = 'running' AND claimed_until < now()
    ORDER BY id
    LIMIT $1
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE jobs j SET
    state = CASE WHEN j.rerun_after IS NOT NULL OR j.attempts < j.max_attempts
                 THEN 'pending' ELSE 'failed' END,
    run_after = greatest(coalesce(j.rerun_after, now()), now()),
    attempts = CASE WHEN j.rerun_after IS NOT NULL THEN 0 ELSE j.attempts END,
    finished_at = CASE WHEN j.rerun_after IS NULL AND j.attempts >= j.max_attempts
                       THEN now() END,
    last_error = 'lease expired: the worker running attempt ' || j.attempts
                 || ' stopped renewing its claim',
    checkpoint = CASE WHEN j.rerun_after IS NOT NULL THEN NULL ELSE j.checkpoint END,
    errors = jsonb_path_query_array(
        j.errors || jsonb_build_object('attempt', j.attempts, 'at', now(), 'kind', 'lease_expired',
                                       'message', 'lease expired: the worker running attempt ' || j.attempts
                                                  || ' stopped renewing its claim', 'runtime', j.runtime_id),
        '$[last - 19 to last]'),
    rerun_after = NULL,
    claimed_by = NULL,
    claimed_until = NULL
FROM expired e
WHERE j.id = e.id AND j.state = 'running' AND j.claimed_until < now()
RETURNING j.id, j.kind, j.state
"#;

/// Locks claim `($1, $2)` if it is still current, in the caller's transaction: at the
/// start of a fenced transaction, and at the end of a transaction-mode handler's
/// transaction, just before the completion. Waits for the row lock (an application's
/// transaction holding the row delays only this job).
///
/// Index: primary key. `statement_timestamp()`, since in transaction mode this runs
/// late in a transaction whose `now()` is its start.
pub(crate) const FENCE: &str = r#"
SELECT id FROM jobs
WHERE id = $1 AND claimed_by = $2 AND claimed_until > statement_timestamp()
FOR NO KEY UPDATE
"#;

/// The key of a periodic kind's one live job.
pub(crate) const PERIODIC_KEY: &str = "every";

/// Arms the periodic kind `$1` (payload `$2`, max_attempts `$3`) if it has no live job,
/// and its newest failed row (a job whose last attempt's worker died) and newest
/// cancelled row (an operator cancelled a run) are at least one period (`$5` ms) old: a
/// kind failing that way still runs at its own pace, and a cancelled run is not
/// replaced at once. The job is
/// due `$6` ms from now: at once for an `every` kind, at its next fire time for a cron
/// kind (whose `$5` is 0: it never runs before that fire time anyway), at the kind's
/// priority `$7`. The fixed
/// key ([`PERIODIC_KEY`], which the derive also gives every job of a periodic kind)
/// makes this safe from every replica at once: the unique index admits one.
///
/// Index: `jobs_live_key` for the existence check and the arbiter; `jobs_failed (kind,
/// id)` and `jobs_cancelled (kind, id)`, each read backwards for one entry, for the
/// newest failed and cancelled rows.
pub(crate) const ARM_PERIODIC: &str = r#"
INSERT INTO jobs (kind, key, payload, max_attempts, run_after, priority)
SELECT $1, $4, $2::jsonb, $3, now() + $6 * interval '1 millisecond', $7
WHERE NOT EXISTS (
    SELECT 1 FROM jobs WHERE kind = $1 AND key = $4 AND state IN ('pending', 'running')
)
AND coalesce(greatest(
    (SELECT finished_at FROM jobs WHERE kind = $1 AND state = 'failed' ORDER BY id DESC LIMIT 1),
    (SELECT finished_at FROM jobs WHERE kind = $1 AND state = 'cancelled' ORDER BY id DESC LIMIT 1)
) <= now() - $5 * interval '1 millisecond', true)
ON CONFLICT (kind, key) WHERE state IN ('pending', 'running') AND key IS NOT NULL DO NOTHING
"#;

/// For the kinds `$1`: how many jobs are claimable now (counted up to 100,000, so the
/// count stays cheap under a large backlog) and the age of the oldest claimable one.
///
/// Index: `jobs_claim (kind, priority, run_after, id) WHERE state = 'pending'`: bounded
/// ranges per kind and priority for the count, their first entries for the age.
#[cfg(feature = "metrics")]
pub(crate) const LAG_DEPTH: &str = r#"
SELECT w.kind,
       (SELECT count(*) FROM (
            SELECT 1
            FROM generate_series(0, 9) AS p(priority)
            CROSS JOIN LATERAL (
                SELECT 1 FROM jobs
                WHERE state = 'pending' AND kind = w.kind AND priority = p.priority::smallint
                  AND run_after <= now()
                LIMIT 100000) d
            LIMIT 100000) c) AS depth,
       (SELECT extract(epoch FROM now() - min(o.run_after))::float8
        FROM generate_series(0, 9) AS p(priority)
        CROSS JOIN LATERAL (
            SELECT run_after FROM jobs
            WHERE state = 'pending' AND kind = w.kind AND priority = p.priority::smallint
              AND run_after <= now()
            ORDER BY run_after
            LIMIT 1) o) AS lag
FROM unnest($1::text[]) AS w(kind)
"#;

/// The ids and payloads of the live jobs of kind `$1`, oldest first (`jobs::testing`).
///
/// Index: `jobs_claim` and `jobs_running` (`jobs_live_key` holds only keyed rows).
pub(crate) const LIVE_PAYLOADS: &str = r#"
SELECT id, payload::text FROM jobs
WHERE kind = $1 AND state IN ('pending', 'running')
ORDER BY id
"#;

/// Whether any job of the kinds `$1` is claimable now or running (`jobs::testing`).
///
/// Index: `jobs_claim` and `jobs_running`, one probe per kind.
pub(crate) const ANY_DUE: &str = r#"
SELECT EXISTS (
    SELECT 1 FROM jobs
    WHERE kind = ANY($1)
      AND ((state = 'pending' AND run_after <= now()) OR state = 'running')
)
"#;

/// Adds the runs a runtime counted to the throughput history: `$1..$6` kind, minute
/// (seconds since the epoch, database clock), succeeded, failed, retried, cancelled;
/// `$7` the run-time histograms, as JSON arrays. Rows are fed in `(kind, minute)`
/// order, so two runtimes' upserts of the same minutes lock them in one order and
/// never deadlock; the second waits for the first and adds to its row. Index: the
/// primary key `(kind, minute)`, the arbiter.
pub(crate) const THROUGHPUT_ADD: &str = r#"
INSERT INTO jobs_throughput AS t
    (kind, minute, succeeded, failed, retried, cancelled, run_time_buckets)
SELECT u.kind, to_timestamp(u.minute), u.s, u.f, u.r, u.c,
       ARRAY(SELECT x::bigint
             FROM jsonb_array_elements_text(u.b::jsonb) WITH ORDINALITY AS e(x, i)
             ORDER BY e.i)
FROM unnest($1::text[], $2::float8[], $3::bigint[], $4::bigint[], $5::bigint[],
            $6::bigint[], $7::text[]) WITH ORDINALITY AS u(kind, minute, s, f, r, c, b, ord)
ORDER BY u.ord
ON CONFLICT (kind, minute) DO UPDATE SET
    succeeded = t.succeeded + EXCLUDED.succeeded,
    failed = t.failed + EXCLUDED.failed,
    retried = t.retried + EXCLUDED.retried,
    cancelled = t.cancelled + EXCLUDED.cancelled,
    run_time_buckets = ARRAY(
        SELECT coalesce(z.a, 0) + coalesce(z.b, 0)
        FROM unnest(t.run_time_buckets, EXCLUDED.run_time_buckets) WITH ORDINALITY AS z(a, b, i)
        ORDER BY z.i)
"#;

/// Removes throughput history older than seven days. The table holds a row per kind
/// and minute: no index is needed to read it whole.
pub(crate) const THROUGHPUT_PRUNE: &str =
    "DELETE FROM jobs_throughput WHERE minute < now() - interval '7 days'";

/// The database's clock, in microseconds since the epoch: what a cron kind's first
/// fire time is computed from when it is armed.
pub(crate) const DB_NOW: &str = "SELECT (extract(epoch FROM now()) * 1000000)::bigint";

/// What operators set per kind: the paused kinds (`jobs::admin::pause`), which the
/// producer leaves out of its claims, and the limits (`jobs::admin::set_limits`), which
/// win over the kinds' attributes: `(kind, paused, concurrency, rate_starts, rate_ms)`.
/// Read once per poll
/// interval. Index: none needed, the tables hold a row per kind an operator paused or
/// limited.
pub(crate) const KIND_SETTINGS: &str = r#"
SELECT kind, true AS paused, NULL::int AS concurrency, NULL::int AS rate_starts,
       NULL::bigint AS rate_ms
FROM jobs_paused
UNION ALL
SELECT kind, false, concurrency, rate_starts, rate_ms FROM jobs_limits
"#;

/// Registers runtime `$1` (name `$2`, host `$3`, process `$4`, version `$5`, kinds `$6`,
/// concurrency `$7`, declared limits `$8`), or marks it seen now: the runtime runs it at
/// start and every few seconds, so a row removed as stale (an outage longer than the
/// limit) comes back. Returns the kinds of `$6` that another runtime seen within the
/// last `$9` ms claims: those whose free shares this one announces
/// ([`NOTIFY_FREED`]). Index: the primary key of `jobs_runtimes` for the upsert; the
/// read scans the table, a row per runtime.
pub(crate) const RUNTIME_SEEN: &str = r#"
WITH seen AS (
    INSERT INTO jobs_runtimes (id, name, host, pid, version, kinds, concurrency, limits)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
    ON CONFLICT (id) DO UPDATE SET last_seen = now()
)
SELECT coalesce(array_agg(DISTINCT k.kind), '{}'::text[])
FROM jobs_runtimes r
CROSS JOIN LATERAL unnest(r.kinds) AS k(kind)
WHERE r.id <> $1 AND r.last_seen > now() - $9 * interval '1 millisecond'
  AND k.kind = ANY($6::text[])
"#;

/// Removes runtime `$1`'s row at a clean shutdown. Index: the primary key.
pub(crate) const RUNTIME_GONE: &str = "DELETE FROM jobs_runtimes WHERE id = $1";

/// Removes the rows of runtimes not seen for `$1` ms. A scan of `jobs_runtimes`, a row
/// per runtime.
pub(crate) const RUNTIMES_STALE: &str =
    "DELETE FROM jobs_runtimes WHERE last_seen < now() - $1 * interval '1 millisecond'";

/// Every statement of this module, by name: the tests read them all.
pub(crate) fn all() -> Vec<(&'static str, &'static str)> {
    #[allow(unused_mut)]
    let mut all = vec![
        ("ENQUEUE_ONE", ENQUEUE_ONE),
        ("ENQUEUE_ONE_UNKEYED", ENQUEUE_ONE_UNKEYED),
        ("ENQUEUE_MANY", ENQUEUE_MANY),
        ("ENQUEUE_UNKEYED", ENQUEUE_UNKEYED),
        ("CLAIM", CLAIM),
        ("CLAIM_SPLIT", CLAIM_SPLIT),
        ("PROBE", PROBE),
        ("NEXT_DUE", NEXT_DUE),
        ("RENEW", RENEW),
        ("COMPLETE_DELETE", COMPLETE_DELETE),
        ("COMPLETE_KEEP", COMPLETE_KEEP),
        ("FAIL", FAIL),
        ("RELEASE", RELEASE),
        ("RESCUE", RESCUE),
        ("FENCE", FENCE),
        ("ARM_PERIODIC", ARM_PERIODIC),
        ("LIVE_PAYLOADS", LIVE_PAYLOADS),
        ("ANY_DUE", ANY_DUE),
        ("DB_NOW", DB_NOW),
        ("THROUGHPUT_ADD", THROUGHPUT_ADD),
        ("THROUGHPUT_PRUNE", THROUGHPUT_PRUNE),
        ("HISTORY", crate::history::HISTORY),
        ("CHECKPOINT", CHECKPOINT),
        ("CLAIM_ID", CLAIM_ID),
        ("MAKE_DUE", MAKE_DUE),
        ("FAILED_SINCE", FAILED_SINCE),
        ("LAST_CHECKPOINT", LAST_CHECKPOINT),
        ("KIND_SETTINGS", KIND_SETTINGS),
        ("LIMIT_LOCK", LIMIT_LOCK),
        ("CLAIM_LIMITED", CLAIM_LIMITED),
        ("CLAIM_PARTITIONED", CLAIM_PARTITIONED),
        ("HAND_OFF", HAND_OFF),
        ("HAND_OFF_ONE", HAND_OFF_ONE),
        ("NOTIFY_FREED", NOTIFY_FREED),
        ("RUNTIME_SEEN", RUNTIME_SEEN),
        ("RUNTIME_GONE", RUNTIME_GONE),
        ("RUNTIMES_STALE", RUNTIMES_STALE),
    ];
    #[cfg(feature = "metrics")]
    all.push(("LAG_DEPTH", LAG_DEPTH));
    all.extend(crate::admin::STATEMENTS.iter().copied());
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The claims' SQL and the runtime's floors look back alike.
    #[test]
    fn the_look_back_is_one_figure() {
        assert_eq!(
            look_back_in_claims!().parse::<f64>().unwrap(),
            LOOK_BACK_IN_CLAIMS
        );
    }

    /// The runtime never asks a claim for more of a kind than the statement takes: a
    /// claim that takes less than asked reads as an empty queue.
    #[test]
    fn claims_take_at_most_claim_max_per_kind_of_a_kind() {
        let limit = format!("LIMIT {CLAIM_MAX_PER_KIND}\n");
        for (name, statement) in [("CLAIM", CLAIM), ("CLAIM_SPLIT", CLAIM_SPLIT)] {
            assert!(
                statement.contains(&limit),
                "{name} has no `{}`",
                limit.trim()
            );
        }
    }
}
