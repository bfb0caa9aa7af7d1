//! Enqueue: one job, or many in one round trip, with coalescing per key.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;
use sqlx::types::chrono::{DateTime, Utc};

use crate::error::Error;
use crate::job::Job;
use crate::sql;

/// What an enqueue did with the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// A new row was inserted.
    Inserted,
    /// The key already had a pending job: it now carries this payload and this run-after.
    Coalesced,
    /// The key's job is running: it is marked to run once more (with this payload, at
    /// this run-after) when its current claim ends.
    RerunMarked,
}

/// The result of an enqueue: the job's id and what happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The id of the row that now stands for the job.
    pub id: i64,
    /// Whether the row is new or an existing live job of the same key.
    pub outcome: EnqueueOutcome,
}

impl Enqueued {
    /// Whether a new row was inserted.
    pub fn inserted(&self) -> bool {
        self.outcome == EnqueueOutcome::Inserted
    }
}

/// How one enqueue differs from its kind's settings: when the job becomes claimable,
/// and how many attempts it gets. For [`Job::enqueue_with`] and
/// [`EnqueueBatch::push_with`].
///
/// ```no_run
/// # use jobs::sqlx;
/// # use jobs::{Job, EnqueueOptions};
/// # use std::time::Duration;
/// # #[derive(Job, serde::Serialize, serde::Deserialize)]
/// # #[job(kind = "invoice.remind", key = "invoice_id")]
/// # struct Remind { invoice_id: i64 }
/// # async fn f(pool: sqlx::PgPool, due: sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>) -> Result<(), jobs::Error> {
/// // At the invoice's due date, with three attempts instead of the kind's default.
/// Remind { invoice_id: 7 }
///     .enqueue_with(&pool, EnqueueOptions::new().at(due).max_attempts(3))
///     .await?;
/// // In an hour.
/// Remind { invoice_id: 8 }
///     .enqueue_with(&pool, EnqueueOptions::new().delay(Duration::from_secs(3600)))
///     .await?;
/// # Ok(()) }
/// ```
///
/// A job enqueued into the live job of its key (coalesced, or a re-run mark) gives it
/// these settings as any trigger does: its run-after and its attempt budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnqueueOptions {
    when: When,
    max_attempts: Option<u32>,
    priority: Option<i16>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum When {
    #[default]
    Now,
    Delay(Duration),
    At(DateTime<Utc>),
}

impl EnqueueOptions {
    /// The kind's settings, claimable now: what [`Job::enqueue`] does.
    pub fn new() -> Self {
        Self::default()
    }

    /// Claimable once `delay` has passed on the database's clock, counted from the
    /// enqueue statement. Replaces an earlier [`at`](Self::at).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.when = When::Delay(delay);
        self
    }

    /// Claimable from `at`, an instant the application chose; whether it has come is
    /// decided on the database's clock, as for every job. An instant already past makes
    /// the job claimable now (its run-after reads as the enqueue's time); one after the
    /// year 9999 is refused when the job is enqueued. Replaces an earlier
    /// [`delay`](Self::delay).
    pub fn at(mut self, at: DateTime<Utc>) -> Self {
        self.when = When::At(at);
        self
    }

    /// How many claims the job gets before it fails for good, instead of the kind's
    /// `max_attempts`. Zero is refused when the job is enqueued.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// The job's priority instead of the kind's (`#[job(priority = N)]`, 0 by
    /// default): among the due jobs of its kind, a lower number is claimed first, then
    /// the earlier run-after. 0 to [`MAX_PRIORITY`](crate::MAX_PRIORITY); anything else
    /// is refused when the job is enqueued.
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = Some(priority);
        self
    }
}

/// One job ready to be written: kind, key, payload text and settings.
#[derive(Debug, Clone)]
pub(crate) struct NewJob {
    pub kind: &'static str,
    pub key: Option<String>,
    pub payload: String,
    pub max_attempts: i32,
    pub delay_ms: i64,
    /// An absolute run-after, instead of the delay.
    pub at: Option<DateTime<Utc>>,
    pub priority: i16,
}

/// The latest instant a job may be scheduled at, in seconds since 1970: the end of
/// the year 9999 (PostgreSQL stores later ones, chrono earlier ones, and no job needs
/// more). Instants before 1970 are passed on as 1970: past instants mean "now" in the
/// database anyway.
const AT_MAX_SECS: i64 = 253_402_300_799;

impl NewJob {
    pub(crate) fn new<J: Job>(job: &J, delay: Duration) -> Result<Self, Error> {
        Self::with(job, EnqueueOptions::new().delay(delay))
    }

    pub(crate) fn with<J: Job>(job: &J, options: EnqueueOptions) -> Result<Self, Error> {
        let payload = serde_json::to_string(job).map_err(|source| Error::Serialize {
            kind: J::KIND,
            source,
        })?;
        let key = job.key();
        let (delay, at) = match options.when {
            When::Now => (Duration::ZERO, None),
            When::Delay(delay) => (delay, None),
            When::At(at) => (Duration::ZERO, Some(at)),
        };
        check_delay(J::KIND, delay)?;
        if let Some(at) = at
            && at.timestamp() > AT_MAX_SECS
        {
            return Err(Error::InvalidInput(format!(
                "the run-after of a job of kind `{}` is {at}, after the year 9999",
                J::KIND
            )));
        }
        let priority = options.priority.unwrap_or(J::CONFIG.priority);
        if !(0..=crate::MAX_PRIORITY).contains(&priority) {
            return Err(Error::InvalidInput(format!(
                "the priority of a job of kind `{}` is {priority}: priorities go from 0 (first) to {}",
                J::KIND,
                crate::MAX_PRIORITY
            )));
        }
        let max_attempts = options.max_attempts.unwrap_or(J::CONFIG.max_attempts);
        if max_attempts == 0 {
            return Err(Error::InvalidInput(format!(
                "max_attempts of a job of kind `{}` is 0: a job needs at least one attempt",
                J::KIND
            )));
        }
        check_text("kind", J::KIND, J::KIND)?;
        crate::registry::check_declared_once(J::KIND)?;
        if let Some(key) = &key {
            check_text("key", J::KIND, key)?;
        }
        crate::limits::check_kind_and_key(J::KIND, key.as_deref())?;
        crate::limits::check_payload(J::KIND, &payload)?;
        // jsonb rejects the escaped NUL character that JSON itself allows.
        if payload.contains("\\u0000") {
            return Err(Error::InvalidInput(format!(
                "the payload of a job of kind `{}` contains a NUL character (\\u0000), which PostgreSQL's jsonb cannot store",
                J::KIND
            )));
        }
        Ok(NewJob {
            kind: J::KIND,
            key,
            payload,
            max_attempts: i32::try_from(max_attempts).unwrap_or(i32::MAX),
            delay_ms: millis(delay),
            priority,
            at: at.map(|at| {
                if at.timestamp() < 0 {
                    DateTime::from_timestamp(0, 0).unwrap_or(at)
                } else {
                    at
                }
            }),
        })
    }
}

fn check_text(what: &str, kind: &str, text: &str) -> Result<(), Error> {
    if text.contains('\0') {
        return Err(Error::InvalidInput(format!(
            "the {what} of a job of kind `{kind}` contains a NUL character, which PostgreSQL text cannot store"
        )));
    }
    Ok(())
}

/// The longest delay or period the database is given: 1,000 years. `now()` plus
/// anything much longer overflows PostgreSQL's timestamp ("interval out of range").
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(1_000 * 365 * 24 * 3600);

/// A duration in whole milliseconds for SQL, capped at [`MAX_DURATION`] (settings such as
/// a backoff cap of `Duration::MAX` mean "as long as possible").
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.min(MAX_DURATION).as_millis()).unwrap_or(i64::MAX)
}

/// Refuses an enqueue delay the database cannot add to its clock.
fn check_delay(kind: &str, delay: Duration) -> Result<(), Error> {
    if delay > MAX_DURATION {
        return Err(Error::InvalidInput(format!(
            "the delay of a job of kind `{kind}` is {delay:?}, more than the 1,000 years a job can be scheduled ahead"
        )));
    }
    Ok(())
}

fn outcome(inserted: bool, state: &str) -> EnqueueOutcome {
    match (inserted, state) {
        (true, _) => EnqueueOutcome::Inserted,
        (false, "running") => EnqueueOutcome::RerunMarked,
        _ => EnqueueOutcome::Coalesced,
    }
}

/// How often one process sends a wake-up notification for a kind, at most.
///
/// `NOTIFY` takes a database-wide lock at commit, held through the commit's WAL flush,
/// so every notifying transaction commits after the one before: 8 producers enqueueing
/// one job each per transaction reached a third of what plain inserts reach (W1m in
/// BENCHMARKS.md). An enqueue within this window of the last notification of its kind
/// sends none; an idle runtime woken by that last one claims again shortly after
/// (its follow-up), which finds the jobs committed meanwhile.
const NOTIFY_EVERY: Duration = Duration::from_millis(5);

/// Whether an enqueue of `kind` sends the wake-up notification now; if so, the window
/// starts again.
pub(crate) fn notify_now(kind: &'static str) -> bool {
    static LAST: std::sync::LazyLock<std::sync::Mutex<HashMap<&'static str, std::time::Instant>>> =
        std::sync::LazyLock::new(Default::default);
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let now = std::time::Instant::now();
    match last.get(kind) {
        Some(at) if now.duration_since(*at) < NOTIFY_EVERY => false,
        _ => {
            last.insert(kind, now);
            true
        }
    }
}

pub(crate) async fn insert_one<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    job: NewJob,
) -> Result<Enqueued, Error> {
    if job.key.is_none() {
        let (id,): (i64,) = bind_one(crate::pooler::query_as(sql::ENQUEUE_ONE_UNKEYED), job)
            .fetch_one(executor)
            .await?;
        return Ok(Enqueued {
            id,
            outcome: EnqueueOutcome::Inserted,
        });
    }
    let (id, inserted, state): (i64, bool, String) =
        bind_one(crate::pooler::query_as(sql::ENQUEUE_ONE), job)
            .fetch_one(executor)
            .await?;
    Ok(Enqueued {
        id,
        outcome: outcome(inserted, &state),
    })
}

/// Binds one job's columns in the order of `sql::ENQUEUE_ONE`; without a key, in that
/// of `sql::ENQUEUE_ONE_UNKEYED` (the same, less the key).
fn bind_one<'q, O>(
    query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    job: NewJob,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    let query = query.bind(job.kind);
    let query = match job.key {
        Some(key) => query.bind(key),
        None => query,
    };
    query
        .bind(job.payload)
        .bind(job.max_attempts)
        .bind(job.delay_ms)
        .bind(notify_now(job.kind))
        .bind(job.at)
        .bind(job.priority)
        .bind(crate::trace::current())
}

/// Many jobs, of one kind or several, enqueued in one statement and one round trip.
///
/// Jobs of one key in the same batch are merged before they are written: the last one
/// pushed wins (its payload and run-after), and every one of them reports the same id.
/// The batch sends at most one wake-up notification per kind.
///
/// ```no_run
/// # use jobs::sqlx;
/// # use jobs::{Job, EnqueueBatch};
/// # #[derive(Job, serde::Serialize, serde::Deserialize)]
/// # #[job(kind = "mail.send")]
/// # struct SendMail { to: String }
/// # async fn f(pool: sqlx::PgPool) -> Result<(), jobs::Error> {
/// let mut batch = EnqueueBatch::new();
/// for to in ["a@example.com", "b@example.com"] {
///     batch.push(&SendMail { to: to.into() })?;
/// }
/// let results = batch.enqueue(&pool).await?;
/// assert_eq!(results.len(), 2);
/// # Ok(()) }
/// ```
#[derive(Debug, Default, Clone)]
pub struct EnqueueBatch {
    jobs: Vec<NewJob>,
}

impl EnqueueBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a job, claimable now. Fails only if the job cannot be serialized or stored.
    pub fn push<J: Job>(&mut self, job: &J) -> Result<&mut Self, Error> {
        self.push_in(job, Duration::ZERO)
    }

    /// Adds a job, claimable after `delay` on the database's clock.
    pub fn push_in<J: Job>(&mut self, job: &J, delay: Duration) -> Result<&mut Self, Error> {
        self.jobs.push(NewJob::new(job, delay)?);
        Ok(self)
    }

    /// Adds a job with options of its own; see [`EnqueueOptions`].
    pub fn push_with<J: Job>(
        &mut self,
        job: &J,
        options: EnqueueOptions,
    ) -> Result<&mut Self, Error> {
        self.jobs.push(NewJob::with(job, options)?);
        Ok(self)
    }

    /// How many jobs were pushed.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether no job was pushed.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Writes every job in one statement; the results are in the order of the pushes.
    pub async fn enqueue<'e, E: sqlx::PgExecutor<'e>>(
        self,
        executor: E,
    ) -> Result<Vec<Enqueued>, Error> {
        insert_many(executor, self.jobs).await
    }
}

/// Enqueues every job of an iterator in one round trip; see [`EnqueueBatch`].
pub async fn enqueue_all<'e, 'j, J, E>(
    executor: E,
    jobs: impl IntoIterator<Item = &'j J>,
) -> Result<Vec<Enqueued>, Error>
where
    J: Job,
    E: sqlx::PgExecutor<'e>,
{
    let mut batch = EnqueueBatch::new();
    for job in jobs {
        batch.push(job)?;
    }
    batch.enqueue(executor).await
}

async fn insert_many<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    jobs: Vec<NewJob>,
) -> Result<Vec<Enqueued>, Error> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    if jobs.iter().all(|job| job.key.is_none()) {
        return insert_unkeyed(executor, &jobs).await;
    }
    // Merge jobs of one (kind, key): a statement that meets one key twice fails with
    // "ON CONFLICT DO UPDATE command cannot affect row a second time".
    // `slot[i]` is the row that input i is written as.
    let mut rows: Vec<NewJob> = Vec::with_capacity(jobs.len());
    let mut slot = Vec::with_capacity(jobs.len());
    let mut by_key: HashMap<(&'static str, String), usize> = HashMap::new();
    for job in jobs {
        match job.key.clone() {
            Some(key) => match by_key.get(&(job.kind, key.clone())) {
                Some(&at) => {
                    rows[at] = job;
                    slot.push(at);
                }
                None => {
                    by_key.insert((job.kind, key), rows.len());
                    slot.push(rows.len());
                    rows.push(job);
                }
            },
            None => {
                slot.push(rows.len());
                rows.push(job);
            }
        }
    }

    // One global lock order for every batch: unkeyed rows first (they never conflict,
    // and keep their input order so their ids rise in it), then keyed rows by
    // (kind, key). Two batches of overlapping keys then never wait on each other in a
    // cycle. `slot` is remapped to the sorted positions.
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (&rows[a], &rows[b]);
        (ra.key.is_some(), ra.kind, &ra.key, a).cmp(&(rb.key.is_some(), rb.kind, &rb.key, b))
    });
    let mut position = vec![0; rows.len()];
    for (to, &from) in order.iter().enumerate() {
        position[from] = to;
    }
    let mut unsorted: Vec<Option<NewJob>> = rows.into_iter().map(Some).collect();
    let rows: Vec<NewJob> = order
        .iter()
        .map(|&from| unsorted[from].take().expect("each row is moved once"))
        .collect();
    for at in &mut slot {
        *at = position[*at];
    }
    for at in by_key.values_mut() {
        *at = position[*at];
    }

    let columns = Columns::of(&rows);
    let n = rows.len();
    let returned: Vec<ManyRow> = columns
        .bind(crate::pooler::query_as(sql::ENQUEUE_MANY), true)
        .fetch_all(executor)
        .await?;

    // Map the returned rows back to their input rows: a keyed row by its (kind, key),
    // unique in the merged batch; unkeyed rows are always inserted, and their ids,
    // drawn from the sequence as the rows were fed in input order, rise in that order.
    let distinct_kinds: HashSet<&'static str> = columns.kinds.iter().copied().collect();
    let mut per_row: Vec<Option<Enqueued>> = vec![None; n];
    let mut unkeyed_returned = Vec::new();
    for (id, kind, key, inserted, state) in returned {
        let result = Enqueued {
            id,
            outcome: outcome(inserted, state.as_deref().unwrap_or("pending")),
        };
        match key {
            Some(key) => {
                let at = kind
                    .as_deref()
                    .and_then(|kind| distinct_kinds.get(kind))
                    .and_then(|k| by_key.get(&(*k, key)))
                    .copied()
                    .ok_or_else(|| {
                        protocol(format!("bulk enqueue returned an unknown row {id}"))
                    })?;
                per_row[at] = Some(result);
            }
            None => unkeyed_returned.push(result),
        }
    }
    unkeyed_returned.sort_by_key(|e| e.id);
    let unkeyed_rows = rows.iter().enumerate().filter(|(_, r)| r.key.is_none());
    if unkeyed_returned.len() != unkeyed_rows.clone().count() {
        return Err(protocol(
            "bulk enqueue returned a different number of rows".into(),
        ));
    }
    for ((at, _), result) in unkeyed_rows.zip(unkeyed_returned) {
        per_row[at] = Some(result);
    }
    // The input index that each row was last written from.
    let mut last = vec![0; n];
    for (i, &at) in slot.iter().enumerate() {
        last[at] = i;
    }
    let mut results = Vec::with_capacity(slot.len());
    for (i, &at) in slot.iter().enumerate() {
        let mut result = per_row[at]
            .ok_or_else(|| protocol(format!("bulk enqueue returned no row for job {at}")))?;
        // An earlier push that a later push of the same key replaced coalesced into it.
        if i != last[at] {
            result.outcome = EnqueueOutcome::Coalesced;
        }
        results.push(result);
    }
    Ok(results)
}

/// A batch in which no job has a key: nothing to merge or order, every row inserted,
/// and the ids come back as one array, in push order (`sql::ENQUEUE_UNKEYED`).
async fn insert_unkeyed<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    jobs: &[NewJob],
) -> Result<Vec<Enqueued>, Error> {
    let columns = Columns::of(jobs);
    let (ids, _notified): (Vec<i64>, i64) = columns
        .bind(crate::pooler::query_as(sql::ENQUEUE_UNKEYED), false)
        .fetch_one(executor)
        .await?;
    if ids.len() != jobs.len() {
        return Err(protocol(format!(
            "bulk enqueue of {} jobs returned {} ids",
            jobs.len(),
            ids.len()
        )));
    }
    Ok(ids
        .into_iter()
        .map(|id| Enqueued {
            id,
            outcome: EnqueueOutcome::Inserted,
        })
        .collect())
}

/// The columns of a bulk enqueue, one array each, in row order. A column where every
/// row has the default (no key, no delay, no instant, priority 0) is left empty: the
/// statements read the missing elements as those defaults, and the server decodes
/// fewer of them.
struct Columns<'a> {
    kinds: Vec<&'static str>,
    keys: Vec<Option<&'a str>>,
    payloads: Vec<&'a str>,
    max_attempts: Vec<i32>,
    delays: Vec<i64>,
    ats: Vec<Option<DateTime<Utc>>>,
    priorities: Vec<i16>,
}

impl<'a> Columns<'a> {
    fn of(rows: &'a [NewJob]) -> Self {
        let defaults = |all: bool| if all { 0 } else { rows.len() };
        let keys = defaults(rows.iter().all(|r| r.key.is_none()));
        let delays = defaults(rows.iter().all(|r| r.delay_ms == 0));
        let ats = defaults(rows.iter().all(|r| r.at.is_none()));
        let priorities = defaults(rows.iter().all(|r| r.priority == 0));
        Self {
            kinds: rows.iter().map(|r| r.kind).collect(),
            keys: rows.iter().take(keys).map(|r| r.key.as_deref()).collect(),
            payloads: rows.iter().map(|r| r.payload.as_str()).collect(),
            max_attempts: rows.iter().map(|r| r.max_attempts).collect(),
            delays: rows.iter().take(delays).map(|r| r.delay_ms).collect(),
            ats: rows.iter().take(ats).map(|r| r.at).collect(),
            priorities: rows.iter().take(priorities).map(|r| r.priority).collect(),
        }
    }

    /// Binds the columns in the statements' order: kinds, keys (only if `keys`: the
    /// unkeyed statement has none), payloads, max_attempts, delays, the kinds to notify
    /// (those of the batch that send their wake-up notification now, [`notify_now`]),
    /// run-afters, priorities, and the enqueuer's trace context ([`crate::trace::current`]).
    fn bind<'q, O>(
        &'q self,
        query: QueryAs<'q, Postgres, O, PgArguments>,
        keys: bool,
    ) -> QueryAs<'q, Postgres, O, PgArguments> {
        let mut notify = self.kinds.clone();
        notify.sort_unstable();
        notify.dedup();
        notify.retain(|kind| notify_now(kind));
        let query = query.bind(&self.kinds);
        let query = if keys { query.bind(&self.keys) } else { query };
        query
            .bind(&self.payloads)
            .bind(&self.max_attempts)
            .bind(&self.delays)
            .bind(notify)
            .bind(&self.ats)
            .bind(&self.priorities)
            .bind(crate::trace::current())
    }
}

/// A row of `sql::ENQUEUE_MANY`: id, kind, key, inserted, state. An unkeyed row comes
/// back as its id only (inserted, pending).
type ManyRow = (i64, Option<String>, Option<String>, bool, Option<String>);

pub(crate) fn protocol(message: String) -> Error {
    Error::Database(sqlx::Error::Protocol(message))
}
