//! Who may read and who may change: the access token, the token against cross-site
//! request forgery, and the origin check of every POST.
//!
//! Forgery: every page sets a random token in a `SameSite=Lax`, `HttpOnly` cookie and
//! carries the same token in each of its forms; a POST whose form token differs from
//! the cookie's is refused (a page of another site can neither read the cookie nor make
//! the browser send it with a POST). A POST whose `Origin` names another host than the
//! request's (`Host`, or `X-Forwarded-Host` behind a proxy) is refused before its body
//! is read. (`Lax`, not `Strict`: a link to the dashboard from elsewhere, a chat or a
//! ticket, then arrives signed in, with the token its open tabs already carry.)
//!
//! Framing: no other site may frame the pages (`frame-ancestors 'none'`, and
//! `X-Frame-Options` for older browsers), so no page can be overlaid to trick a click;
//! the content security policy allows only the dashboard's own stylesheet and script,
//! a second wall behind the escaping.

use axum::extract::{NestedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};

use crate::Shared;

/// The cookie holding the forgery token.
pub(crate) const CSRF_COOKIE: &str = "jobs_web_csrf";
/// The cookie holding the access token once signed in.
pub(crate) const TOKEN_COOKIE: &str = "jobs_web_token";

/// What a page needs to know about the request and the dashboard.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    /// The path the dashboard is mounted under ("" at the root).
    pub prefix: String,
    /// The forgery token the page's forms carry.
    pub csrf: String,
    /// No actions.
    pub read_only: bool,
    /// Seconds between live refreshes (0: none).
    pub refresh: u32,
}

impl Ctx {
    /// `path` (starting with `/`) under the dashboard's prefix.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.prefix, path)
    }
}

/// Byte-wise comparison whose time does not depend on where the inputs differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Whether the request carries the access token (header or cookie).
fn authorized(dashboard: &crate::Dashboard, headers: &HeaderMap, jar: &CookieJar) -> bool {
    let Some(token) = dashboard.token.as_deref() else {
        return true;
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    bearer.is_some_and(|b| same(b, token))
        || jar
            .get(TOKEN_COOKIE)
            .is_some_and(|c| same(c.value(), token))
}

/// Whether a POST's `Origin`, when the browser sends one, is the host the request was
/// sent to: its `Host`, or the `X-Forwarded-Host` a reverse proxy sets when it
/// rewrites `Host`.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let Some((_, origin_host)) = origin.split_once("://") else {
        return false;
    };
    let value = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let forwarded = value("x-forwarded-host").and_then(|v| v.split(',').next());
    [value(header::HOST.as_str()), forwarded]
        .into_iter()
        .flatten()
        .any(|host| host.trim().eq_ignore_ascii_case(origin_host))
}

/// The headers every answer carries: no framing by other sites, only the dashboard's
/// own assets, no type sniffing, no referrer sent elsewhere.
fn harden(response: &mut Response) {
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
    ] {
        headers.insert(name, header::HeaderValue::from_static(value));
    }
}

/// Checks the access token and the origin, and hands the page its [`Ctx`] (setting
/// the forgery cookie when the browser has none).
pub(crate) async fn guard(
    State(dashboard): State<Shared>,
    jar: CookieJar,
    mut request: Request,
    next: Next,
) -> Response {
    // Nested in an application's router, the prefix it is mounted under.
    let prefix = request
        .extensions()
        .get::<NestedPath>()
        .map(|n| n.as_str().trim_end_matches('/').to_owned())
        .unwrap_or_default();
    let path = request.uri().path().to_owned();
    let open = path.starts_with("/assets/") || path == "/login";
    if !open && !authorized(&dashboard, request.headers(), &jar) {
        let mut refused = if request.method() == Method::GET {
            Redirect::to(&format!("{prefix}/login")).into_response()
        } else {
            (StatusCode::UNAUTHORIZED, "sign in first").into_response()
        };
        harden(&mut refused);
        return refused;
    }
    if request.method() == Method::POST && !same_origin(request.headers()) {
        let mut refused = (
            StatusCode::FORBIDDEN,
            "cross-origin request refused: the Origin header names another host than the request's (behind a proxy that rewrites Host, have it set X-Forwarded-Host)",
        )
            .into_response();
        harden(&mut refused);
        return refused;
    }
    let existing = jar
        .get(CSRF_COOKIE)
        .map(|c| c.value().to_owned())
        .filter(|v| v.len() == 32);
    let csrf = existing
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    request.extensions_mut().insert(Ctx {
        prefix: prefix.clone(),
        csrf: csrf.clone(),
        read_only: dashboard.read_only,
        refresh: dashboard.refresh_seconds,
    });
    let mut response = next.run(request).await;
    harden(&mut response);
    if existing.is_some() {
        return response;
    }
    let cookie = cookie(CSRF_COOKIE, csrf, &prefix);
    (CookieJar::new().add(cookie), response).into_response()
}

/// A cookie of the dashboard's: scoped to its path, never sent with another site's
/// POST, never read by scripts.
pub(crate) fn cookie(name: &'static str, value: String, prefix: &str) -> Cookie<'static> {
    let path = if prefix.is_empty() {
        "/".to_owned()
    } else {
        prefix.to_owned()
    };
    Cookie::build((name, value))
        .path(path)
        .http_only(true)
        .same_site(SameSite::Lax)
        .build()
}

/// Whether a submitted form's forgery token is the cookie's.
pub(crate) fn csrf_ok(jar: &CookieJar, submitted: &str) -> bool {
    jar.get(CSRF_COOKIE)
        .is_some_and(|c| !submitted.is_empty() && same(c.value(), submitted))
}

/// Whether `token` is the dashboard's access token.
pub(crate) fn token_ok(dashboard: &crate::Dashboard, token: &str) -> bool {
    dashboard.token.as_deref().is_some_and(|t| same(t, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_whole_strings() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
        assert!(!same("", "a"));
    }

    #[test]
    fn an_origin_must_name_the_host() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
        assert!(same_origin(&headers), "no Origin: a same-site form");
        headers.insert(header::ORIGIN, "http://127.0.0.1:8080".parse().unwrap());
        assert!(same_origin(&headers));
        headers.insert(header::ORIGIN, "https://evil.example".parse().unwrap());
        assert!(!same_origin(&headers));
        headers.insert(header::ORIGIN, "null".parse().unwrap());
        assert!(!same_origin(&headers));
        // Behind a proxy that rewrote Host to its upstream.
        headers.insert(header::ORIGIN, "https://jobs.example.com".parse().unwrap());
        assert!(!same_origin(&headers));
        headers.insert("x-forwarded-host", "jobs.example.com".parse().unwrap());
        assert!(same_origin(&headers));
        headers.insert("x-forwarded-host", "evil.example".parse().unwrap());
        assert!(!same_origin(&headers));
    }
}
