//! The overview: per kind, the jobs in each state and the age of the oldest due job;
//! the runs per minute over the last hours; the runtimes.

use axum::Extension;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use chrono::DurationRound as _;
use chrono::{DateTime, Utc};
use jobs::admin::{self, RuntimeRow};
use maud::{Markup, html};
use serde::Deserialize;

use crate::layout::{self, Nav, link, when};
use crate::queries::{self, Count, KindLine};
use crate::security::Ctx;
use crate::{Action, Shared};

/// How far back the chart can go, in hours; the first is the default. (The history
/// keeps seven days, but a week of twenty kinds is 200,000 rows to add up: 150 ms.)
const RANGES: [i64; 3] = [1, 6, 24];

/// At most this many bars: longer ranges add up several minutes per bar.
const BARS: i64 = 360;

/// The query string.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Params {
    hours: Option<i64>,
}

/// `GET /`
pub(crate) async fn page(
    State(dash): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    params: Result<Query<Params>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let hours = params
        .ok()
        .and_then(|Query(p)| p.hours)
        .filter(|h| RANGES.contains(h))
        .unwrap_or(RANGES[0]);
    let pool = &dash.pool;
    let read = async {
        let now = super::db_now(pool).await?;
        let scale = Scale::new(now, hours);
        // Three reads at once, on connections of their own: the page waits for the
        // longest (the counts), not for the sum.
        let (kinds, runtimes, bars) = tokio::try_join!(
            async { Ok::<_, jobs::Error>(queries::overview(pool).await?) },
            admin::runtimes(pool),
            async { Ok(queries::chart(pool, scale.start, scale.per_bar).await?) },
        )?;
        Ok::<_, jobs::Error>((now, kinds, runtimes, scale, bars))
    };
    match read.await {
        Ok((now, kinds, runtimes, scale, bars)) => {
            let body = html! {
                h1 { "Overview" }
                (kinds_table(&ctx, now, &kinds))
                h2 { "Runs, last " (span(hours)) }
                (range_links(&ctx, hours))
                (chart(&scale, &bars))
                h2 { "Runtimes" }
                (runtimes_table(now, &runtimes))
            };
            layout::page(&ctx, "Overview", Nav::Overview, body).into_response()
        }
        Err(e) => layout::database_error(&ctx, e),
    }
}

fn count_link(ctx: &Ctx, kind: &str, state: &str, by_run_time: bool, count: Count) -> Markup {
    if count.n == 0 {
        return html! { span.muted { "0" } };
    }
    let mut params = vec![("kind", kind.to_owned()), ("state", state.to_owned())];
    if by_run_time {
        params.push(("order", "run".to_owned()));
    }
    html! { a href=(link(ctx, "/jobs", &params)) { (count) } }
}

fn kinds_table(ctx: &Ctx, now: DateTime<Utc>, kinds: &[KindLine]) -> Markup {
    if kinds.is_empty() {
        return html! { p.muted { "No jobs yet: the table is empty and no kind is paused." } };
    }
    html! {
        div.scroll {
            table.kinds {
                thead { tr {
                    th { "Kind" }
                    th.num title="Pending and due" { "Due" }
                    th.num title="Pending, run_after in the future" { "Scheduled" }
                    th.num { "Running" }
                    th.num { "Failed" }
                    th.num { "Cancelled" }
                    th.num { "Done" }
                    th title="How long the oldest due job has waited" { "Oldest due" }
                    th { "" }
                } }
                tbody {
                    @for k in kinds {
                        tr data-kind=(k.kind) {
                            td {
                                a href=(link(ctx, "/jobs", &[("kind", k.kind.clone())])) { code { (k.kind) } }
                                @if k.paused { " " span.badge.state-paused { "paused" } }
                                @if let Some(n) = k.limit {
                                    " " span.badge title="At most this many running at once across every runtime (set by an operator: jobsctl limits)" { "limit " (n) }
                                }
                                @if let Some((starts, ms)) = k.rate {
                                    " " span.badge title="At most this many starts in any window of this length across every runtime (set by an operator: jobsctl limits)" { "rate " (starts) "/" (rate_window(ms)) }
                                }
                            }
                            td.num { (count_link(ctx, &k.kind, "pending", true, k.ready)) }
                            td.num { (count_link(ctx, &k.kind, "pending", true, k.scheduled)) }
                            td.num {
                                (count_link(ctx, &k.kind, "running", false, k.running))
                                @if let Some(n) = k.limit { span.muted title="of the limit" { " / " (n) } }
                            }
                            td class={ "num" @if k.failed.n > 0 { " bad" } } { (count_link(ctx, &k.kind, "failed", false, k.failed)) }
                            td.num { (count_link(ctx, &k.kind, "cancelled", false, k.cancelled)) }
                            td.num { (count_link(ctx, &k.kind, "done", false, k.done)) }
                            td { @match k.oldest_due { Some(t) => (when(now, t)), None => (layout::none()) } }
                            td.actions {
                                @if k.paused {
                                    (layout::action_form(ctx, &Action::Resume(k.kind.clone())))
                                } @else {
                                    (layout::action_form(ctx, &Action::Pause(k.kind.clone())))
                                }
                                @if k.failed.n > 0 {
                                    (layout::action_form(ctx, &Action::RetryKind(k.kind.clone())))
                                }
                            }
                        }
                    }
                }
            }
        }
        p.muted.small { "Counts stop at " (queries::COUNT_CAP) " per kind and state (per priority for due and scheduled jobs), shown as " (queries::COUNT_CAP) "+." }
    }
}

/// A rate's window: "1s", "1m", "1500ms".
fn rate_window(ms: i64) -> String {
    match ms {
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

/// "hour", "6 hours", "7 days".
fn span(hours: i64) -> String {
    match hours {
        1 => "hour".to_owned(),
        h if h % 24 == 0 && h > 24 => format!("{} days", h / 24),
        h => format!("{h} hours"),
    }
}

fn short(hours: i64) -> String {
    if hours >= 48 {
        format!("{}d", hours / 24)
    } else {
        format!("{hours}h")
    }
}

fn range_links(ctx: &Ctx, current: i64) -> Markup {
    html! {
        nav.ranges {
            @for h in RANGES {
                @if h == current { strong { (short(h)) } } @else {
                    a href=(link(ctx, "/", &[("hours", h.to_string())])) { (short(h)) }
                }
            }
        }
    }
}

/// The chart's time axis: `bars` bars of `per_bar` minutes from `start`, the last
/// holding the current minute.
pub(crate) struct Scale {
    hours: i64,
    start: DateTime<Utc>,
    per_bar: i64,
    bars: i64,
}

impl Scale {
    fn new(now: DateTime<Utc>, hours: i64) -> Self {
        let minutes = hours * 60;
        let per_bar = (minutes + BARS - 1) / BARS;
        let this_minute = now
            .duration_trunc(chrono::TimeDelta::minutes(1))
            .unwrap_or(now);
        Scale {
            hours,
            start: this_minute - chrono::TimeDelta::minutes(minutes - per_bar),
            per_bar,
            bars: minutes / per_bar,
        }
    }
}

/// Succeeded and failed runs, all kinds together, as stacked bars of one or more
/// minutes each: an SVG drawn on the server (no script needed).
fn chart(scale: &Scale, bars: &[queries::Bar]) -> Markup {
    let Scale {
        hours,
        start,
        per_bar,
        bars: count,
    } = *scale;
    let shown: Vec<(i64, u64, u64)> = bars
        .iter()
        .filter(|(slot, _, _)| (0..count).contains(slot))
        .map(|&(slot, ok, failed)| (slot, ok.max(0) as u64, failed.max(0) as u64))
        .collect();
    if shown.is_empty() {
        return html! { p.muted { "No runs in the last " (span(hours)) "." } };
    }
    let peak = shown
        .iter()
        .map(|(_, s, f)| s + f)
        .max()
        .unwrap_or(1)
        .max(1);
    let unit = if per_bar == 1 {
        "minute".to_owned()
    } else {
        format!("{per_bar} minutes")
    };
    let (width, height) = (count as f64 * 2.0, 120.0);
    let total = shown
        .iter()
        .fold((0, 0), |acc, (_, s, f)| (acc.0 + s, acc.1 + f));
    html! {
        figure.chart {
            svg viewBox={ "0 0 " (width) " " (height) } preserveAspectRatio="none" role="img"
                aria-label={ "Runs per " (unit) "; peak " (peak) } {
                @for (slot, ok, failed) in &shown {
                    @let x = *slot as f64 * 2.0;
                    @let h_ok = *ok as f64 / peak as f64 * height;
                    @let h_failed = *failed as f64 / peak as f64 * height;
                    @let at = layout::time(start + chrono::Duration::minutes(*slot * per_bar));
                    g {
                        title { (at) ": " (ok) " succeeded, " (failed) " failed" }
                        rect.ok x=(x) y=(height - h_ok) width="2" height=(h_ok) {}
                        @if *failed > 0 {
                            rect.failed x=(x) y=(height - h_ok - h_failed) width="2" height=(h_failed) {}
                        }
                    }
                }
            }
            figcaption {
                "Peak " (peak) " per " (unit) ". In all: " (total.0) " succeeded, " (total.1) " failed. "
                span.legend.ok { "succeeded" } " " span.legend.failed { "failed" }
            }
        }
    }
}

fn runtimes_table(now: DateTime<Utc>, runtimes: &[RuntimeRow]) -> Markup {
    if runtimes.is_empty() {
        return html! { p.muted { "No runtime is registered." } };
    }
    html! {
        div.scroll {
            table {
                thead { tr {
                    th { "Runtime" } th { "Host" } th.num { "Pid" } th { "Version" } th { "Kinds" }
                    th.num { "Running" } th.num { "Concurrency" } th { "Started" } th { "Last seen" }
                } }
                tbody {
                    @for r in runtimes {
                        tr {
                            td { (r.name.as_deref().unwrap_or("")) " " code.muted.small { (r.id) } }
                            td { (r.host) }
                            td.num { (r.pid) }
                            td { (r.version) }
                            td { @for (i, k) in r.kinds.iter().enumerate() { @if i > 0 { ", " } code { (k) } } }
                            td.num { (r.running) }
                            td.num { (r.concurrency) }
                            td { (when(now, r.started_at)) }
                            td { (when(now, r.last_seen)) }
                        }
                    }
                }
            }
        }
    }
}
