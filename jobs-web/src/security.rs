//! Who may read and who may change: the access token, the token against cross-site
//! request forgery, and the origin check of every POST.
//!
//! Forgery: every page sets a token in a `SameSite=Lax`, `HttpOnly` cookie and carries
//! the same token in each of its forms; a POST whose form token differs from the
//! cookie's is refused (a page of another site can neither read the cookie nor make
//! the browser send it with a POST). The token is issued by this dashboard: a random
//! nonce and its HMAC-SHA256 under a key drawn at random when the [`Dashboard`] is
//! made, so a cookie planted by someone else (from a sibling subdomain, say) together
//! with a matching form field is refused too, and never adopted as the page's token.
//! A restart draws a new key: a page served before it gets a new token on its next
//! load. A POST whose `Origin` names another host than the request's `Host` is refused
//! before its body is read; `X-Forwarded-Host` counts only when the dashboard is told
//! that a reverse proxy in front of it sets it ([`Dashboard::trust_forwarded_host`]),
//! since any client can send it. (`Lax`, not `Strict`: a link to the dashboard from
//! elsewhere, a chat or a ticket, then arrives signed in, with the token its open tabs
//! already carry.)
//!
//! Framing: no other site may frame the pages (`frame-ancestors 'none'`, and
//! `X-Frame-Options` for older browsers), so no page can be overlaid to trick a click;
//! the content security policy allows only the dashboard's own stylesheet and script,
//! a second wall behind the escaping.
//!
//! [`Dashboard`]: crate::Dashboard
//! [`Dashboard::trust_forwarded_host`]: crate::Dashboard::trust_forwarded_host

use axum::extract::{NestedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

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
    /// `path` (starting with `/`) under the dashboard's prefix. The home under a prefix
    /// is the prefix itself: nested at `/admin/jobs`, axum routes `/admin/jobs` to the
    /// dashboard's `/`, and answers 404 for `/admin/jobs/`.
    pub fn url(&self, path: &str) -> String {
        if path == "/" && !self.prefix.is_empty() {
            return self.prefix.clone();
        }
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

/// The key that signs forgery tokens: 32 random bytes (from the operating system's
/// generator, through two version-4 UUIDs: 244 random bits), drawn once per dashboard.
#[derive(Clone)]
pub(crate) struct CsrfKey([u8; 32]);

impl CsrfKey {
    pub(crate) fn random() -> Self {
        let mut key = [0u8; 32];
        key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        CsrfKey(key)
    }

    /// The signature of `nonce`, in hex.
    fn sign(&self, nonce: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(nonce.as_bytes());
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// A fresh token: a random nonce and its signature, `nonce.signature`.
    pub(crate) fn issue(&self) -> String {
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let signature = self.sign(&nonce);
        format!("{nonce}.{signature}")
    }

    /// Whether `token` is one this key issued.
    pub(crate) fn issued(&self, token: &str) -> bool {
        token.split_once('.').is_some_and(|(nonce, signature)| {
            nonce.len() == 32 && same(&self.sign(nonce), signature)
        })
    }
}

/// Whether a POST's `Origin`, when the browser sends one, is the host the request was
/// sent to: its `Host`, or, when `trust_forwarded` (a reverse proxy in front sets it,
/// and overwrites what clients send), the `X-Forwarded-Host` it sets when it rewrites
/// `Host`.
fn same_origin(headers: &HeaderMap, trust_forwarded: bool) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let Some((_, origin_host)) = origin.split_once("://") else {
        return false;
    };
    let value = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let forwarded = trust_forwarded
        .then(|| value("x-forwarded-host").and_then(|v| v.split(',').next()))
        .flatten();
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
    if request.method() == Method::POST
        && !same_origin(request.headers(), dashboard.trust_forwarded_host)
    {
        let mut refused = (
            StatusCode::FORBIDDEN,
            "cross-origin request refused: the Origin header names another host than the request's (behind a proxy that rewrites Host, have it set X-Forwarded-Host and tell the dashboard to trust it: Dashboard::trust_forwarded_host, jobsctl web --trust-forwarded-host)",
        )
            .into_response();
        harden(&mut refused);
        return refused;
    }
    // Only a token this dashboard issued is kept; anything else is replaced.
    let existing = jar
        .get(CSRF_COOKIE)
        .map(|c| c.value().to_owned())
        .filter(|v| dashboard.csrf_key.issued(v));
    let csrf = existing
        .clone()
        .unwrap_or_else(|| dashboard.csrf_key.issue());
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

/// Whether a submitted form's forgery token is the cookie's, and one this dashboard
/// issued.
pub(crate) fn csrf_ok(dashboard: &crate::Dashboard, jar: &CookieJar, submitted: &str) -> bool {
    jar.get(CSRF_COOKIE).is_some_and(|c| {
        !submitted.is_empty() && same(c.value(), submitted) && dashboard.csrf_key.issued(c.value())
    })
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
        assert!(same_origin(&headers, false), "no Origin: a same-site form");
        headers.insert(header::ORIGIN, "http://127.0.0.1:8080".parse().unwrap());
        assert!(same_origin(&headers, false));
        headers.insert(header::ORIGIN, "https://evil.example".parse().unwrap());
        assert!(!same_origin(&headers, false));
        headers.insert(header::ORIGIN, "null".parse().unwrap());
        assert!(!same_origin(&headers, false));
        // Behind a proxy that rewrote Host to its upstream.
        headers.insert(header::ORIGIN, "https://jobs.example.com".parse().unwrap());
        assert!(!same_origin(&headers, true));
        headers.insert("x-forwarded-host", "jobs.example.com".parse().unwrap());
        assert!(same_origin(&headers, true));
        // Any client can send the header: unless told that a proxy sets it, it counts
        // for nothing.
        assert!(!same_origin(&headers, false));
        headers.insert("x-forwarded-host", "evil.example".parse().unwrap());
        assert!(!same_origin(&headers, true));
    }

    #[test]
    fn only_tokens_the_key_issued_verify() {
        let key = CsrfKey::random();
        let token = key.issue();
        assert!(key.issued(&token));
        assert!(!CsrfKey::random().issued(&token), "another key's");
        let (nonce, _) = token.split_once('.').unwrap();
        assert!(!key.issued(nonce), "a nonce without its signature");
        assert!(!key.issued(&format!("{nonce}.{}", "0".repeat(64))));
        assert!(
            !key.issued("0123456789abcdef0123456789abcdef"),
            "a planted value"
        );
        assert!(!key.issued(""));
    }
}
