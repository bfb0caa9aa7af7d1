//! Backoff between retries of the runtime's own database work during an outage.

use std::time::Duration;

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
