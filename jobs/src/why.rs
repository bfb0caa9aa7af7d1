//! Why a job waits: [`explain`], from the database's view and what the runtimes report
//! of themselves (`jobs_runtimes`: their kinds and their kinds' declared limits).

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use sqlx::types::chrono::{DateTime, Utc};
use sqlx::{Acquire, Postgres, Row};

use crate::admin::{JobRow, JobState};
use crate::error::Error;

/// How long after its last report a runtime counts as alive: it reports every 5 s.
pub(crate) const ALIVE_WITHIN: Duration = Duration::from_secs(30);

/// What holds up kind `$1`'s job `$2` besides its own row: the kind's pause, an
/// operator's limits, the limits the runtimes declare for it (the latest report), the
/// runtimes alive (seen within `$3` ms), and how many due jobs of the kind come before
/// it in claim order (up to 100,000). Indexes: the primary keys of `jobs`,
/// `jobs_paused` and `jobs_limits`; `jobs_runtimes` whole (a row per runtime);
/// `jobs_claim`, the kind's range before the job (its place read from its row, each
/// column a value of its own, so that the row comparison is the index's condition).
pub(crate) const WHY_KIND: &str = r#"
SELECT (SELECT p.paused_at FROM jobs_paused p WHERE p.kind = $1) AS paused_at,
       l.concurrency AS set_concurrency, l.rate_starts AS set_rate_starts, l.rate_ms AS set_rate_ms,
       (SELECT r.limits -> $1 FROM jobs_runtimes r
        WHERE r.limits ? $1 ORDER BY r.last_seen DESC LIMIT 1) AS declared,
       coalesce((SELECT jsonb_agg(jsonb_build_object('id', r.id, 'name', r.name, 'host', r.host,
                                                     'kinds', r.kinds) ORDER BY r.started_at, r.id)
                 FROM jobs_runtimes r
                 WHERE r.last_seen > now() - $3 * interval '1 millisecond'), '[]') AS live,
       (SELECT count(*) FROM (
            SELECT FROM jobs a
            WHERE a.state = 'pending' AND a.kind = $1 AND a.run_after <= now()
              AND (a.priority, a.run_after, a.id)
                  < ((SELECT j.priority FROM jobs j WHERE j.id = $2),
                     (SELECT j.run_after FROM jobs j WHERE j.id = $2), $2::bigint)
            LIMIT 100000) a) AS ahead,
       now() AS now
FROM (SELECT) one
LEFT JOIN jobs_limits l ON l.kind = $1
"#;

/// The shares of kind `$1`'s limits that hold up its job `$2`: the runtimes that hold
/// its running jobs (of the job's partition, by the payload fields `$3`, when it has
/// them), and the starts in the rate's window of `$4` ms (NULL without a rate), with
/// when its oldest leaves it, counted as the claims count them (each start until its
/// claim's margin has passed; the margin is at most 10 s). Indexes: the primary key for the job; `jobs_running` for
/// the kind's running rows; `jobs_starts_kind_at` for the window.
pub(crate) const WHY_SHARES: &str = r#"
WITH me AS (
    SELECT CASE WHEN $3::text[] IS NOT NULL THEN
               jsonb_build_array(j.payload -> ($3::text[])[1], j.payload -> ($3::text[])[2],
                                 j.payload -> ($3::text[])[3], j.payload -> ($3::text[])[4])
           END AS part
    FROM jobs j WHERE j.id = $2
),
holders AS (
    SELECT r.runtime_id, count(*) AS n
    FROM jobs r
    WHERE r.state = 'running' AND r.kind = $1
      AND ($3::text[] IS NULL
           OR coalesce(r.part, jsonb_build_array(r.payload -> ($3::text[])[1], r.payload -> ($3::text[])[2],
                                                 r.payload -> ($3::text[])[3], r.payload -> ($3::text[])[4]))
              = (SELECT part FROM me))
    GROUP BY r.runtime_id
),
starts AS (
    SELECT sum(s.n) AS n, min(s.at + s.margin_ms * interval '1 millisecond') AS oldest
    FROM jobs_starts s
    WHERE $4::bigint IS NOT NULL AND s.kind = $1
      AND s.at > statement_timestamp() - ($4 + 10000) * interval '1 millisecond'
      AND s.at + s.margin_ms * interval '1 millisecond'
          > statement_timestamp() - $4 * interval '1 millisecond'
      AND CASE WHEN $3::text[] IS NULL THEN s.part IS NULL ELSE s.part = (SELECT part FROM me) END
)
SELECT (SELECT part FROM me) AS part,
       coalesce((SELECT jsonb_agg(jsonb_build_object('runtime', h.runtime_id, 'name', rt.name,
                                                     'host', rt.host, 'running', h.n)
                                  ORDER BY h.n DESC, h.runtime_id)
                 FROM holders h LEFT JOIN jobs_runtimes rt ON rt.id = h.runtime_id), '[]') AS holders,
       coalesce((SELECT n FROM starts), 0)::bigint AS starts,
       (SELECT oldest + $4 * interval '1 millisecond' FROM starts) AS room_at
"#;

/// Why job [`Explanation::id`] has not started, as [`explain`] found it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Explanation {
    /// The job's id.
    pub id: i64,
    /// Its kind.
    pub kind: String,
    /// Its state.
    pub state: JobState,
    /// Every reason that holds, most basic first; [`Wait::Ready`] alone when none does.
    pub reasons: Vec<Wait>,
    /// When this was read, on the database clock.
    pub at: DateTime<Utc>,
}

/// One reason a job has not started.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Wait {
    /// It is not waiting: a runtime holds it claimed (running, or claimed ahead of a
    /// free slot) until `until`.
    Claimed {
        /// The runtime that claimed it.
        runtime: Option<RuntimeInfo>,
        /// When its lease ends unless renewed.
        until: Option<DateTime<Utc>>,
    },
    /// It is not waiting: it ended in this state.
    Ended(JobState),
    /// It is due at `at` (a delay, a schedule, or a retry's backoff).
    Scheduled {
        /// Its run-after.
        at: DateTime<Utc>,
    },
    /// Its kind is paused (`jobs::admin::pause`).
    Paused {
        /// Since when.
        since: DateTime<Utc>,
    },
    /// No runtime alive (seen in the last 30 s) claims its kind; these are alive.
    NoRuntime {
        /// The runtimes alive, with their kinds.
        alive: Vec<RuntimeInfo>,
    },
    /// Its kind (or, with `partition`, the job's partition) runs as many jobs as its
    /// global concurrency allows; `holders` hold them.
    AtLimit {
        /// The limit.
        limit: u32,
        /// The partition's value (the values of the payload fields the limit holds per,
        /// as a JSON array; `null` for a missing field), if the limit is per partition.
        partition: Option<serde_json::Value>,
        /// The runtimes that hold the running jobs, and how many each.
        holders: Vec<(Option<RuntimeInfo>, u64)>,
    },
    /// Its kind's (or partition's) rate has no room: `starts` started in the last
    /// `per`, at most `limit` may; the window has room again at `until`.
    RateFull {
        /// The most starts in a window.
        limit: u32,
        /// The window.
        per: Duration,
        /// Starts in the window now.
        starts: u64,
        /// The partition's value, if the rate is per partition.
        partition: Option<serde_json::Value>,
        /// When the oldest start leaves the window.
        until: Option<DateTime<Utc>>,
    },
    /// These many due jobs of its kind come before it in claim order (priority, then
    /// run-after; counted up to 100,000).
    Behind {
        /// How many.
        ahead: u64,
    },
    /// Due, and nothing holds it up: the next claim of a runtime of its kind takes it.
    Ready,
}

/// A runtime, as it reported itself (`jobs::admin::runtimes` has all it reports).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct RuntimeInfo {
    /// Its id.
    pub id: uuid::Uuid,
    /// Its name, if it was given one.
    pub name: Option<String>,
    /// Its host (None for a runtime that no longer reports).
    pub host: Option<String>,
    /// The kinds it claims (empty where not known).
    #[serde(default)]
    pub kinds: Vec<String>,
}

impl fmt::Display for RuntimeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.name, &self.host) {
            (Some(name), Some(host)) => write!(f, "{name} ({}, on {host})", self.id),
            (None, Some(host)) => write!(f, "{} on {host}", self.id),
            (Some(name), None) => write!(f, "{name} ({})", self.id),
            (None, None) => write!(f, "{} (no longer reporting)", self.id),
        }
    }
}

impl Wait {
    /// The reason as one word, for programs: `claimed`, `ended`, `scheduled`, `paused`,
    /// `no_runtime`, `at_limit`, `rate_full`, `behind`, `ready`.
    pub fn code(&self) -> &'static str {
        match self {
            Wait::Claimed { .. } => "claimed",
            Wait::Ended(_) => "ended",
            Wait::Scheduled { .. } => "scheduled",
            Wait::Paused { .. } => "paused",
            Wait::NoRuntime { .. } => "no_runtime",
            Wait::AtLimit { .. } => "at_limit",
            Wait::RateFull { .. } => "rate_full",
            Wait::Behind { .. } => "behind",
            Wait::Ready => "ready",
        }
    }
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let partition = |p: &Option<serde_json::Value>| match p {
            Some(p) => format!(" (partition {p})"),
            None => String::new(),
        };
        match self {
            Wait::Claimed { runtime, until } => {
                write!(f, "claimed")?;
                if let Some(runtime) = runtime {
                    write!(f, " by runtime {runtime}")?;
                }
                match until {
                    Some(until) => write!(f, ", leased until {}", until.to_rfc3339()),
                    None => Ok(()),
                }
            }
            Wait::Ended(state) => write!(f, "not waiting: it is {state}"),
            Wait::Scheduled { at } => write!(f, "due at {}", at.to_rfc3339()),
            Wait::Paused { since } => write!(f, "its kind is paused since {}", since.to_rfc3339()),
            Wait::NoRuntime { alive } if alive.is_empty() => {
                write!(f, "no runtime claims its kind: none is alive")
            }
            Wait::NoRuntime { alive } => {
                write!(f, "no runtime claims its kind; alive: ")?;
                for (i, rt) in alive.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "; " };
                    write!(f, "{sep}{rt} with {}", rt.kinds.join(", "))?;
                }
                Ok(())
            }
            Wait::AtLimit {
                limit,
                partition: p,
                holders,
            } => {
                let running: u64 = holders.iter().map(|(_, n)| n).sum();
                write!(
                    f,
                    "its kind{} is at its global concurrency: {running} running of {limit}",
                    partition(p)
                )?;
                for (i, (rt, n)) in holders.iter().enumerate() {
                    let sep = if i == 0 { ", held by " } else { ", " };
                    match rt {
                        Some(rt) => write!(f, "{sep}{n} by runtime {rt}")?,
                        None => write!(f, "{sep}{n} by no runtime")?,
                    }
                }
                Ok(())
            }
            Wait::RateFull {
                limit,
                per,
                starts,
                partition: p,
                until,
            } => {
                write!(
                    f,
                    "its kind{}'s rate is full: {starts} started in the last {per:?}, at most {limit}",
                    partition(p)
                )?;
                match until {
                    Some(until) => write!(f, "; room again at {}", until.to_rfc3339()),
                    None => Ok(()),
                }
            }
            Wait::Behind { ahead } => {
                write!(f, "behind {ahead} due jobs of its kind in claim order")
            }
            Wait::Ready => write!(
                f,
                "due and held up by nothing: the next claim of a runtime of its kind takes it"
            ),
        }
    }
}

/// A kind's limits across runtimes as they hold: an operator's values, field by
/// field, over those its runtimes declare.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
struct Declared {
    concurrency: Option<u32>,
    rate_starts: Option<u32>,
    rate_ms: Option<u64>,
    partition: Option<Vec<String>>,
}

/// What [`WHY_KIND`] read.
struct KindView {
    paused_at: Option<DateTime<Utc>>,
    limits: Declared,
    alive: Vec<RuntimeInfo>,
    ahead: u64,
    now: DateTime<Utc>,
}

/// What [`WHY_SHARES`] read.
struct Shares {
    partition: Option<serde_json::Value>,
    holders: Vec<(Option<RuntimeInfo>, u64)>,
    starts: u64,
    room_at: Option<DateTime<Utc>>,
}

/// Why job `id` has not started: every reason that holds, from the database's view
/// and the runtimes' reports; `None` if there is no such job. Several may hold at once
/// (a job scheduled for later, of a paused kind, behind others): all are listed. A job
/// that is not pending gets one: claimed (by which runtime, until when) or ended.
///
/// Read-only, three statements on one connection, each on an index (the job by its
/// primary key, its kind's due jobs before it on `jobs_claim`, counted up to 100,000,
/// its kind's running jobs on `jobs_running`): safe while runtimes work. The runtimes alive are those that
/// reported in the last 30 s; the limits are an operator's (`set_limits`) over those
/// the kind's runtimes declare.
///
/// ```no_run
/// # async fn demo(pool: jobs::sqlx::PgPool) -> Result<(), jobs::Error> {
/// if let Some(why) = jobs::admin::explain(&pool, 42).await? {
///     for reason in &why.reasons {
///         println!("job 42: {reason}");
///     }
/// }
/// # Ok(()) }
/// ```
pub async fn explain<'a, A>(conn: A, id: i64) -> Result<Option<Explanation>, Error>
where
    A: Acquire<'a, Database = Postgres>,
{
    let mut conn = conn.acquire().await?;
    let Some(job) = crate::admin::get(&mut *conn, id).await? else {
        return Ok(None);
    };
    let row = crate::pooler::query(WHY_KIND)
        .bind(&job.kind)
        .bind(job.id)
        .bind(crate::enqueue::millis(ALIVE_WITHIN))
        .fetch_one(&mut *conn)
        .await?;
    let view = kind_view(&row)?;
    let shares = if job.state == JobState::Pending
        && (view.limits.concurrency.is_some() || view.limits.rate_starts.is_some())
    {
        let row = crate::pooler::query(WHY_SHARES)
            .bind(&job.kind)
            .bind(job.id)
            .bind(view.limits.partition.as_deref())
            .bind(view.limits.rate_ms.and_then(|ms| i64::try_from(ms).ok()))
            .fetch_one(&mut *conn)
            .await?;
        let mut shares = shares(&row)?;
        // The partition as the values of its fields alone (the claims compare four).
        if let (Some(serde_json::Value::Array(values)), Some(fields)) =
            (&mut shares.partition, &view.limits.partition)
        {
            values.truncate(fields.len());
        }
        Some(shares)
    } else {
        None
    };
    Ok(Some(Explanation {
        id: job.id,
        kind: job.kind.clone(),
        state: job.state,
        reasons: reasons(&job, &view, shares.as_ref()),
        at: view.now,
    }))
}

fn kind_view(row: &sqlx::postgres::PgRow) -> Result<KindView, Error> {
    let declared: Option<serde_json::Value> = row.try_get("declared")?;
    let declared: Declared = declared
        .and_then(|d| serde_json::from_value(d).ok())
        .unwrap_or_default();
    let positive = |n: Option<i64>| n.and_then(|n| u64::try_from(n).ok()).filter(|n| *n > 0);
    let set_concurrency: Option<i32> = row.try_get("set_concurrency")?;
    let set_starts: Option<i32> = row.try_get("set_rate_starts")?;
    let set_ms: Option<i64> = row.try_get("set_rate_ms")?;
    let (rate_starts, rate_ms) = match (positive(set_starts.map(i64::from)), positive(set_ms)) {
        (Some(starts), Some(ms)) => (u32::try_from(starts).ok(), Some(ms)),
        _ => (declared.rate_starts, declared.rate_ms),
    };
    let alive: serde_json::Value = row.try_get("live")?;
    Ok(KindView {
        paused_at: row.try_get("paused_at")?,
        limits: Declared {
            concurrency: positive(set_concurrency.map(i64::from))
                .and_then(|n| u32::try_from(n).ok())
                .or(declared.concurrency),
            rate_starts,
            rate_ms,
            partition: declared.partition,
        },
        alive: serde_json::from_value(alive).map_err(|e| protocol(&e))?,
        ahead: crate::admin::count(row.try_get("ahead")?),
        now: row.try_get("now")?,
    })
}

fn shares(row: &sqlx::postgres::PgRow) -> Result<Shares, Error> {
    #[derive(Deserialize)]
    struct Holder {
        runtime: Option<uuid::Uuid>,
        name: Option<String>,
        host: Option<String>,
        running: u64,
    }
    let holders: serde_json::Value = row.try_get("holders")?;
    let holders: Vec<Holder> = serde_json::from_value(holders).map_err(|e| protocol(&e))?;
    Ok(Shares {
        partition: row.try_get("part")?,
        holders: holders
            .into_iter()
            .map(|h| {
                let runtime = h.runtime.map(|id| RuntimeInfo {
                    id,
                    name: h.name,
                    host: h.host,
                    kinds: Vec::new(),
                });
                (runtime, h.running)
            })
            .collect(),
        starts: crate::admin::count(row.try_get("starts")?),
        room_at: row.try_get("room_at")?,
    })
}

fn protocol(e: &serde_json::Error) -> Error {
    crate::enqueue::protocol(format!("an explanation's row does not read: {e}"))
}

/// The reasons that hold for `job`, given its kind's view and, for a kind with a
/// limit, the shares of it in use.
fn reasons(job: &JobRow, view: &KindView, shares: Option<&Shares>) -> Vec<Wait> {
    match job.state {
        JobState::Pending => {}
        JobState::Running => {
            let runtime = job.runtime.map(|id| {
                view.alive
                    .iter()
                    .find(|rt| rt.id == id)
                    .cloned()
                    .unwrap_or(RuntimeInfo {
                        id,
                        name: None,
                        host: None,
                        kinds: Vec::new(),
                    })
            });
            return vec![Wait::Claimed {
                runtime,
                until: job.claimed_until,
            }];
        }
        state => return vec![Wait::Ended(state)],
    }
    let mut reasons = Vec::new();
    if job.run_after > view.now {
        reasons.push(Wait::Scheduled { at: job.run_after });
    }
    if let Some(since) = view.paused_at {
        reasons.push(Wait::Paused { since });
    }
    if !view.alive.iter().any(|rt| rt.kinds.contains(&job.kind)) {
        reasons.push(Wait::NoRuntime {
            alive: view.alive.clone(),
        });
    }
    if let Some(shares) = shares {
        let running: u64 = shares.holders.iter().map(|(_, n)| n).sum();
        if let Some(limit) = view.limits.concurrency
            && running >= u64::from(limit)
        {
            reasons.push(Wait::AtLimit {
                limit,
                partition: shares.partition.clone(),
                holders: shares.holders.clone(),
            });
        }
        if let (Some(limit), Some(ms)) = (view.limits.rate_starts, view.limits.rate_ms)
            && shares.starts >= u64::from(limit)
        {
            reasons.push(Wait::RateFull {
                limit,
                per: Duration::from_millis(ms),
                starts: shares.starts,
                partition: shares.partition.clone(),
                until: shares.room_at,
            });
        }
    }
    if job.run_after <= view.now && view.ahead > 0 {
        reasons.push(Wait::Behind { ahead: view.ahead });
    }
    if reasons.is_empty() {
        reasons.push(Wait::Ready);
    }
    reasons
}
