//! What every page shares: the frame (head, navigation, theme and live-refresh
//! switches), the embedded assets, the error pages, and small formatting helpers.

use axum::Extension;
use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::security::Ctx;

/// The stylesheet and the script, compiled in: the dashboard never loads anything from
/// another machine.
const CSS: &str = include_str!("../assets/app.css");
const JS: &str = include_str!("../assets/app.js");

/// Which navigation entry is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    Overview,
    Jobs,
    Failed,
    None,
}

/// A whole page: `body` inside the frame. The `main` element is what the live refresh
/// replaces.
pub(crate) fn page(ctx: &Ctx, title: &str, nav: Nav, body: Markup) -> Markup {
    let version = env!("CARGO_PKG_VERSION");
    let entry = |target: Nav, href: String, label: &str| {
        html! {
            a href=(href) aria-current=[(nav == target).then_some("page")] { (label) }
        }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="same-origin";
                title { (title) " · jobs" }
                link rel="stylesheet" href=(ctx.url(&format!("/assets/app.css?v={version}")));
                script defer src=(ctx.url(&format!("/assets/app.js?v={version}"))) {}
            }
            body data-refresh=(ctx.refresh) {
                header.top {
                    a.brand href=(ctx.url("/")) { "jobs" }
                    nav {
                        (entry(Nav::Overview, ctx.url("/"), "Overview"))
                        (entry(Nav::Jobs, ctx.url("/jobs"), "Jobs"))
                        (entry(Nav::Failed, ctx.url("/jobs?state=failed"), "Failed"))
                    }
                    form.find method="get" action=(ctx.url("/jobs")) {
                        input type="search" name="id" placeholder="Job id" inputmode="numeric" aria-label="Job id";
                    }
                    div.switches {
                        @if ctx.read_only { span.badge.muted title="This dashboard changes nothing" { "read-only" } }
                        button #live-toggle type="button" hidden { "Pause refresh" }
                        button #theme-toggle type="button" hidden { "Theme" }
                    }
                }
                main #live { (body) }
            }
        }
    }
}

/// The embedded assets, by name.
pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "app.css" => (CSS, "text/css; charset=utf-8"),
        "app.js" => (JS, "text/javascript; charset=utf-8"),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "public, max-age=86400"),
        ],
        body,
    )
        .into_response()
}

/// A page that says what went wrong, with the status.
pub(crate) fn error(ctx: &Ctx, status: StatusCode, message: &str) -> Response {
    let body = html! {
        h1 { (status.canonical_reason().unwrap_or("Error")) }
        p.notice.bad { (message) }
        p { a href=(ctx.url("/")) { "Back to the overview" } }
    };
    (status, page(ctx, "Error", Nav::None, body)).into_response()
}

/// What the dashboard says of an unknown path.
pub(crate) async fn not_found(ctx: Option<Extension<Ctx>>) -> Response {
    match ctx {
        Some(Extension(ctx)) => error(&ctx, StatusCode::NOT_FOUND, "There is no such page."),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// A database failure as a page (the pool waits out short outages; this is what is
/// left). A database without the job table, or with an older one (a table of a later
/// migration missing), says what to run instead.
pub(crate) fn database_error(ctx: &Ctx, e: jobs::Error) -> Response {
    tracing::warn!(error = %e, "dashboard query failed");
    let unmigrated = match &e {
        jobs::Error::Schema(_) => true,
        // undefined_table: one of the tables a later migration adds
        jobs::Error::Database(sqlx::Error::Database(db)) => db.code().as_deref() == Some("42P01"),
        _ => false,
    };
    let message = if unmigrated {
        format!(
            "This database has no job table, or an older one than this dashboard reads: \
             create or upgrade it with `jobsctl migrate` against this database (or call \
             `jobs::migrate(&pool)` at the start of your application). ({e})"
        )
    } else {
        format!("The database did not answer: {e}")
    };
    error(ctx, StatusCode::SERVICE_UNAVAILABLE, &message)
}

/// `t` as an absolute UTC time, to the second.
pub(crate) fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// How far `t` is from `now`, in the largest unit that says it: "4s ago", "in 3m".
pub(crate) fn relative(now: DateTime<Utc>, t: DateTime<Utc>) -> String {
    let delta = t.signed_duration_since(now);
    let secs = delta.num_seconds().unsigned_abs();
    let span = if secs < 60 {
        format!("{secs}s")
    } else if secs < 3600 {
        format!("{}m", secs / 60)
    } else if secs < 86_400 {
        format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
    } else {
        format!("{}d{}h", secs / 86_400, secs % 86_400 / 3600)
    };
    if delta.num_milliseconds() > 0 {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

/// A time with its distance from `now` (the exact time on hover).
pub(crate) fn when(now: DateTime<Utc>, t: DateTime<Utc>) -> Markup {
    html! { time datetime=(t.to_rfc3339()) title=(time(t)) { (relative(now, t)) } }
}

/// A state, as a coloured badge.
pub(crate) fn state_badge(state: &str) -> Markup {
    html! { span class={ "badge state-" (state) } { (state) } }
}

/// `path` under the prefix with `params` as its query (empty values left out),
/// percent-encoded.
pub(crate) fn link(ctx: &Ctx, path: &str, params: &[(&str, String)]) -> String {
    let kept: Vec<(&str, &str)> = params
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    if kept.is_empty() {
        return ctx.url(path);
    }
    let query = serde_urlencoded::to_string(kept).unwrap_or_default();
    format!("{}?{query}", ctx.url(path))
}

/// A form that runs `action`: its fields, the forgery token, and the button. The
/// handler asks for confirmation first when the action is destructive.
pub(crate) fn action_form(ctx: &Ctx, action: &crate::Action) -> Markup {
    if ctx.read_only {
        return html! {};
    }
    let (name, target) = crate::pages::action::fields(action);
    let class = if action.is_destructive() {
        "danger"
    } else {
        ""
    };
    html! {
        form.inline method="post" action=(ctx.url("/action")) {
            input type="hidden" name="csrf" value=(ctx.csrf);
            input type="hidden" name="action" value=(name);
            input type="hidden" name="target" value=(target);
            button type="submit" class=(class) data-action=(name) { (action.label()) }
        }
    }
}

/// How much of a payload or checkpoint a page shows: 16 KiB of its indented JSON. A page
/// refreshes every few seconds; a 20 MB payload rendered whole each time made the job's
/// page unusable.
pub(crate) const JSON_SHOWN_BYTES: usize = 16 * 1024;

/// `value` as indented JSON, escaped, at most `cap` bytes of it; what is cut off is
/// counted, and `whole` links to all of it.
pub(crate) fn json_block_capped(
    value: &serde_json::Value,
    cap: usize,
    whole: Option<&str>,
) -> Markup {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    if text.len() <= cap {
        return html! { pre.json { code { (text) } } };
    }
    let mut at = cap;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    html! {
        pre.json { code { (&text[..at]) " …" } }
        p.muted.small.cut {
            (text.len() - at) " more bytes not shown"
            @if let Some(href) = whole { " · " a href=(href) { "the whole JSON (" (text.len()) " bytes)" } }
        }
    }
}

/// An em dash for an absent value.
pub(crate) fn none() -> Markup {
    html! { span.muted { (PreEscaped("&mdash;")) } }
}
