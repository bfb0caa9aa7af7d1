//! The actions: one POST route for all of them. A destructive action answers first
//! with a page that asks for confirmation (a form, so it works without JavaScript);
//! the confirmed one runs and says what it did.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use axum_extra::extract::cookie::CookieJar;
use maud::html;
use serde::Deserialize;

use crate::layout::{self, Nav};
use crate::security::{self, Ctx};
use crate::{Action, ActionError, Shared};

/// The form every action button submits.
#[derive(Debug, Deserialize)]
pub(crate) struct Submitted {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    target: String,
    #[serde(default)]
    confirmed: String,
}

/// The form's `action` and `target` fields for `action`.
pub(crate) fn fields(action: &Action) -> (&'static str, String) {
    match action {
        Action::Retry(id) => ("retry", id.to_string()),
        Action::RetryKind(kind) => ("retry-kind", kind.clone()),
        Action::Cancel(id) => ("cancel", id.to_string()),
        Action::Discard(id) => ("discard", id.to_string()),
        Action::Pause(kind) => ("pause", kind.clone()),
        Action::Resume(kind) => ("resume", kind.clone()),
    }
}

/// The action a form names, if it names one.
fn parse(action: &str, target: &str) -> Option<Action> {
    let id = || target.parse::<i64>().ok();
    let kind = || Some(target.to_owned()).filter(|k| !k.is_empty());
    Some(match action {
        "retry" => Action::Retry(id()?),
        "retry-kind" => Action::RetryKind(kind()?),
        "cancel" => Action::Cancel(id()?),
        "discard" => Action::Discard(id()?),
        "pause" => Action::Pause(kind()?),
        "resume" => Action::Resume(kind()?),
        _ => return None,
    })
}

/// Where to go after `action`: its job, or the overview for a kind.
fn back(ctx: &Ctx, action: &Action) -> (String, String) {
    match action {
        Action::Retry(id) | Action::Cancel(id) | Action::Discard(id) => {
            (ctx.url(&format!("/jobs/{id}")), format!("Back to job {id}"))
        }
        _ => (ctx.url("/"), "Back to the overview".to_owned()),
    }
}

/// `POST /action`
pub(crate) async fn submit(
    State(dash): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    jar: CookieJar,
    form: Result<Form<Submitted>, axum::extract::rejection::FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return layout::error(&ctx, StatusCode::BAD_REQUEST, "That form is malformed.");
    };
    if !security::csrf_ok(&dash, &jar, &form.csrf) {
        return layout::error(
            &ctx,
            StatusCode::FORBIDDEN,
            "This request did not come from the dashboard's own page (its form token is missing or stale): nothing was changed. Reload the page and try again.",
        );
    }
    let Some(action) = parse(&form.action, &form.target) else {
        return layout::error(&ctx, StatusCode::BAD_REQUEST, "No such action.");
    };
    let (back_href, back_label) = back(&ctx, &action);
    if action.is_destructive() && form.confirmed != "yes" {
        let (name, target) = fields(&action);
        let body = html! {
            h1 { "Confirm" }
            p.question { (action.question()) }
            form.inline method="post" action=(ctx.url("/action")) {
                input type="hidden" name="csrf" value=(ctx.csrf);
                input type="hidden" name="action" value=(name);
                input type="hidden" name="target" value=(target);
                input type="hidden" name="confirmed" value="yes";
                button.danger type="submit" #confirm { "Yes, " (action.label().to_lowercase()) }
            }
            " "
            a.button href=(back_href) { "No, go back" }
        };
        return layout::page(&ctx, "Confirm", Nav::None, body).into_response();
    }
    let outcome = match dash.pool.acquire().await {
        Ok(mut conn) => crate::perform(&mut conn, &action).await,
        Err(e) => Err(ActionError::Database(e.into())),
    };
    let (status, class, message) = match outcome {
        Ok(message) => (StatusCode::OK, "good", message),
        Err(ActionError::Refused(message)) => (StatusCode::CONFLICT, "bad", message),
        Err(e) => {
            tracing::warn!(error = %e, ?action, "dashboard action failed");
            (StatusCode::SERVICE_UNAVAILABLE, "bad", e.to_string())
        }
    };
    let heading = if class == "good" {
        "Done"
    } else {
        "Nothing done"
    };
    let body = html! {
        h1 { (heading) }
        p #outcome class={ "notice " (class) } { (message) }
        p { a href=(back_href) { (back_label) } }
    };
    (status, layout::page(&ctx, heading, Nav::None, body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_action_reads_back_from_its_form() {
        for action in [
            Action::Retry(7),
            Action::RetryKind("a.b".into()),
            Action::Cancel(8),
            Action::Discard(9),
            Action::Pause("x y".into()),
            Action::Resume("<k>".into()),
        ] {
            let (name, target) = fields(&action);
            assert_eq!(parse(name, &target), Some(action));
        }
        assert_eq!(parse("retry", "x"), None);
        assert_eq!(parse("pause", ""), None);
        assert_eq!(parse("drop", "1"), None);
    }
}
