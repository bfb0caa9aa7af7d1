//! Backoff between retries of the runtime's own database work during an outage.

use std::time::Duration;

/// The longest wait between two attempts at the runtime's own work while the database
/// is out of reach (unreachable, restarting, or not answering in time). A failed
/// attempt then costs a refused connection, so a short cap costs the database little,
/// and once it is back (a restart, a failover) the runtime is at full speed within this
/// long: with caps of 5 to 30 s, a claim loop that had backed off to its cap waited that
/// long after the database returned, while its backlog grew. Other errors (a statement
/// the database refuses) still back off to their part's cap, so a lasting one is not
/// retried, and logged, twice a second.
pub(crate) const OUTAGE_MAX: Duration = Duration::from_millis(500);

/// Doubling delays from `base` up to `max`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(base: Duration, max: Duration) -> Self {
        Backoff { next: base, max }
    }

    /// The delay to wait now; the following one is twice as long, up to the cap.
    pub(crate) fn next(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }

    /// The delay to wait after `error`: [`Backoff::next`], but at most [`OUTAGE_MAX`]
    /// when the error says the database is out of reach.
    pub(crate) fn after(&mut self, error: &sqlx::Error) -> Duration {
        let wait = self.next();
        if crate::migrate::is_transient(error) {
            wait.min(OUTAGE_MAX)
        } else {
            wait
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_retried_within_the_outage_cap_and_other_errors_back_off_to_the_cap() {
        let mut outage = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        let mut refused = outage.clone();
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let waits: Vec<Duration> = (0..10).map(|_| outage.after(&io)).collect();
        assert_eq!(waits[0], Duration::from_millis(100));
        assert!(waits.iter().all(|w| *w <= OUTAGE_MAX), "{waits:?}");
        assert_eq!(waits[9], OUTAGE_MAX);
        let waits: Vec<Duration> = (0..10)
            .map(|_| refused.after(&sqlx::Error::RowNotFound))
            .collect();
        assert_eq!(waits[9], Duration::from_secs(30), "{waits:?}");
    }
}
