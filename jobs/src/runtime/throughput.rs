//! Throughput history: what the runs of each kind came to, per minute of the database's
//! clock, counted in memory and added to `jobs_throughput` by the completer every few
//! seconds and when it goes quiet (one statement for every kind and minute), never one
//! write per job.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use sqlx::PgConnection;

use crate::sql;

/// How many run-time buckets a minute keeps: bucket `i` counts runs of up to
/// `100 µs * 2^(i / 4)` (a step of 19 %), the last one everything longer (from about
/// six hours on).
pub(crate) const BUCKETS: usize = 112;

/// The bucket of a run that took `took`.
pub(crate) fn bucket(took: Duration) -> usize {
    let us = took.as_secs_f64() * 1e6;
    if us <= 100.0 {
        return 0;
    }
    let i = (4.0 * (us / 100.0).log2()).ceil();
    (i as usize).min(BUCKETS - 1)
}

/// The upper bound of bucket `i`.
pub(crate) fn bucket_bound(i: usize) -> Duration {
    Duration::from_secs_f64(100e-6 * 2f64.powf(i as f64 / 4.0))
}

/// One kind's runs in one minute.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    pub succeeded: i64,
    pub failed: i64,
    pub retried: i64,
    pub cancelled: i64,
    pub buckets: Vec<i64>,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        self.retried += other.retried;
        self.cancelled += other.cancelled;
        if self.buckets.len() < other.buckets.len() {
            self.buckets.resize(other.buckets.len(), 0);
        }
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
    }
}

/// The runs not yet written, by kind and minute (seconds since the epoch, database
/// clock).
#[derive(Default)]
pub(crate) struct Throughput {
    pending: Mutex<HashMap<(&'static str, i64), Tally>>,
}

impl Throughput {
    /// Counts one run of `kind` that ended as `outcome` (the label of
    /// `jobs_finished_total`) at `db_now_us` on the database's clock, after running for
    /// `took` (none for a claim that never started). Outcomes other than succeeded,
    /// failed, retried and cancelled (a snooze, a lost lease, a hand-back) are not a
    /// run's end and are not counted.
    pub(crate) fn record(
        &self,
        kind: &'static str,
        db_now_us: i64,
        outcome: &str,
        took: Option<Duration>,
    ) {
        let minute = db_now_us.div_euclid(60_000_000) * 60;
        let mut pending = self.pending.lock().expect("lock poisoned");
        let tally = pending.entry((kind, minute)).or_default();
        match outcome {
            "succeeded" => tally.succeeded += 1,
            "failed" => tally.failed += 1,
            "retried" => tally.retried += 1,
            "cancelled" => tally.cancelled += 1,
            _ => return,
        }
        if let Some(took) = took {
            if tally.buckets.is_empty() {
                tally.buckets = vec![0; BUCKETS];
            }
            tally.buckets[bucket(took)] += 1;
        }
    }

    /// Adds what was counted to `jobs_throughput`; on an error it is kept for the next
    /// flush.
    pub(crate) async fn flush(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        let taken: Vec<((&'static str, i64), Tally)> = {
            let mut pending = self.pending.lock().expect("lock poisoned");
            if pending.is_empty() {
                return Ok(());
            }
            let mut taken: Vec<_> = pending.drain().collect();
            // One order for every runtime's upsert: no two wait on each other in a cycle.
            taken.sort_by(|a, b| a.0.cmp(&b.0));
            taken
        };
        let kinds: Vec<&str> = taken.iter().map(|((k, _), _)| *k).collect();
        let minutes: Vec<f64> = taken.iter().map(|((_, m), _)| *m as f64).collect();
        let column =
            |f: fn(&Tally) -> i64| -> Vec<i64> { taken.iter().map(|(_, t)| f(t)).collect() };
        let buckets: Vec<String> = taken
            .iter()
            .map(|(_, t)| serde_json::to_string(&t.buckets).unwrap_or_else(|_| "[]".into()))
            .collect();
        let result = crate::pooler::alone!(
            conn,
            crate::pooler::query(sql::THROUGHPUT_ADD)
                .bind(&kinds)
                .bind(&minutes)
                .bind(column(|t| t.succeeded))
                .bind(column(|t| t.failed))
                .bind(column(|t| t.retried))
                .bind(column(|t| t.cancelled))
                .bind(&buckets),
            execute
        )
        .await;
        if let Err(e) = result {
            let mut pending = self.pending.lock().expect("lock poisoned");
            for (key, tally) in taken {
                pending.entry(key).or_default().add(&tally);
            }
            return Err(e);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_grow_by_a_fifth_and_cover_hours() {
        assert_eq!(bucket(Duration::from_micros(50)), 0);
        assert_eq!(bucket(Duration::from_micros(100)), 0);
        assert_eq!(bucket(Duration::from_micros(101)), 1);
        assert_eq!(bucket(Duration::from_micros(200)), 4);
        assert!(bucket_bound(bucket(Duration::from_millis(7))) >= Duration::from_millis(7));
        assert!(bucket_bound(bucket(Duration::from_millis(7))) < Duration::from_micros(8_400));
        assert_eq!(bucket(Duration::from_secs(86_400)), BUCKETS - 1);
        assert!(bucket_bound(BUCKETS - 2) > Duration::from_secs(3 * 3600));
    }
}
