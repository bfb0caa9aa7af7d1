//! The jobs: a listing filtered by kind, state, key or id, newest first (or pending
//! jobs by run time), one keyset page at a time.

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use jobs::admin::JobState;
use maud::{Markup, html};
use serde::Deserialize;

use crate::Shared;
use crate::layout::{self, Nav, link, state_badge, when};
use crate::queries::{self, Cursor, Filter, Page};
use crate::security::Ctx;

/// The query string.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Params {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    id: String,
    /// `run`: pending jobs by run time.
    #[serde(default)]
    order: String,
    /// Newest first: ids below this one.
    before: Option<i64>,
    /// By run time: after this run time (RFC 3339) and id.
    at: Option<String>,
    after: Option<i64>,
}

/// `GET /jobs`
pub(crate) async fn page(
    State(dash): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    params: Result<Query<Params>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(params)) = params else {
        return layout::error(
            &ctx,
            StatusCode::BAD_REQUEST,
            "That listing's address is malformed.",
        );
    };
    let id = params.id.trim();
    if !id.is_empty() {
        return match id.trim_start_matches('#').parse::<i64>() {
            Ok(id) => Redirect::to(&ctx.url(&format!("/jobs/{id}"))).into_response(),
            Err(_) => layout::error(
                &ctx,
                StatusCode::BAD_REQUEST,
                &format!("`{id}` is not a job id (a whole number)."),
            ),
        };
    }
    let state = match params.state.as_str() {
        "" => None,
        s => match s.parse::<JobState>() {
            Ok(state) => Some(state),
            Err(_) => {
                return layout::error(
                    &ctx,
                    StatusCode::BAD_REQUEST,
                    &format!("`{s}` is not a state."),
                );
            }
        },
    };
    let filter = Filter {
        kind: Some(params.kind.trim().to_owned()).filter(|k| !k.is_empty()),
        state,
        key: Some(params.key.clone()).filter(|k| !k.is_empty()),
        by_run_time: params.order == "run" && state == Some(JobState::Pending),
    };
    let after_run = match (&params.at, params.after) {
        (Some(at), Some(id)) => match DateTime::parse_from_rfc3339(at) {
            Ok(at) => Some((at.with_timezone(&Utc), id)),
            Err(_) => {
                return layout::error(
                    &ctx,
                    StatusCode::BAD_REQUEST,
                    "That page's cursor is malformed.",
                );
            }
        },
        _ => None,
    };
    let cursor = Cursor {
        before: params.before,
        after_run,
    };
    match queries::list(&dash.pool, &filter, cursor).await {
        Ok((now, page)) => {
            let nav = if filter.state == Some(JobState::Failed) && filter.kind.is_none() {
                Nav::Failed
            } else {
                Nav::Jobs
            };
            let first = cursor == Cursor::default();
            let body = html! {
                h1 { "Jobs" }
                (filter_form(&ctx, &filter))
                (table(&ctx, now, &filter, &page))
                (pager(&ctx, &filter, &page, first))
            };
            layout::page(&ctx, "Jobs", nav, body).into_response()
        }
        Err(e) => layout::database_error(&ctx, e.into()),
    }
}

/// The filter's fields as query parameters.
fn filter_params(filter: &Filter) -> Vec<(&'static str, String)> {
    vec![
        ("kind", filter.kind.clone().unwrap_or_default()),
        (
            "state",
            filter
                .state
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default(),
        ),
        ("key", filter.key.clone().unwrap_or_default()),
        (
            "order",
            if filter.by_run_time {
                "run".to_owned()
            } else {
                String::new()
            },
        ),
    ]
}

fn filter_form(ctx: &Ctx, filter: &Filter) -> Markup {
    let state = filter.state.map(JobState::as_str).unwrap_or("");
    html! {
        form.filters method="get" action=(ctx.url("/jobs")) {
            label { "Kind " input type="text" name="kind" value=(filter.kind.as_deref().unwrap_or("")); }
            label { "State "
                select name="state" {
                    option value="" selected[state.is_empty()] { "any" }
                    @for s in JobState::ALL {
                        option value=(s.as_str()) selected[state == s.as_str()] { (s.as_str()) }
                    }
                }
            }
            label { "Key " input type="search" name="key" value=(filter.key.as_deref().unwrap_or("")); }
            label { "Order "
                select name="order" {
                    option value="" selected[!filter.by_run_time] { "newest first" }
                    option value="run" selected[filter.by_run_time] { "by run time (pending)" }
                }
            }
            label { "Id " input type="text" name="id" inputmode="numeric" size="10"; }
            button type="submit" { "Show" }
        }
    }
}

fn table(ctx: &Ctx, now: DateTime<Utc>, filter: &Filter, page: &Page) -> Markup {
    if page.rows.is_empty() {
        return html! { p.muted.empty { "No job matches." } };
    }
    html! {
        div.scroll {
            table.jobs {
                thead { tr {
                    th.num { "Id" } th { "Kind" } th { "Key" } th { "State" } th.num { "Attempts" }
                    th.num title="Priority (0 runs first)" { "Pri" }
                    th { @if filter.by_run_time { "Runs" } @else { "Enqueued" } }
                    th { "Finished" } th { "Last error" }
                } }
                tbody {
                    @for r in &page.rows {
                        tr data-id=(r.id) {
                            td.num { a href=(ctx.url(&format!("/jobs/{}", r.id))) { (r.id) } }
                            td { code { (r.kind) } }
                            td { @match &r.key { Some(k) => code { (k) }, None => (layout::none()) } }
                            td { (state_badge(&r.state)) }
                            td.num { (r.attempts) "/" (r.max_attempts) }
                            td.num { (r.priority) }
                            td { @if filter.by_run_time { (when(now, r.run_after)) } @else { (when(now, r.created_at)) } }
                            td { @match r.finished_at { Some(t) => (when(now, t)), None => (layout::none()) } }
                            td.error { @match &r.error { Some(e) => (e), None => "" } }
                        }
                    }
                }
            }
        }
    }
}

fn pager(ctx: &Ctx, filter: &Filter, page: &Page, first: bool) -> Markup {
    let mut base = filter_params(filter);
    let next = page.next.map(|c| {
        let mut params = base.clone();
        if let Some(before) = c.before {
            params.push(("before", before.to_string()));
        }
        if let Some((at, id)) = c.after_run {
            params.push(("at", at.to_rfc3339()));
            params.push(("after", id.to_string()));
        }
        link(ctx, "/jobs", &params)
    });
    base.retain(|(_, v)| !v.is_empty());
    html! {
        nav.pager {
            @if !first { a href=(link(ctx, "/jobs", &base)) { "First page" } }
            @if let Some(low) = page.searched_down_to {
                span.muted { "Searched the ids down to " (low) "; older jobs may match." }
            }
            @if let Some(next) = next {
                a.next href=(next) rel="next" { @if page.searched_down_to.is_some() { "Search older" } @else { "Next page" } }
            }
        }
    }
}
