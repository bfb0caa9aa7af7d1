//! Backoff between retries of the runtime's own database work during an outage.

use std::time::Duration;

/// The longest wait between two attempts at the runtime's claims and completions while
/// the database does not answer. A failed attempt costs a refused connection, so a
/// short cap costs the database little, and once it is back (a restart, a failover)
/// the runtime is at full speed within this long: with a cap of 30 s, a claim loop that
/// had backed off there waited up to 30 s after the database returned, while its
/// backlog grew.
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
}
