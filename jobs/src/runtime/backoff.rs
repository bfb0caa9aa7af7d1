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
    /// when the error says the database is out of reach. A server short of resources
    /// (SQLSTATE class 53: too many connections, disk full) is not hurried: every
    /// replica retrying twice a second would add to what it is short of.
    pub(crate) fn after(&mut self, error: &sqlx::Error) -> Duration {
        let wait = self.next();
        let short_of_resources = matches!(error, sqlx::Error::Database(db)
            if db.code().is_some_and(|code| code.starts_with("53")));
        if crate::migrate::is_transient(error) && !short_of_resources {
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
        // A server shutting down or starting up (class 57) is an outage; one with too
        // many connections (class 53) is not hurried.
        for (code, cap) in [("57P01", OUTAGE_MAX), ("53300", Duration::from_secs(30))] {
            let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
            let e = sqlx::Error::Database(Box::new(Coded(code)));
            let last = (0..10).map(|_| b.after(&e)).last().unwrap();
            assert_eq!(last, cap, "{code}");
        }
    }

    /// A database error with a SQLSTATE, as the server would send it.
    #[derive(Debug)]
    struct Coded(&'static str);

    impl std::fmt::Display for Coded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "error {}", self.0)
        }
    }

    impl std::error::Error for Coded {}

    impl sqlx::error::DatabaseError for Coded {
        fn message(&self) -> &str {
            "test"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }
}
