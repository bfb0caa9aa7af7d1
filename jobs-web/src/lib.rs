//! A dashboard for [pgjobs](jobs): the queues, the jobs, their failures and the
//! operator's actions in a browser, served from a database pool.
//!
//! Two ways to run it:
//!
//! - `jobsctl web --listen 127.0.0.1:8080` serves it on its own (the database from
//!   `DATABASE_URL` or `--database-url`);
//! - [`Dashboard::router`] gives an [`axum::Router`] that an application mounts in its
//!   own server, under a path of its choice:
//!
//! ```no_run
//! # async fn example(pool: sqlx::PgPool) -> std::io::Result<()> {
//! let app = axum::Router::new()
//!     // ... the application's own routes ...
//!     .nest("/admin/jobs", jobs_web::Dashboard::new(pool).router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await
//! # }
//! ```
//!
//! Every page reads with bounded work whatever the table's size (counts stop at
//! [`COUNT_CAP`], listings are keyset pages), renders everything from the table
//! escaped, and works without JavaScript; with it, the page refreshes itself every few
//! seconds. Every change is a POST carrying a token against cross-site request forgery,
//! and the destructive ones ask for confirmation first. Mounted in an application,
//! the dashboard trusts whoever reaches it: put it behind the application's own
//! authentication layer, or give it an access token with [`Dashboard::token`].
//! [`Dashboard::read_only`] removes every action.

mod actions;
mod layout;
mod pages;
mod queries;
mod security;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use sqlx::PgPool;

pub use actions::{Action, ActionError, pause_outcome, perform};
pub use queries::COUNT_CAP;

/// The dashboard's settings; [`router`](Dashboard::router) turns them into routes.
#[derive(Clone)]
pub struct Dashboard {
    pool: PgPool,
    read_only: bool,
    token: Option<String>,
    refresh_seconds: u32,
    trust_forwarded_host: bool,
    csrf_key: security::CsrfKey,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("read_only", &self.read_only)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("refresh_seconds", &self.refresh_seconds)
            .field("trust_forwarded_host", &self.trust_forwarded_host)
            .finish_non_exhaustive()
    }
}

impl Dashboard {
    /// A dashboard on `pool`'s database, with actions, without an access token,
    /// refreshing every 5 seconds.
    pub fn new(pool: PgPool) -> Self {
        Dashboard {
            pool,
            read_only: false,
            token: None,
            refresh_seconds: 5,
            trust_forwarded_host: false,
            csrf_key: security::CsrfKey::random(),
        }
    }

    /// Without any action: pages only show, and no route changes anything.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Requires this access token: a browser signs in once with it (a form that sets
    /// a cookie), a script sends it as `Authorization: Bearer <token>`.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        let token = token.into();
        self.token = (!token.is_empty()).then_some(token);
        self
    }

    /// How often a page refreshes itself in the browser (5 seconds unless set; 0 turns
    /// the live refresh off).
    pub fn refresh_seconds(mut self, seconds: u32) -> Self {
        self.refresh_seconds = seconds;
        self
    }

    /// Trusts the `X-Forwarded-Host` header in the origin check of every POST (off
    /// unless set). Turn it on only behind a reverse proxy that rewrites `Host` and
    /// sets this header itself, overwriting what the client sent: any client can send
    /// it, so without such a proxy it would let a page of another site name itself as
    /// the dashboard's host.
    pub fn trust_forwarded_host(mut self, trust: bool) -> Self {
        self.trust_forwarded_host = trust;
        self
    }

    /// The dashboard's routes, to serve or to [`nest`](axum::Router::nest) under a
    /// path of the application's.
    pub fn router(self) -> Router {
        let state = Arc::new(self);
        let mut router = Router::new()
            .route("/", get(pages::overview::page))
            .route("/jobs", get(pages::jobs::page))
            .route("/jobs/{id}", get(pages::job::page))
            .route("/jobs/{id}/payload", get(pages::job::payload))
            .route("/assets/{file}", get(layout::asset))
            .route("/login", get(pages::login::form).post(pages::login::submit));
        if !state.read_only {
            router = router.route("/action", post(pages::action::submit));
        }
        router
            .fallback(layout::not_found)
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                security::guard,
            ))
            .with_state(state)
    }
}

impl Dashboard {
    /// Serves the dashboard on `listener` until `shutdown` completes (requests under
    /// way finish first).
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }
}

/// What every handler shares.
pub(crate) type Shared = Arc<Dashboard>;
