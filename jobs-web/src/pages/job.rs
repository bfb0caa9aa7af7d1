//! One job: its payload, state, attempts and their errors, checkpoint, times, the
//! runtime holding it, why it has not started (a pending job), and what can be done
//! with it.

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use jobs::admin::{self, Explanation, JobRow, JobState, RuntimeRow};
use maud::{Markup, html};

use crate::layout::{self, Nav, link, state_badge, when};
use crate::security::Ctx;
use crate::{Action, Shared};

/// `GET /jobs/{id}`
pub(crate) async fn page(
    State(dash): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    id: Result<Path<i64>, axum::extract::rejection::PathRejection>,
) -> Response {
    let Ok(Path(id)) = id else {
        return layout::error(&ctx, StatusCode::BAD_REQUEST, "A job id is a whole number.");
    };
    let pool = &dash.pool;
    let read = async {
        let now = super::db_now(pool).await?;
        let job = admin::get(pool, id).await?;
        let runtime = match job.as_ref().and_then(|j| j.runtime) {
            Some(rid) => admin::runtimes(pool)
                .await?
                .into_iter()
                .find(|r| r.id == rid),
            None => None,
        };
        // Why a pending job waits (the other states say it themselves).
        let why = match &job {
            Some(j) if j.state == JobState::Pending => admin::explain(pool, id).await?,
            _ => None,
        };
        Ok::<_, jobs::Error>((now, job, runtime, why))
    };
    match read.await {
        Ok((_, None, _, _)) => layout::error(
            &ctx,
            StatusCode::NOT_FOUND,
            &format!(
                "There is no job {id}: it never existed, or it finished and its row was deleted (done jobs of kinds without retention, pruned rows)."
            ),
        ),
        Ok((now, Some(job), runtime, why)) => {
            let title = format!("Job {id}");
            layout::page(
                &ctx,
                &title,
                Nav::None,
                body(&ctx, now, &job, runtime.as_ref(), why.as_ref()),
            )
            .into_response()
        }
        Err(e) => layout::database_error(&ctx, e),
    }
}

fn body(
    ctx: &Ctx,
    now: DateTime<Utc>,
    job: &JobRow,
    runtime: Option<&RuntimeRow>,
    why: Option<&Explanation>,
) -> Markup {
    let actions: Vec<Action> = match job.state {
        JobState::Failed => vec![Action::Retry(job.id), Action::Discard(job.id)],
        JobState::Pending | JobState::Running => vec![Action::Cancel(job.id)],
        _ => Vec::new(),
    };
    let time_row = |label: &str, t: Option<DateTime<Utc>>| {
        html! {
            tr { th { (label) } td { @match t {
                Some(t) if t == DateTime::<Utc>::MAX_UTC => "until it ends (no lease)",
                Some(t) => { (when(now, t)) " " span.muted.small { (layout::time(t)) } },
                None => (layout::none()),
            } } }
        }
    };
    html! {
        h1 { "Job " (job.id) " " (state_badge(job.state.as_str())) }
        @if !actions.is_empty() && !ctx.read_only {
            div.actions.bar { @for a in &actions { (layout::action_form(ctx, a)) } }
        }
        @if let Some(why) = why {
            section.why {
                h2 { "Why it waits" }
                ul.reasons { @for r in &why.reasons { li data-reason=(r.code()) { (r.to_string()) } } }
            }
        }
        div.columns {
            section {
                table.facts {
                    tr { th { "Kind" } td { a href=(link(ctx, "/jobs", &[("kind", job.kind.clone())])) { code { (job.kind) } } } }
                    tr { th { "Key" } td { @match &job.key {
                        Some(k) => a href=(link(ctx, "/jobs", &[("kind", job.kind.clone()), ("key", k.clone())])) { code { (k) } },
                        None => (layout::none()),
                    } } }
                    tr { th { "State" } td { (job.state.as_str()) } }
                    tr { th { "Attempts" } td { (job.attempts) " of " (job.max_attempts) } }
                    tr { th { "Priority" } td { (job.priority) } }
                    (time_row("Enqueued", Some(job.created_at)))
                    (time_row("Runs after", Some(job.run_after)))
                    (time_row("Claimed until", job.claimed_until))
                    (time_row("Finished", job.finished_at))
                    tr { th { "Runtime" } td { @match (job.runtime, runtime) {
                        (_, Some(r)) => { (r.name.as_deref().unwrap_or("")) " " (r.host) ":" (r.pid) " " code.muted.small { (r.id) } },
                        (Some(id), None) => { code { (id) } " " span.muted { "(no longer registered)" } },
                        (None, _) => (layout::none()),
                    } } }
                }
            }
            section {
                h2 { "Payload" }
                (layout::json_block_capped(&job.payload, layout::JSON_SHOWN_BYTES, Some(&ctx.url(&format!("/jobs/{}/payload", job.id)))))
                h2 { "Checkpoint" }
                @match &job.checkpoint {
                    Some(c) => (layout::json_block_capped(c, layout::JSON_SHOWN_BYTES, None)),
                    None => p.muted { "None saved." },
                }
                @if let Some(output) = &job.output {
                    h2 { "Output" }
                    div.output { (layout::json_block_capped(output, layout::JSON_SHOWN_BYTES, None)) }
                }
            }
        }
        h2 { "Attempts" }
        @if job.errors.is_empty() {
            @match &job.last_error {
                Some(e) => { p.muted { "Last error:" } pre.error-text { (e) } },
                None => p.muted { "No attempt has failed." },
            }
        } @else {
            ol.attempts {
                @for (i, e) in job.errors.iter().enumerate() {
                    // A retry (or a new request coalesced into the job) gives it a fresh
                    // attempt budget: its attempts count from 1 again.
                    @if i > 0 && e.attempt <= job.errors[i - 1].attempt {
                        li.restart.muted { "Attempts counted from 1 again: the job was retried, or a new request came in." }
                    }
                    li {
                        div { strong { "Attempt " (e.attempt) } " · " span.badge.state-failed { (e.kind.as_str()) } " · " (when(now, e.at))
                            @if let Some(r) = e.runtime { " · " span.muted.small { "runtime " code { (r) } } } }
                        pre.error-text { (e.message) }
                    }
                }
            }
        }
    }
}

/// `GET /jobs/{id}/payload`: the job's whole payload, as JSON (the job's page shows
/// its first [`layout::JSON_SHOWN_BYTES`]).
pub(crate) async fn payload(
    State(dash): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    id: Result<Path<i64>, axum::extract::rejection::PathRejection>,
) -> Response {
    let Ok(Path(id)) = id else {
        return layout::error(&ctx, StatusCode::BAD_REQUEST, "A job id is a whole number.");
    };
    match admin::get(&dash.pool, id).await {
        Ok(Some(job)) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            job.payload.to_string(),
        )
            .into_response(),
        Ok(None) => layout::error(
            &ctx,
            StatusCode::NOT_FOUND,
            &format!("There is no job {id}."),
        ),
        Err(e) => layout::database_error(&ctx, e),
    }
}
