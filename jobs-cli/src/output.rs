//! What the commands print: aligned tables for people, one JSON object per line for
//! programs.

use std::fmt::Write as _;
use std::time::Duration;

use jobs::admin::{Explanation, JobRow, KindStats};
use serde_json::{Value, json};
use sqlx::types::chrono::{DateTime, Utc};

/// A column's alignment.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// Lays out `rows` under `headers`, each column as wide as its widest cell, two spaces
/// apart, with no trailing spaces.
pub fn table(headers: &[(&str, Align)], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|(h, _)| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|(h, _)| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, ((_, align), cell)) in headers.iter().zip(row).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            match align {
                Align::Left => {
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad));
                }
                Align::Right => {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                }
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// An instant as RFC 3339 in UTC, to the second; a claim without end as `infinity`.
pub fn time(t: &DateTime<Utc>) -> String {
    if *t == DateTime::<Utc>::MAX_UTC {
        "infinity".to_owned()
    } else {
        t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
    }
}

fn time_opt(t: Option<&DateTime<Utc>>) -> String {
    t.map_or_else(|| "-".to_owned(), time)
}

/// A duration for people, to two units: `850ms`, `12s`, `5m03s`, `2h05m`, `3d04h`, and
/// `5m`, `7d` when the second unit is zero.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    let (major, major_unit, minor, minor_unit) = match s {
        0 => return format!("{}ms", d.as_millis()),
        1..60 => return format!("{s}s"),
        60..3600 => (s / 60, "m", s % 60, "s"),
        3600..86_400 => (s / 3600, "h", s % 3600 / 60, "m"),
        _ => (s / 86_400, "d", s % 86_400 / 3600, "h"),
    };
    if minor == 0 {
        format!("{major}{major_unit}")
    } else {
        format!("{major}{major_unit}{minor:02}{minor_unit}")
    }
}

/// `text` with every control character but the line feed written as an escape
/// (`\u{1b}`), so that a key, kind or error from the table cannot drive the terminal.
pub fn clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// How much of a payload `show` prints; `--json` prints all of it.
const PAYLOAD_SHOWN: usize = 4096;

/// At most `max` characters of the first line of `text`, with `…` when cut; control
/// characters escaped.
fn cut(text: &str, max: usize) -> String {
    let text = clean(text);
    let text = text.as_str();
    let line = text.lines().next().unwrap_or("");
    let multiline = line.len() < text.trim_end().len();
    if line.chars().count() > max {
        let mut s: String = line.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    } else if multiline {
        format!("{line} …")
    } else {
        line.to_owned()
    }
}

/// What kind of failure a job's last error records, from the prefix the runtime writes
/// (`permanent: `, `timed out after`, `handler panicked: `, `lease expired: `) and, for
/// a plain error, whether the attempts ran out; a cancelled job says who cancelled it.
pub fn failure_kind(job: &JobRow) -> Option<&'static str> {
    let error = job.last_error.as_deref()?;
    Some(if job.state == jobs::admin::JobState::Cancelled {
        // An operator's cancel writes this message; a handler's own starts `cancelled: `.
        if error == "cancelled by an operator" {
            "cancelled by an operator"
        } else {
            "cancelled by its handler"
        }
    } else if error.starts_with("permanent: ") {
        if error.contains("does not deserialize") {
            "permanent (the payload does not deserialize)"
        } else {
            "permanent"
        }
    } else if error.starts_with("timed out after") {
        "timeout"
    } else if error.starts_with("handler panicked") {
        "panic"
    } else if error.starts_with("lease expired") {
        "lease expired (its worker died or stalled)"
    } else if job.state == jobs::admin::JobState::Failed && job.attempts >= job.max_attempts {
        "out of attempts"
    } else {
        "error"
    })
}

/// A failed job's last error as the listing shows it: what kind of failure, then the
/// message (the runtime's own prefixes are not repeated).
fn listed_error(job: &JobRow) -> String {
    let Some(error) = job.last_error.as_deref() else {
        return "-".to_owned();
    };
    let text = match failure_kind(job) {
        Some("out of attempts") => format!("out of attempts: {error}"),
        _ => error.to_owned(),
    };
    cut(&text, 60)
}

/// The jobs of a listing as a table.
pub fn jobs_table(rows: &[JobRow]) -> String {
    use Align::{Left, Right};
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|job| {
            vec![
                job.id.to_string(),
                cut(&job.kind, 40),
                job.key
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), |k| cut(k, 24)),
                job.state.to_string(),
                format!("{}/{}", job.attempts, job.max_attempts),
                time(&job.run_after),
                time_opt(job.finished_at.as_ref()),
                listed_error(job),
            ]
        })
        .collect();
    table(
        &[
            ("ID", Right),
            ("KIND", Left),
            ("KEY", Left),
            ("STATE", Left),
            ("ATTEMPTS", Right),
            ("RUN AFTER", Left),
            ("FINISHED", Left),
            ("LAST ERROR", Left),
        ],
        &cells,
    )
}

/// One job as a JSON object.
pub fn job_json(job: &JobRow) -> Value {
    json!({
        "id": job.id,
        "kind": job.kind,
        "key": job.key,
        "state": job.state.as_str(),
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "run_after": time(&job.run_after),
        "last_error": job.last_error,
        "failure": failure_kind(job),
        "payload": job.payload,
        "created_at": time(&job.created_at),
        "finished_at": job.finished_at.as_ref().map(time),
        "claimed_until": job.claimed_until.as_ref().map(time),
        "runtime": job.runtime,
        "errors": job.errors.iter().map(|e| json!({
            "attempt": e.attempt,
            "at": time(&e.at),
            "kind": e.kind.as_str(),
            "message": e.message,
            "runtime": e.runtime,
        })).collect::<Vec<_>>(),
        "checkpoint": job.checkpoint,
        "output": job.output,
        "priority": job.priority,
    })
}

/// Why a job has not started, a reason per line.
pub fn why_text(why: &Explanation) -> String {
    let mut out = format!("job {} ({}, {}):\n", why.id, why.kind, why.state);
    for reason in &why.reasons {
        let _ = writeln!(out, "  {reason}");
    }
    out
}

/// Why a job has not started, as a JSON object: each reason's `code` and `text`.
pub fn why_json(why: &Explanation) -> Value {
    json!({
        "id": why.id,
        "kind": why.kind,
        "state": why.state.as_str(),
        "at": time(&why.at),
        "reasons": why.reasons.iter().map(|r| json!({
            "code": r.code(),
            "text": r.to_string(),
        })).collect::<Vec<_>>(),
    })
}

/// One job in full, a field per line.
pub fn job_detail(job: &JobRow) -> String {
    let mut out = String::new();
    let fields = [
        ("id", job.id.to_string()),
        ("kind", clean(&job.kind)),
        (
            "key",
            job.key.as_deref().map_or_else(|| "-".to_owned(), clean),
        ),
        ("state", job.state.to_string()),
        ("attempts", format!("{}/{}", job.attempts, job.max_attempts)),
        ("priority", job.priority.to_string()),
        ("run after", time(&job.run_after)),
        ("created at", time(&job.created_at)),
        ("finished at", time_opt(job.finished_at.as_ref())),
        ("claimed until", time_opt(job.claimed_until.as_ref())),
        (
            "runtime",
            job.runtime
                .map_or_else(|| "-".to_owned(), |r| r.to_string()),
        ),
    ];
    for (name, value) in fields {
        let _ = writeln!(out, "{name:<14}{value}");
    }
    match &job.last_error {
        None => out.push_str("last error    -\n"),
        Some(e) => {
            if let Some(kind) = failure_kind(job) {
                let _ = writeln!(out, "{:<14}{kind}", "failure");
            }
            out.push_str("last error\n");
            for line in clean(e).lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
    if !job.errors.is_empty() {
        let _ = writeln!(out, "attempt history ({}, oldest first)", job.errors.len());
        let mut previous = 0;
        for e in &job.errors {
            // An operator's retry (or a new request coalesced into the job) gives it a
            // fresh attempt budget: its attempts count from 1 again.
            if e.attempt <= previous {
                let _ = writeln!(
                    out,
                    "  -- attempts counted from 1 again: retried, or a new request --"
                );
            }
            previous = e.attempt;
            let runtime = e
                .runtime
                .map_or_else(|| "-".to_owned(), |r| r.to_string()[..8].to_owned());
            let _ = writeln!(
                out,
                "  #{:<3} {}  {:<13} runtime {runtime}",
                e.attempt,
                time(&e.at),
                e.kind.as_str(),
            );
            for line in clean(&e.message).lines() {
                let _ = writeln!(out, "       {line}");
            }
        }
    }
    for (label, value) in [("checkpoint", &job.checkpoint), ("output", &job.output)] {
        let Some(value) = value else { continue };
        // Compact, on one line: serde_json escapes control characters inside strings.
        let text = value.to_string();
        let shown = match text.char_indices().nth(PAYLOAD_SHOWN) {
            Some((at, _)) => format!("{} …", &text[..at]),
            None => text,
        };
        let _ = writeln!(out, "{label:<14}{shown}");
    }
    out.push_str("payload\n");
    // serde_json escapes control characters inside strings.
    let pretty = serde_json::to_string_pretty(&job.payload).unwrap_or_default();
    let shown = match pretty.char_indices().nth(PAYLOAD_SHOWN) {
        Some((at, _)) => &pretty[..at],
        None => &pretty,
    };
    for line in shown.lines() {
        let _ = writeln!(out, "  {line}");
    }
    if shown.len() < pretty.len() {
        let _ = writeln!(
            out,
            "  … {} more bytes (show --json prints the whole payload)",
            pretty.len() - shown.len()
        );
    }
    out
}

/// The stats of every kind as a table, with a total row when there are several kinds.
pub fn stats_table(stats: &[KindStats]) -> String {
    use Align::{Left, Right};
    let row = |kind: &str, s: [u64; 6], lag: Option<Duration>| {
        let mut cells = vec![clean(kind)];
        cells.extend(s.iter().map(u64::to_string));
        cells.push(lag.map_or_else(|| "-".to_owned(), human));
        cells
    };
    let mut cells: Vec<Vec<String>> = stats
        .iter()
        .map(|k| {
            row(
                &if k.paused {
                    format!("{} (paused)", k.kind)
                } else {
                    k.kind.clone()
                },
                [
                    k.ready,
                    k.scheduled,
                    k.running,
                    k.done,
                    k.failed,
                    k.cancelled,
                ],
                k.lag,
            )
        })
        .collect();
    if stats.len() > 1 {
        let sum = |f: fn(&KindStats) -> u64| stats.iter().map(f).sum::<u64>();
        cells.push(row(
            "(all)",
            [
                sum(|k| k.ready),
                sum(|k| k.scheduled),
                sum(|k| k.running),
                sum(|k| k.done),
                sum(|k| k.failed),
                sum(|k| k.cancelled),
            ],
            stats.iter().filter_map(|k| k.lag).max(),
        ));
    }
    table(
        &[
            ("KIND", Left),
            ("READY", Right),
            ("SCHEDULED", Right),
            ("RUNNING", Right),
            ("DONE", Right),
            ("FAILED", Right),
            ("CANCELLED", Right),
            ("LAG", Right),
        ],
        &cells,
    )
}

/// One kind's stats as a JSON object; the lag in (fractional) seconds.
pub fn stats_json(k: &KindStats) -> Value {
    json!({
        "kind": k.kind,
        "ready": k.ready,
        "scheduled": k.scheduled,
        "running": k.running,
        "done": k.done,
        "failed": k.failed,
        "cancelled": k.cancelled,
        "lag_seconds": k.lag.map(|d| d.as_secs_f64()),
        "paused": k.paused,
    })
}

/// A run time for the history: tenths of a millisecond below 10 ms, then as
/// [`human`].
pub fn run_time(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.1}ms", d.as_secs_f64() * 1000.0)
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        human(d)
    }
}

/// The throughput history as a table: a row per kind and minute.
pub fn history_table(rows: &[jobs::admin::MinuteStats]) -> String {
    use Align::{Left, Right};
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let p = |f: fn(&jobs::admin::Percentiles) -> Duration| {
                r.run_time
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |p| run_time(f(p)))
            };
            vec![
                r.minute.format("%Y-%m-%dT%H:%MZ").to_string(),
                clean(&r.kind),
                r.succeeded.to_string(),
                r.failed.to_string(),
                r.retried.to_string(),
                r.cancelled.to_string(),
                p(|p| p.p50),
                p(|p| p.p95),
                p(|p| p.p99),
            ]
        })
        .collect();
    table(
        &[
            ("MINUTE", Left),
            ("KIND", Left),
            ("SUCCEEDED", Right),
            ("FAILED", Right),
            ("RETRIED", Right),
            ("CANCELLED", Right),
            ("P50", Right),
            ("P95", Right),
            ("P99", Right),
        ],
        &cells,
    )
}

/// One kind's minute as a JSON object; run times in (fractional) seconds.
pub fn minute_json(r: &jobs::admin::MinuteStats) -> Value {
    json!({
        "kind": r.kind,
        "minute": time(&r.minute),
        "succeeded": r.succeeded,
        "failed": r.failed,
        "retried": r.retried,
        "cancelled": r.cancelled,
        "p50_seconds": r.run_time.map(|p| p.p50.as_secs_f64()),
        "p95_seconds": r.run_time.map(|p| p.p95.as_secs_f64()),
        "p99_seconds": r.run_time.map(|p| p.p99.as_secs_f64()),
    })
}

/// The runtimes as a table.
pub fn runtimes_table(rows: &[jobs::admin::RuntimeRow]) -> String {
    use Align::{Left, Right};
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.id.to_string()[..8].to_owned(),
                r.name
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), |n| cut(n, 24)),
                cut(&r.host, 24),
                r.pid.to_string(),
                clean(&r.version),
                cut(&r.kinds.join(","), 40),
                r.concurrency.to_string(),
                r.running.to_string(),
                time(&r.started_at),
                time(&r.last_seen),
            ]
        })
        .collect();
    table(
        &[
            ("ID", Left),
            ("NAME", Left),
            ("HOST", Left),
            ("PID", Right),
            ("VERSION", Left),
            ("KINDS", Left),
            ("CONC", Right),
            ("CLAIMS", Right),
            ("STARTED", Left),
            ("LAST SEEN", Left),
        ],
        &cells,
    )
}

/// One runtime as a JSON object.
pub fn runtime_json(r: &jobs::admin::RuntimeRow) -> Value {
    json!({
        "id": r.id,
        "name": r.name,
        "host": r.host,
        "pid": r.pid,
        "version": r.version,
        "kinds": r.kinds,
        "concurrency": r.concurrency,
        "claims": r.running,
        "started_at": time(&r.started_at),
        "last_seen": time(&r.last_seen),
    })
}

/// The limits operators set, as a table.
pub fn limits_table(rows: &[jobs::admin::KindLimitsRow]) -> String {
    use Align::{Left, Right};
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                cut(&r.kind, 40),
                r.limits
                    .concurrency
                    .map_or_else(|| "-".to_owned(), |n| n.to_string()),
                r.limits.rate.map_or_else(
                    || "-".to_owned(),
                    |r| format!("{}/{}", r.starts, human(r.per)),
                ),
                r.running.to_string(),
                time(&r.updated_at),
            ]
        })
        .collect();
    table(
        &[
            ("KIND", Left),
            ("CONCURRENCY", Right),
            ("RATE", Right),
            ("RUNNING", Right),
            ("SET", Left),
        ],
        &cells,
    )
}

/// One kind's limits as a JSON object.
pub fn limits_json(r: &jobs::admin::KindLimitsRow) -> Value {
    json!({
        "kind": r.kind,
        "concurrency": r.limits.concurrency,
        "rate": r.limits.rate.map(|r| json!({ "starts": r.starts, "per_ms": r.per.as_millis() as u64 })),
        "running": r.running,
        "set_at": time(&r.updated_at),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let t = table(
            &[("ID", Align::Right), ("NAME", Align::Left)],
            &[vec!["7".into(), "a".into()], vec!["1234".into(), "".into()]],
        );
        assert_eq!(t, "  ID  NAME\n   7  a\n1234\n");
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_secs(12)), "12s");
        assert_eq!(human(Duration::from_secs(303)), "5m03s");
        assert_eq!(human(Duration::from_secs(7500)), "2h05m");
        assert_eq!(human(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3d04h");
        assert_eq!(human(Duration::from_secs(300)), "5m");
        assert_eq!(human(Duration::from_secs(7 * 86_400)), "7d");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(clean("a\u{1b}[2Jb\tc"), "a\\u{1b}[2Jb\\tc");
        assert_eq!(cut("key\u{7}", 24), "key\\u{7}");
        assert_eq!(clean("two\nlines"), "two\nlines");
    }

    #[test]
    fn cut_keeps_the_first_line() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("abcdefghijkl", 5), "abcd…");
        assert_eq!(cut("first\nsecond", 20), "first …");
    }
}
