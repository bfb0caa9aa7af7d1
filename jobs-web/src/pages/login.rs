//! Signing in with the access token (only when the dashboard has one): a form whose
//! POST sets the token's cookie.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use axum_extra::extract::cookie::CookieJar;
use maud::html;
use serde::Deserialize;

use crate::Shared;
use crate::layout::{self, Nav};
use crate::security::{self, Ctx, TOKEN_COOKIE};

/// The sign-in form's fields.
#[derive(Debug, Deserialize)]
pub(crate) struct Submitted {
    #[serde(default)]
    token: String,
}

fn render(ctx: &Ctx, status: StatusCode, wrong: bool) -> Response {
    let body = html! {
        h1 { "Sign in" }
        @if wrong { p.notice.bad { "That is not the access token." } }
        form.login method="post" action=(ctx.url("/login")) {
            label { "Access token " input type="password" name="token" autocomplete="current-password" autofocus; }
            " "
            button type="submit" { "Sign in" }
        }
    };
    (status, layout::page(ctx, "Sign in", Nav::None, body)).into_response()
}

/// `GET /login`
pub(crate) async fn form(State(dash): State<Shared>, Extension(ctx): Extension<Ctx>) -> Response {
    if dash.token.is_none() {
        return Redirect::to(&ctx.url("/")).into_response();
    }
    render(&ctx, StatusCode::OK, false)
}

/// `POST /login`: the right token sets the cookie and goes to the overview.
pub(crate) async fn submit(
    State(dash): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    jar: CookieJar,
    form: Result<Form<Submitted>, axum::extract::rejection::FormRejection>,
) -> Response {
    let token = form.map(|Form(f)| f.token).unwrap_or_default();
    if !security::token_ok(&dash, &token) {
        return render(&ctx, StatusCode::UNAUTHORIZED, true);
    }
    let jar = jar.add(security::cookie(TOKEN_COOKIE, token, &ctx.prefix));
    (jar, Redirect::to(&ctx.url("/"))).into_response()
}
