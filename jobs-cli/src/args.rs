//! The command line: subcommands, options and the parsers of their values.

use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use jobs::admin::JobState;

/// Inspect and operate the background jobs of a pgjobs database.
#[derive(Debug, Parser)]
#[command(name = "jobsctl", version, about)]
pub struct Cli {
    /// The database, as a PostgreSQL URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub database_url: Option<String>,

    /// Give up connecting after this long (250ms, 30s, 5m, ...).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, global = true)]
    pub connect_timeout: Duration,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the job table.
    Migrate,
    /// Jobs per kind: ready, scheduled, running, done, failed, and the lag of the oldest
    /// claimable job.
    Stats {
        /// One JSON object per kind and line.
        #[arg(long)]
        json: bool,
    },
    /// Runs per kind and minute: succeeded, failed, retried, cancelled, and run-time
    /// percentiles (p50, p95, p99), oldest minute first.
    History {
        /// Only this kind.
        #[arg(long)]
        kind: Option<String>,
        /// How far back (the history keeps seven days).
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
        since: Duration,
        /// One JSON object per kind and minute, and line.
        #[arg(long)]
        json: bool,
    },
    /// List jobs, newest first, one page at a time.
    List {
        /// Only jobs in this state.
        #[arg(long, value_enum)]
        state: Option<StateArg>,
        /// Only jobs of this kind.
        #[arg(long)]
        kind: Option<String>,
        /// At most this many jobs.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..))]
        limit: i64,
        /// The next page: only jobs past this id (the last id of the previous page).
        #[arg(long, value_name = "ID")]
        after: Option<i64>,
        /// Lowest ids first.
        #[arg(long)]
        oldest: bool,
        /// One JSON object per job and line.
        #[arg(long)]
        json: bool,
    },
    /// Show one job in full: payload, last error, timestamps.
    Show {
        /// The job's id.
        id: i64,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Why a job has not started: due later, its kind paused, at its limit or rate, no
    /// runtime alive for its kind, behind other jobs, or claimed by a runtime.
    Why {
        /// The job's id.
        id: i64,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Make a failed job pending again (claimable now, attempts reset), or every failed
    /// job of a kind.
    Retry {
        /// The failed job's id.
        #[arg(required_unless_present = "kind", conflicts_with = "kind")]
        id: Option<i64>,
        /// Every failed job of this kind instead.
        #[arg(long)]
        kind: Option<String>,
    },
    /// Cancel a pending or running job: it becomes `cancelled` and is never run again;
    /// a running one's runtime drops its handler and refuses its results.
    Cancel {
        /// The job's id.
        id: i64,
    },
    /// The runtimes at work on the database: host, process, kinds, concurrency, claims
    /// held, last seen.
    Runtimes {
        /// One JSON object per runtime and line.
        #[arg(long)]
        json: bool,
    },
    /// Stop every runtime claiming a kind (within its poll interval); running jobs
    /// finish, enqueues go on.
    Pause {
        /// The kind: one that a runtime has declared or a job carries, unless --force.
        kind: String,
        /// Pause it even if no runtime has declared it and no job carries it (a kind
        /// still to be deployed).
        #[arg(long)]
        force: bool,
    },
    /// Let runtimes claim a paused kind again.
    Resume {
        /// The kind.
        kind: String,
    },
    /// Show or set a kind's limits across every runtime (without a kind: every kind an
    /// operator has limited). A value set here wins over the kind's attribute
    /// (`global_concurrency`) until --clear; runtimes apply it within their poll interval.
    Limits {
        /// The kind.
        kind: Option<String>,
        /// At most this many jobs of the kind running at once, across every runtime.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        concurrency: Option<u32>,
        /// At most N starts in any window of the duration, across every runtime
        /// (`100/1s`, `600/1m`).
        #[arg(long, value_name = "N/DURATION", value_parser = parse_rate)]
        rate: Option<(u32, Duration)>,
        /// Clear the limits set here: the kind's attribute applies again.
        #[arg(long, conflicts_with_all = ["concurrency", "rate"])]
        clear: bool,
        /// One JSON object per kind and line.
        #[arg(long)]
        json: bool,
    },
    /// Delete a failed job.
    Discard {
        /// The failed job's id.
        id: i64,
    },
    /// Serve the dashboard: queues, jobs, failures and actions in a browser.
    Web {
        /// The address to listen on. Anything but a loopback address needs --token.
        #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// The access token a browser signs in with (a script sends it as
        /// `Authorization: Bearer <token>`).
        #[arg(long, env = "JOBS_WEB_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Show only: no button changes anything.
        #[arg(long)]
        read_only: bool,
        /// Behind a reverse proxy that rewrites Host and sets X-Forwarded-Host itself:
        /// trust that header in the origin check of every change (any client can send
        /// it, so it counts for nothing unless set).
        #[arg(long)]
        trust_forwarded_host: bool,
        /// Database connections the dashboard may hold.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
        pool_size: u32,
    },
    /// Delete done jobs finished longer ago than a duration.
    Prune {
        /// How old a done job must be (250ms, 30s, 5m, 1h, 7d, or 1h30m).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        older_than: Duration,
        /// Only jobs of this kind.
        #[arg(long)]
        kind: Option<String>,
        /// Rows deleted per statement.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..))]
        batch: i64,
    },
}

/// A job state as typed on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StateArg {
    /// Waiting to be claimed.
    Pending,
    /// Claimed by a runtime.
    Running,
    /// Finished, kept as history.
    Done,
    /// Out of attempts, kept for operators.
    Failed,
    /// Cancelled by an operator or its handler, kept for operators.
    Cancelled,
}

impl From<StateArg> for JobState {
    fn from(state: StateArg) -> Self {
        match state {
            StateArg::Pending => JobState::Pending,
            StateArg::Running => JobState::Running,
            StateArg::Done => JobState::Done,
            StateArg::Failed => JobState::Failed,
            StateArg::Cancelled => JobState::Cancelled,
        }
    }
}

/// Parses a duration in the grammar the job attributes use too (the `humantime`
/// crate's): `250ms`, `30s`, `5m`, `1h30m`, `7d`, `2weeks`.
/// `100/1s`: at least one start per a window of at least a millisecond.
pub fn parse_rate(text: &str) -> Result<(u32, Duration), String> {
    let (starts, per) = text
        .split_once('/')
        .ok_or_else(|| format!("`{text}` is not a rate: starts, a slash, a window (100/1s)"))?;
    let starts: u32 = starts
        .trim()
        .parse()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("`{starts}` is not a whole number of starts of at least 1"))?;
    let per = parse_duration(per)?;
    if per.as_millis() == 0 {
        return Err("a rate's window must be at least 1ms".to_owned());
    }
    Ok((starts, per))
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        format!(
            "invalid duration `{text}`: {e}; expected a number and a unit, or a sum of them, as in 250ms, 30s, 5m, 1h30m, 7d"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_durations_are_refused() {
        for bad in ["", "7", "d", "7x", "-1s", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
