//! The [`Job`] trait and the per-kind settings that `#[derive(Job)]` fills in.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::types::chrono::Utc;

use crate::enqueue::{self, Enqueued};
use crate::error::Error;

/// A type of background job: one kind string, an optional dedup key, and its settings.
///
/// Implement it with `#[derive(Job)]` and the `#[job(...)]` attribute; see the crate
/// documentation for every key the attribute takes.
///
/// ```
/// use jobs::Job;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Job, Serialize, Deserialize)]
/// #[job(kind = "report.build", key = "report_id", max_attempts = 5, lease = "2m")]
/// struct BuildReport {
///     report_id: i64,
/// }
///
/// assert_eq!(BuildReport::KIND, "report.build");
/// assert_eq!(BuildReport { report_id: 7 }.key().as_deref(), Some("7"));
/// assert_eq!(BuildReport::CONFIG.max_attempts, 5);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a job type",
    label = "not a job",
    note = "derive it: #[derive(jobs::Job, serde::Serialize, serde::Deserialize)] #[job(kind = \"...\")]"
)]
pub trait Job: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The kind string stored in the `kind` column, e.g. `session.delete`.
    const KIND: &'static str;

    /// The kind's settings: attempts, backoff, lease, timeout, concurrency, retention, period.
    const CONFIG: JobConfig;

    /// The dedup key of this job, or `None` for a job without one.
    ///
    /// At most one job per `(kind, key)` is live (pending or running) at a time.
    fn key(&self) -> Option<String>;

    /// Builds the job that a periodic kind (`every = "..."`) keeps armed.
    #[doc(hidden)]
    fn periodic_instance() -> Option<Self>
    where
        Self: Sized,
    {
        None
    }

    /// Enqueues the job, claimable now.
    ///
    /// `executor` is a pool (`&pool`), a connection (`&mut *conn`) or a transaction
    /// (`&mut *tx`): enqueued in a transaction, the job exists exactly when the
    /// transaction commits. A job whose key already has a pending job coalesces into it;
    /// one whose key's job is running marks that job for a re-run (see [`Enqueued`]).
    fn enqueue<'e, E>(&self, executor: E) -> impl Future<Output = Result<Enqueued, Error>> + Send
    where
        E: sqlx::PgExecutor<'e>,
        Self: Sized,
    {
        let row = enqueue::NewJob::new(self, Duration::ZERO);
        async move { enqueue::insert_one(executor, row?).await }
    }

    /// Enqueues the job, claimable once `delay` has passed on the database's clock.
    fn enqueue_in<'e, E>(
        &self,
        executor: E,
        delay: Duration,
    ) -> impl Future<Output = Result<Enqueued, Error>> + Send
    where
        E: sqlx::PgExecutor<'e>,
        Self: Sized,
    {
        let row = enqueue::NewJob::new(self, delay);
        async move { enqueue::insert_one(executor, row?).await }
    }

    /// Enqueues the job with options of its own: a delay or an instant to run at, and
    /// an attempt budget; see [`EnqueueOptions`](crate::EnqueueOptions).
    fn enqueue_with<'e, E>(
        &self,
        executor: E,
        options: crate::EnqueueOptions,
    ) -> impl Future<Output = Result<Enqueued, Error>> + Send
    where
        E: sqlx::PgExecutor<'e>,
        Self: Sized,
    {
        let row = enqueue::NewJob::with(self, options);
        async move { enqueue::insert_one(executor, row?).await }
    }
}

/// How a kind holds its claim while the handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// A timestamp lease of this length, renewed by the runtime while the handler runs
    /// (`lease = "30s"`). Delivery is at least once; fence result writes with
    /// [`JobContext::fenced_tx`](crate::JobContext::fenced_tx).
    Heartbeat(Duration),
    /// The handler's writes and the job's completion commit in one transaction, exactly
    /// once, or not at all (`lease = "transaction"`). The claim itself is committed
    /// under a heartbeat lease of [`Lease::TRANSACTION_LEASE`], so the attempt counts
    /// even if the session dies, and the row is locked only at the end, to check the
    /// claim and complete the job. For short database-only steps.
    Transaction,
}

impl Lease {
    /// The heartbeat lease under which a transaction-mode job is claimed.
    pub const TRANSACTION_LEASE: Duration = Duration::from_secs(30);
}

/// The settings of one kind, written in the `#[job(...)]` attribute.
///
/// Built in constant context by the derive from [`JobConfig::DEFAULT`] and the `with_*`
/// methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobConfig {
    /// Claims after which a failing job is parked as `failed` (`max_attempts = 20`).
    pub max_attempts: u32,
    /// Base delay of the exponential backoff between attempts (`backoff = "1s"`).
    pub backoff: Duration,
    /// Cap of the backoff delay (`max_backoff = "1h"`).
    pub max_backoff: Duration,
    /// Lease length or transaction mode (`lease = "30s"`, `lease = "transaction"`).
    pub lease: Lease,
    /// Whether a handler whose lease is lost is cancelled at its next await point
    /// (`cancel_on_lease_loss = false` opts out).
    pub cancel_on_lease_loss: bool,
    /// Time after which a running handler is cancelled and the attempt fails (`timeout = "5m"`).
    pub timeout: Option<Duration>,
    /// At most this many jobs of the kind run at once in one runtime (`concurrency = 4`).
    pub concurrency: Option<u32>,
    /// At most this many jobs of the kind run at once across every runtime on the
    /// database (`global_concurrency = 8`). An operator's value
    /// ([`admin::set_limits`](crate::admin::set_limits)) wins over it until cleared.
    pub global_concurrency: Option<u32>,
    /// At most this many starts of the kind's jobs in any window of this length, across
    /// every runtime on the database (`rate = "600/1m"`). An operator's value wins over
    /// it until cleared.
    pub rate: Option<Rate>,
    /// The payload fields whose values split the kind into partitions, each with its own
    /// global concurrency and rate (`partition = "tenant"`, `partition = ["tenant",
    /// "region"]`): at most four.
    pub partition: Option<&'static [&'static str]>,
    /// Keep done rows this long instead of deleting them on success (`retain = "7d"`).
    pub retain: Option<Duration>,
    /// Period of a periodic kind (`every = "10m"`): one live job across all replicas,
    /// re-armed one period after each completion.
    pub every: Option<Duration>,
    /// Cron schedule of a scheduled kind (`cron = "0 3 * * *"`, `timezone = "..."`):
    /// one live job across all replicas, run at each fire time.
    pub cron: Option<CronSchedule>,
    /// The kind's default priority (`priority = 2`), 0 to 9: among the due jobs of the
    /// kind, a lower number is claimed first.
    pub priority: i16,
}

/// A kind's rate across every runtime on the database: at most `starts` of its jobs
/// start in any window of length `per` (a sliding window: counted back from each
/// claim, not in fixed slots, so a burst at the edge of one slot and the start of the
/// next cannot double it). A start is counted when the job is claimed, on the
/// database's clock; its handler begins a moment later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// The most starts in a window.
    pub starts: u32,
    /// The window's length.
    pub per: Duration,
}

/// When a cron kind runs: a cron expression read in an IANA time zone.
///
/// Five fields (minute, hour, day of month, month, day of week), or six with seconds
/// first, and the `@daily`-style macros, as the `croner` crate reads them. Fire times
/// follow the zone's wall clock across daylight-saving changes, as Vixie cron's do:
///
/// - A schedule that names its hours (`30 2 * * *`, `0 9-17 * * 1-5`, `@daily`) fires at
///   those wall-clock times: a local time that a change skips fires at the
///   corresponding time after it (02:30 on the spring-forward night fires at 03:00),
///   and one that occurs twice (the autumn's repeated hour) fires once, at its first
///   occurrence.
/// - A schedule whose hour is a wildcard or a step (`*/15 * * * *`, `0 * * * *`,
///   `0 */2 * * *`, `@hourly`) keeps its cadence in real time: it fires at every instant
///   whose local time matches, so through the repeated hour too (`*/15` fires every 15
///   minutes of the night, never 75 minutes apart), and across the skipped hour it
///   goes on from the first local time after it.
///
/// ```
/// use jobs::sqlx::types::chrono::{TimeZone, Utc};
/// use jobs::{CronSchedule, Job};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Job, Serialize, Deserialize, Default)]
/// #[job(kind = "report.nightly", cron = "0 3 * * *", timezone = "Europe/Paris")]
/// struct NightlyReport {}
///
/// let schedule: CronSchedule = NightlyReport::CONFIG.cron.unwrap();
/// // 03:00 in Paris is 02:00 UTC in winter, 01:00 UTC in summer.
/// let noon = Utc.with_ymd_and_hms(2026, 1, 10, 12, 0, 0).unwrap();
/// assert_eq!(schedule.next_after(noon), Some(Utc.with_ymd_and_hms(2026, 1, 11, 2, 0, 0).unwrap()));
/// let noon = Utc.with_ymd_and_hms(2026, 7, 10, 12, 0, 0).unwrap();
/// assert_eq!(schedule.next_after(noon), Some(Utc.with_ymd_and_hms(2026, 7, 11, 1, 0, 0).unwrap()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CronSchedule {
    /// The cron expression, e.g. `0 3 * * *`.
    pub expression: &'static str,
    /// The IANA time zone it is read in, e.g. `Europe/Paris` (`UTC` by default).
    pub timezone: &'static str,
}

impl CronSchedule {
    /// The first fire time strictly after `after`, at whole seconds. `None` if the
    /// expression or the zone does not parse (the derive checks both at compile time),
    /// or it never fires again (the 30th of February).
    pub fn next_after(
        &self,
        after: sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>,
    ) -> Option<sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>> {
        use std::str::FromStr;
        let cron = croner::Cron::from_str(self.expression).ok()?;
        let zone = chrono_tz::Tz::from_str(self.timezone).ok()?;
        // croner keeps the fraction of a second of its start: start at the whole second.
        let after = chrono::DurationRound::duration_trunc(after, chrono::TimeDelta::seconds(1))
            .unwrap_or(after);
        let hours = &cron.pattern.hours;
        if hours.from_wildcard || hours.step > 1 {
            cadence_next(&cron, zone, after)
        } else {
            named_hours_next(&cron, zone, after)
        }
    }
}

/// An instant, in UTC.
type Instant = sqlx::types::chrono::DateTime<Utc>;

/// The UTC offset of `zone` at `t`.
fn offset_at(zone: chrono_tz::Tz, t: Instant) -> chrono::FixedOffset {
    use chrono::{Offset, TimeZone};
    zone.offset_from_utc_datetime(&t.naive_utc()).fix()
}

/// The first instant in `(from, to]` at which `zone`'s offset is no longer the one at
/// `from`, if any: a scan by days, then a bisection to the second. (Zones change
/// offset at most a few times a year, never twice in a day.)
fn offset_change(zone: chrono_tz::Tz, from: Instant, to: Instant) -> Option<Instant> {
    let before = offset_at(zone, from);
    let day = chrono::TimeDelta::days(1);
    let mut lo = from;
    while lo < to {
        let hi = (lo + day).min(to);
        if offset_at(zone, hi) != before {
            // offset(lo) is `before`, offset(hi) is not: bisect to the first second.
            let (mut lo, mut hi) = (lo, hi);
            while hi - lo > chrono::TimeDelta::seconds(1) {
                let mid = lo + (hi - lo) / 2;
                if offset_at(zone, mid) == before {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            return Some(hi);
        }
        lo = hi;
    }
    None
}

/// The next fire of a schedule whose hour is a wildcard or a step: the first instant
/// after `after` whose local time in `zone` matches, whatever offset the zone has then.
/// Between two offset changes the local time is a fixed offset from UTC, where croner
/// finds the next match; a match past an offset change is looked for again from the
/// change, under the new offset.
fn cadence_next(cron: &croner::Cron, zone: chrono_tz::Tz, after: Instant) -> Option<Instant> {
    let mut from = after;
    let mut inclusive = false;
    // Each round passes an offset change: a few a year in any real zone.
    for _ in 0..64 {
        let offset = offset_at(zone, from);
        let next = cron
            .find_next_occurrence(&from.with_timezone(&offset), inclusive)
            .ok()?
            .with_timezone(&Utc);
        match offset_change(zone, from, next) {
            None => return Some(next),
            Some(change) => {
                from = change;
                inclusive = true;
            }
        }
    }
    None
}

/// The next fire of a schedule that names its hours: croner's reading of the zone's
/// wall clock (a skipped time fires just after the gap, a repeated one at its first
/// occurrence). Started inside the repeated hour, croner may answer that hour's first
/// occurrence, before `after`: that one has fired, so the search starts again once the
/// local time is past the repeated hour.
fn named_hours_next(cron: &croner::Cron, zone: chrono_tz::Tz, after: Instant) -> Option<Instant> {
    use chrono::TimeZone;
    let next = cron
        .find_next_occurrence(&after.with_timezone(&zone), false)
        .ok()?
        .with_timezone(&Utc);
    if next > after {
        return Some(next);
    }
    let mut from = after;
    let limit = after + chrono::TimeDelta::hours(3);
    while from < limit
        && zone
            .from_local_datetime(&from.with_timezone(&zone).naive_local())
            .single()
            .is_none()
    {
        from += chrono::TimeDelta::seconds(1);
    }
    let next = cron
        .find_next_occurrence(&from.with_timezone(&zone), true)
        .ok()?
        .with_timezone(&Utc);
    (next > after).then_some(next)
}

impl JobConfig {
    /// The settings of a kind whose attribute names only `kind`.
    pub const DEFAULT: JobConfig = JobConfig {
        max_attempts: 20,
        backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(3600),
        lease: Lease::Heartbeat(Duration::from_secs(30)),
        cancel_on_lease_loss: true,
        timeout: None,
        concurrency: None,
        global_concurrency: None,
        rate: None,
        partition: None,
        retain: None,
        every: None,
        cron: None,
        priority: 0,
    };

    /// Sets `max_attempts` (at least 1).
    pub const fn with_max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = if n == 0 { 1 } else { n };
        self
    }
    /// Sets the backoff base delay.
    pub const fn with_backoff(mut self, d: Duration) -> Self {
        self.backoff = d;
        self
    }
    /// Sets the backoff cap.
    pub const fn with_max_backoff(mut self, d: Duration) -> Self {
        self.max_backoff = d;
        self
    }
    /// Sets the lease mode.
    pub const fn with_lease(mut self, lease: Lease) -> Self {
        self.lease = lease;
        self
    }
    /// Sets whether a lost lease cancels the handler.
    pub const fn with_cancel_on_lease_loss(mut self, cancel: bool) -> Self {
        self.cancel_on_lease_loss = cancel;
        self
    }
    /// Sets the handler timeout.
    pub const fn with_timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }
    /// Sets the per-runtime concurrency of the kind (at least 1).
    pub const fn with_concurrency(mut self, n: u32) -> Self {
        self.concurrency = Some(if n == 0 { 1 } else { n });
        self
    }
    /// Sets the concurrency of the kind across every runtime on the database (at least 1).
    pub const fn with_global_concurrency(mut self, n: u32) -> Self {
        self.global_concurrency = Some(if n == 0 { 1 } else { n });
        self
    }
    /// Sets the rate of the kind across every runtime on the database: at most `starts`
    /// (at least 1) in any window of `per` (at least 1 ms).
    pub const fn with_rate(mut self, starts: u32, per: Duration) -> Self {
        self.rate = Some(Rate {
            starts: if starts == 0 { 1 } else { starts },
            per: if per.is_zero() {
                Duration::from_millis(1)
            } else {
                per
            },
        });
        self
    }
    /// Splits the kind's global concurrency and rate by the values of these payload
    /// fields (the names its JSON has): at most that many running, and that many starts
    /// in a window, per distinct value.
    ///
    /// # Panics
    ///
    /// With no fields or more than four (at compile time, where the configuration is a
    /// constant, as `#[derive(Job)]` makes it).
    pub const fn with_partition(mut self, fields: &'static [&'static str]) -> Self {
        assert!(
            !fields.is_empty() && fields.len() <= 4,
            "a partition names one to four payload fields"
        );
        self.partition = Some(fields);
        self
    }
    /// Keeps done rows for this long.
    pub const fn with_retain(mut self, d: Duration) -> Self {
        self.retain = Some(d);
        self
    }
    /// Makes the kind periodic.
    pub const fn with_every(mut self, d: Duration) -> Self {
        self.every = Some(d);
        self
    }
    /// Runs the kind on a cron schedule, read in the IANA time zone `timezone`.
    pub const fn with_cron(mut self, expression: &'static str, timezone: &'static str) -> Self {
        self.cron = Some(CronSchedule {
            expression,
            timezone,
        });
        self
    }

    /// Sets the kind's default priority (0 to 9; out of range is clamped, the derive
    /// refuses it).
    pub const fn with_priority(mut self, priority: i16) -> Self {
        self.priority = if priority < 0 {
            0
        } else if priority > crate::MAX_PRIORITY {
            crate::MAX_PRIORITY
        } else {
            priority
        };
        self
    }

    /// Whether one live job of the kind is kept armed (`every` or `cron`).
    pub(crate) fn is_periodic(&self) -> bool {
        self.every.is_some() || self.cron.is_some()
    }

    /// How long after `db_now` (the database's clock, in microseconds since the epoch)
    /// the kind's next run is due, in milliseconds: its period, or the time until its
    /// next cron fire (rounded up, so never before it). `None` for other kinds, and for
    /// a schedule that never fires again.
    pub(crate) fn next_run_ms(&self, db_now_us: i64) -> Option<i64> {
        if let Some(every) = self.every {
            return Some(crate::enqueue::millis(every));
        }
        let cron = self.cron?;
        let now = sqlx::types::chrono::DateTime::from_timestamp_micros(db_now_us)?;
        let next = cron.next_after(now)?;
        let us = (next - now).num_microseconds()?;
        Some((us + 999) / 1000)
    }

    /// The length of the lease a claim of this kind is taken and renewed under.
    pub(crate) fn lease_length(&self) -> Duration {
        match self.lease {
            Lease::Heartbeat(d) => d,
            Lease::Transaction => Lease::TRANSACTION_LEASE,
        }
    }

    /// Whether the kind runs in transaction mode.
    pub(crate) fn is_transaction(&self) -> bool {
        self.lease == Lease::Transaction
    }

    /// The backoff delay before the next attempt after `attempts` claims, before jitter:
    /// `backoff * 2^(attempts - 1)`, capped at `max_backoff`.
    pub fn backoff_after(&self, attempts: u32) -> Duration {
        let exp = attempts.saturating_sub(1).min(32);
        self.backoff
            .checked_mul(1u32 << exp.min(31))
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }
}

impl Default for JobConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A value that can be (part of) a job's dedup key.
///
/// Implemented for strings, integers, `bool`, `char`, [`uuid::Uuid`], references, and
/// `Option<T>` (where `None` means the job has no key). Implement it for your own
/// identifier types to use them in `key = "..."`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of a job key",
    note = "implement jobs::KeyPart for it, or key the job on a string, integer or uuid field"
)]
pub trait KeyPart {
    /// The key text of this value, or `None` for "no key".
    fn key_part(&self) -> Option<String>;
}

macro_rules! key_part_display {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn key_part(&self) -> Option<String> {
                Some(self.to_string())
            }
        }
    )*};
}
key_part_display!(
    String,
    str,
    bool,
    char,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    uuid::Uuid
);

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn key_part(&self) -> Option<String> {
        (**self).key_part()
    }
}

impl<T: KeyPart> KeyPart for Option<T> {
    fn key_part(&self) -> Option<String> {
        self.as_ref().and_then(KeyPart::key_part)
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Box<T> {
    fn key_part(&self) -> Option<String> {
        (**self).key_part()
    }
}

/// Joins the parts of a key over several fields: `a:b`, with `\` and `:` inside a part
/// escaped, so that different field values never give the same key. `None` if any part
/// is `None`.
pub(crate) fn join_key_parts(parts: &[Option<String>]) -> Option<String> {
    let mut out = String::new();
    for (i, part) in parts.iter().enumerate() {
        let part = part.as_deref()?;
        if i > 0 {
            out.push(':');
        }
        for c in part.chars() {
            if c == '\\' || c == ':' {
                out.push('\\');
            }
            out.push(c);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fire times of `expression` in Paris from `from` (UTC), `n` of them, as
    /// local wall-clock times with their offset.
    fn fires(expression: &'static str, from: &str, n: usize) -> Vec<String> {
        let cron = CronSchedule {
            expression,
            timezone: "Europe/Paris",
        };
        let mut at = sqlx::types::chrono::DateTime::parse_from_rfc3339(from)
            .unwrap()
            .to_utc();
        (0..n)
            .map(|_| {
                at = cron.next_after(at).unwrap();
                at.with_timezone(&chrono_tz::Europe::Paris)
                    .format("%m-%d %H:%M %z")
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn cron_fire_times_follow_the_wall_clock_across_daylight_saving() {
        // Spring forward (2027-03-28, 02:00 CET -> 03:00 CEST): 02:30 does not exist
        // that night; it fires at 03:00, once, and at 02:30 again after.
        assert_eq!(
            fires("30 2 * * *", "2027-03-27T12:00:00Z", 3),
            [
                "03-28 03:00 +0200",
                "03-29 02:30 +0200",
                "03-30 02:30 +0200"
            ]
        );
        // Fall back (2027-10-31, 03:00 CEST -> 02:00 CET): 02:30 happens twice; it
        // fires once, at the first.
        assert_eq!(
            fires("30 2 * * *", "2027-10-30T12:00:00Z", 3),
            [
                "10-31 02:30 +0200",
                "11-01 02:30 +0100",
                "11-02 02:30 +0100"
            ]
        );
        // An hourly schedule through the repeated hour keeps its cadence: 02:00 twice,
        // an hour apart in real time.
        assert_eq!(
            fires("0 * * * *", "2027-10-30T22:30:00Z", 4),
            [
                "10-31 01:00 +0200",
                "10-31 02:00 +0200",
                "10-31 02:00 +0100",
                "10-31 03:00 +0100"
            ]
        );
    }

    #[test]
    fn the_next_run_of_a_cron_kind_is_strictly_after_now_and_never_early() {
        let config = JobConfig::DEFAULT.with_cron("*/2 * * * * *", "UTC");
        // 10.0004 s past the epoch: the next fire is at 12 s, 1,999.6 ms away, rounded up.
        assert_eq!(config.next_run_ms(10_000_400), Some(2_000));
        // Exactly at a fire time: the next one, not this one again.
        assert_eq!(config.next_run_ms(12_000_000), Some(2_000));
        // Never: the 30th of February.
        let never = JobConfig::DEFAULT.with_cron("0 0 30 2 *", "UTC");
        assert_eq!(never.next_run_ms(0), None);
        let every = JobConfig::DEFAULT.with_every(Duration::from_secs(5));
        assert_eq!(every.next_run_ms(123), Some(5_000));
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let c = JobConfig::DEFAULT
            .with_backoff(Duration::from_secs(2))
            .with_max_backoff(Duration::from_secs(60));
        assert_eq!(c.backoff_after(1), Duration::from_secs(2));
        assert_eq!(c.backoff_after(2), Duration::from_secs(4));
        assert_eq!(c.backoff_after(5), Duration::from_secs(32));
        assert_eq!(c.backoff_after(6), Duration::from_secs(60));
        assert_eq!(c.backoff_after(1000), Duration::from_secs(60));
    }

    #[test]
    fn multi_field_keys_do_not_collide() {
        let a = join_key_parts(&[Some("a:b".into()), Some("c".into())]);
        let b = join_key_parts(&[Some("a".into()), Some("b:c".into())]);
        assert_ne!(a, b);
        assert_eq!(a.as_deref(), Some("a\\:b:c"));
        assert_eq!(join_key_parts(&[Some("x".into()), None]), None);
    }
}
