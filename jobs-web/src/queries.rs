//! The dashboard's reads. Each does bounded work whatever the table holds: counts stop
//! at [`COUNT_CAP`] per kind, state and priority; listings read one keyset page through
//! a partial index, or a bounded window of ids. Every statement only reads.

use chrono::{DateTime, Utc};
use jobs::admin::JobState;
use sqlx::{PgPool, Row};

/// Counts on the overview stop here (per kind, state and priority) and show as
/// "10000+": an exact count of millions of rows would take seconds.
pub const COUNT_CAP: i64 = 10_000;

/// How many ids a filtered listing reads at most per page when no index serves its
/// filter (a key search, a kind without a state): the page says which ids it searched
/// and offers the next window.
pub(crate) const SCAN_WINDOW: i64 = 50_000;

/// A listing's page size.
pub(crate) const PAGE: i64 = 50;

/// A count that may have stopped at the cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Count {
    pub n: i64,
    pub capped: bool,
}

impl std::fmt::Display for Count {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.capped {
            write!(f, "{}+", self.n)
        } else {
            write!(f, "{}", self.n)
        }
    }
}

/// One kind's line of the overview.
#[derive(Debug, Clone)]
pub(crate) struct KindLine {
    pub kind: String,
    pub ready: Count,
    pub scheduled: Count,
    pub running: Count,
    pub failed: Count,
    pub cancelled: Count,
    pub done: Count,
    pub oldest_due: Option<DateTime<Utc>>,
    pub paused: bool,
    /// The global concurrency an operator set (`jobs_limits`), if any.
    pub limit: Option<i32>,
    /// The rate an operator set: starts per so many ms.
    pub rate: Option<(i32, i64)>,
}

/// A loose index scan over the partial index of one state: the CTE `$name` of the
/// kinds having rows in `$state`, one index probe per kind (and a last NULL row).
macro_rules! kinds_in {
    ($name:literal, $state:literal) => {
        concat!(
            $name,
            " AS ((SELECT kind FROM jobs WHERE state = '",
            $state,
            "' ORDER BY kind LIMIT 1)
       UNION ALL
       SELECT (SELECT j.kind FROM jobs j WHERE j.state = '",
            $state,
            "' AND j.kind > ",
            $name,
            ".kind ORDER BY j.kind LIMIT 1)
       FROM ",
            $name,
            " WHERE ",
            $name,
            ".kind IS NOT NULL),
"
        )
    };
}

/// The kinds, one loose index scan per state's partial index (one probe per kind), plus
/// the paused and limited kinds and the kinds a registered runtime claims (a kind with
/// a handler and no job yet shows, and can be paused before its first job), each with
/// the limits an operator set (`jobs_limits`, its primary key). `$1` is the cap + 1;
/// each count is bounded by it (per priority for the pending rows).
///
/// Indexes: `jobs_claim (kind, priority, run_after, id)` for the pending rows, one range
/// per kind and priority (ready below `now()`, scheduled above, the oldest due at the
/// start of each ready range); `jobs_running`, `jobs_failed`, `jobs_cancelled`
/// (`(kind, id)`) and `jobs_done (kind, finished_at)` for the others. Index-only where
/// the visibility map allows.
const OVERVIEW: &str = concat!(
    "WITH RECURSIVE\n",
    kinds_in!("kp", "pending"),
    kinds_in!("kr", "running"),
    kinds_in!("kf", "failed"),
    kinds_in!("kc", "cancelled"),
    kinds_in!("kd", "done"),
    r#"kinds AS (
    SELECT kind FROM kp UNION SELECT kind FROM kr UNION SELECT kind FROM kf
    UNION SELECT kind FROM kc UNION SELECT kind FROM kd UNION SELECT kind FROM jobs_paused
    UNION SELECT kind FROM jobs_limits UNION SELECT unnest(kinds) FROM jobs_runtimes
)
SELECT k.kind,
       p.ready, p.ready_capped, p.scheduled, p.scheduled_capped, p.oldest_due,
       (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE state = 'running' AND kind = k.kind LIMIT $1) s) AS running,
       (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE state = 'failed' AND kind = k.kind LIMIT $1) s) AS failed,
       (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE state = 'cancelled' AND kind = k.kind LIMIT $1) s) AS cancelled,
       (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE state = 'done' AND kind = k.kind LIMIT $1) s) AS done,
       EXISTS (SELECT 1 FROM jobs_paused z WHERE z.kind = k.kind) AS paused,
       l.concurrency AS limit_concurrency, l.rate_starts, l.rate_ms
FROM kinds k
LEFT JOIN jobs_limits l ON l.kind = k.kind
CROSS JOIN LATERAL (
    SELECT coalesce(sum(r.n), 0)::bigint AS ready, coalesce(bool_or(r.n >= $1), false) AS ready_capped,
           coalesce(sum(s.n), 0)::bigint AS scheduled, coalesce(bool_or(s.n >= $1), false) AS scheduled_capped,
           min(o.run_after) AS oldest_due
    FROM generate_series(0, $2::int) AS pr(priority)
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM (
            SELECT 1 FROM jobs WHERE state = 'pending' AND kind = k.kind
              AND priority = pr.priority AND run_after <= now() LIMIT $1) x
    ) r
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM (
            SELECT 1 FROM jobs WHERE state = 'pending' AND kind = k.kind
              AND priority = pr.priority AND run_after > now() LIMIT $1) x
    ) s
    LEFT JOIN LATERAL (
        SELECT run_after FROM jobs WHERE state = 'pending' AND kind = k.kind
          AND priority = pr.priority AND run_after <= now()
        ORDER BY run_after LIMIT 1
    ) o ON true
) p
WHERE k.kind IS NOT NULL
ORDER BY k.kind
"#
);

/// A read-only transaction without JIT compilation, and the database's clock. The planner's costs for these
/// reads grow with the table's estimated size, past the JIT threshold at a few million
/// rows, where compiling takes half a second and the read itself a few milliseconds
/// (measured: the overview at 2 million rows, 540 ms with JIT, under 80 without).
async fn reading(
    pool: &PgPool,
) -> Result<(sqlx::Transaction<'static, sqlx::Postgres>, DateTime<Utc>), sqlx::Error> {
    let mut tx = pool.begin_with("BEGIN READ ONLY").await?;
    // The setting and the database's clock (every relative time on a page is measured
    // against it) in one round trip.
    let (_, now): (String, DateTime<Utc>) =
        sqlx::query_as("SELECT set_config('jit', 'off', true), now()")
            .fetch_one(&mut *tx)
            .await?;
    Ok((tx, now))
}

/// Every kind's line of the overview, in kind order.
pub(crate) async fn overview(pool: &PgPool) -> Result<Vec<KindLine>, sqlx::Error> {
    let (mut tx, _) = reading(pool).await?;
    let rows = sqlx::query(OVERVIEW)
        .bind(COUNT_CAP + 1)
        .bind(i32::from(jobs::MAX_PRIORITY))
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    let bounded = |n: i64| Count {
        n: n.min(COUNT_CAP),
        capped: n > COUNT_CAP,
    };
    rows.iter()
        .map(|row| {
            let summed = |n: &str, capped: &str| -> Result<Count, sqlx::Error> {
                let n: i64 = row.try_get(n)?;
                let capped: bool = row.try_get(capped)?;
                Ok(Count { n, capped })
            };
            Ok(KindLine {
                kind: row.try_get("kind")?,
                ready: summed("ready", "ready_capped")?,
                scheduled: summed("scheduled", "scheduled_capped")?,
                running: bounded(row.try_get("running")?),
                failed: bounded(row.try_get("failed")?),
                cancelled: bounded(row.try_get("cancelled")?),
                done: bounded(row.try_get("done")?),
                oldest_due: row.try_get("oldest_due")?,
                paused: row.try_get("paused")?,
                limit: row.try_get("limit_concurrency")?,
                rate: row
                    .try_get::<Option<i32>, _>("rate_starts")?
                    .zip(row.try_get::<Option<i64>, _>("rate_ms")?),
            })
        })
        .collect()
}

/// One job's line in a listing.
#[derive(Debug, Clone)]
pub(crate) struct ListRow {
    pub id: i64,
    pub kind: String,
    pub key: Option<String>,
    pub state: String,
    pub attempts: i32,
    pub max_attempts: i32,
    pub priority: i16,
    pub run_after: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The first 200 characters of the last error.
    pub error: Option<String>,
}

/// The columns of a [`ListRow`] (the error cut short: a page of listings never carries
/// megabytes of stack traces).
macro_rules! list_columns {
    () => {
        "j.id, j.kind, j.key, j.state, j.attempts, j.max_attempts, j.priority, \
         j.run_after, j.created_at, j.finished_at, left(j.last_error, 200) AS error"
    };
}

fn list_rows(rows: &[sqlx::postgres::PgRow]) -> Result<Vec<ListRow>, sqlx::Error> {
    rows.iter().map(list_row).collect()
}

fn list_row(row: &sqlx::postgres::PgRow) -> Result<ListRow, sqlx::Error> {
    Ok(ListRow {
        id: row.try_get("id")?,
        kind: row.try_get("kind")?,
        key: row.try_get("key")?,
        state: row.try_get("state")?,
        attempts: row.try_get("attempts")?,
        max_attempts: row.try_get("max_attempts")?,
        priority: row.try_get("priority")?,
        run_after: row.try_get("run_after")?,
        created_at: row.try_get("created_at")?,
        finished_at: row.try_get("finished_at")?,
        error: row.try_get("error")?,
    })
}

/// What a listing selects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    pub kind: Option<String>,
    pub state: Option<JobState>,
    pub key: Option<String>,
    /// Pending jobs by run time (the next to run first) instead of newest first.
    pub by_run_time: bool,
}

/// Where a page starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cursor {
    /// Newest first: only ids below this one.
    pub before: Option<i64>,
    /// By run time: only jobs after this (run_after, id).
    pub after_run: Option<(DateTime<Utc>, i64)>,
}

/// One page of a listing and where the next starts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Page {
    pub rows: Vec<ListRow>,
    pub next: Option<Cursor>,
    /// When the page read a window of ids: the lowest id it searched (the next page
    /// searches below it).
    pub searched_down_to: Option<i64>,
}

/// The kinds having rows in `state`: the loose index scan of [`OVERVIEW`] for one
/// state, as a common table expression `k` (`$1` the state).
macro_rules! kinds_of_state {
    () => {
        r#"
WITH RECURSIVE k AS (
    (SELECT kind FROM jobs WHERE state = $1 ORDER BY kind LIMIT 1)
    UNION ALL
    SELECT (SELECT j.kind FROM jobs j WHERE j.state = $1 AND j.kind > k.kind ORDER BY j.kind LIMIT 1)
    FROM k WHERE k.kind IS NOT NULL
)"#
    };
}

/// Newest first in a state whose partial index is `(kind, id)` (running, failed,
/// cancelled): one backward range per kind below the cursor, merged. Reads at most a
/// page per kind. `$1` state, `$2` kind or NULL, `$3` cursor id or NULL, `$4` page.
const BY_STATE_NEWEST: &str = concat!(
    kinds_of_state!(),
    "\nSELECT ",
    list_columns!(),
    r#"
FROM (SELECT kind FROM k WHERE kind IS NOT NULL AND ($2::text IS NULL OR kind = $2)) kk
CROSS JOIN LATERAL (
    SELECT * FROM jobs j WHERE j.state = $1 AND j.kind = kk.kind
      AND ($3::bigint IS NULL OR j.id < $3)
    ORDER BY j.id DESC LIMIT $4
) j
ORDER BY j.id DESC LIMIT $4
"#
);

/// Pending jobs by run time: one forward range of `jobs_claim (kind, priority,
/// run_after, id)` per kind and priority after the cursor, merged. `$1` the state
/// (`pending`), `$2` kind or NULL, `$3`/`$4` the cursor's run_after and id or NULLs, `$5`
/// page, `$6` the highest priority.
const PENDING_BY_RUN_TIME: &str = concat!(
    kinds_of_state!(),
    "\nSELECT ",
    list_columns!(),
    r#"
FROM (SELECT kind FROM k WHERE kind IS NOT NULL AND ($2::text IS NULL OR kind = $2)) kk
CROSS JOIN generate_series(0, $6::int) AS pr(priority)
CROSS JOIN LATERAL (
    SELECT * FROM jobs j WHERE j.state = $1 AND j.kind = kk.kind AND j.priority = pr.priority
      AND ($3::timestamptz IS NULL OR (j.run_after, j.id) > ($3, $4))
    ORDER BY j.run_after, j.id LIMIT $5
) j
ORDER BY j.run_after, j.id LIMIT $5
"#
);

/// Any filter, newest first, over a window of at most [`SCAN_WINDOW`] ids below the
/// cursor: a backward range of the primary key, each row checked against the filter.
/// `$1` state, `$2` kind, `$3` key (each NULL when not filtered), `$4` the cursor (ids
/// below it), `$5` the window's lowest id, `$6` page.
const WINDOW: &str = concat!(
    "SELECT ",
    list_columns!(),
    r#"
FROM jobs j
WHERE j.id < $4 AND j.id >= $5
  AND ($1::text IS NULL OR j.state = $1)
  AND ($2::text IS NULL OR j.kind = $2)
  AND ($3::text IS NULL OR j.key = $3)
ORDER BY j.id DESC
LIMIT $6
"#
);

/// The highest and lowest ids (two probes of the primary key).
const ID_RANGE: &str = "SELECT (SELECT max(id) FROM jobs), (SELECT min(id) FROM jobs)";

/// One page of the jobs `filter` selects, from `cursor`, and the database's clock.
pub(crate) async fn list(
    pool: &PgPool,
    filter: &Filter,
    cursor: Cursor,
) -> Result<(DateTime<Utc>, Page), sqlx::Error> {
    let (mut tx, now) = reading(pool).await?;
    let page = list_in(&mut tx, filter, cursor).await?;
    tx.commit().await?;
    Ok((now, page))
}

async fn list_in(
    tx: &mut sqlx::PgConnection,
    filter: &Filter,
    cursor: Cursor,
) -> Result<Page, sqlx::Error> {
    let indexed_state = matches!(
        filter.state,
        Some(JobState::Running | JobState::Failed | JobState::Cancelled)
    );
    if filter.key.is_none() && filter.state == Some(JobState::Pending) && filter.by_run_time {
        let rows = sqlx::query(PENDING_BY_RUN_TIME)
            .bind("pending")
            .bind(filter.kind.as_deref())
            .bind(cursor.after_run.map(|(at, _)| at))
            .bind(cursor.after_run.map(|(_, id)| id))
            .bind(PAGE)
            .bind(i32::from(jobs::MAX_PRIORITY))
            .fetch_all(&mut *tx)
            .await?;
        return Ok(Page::keyset(list_rows(&rows)?, true));
    }
    if filter.key.is_none() && indexed_state {
        let rows = sqlx::query(BY_STATE_NEWEST)
            .bind(filter.state.map(JobState::as_str))
            .bind(filter.kind.as_deref())
            .bind(cursor.before)
            .bind(PAGE)
            .fetch_all(&mut *tx)
            .await?;
        return Ok(Page::keyset(list_rows(&rows)?, false));
    }
    let (max, min): (Option<i64>, Option<i64>) =
        sqlx::query_as(ID_RANGE).fetch_one(&mut *tx).await?;
    let (Some(max), Some(min)) = (max, min) else {
        return Ok(Page::default());
    };
    let top = cursor.before.unwrap_or(max + 1).min(max + 1);
    let filtered = filter.state.is_some() || filter.kind.is_some() || filter.key.is_some();
    // Unfiltered, every row matches: the page is the next PAGE ids, no window needed.
    let low = if filtered {
        top.saturating_sub(SCAN_WINDOW)
    } else {
        i64::MIN
    };
    let rows = sqlx::query(WINDOW)
        .bind(filter.state.map(JobState::as_str))
        .bind(filter.kind.as_deref())
        .bind(filter.key.as_deref())
        .bind(top)
        .bind(low)
        .bind(PAGE)
        .fetch_all(&mut *tx)
        .await?;
    let rows = list_rows(&rows)?;
    if rows.len() as i64 == PAGE {
        return Ok(Page::keyset(rows, false));
    }
    // Fewer than a page: the window is exhausted. Older ids may still match.
    let more = filtered && low > min;
    Ok(Page {
        rows,
        next: more.then_some(Cursor {
            before: Some(low),
            after_run: None,
        }),
        searched_down_to: more.then_some(low),
    })
}

impl Page {
    /// A page read through an index in the listing's order: when full, the next page
    /// starts after its last row (by run time, or by id).
    fn keyset(rows: Vec<ListRow>, by_run_time: bool) -> Page {
        let next = match rows.last() {
            Some(last) if rows.len() as i64 == PAGE => Some(if by_run_time {
                Cursor {
                    before: None,
                    after_run: Some((last.run_after, last.id)),
                }
            } else {
                Cursor {
                    before: Some(last.id),
                    after_run: None,
                }
            }),
            _ => None,
        };
        Page {
            rows,
            next,
            searched_down_to: None,
        }
    }
}

/// Succeeded and failed runs per bar of `$2` minutes since `$1`, all kinds together.
///
/// Index: the primary key `(kind, minute)` of `jobs_throughput`: the kinds by a loose
/// scan (one probe each), then each kind's range from `$1`. Reads only the rows of
/// the range, added up here rather than sent (a week of twenty kinds is 200,000 rows).
const CHART: &str = r#"
WITH RECURSIVE k AS (
    (SELECT kind FROM jobs_throughput ORDER BY kind LIMIT 1)
    UNION ALL
    SELECT (SELECT t.kind FROM jobs_throughput t WHERE t.kind > k.kind ORDER BY t.kind LIMIT 1)
    FROM k WHERE k.kind IS NOT NULL
)
SELECT floor(floor(extract(epoch FROM t.minute - $1) / 60) / $2)::bigint AS slot,
       sum(t.succeeded)::bigint AS succeeded, sum(t.failed)::bigint AS failed
FROM k
CROSS JOIN LATERAL (
    SELECT minute, succeeded, failed FROM jobs_throughput t
    WHERE t.kind = k.kind AND t.minute >= $1
    OFFSET 0 -- kept a subquery: one index range per kind, never a scan of the table
) t
WHERE k.kind IS NOT NULL
GROUP BY 1
ORDER BY 1
"#;

/// One bar of the chart: its index from the start, succeeded and failed runs.
pub(crate) type Bar = (i64, i64, i64);

/// The chart's bars since `start`, `per_bar` minutes each (bars without runs absent).
pub(crate) async fn chart(
    pool: &PgPool,
    start: DateTime<Utc>,
    per_bar: i64,
) -> Result<Vec<Bar>, sqlx::Error> {
    let (mut tx, _) = reading(pool).await?;
    let bars = sqlx::query_as(CHART)
        .bind(start)
        .bind(per_bar as f64)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(bars)
}
