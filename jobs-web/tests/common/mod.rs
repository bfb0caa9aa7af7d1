//! Helpers shared by the dashboard's tests: rows in known states, and requests.
#![allow(dead_code, missing_docs)]

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use http_body_util::BodyExt as _;
use sqlx::PgPool;
use tower::ServiceExt as _;

/// Inserts a job row as the runtime would have left it in `state`, and returns its id.
pub async fn insert(pool: &PgPool, kind: &str, state: &str, error: Option<&str>) -> i64 {
    insert_with(pool, kind, None, state, error, serde_json::json!({"n": 1})).await
}

/// [`insert`] with a key and a payload.
pub async fn insert_with(
    pool: &PgPool,
    kind: &str,
    key: Option<&str>,
    state: &str,
    error: Option<&str>,
    payload: serde_json::Value,
) -> i64 {
    let finished = matches!(state, "done" | "failed" | "cancelled");
    sqlx::query_scalar(
        "INSERT INTO jobs (kind, key, state, attempts, max_attempts, payload, last_error, finished_at,
                           claimed_by, claimed_until, errors)
         VALUES ($1, $2, $3, CASE WHEN $3 = 'pending' THEN 0 ELSE 3 END, 3, $4, $5,
                 CASE WHEN $6 THEN now() END,
                 CASE WHEN $3 = 'running' THEN gen_random_uuid() END,
                 CASE WHEN $3 = 'running' THEN now() + interval '1 minute' END,
                 CASE WHEN $5::text IS NULL THEN '[]'::jsonb
                      ELSE jsonb_build_array(jsonb_build_object(
                          'attempt', 3, 'at', now(), 'kind', 'error', 'message', $5::text)) END)
         RETURNING id",
    )
    .bind(kind)
    .bind(key)
    .bind(state)
    .bind(payload)
    .bind(error)
    .bind(finished)
    .fetch_one(pool)
    .await
    .expect("insert a job")
}

/// The state of job `id`, if its row exists.
pub async fn state_of(pool: &PgPool, id: i64) -> Option<String> {
    sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .expect("read a job's state")
}

/// Whether `kind` is paused.
pub async fn paused(pool: &PgPool, kind: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM jobs_paused WHERE kind = $1)")
        .bind(kind)
        .fetch_one(pool)
        .await
        .expect("read the paused kinds")
}

/// A response, read whole.
pub struct Answer {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: String,
}

impl Answer {
    /// The value of the cookie `name` that the response sets.
    pub fn cookie(&self, name: &str) -> Option<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|v| {
                let first = v.split(';').next()?;
                let (n, value) = first.split_once('=')?;
                (n == name).then(|| value.to_owned())
            })
    }

    /// The redirect's target.
    pub fn location(&self) -> Option<&str> {
        self.headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
    }
}

async fn read(response: Response<Body>) -> Answer {
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("read the body")
        .to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).expect("UTF-8 body"),
    }
}

/// `GET path`, with `cookie` (a `Cookie` header's value) when given.
pub async fn get(app: &Router, path: &str, cookie: Option<&str>) -> Answer {
    let mut request = Request::get(path).header(header::HOST, "dash.test");
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .expect("the router answers");
    read(response).await
}

/// `POST path` with a form body, `cookie` and extra headers.
pub async fn post(
    app: &Router,
    path: &str,
    form: &[(&str, &str)],
    cookie: Option<&str>,
    headers: &[(&str, &str)],
) -> Answer {
    let mut request = Request::post(path)
        .header(header::HOST, "dash.test")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = serde_urlencoded::to_string(form).unwrap();
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body)).unwrap())
        .await
        .expect("the router answers");
    read(response).await
}

/// The forgery token a first visit hands out, as (cookie header, form value).
pub async fn session(app: &Router, path: &str) -> (String, String) {
    let page = get(app, path, None).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let token = page
        .cookie("jobs_web_csrf")
        .expect("the page sets a forgery cookie");
    assert!(
        page.body
            .contains(&format!("name=\"csrf\" value=\"{token}\""))
            || !page.body.contains("name=\"csrf\""),
        "the page's forms carry the cookie's token"
    );
    (format!("jobs_web_csrf={token}"), token)
}
