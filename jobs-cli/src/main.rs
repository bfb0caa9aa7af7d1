//! `jobs`: the operators' command for a `jobs` database. See [`jobs::admin`] for what each
//! subcommand does to the job table.
//!
//! Exit codes: 0 done, 1 the operation failed (an unknown id, a database error), 2 a
//! usage error, 3 the database cannot be reached.

mod args;
mod output;

use std::io::Write as _;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use clap::Parser;
use jobs::admin::{self, ListFilter, Order};
use jobs_web::{Action, ActionError};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection as _};

use args::{Cli, Command};

/// Why the command failed, and its exit code.
#[derive(Debug)]
enum Failure {
    /// The operation failed: 1.
    Operation(String),
    /// The command line is incomplete: 2.
    Usage(String),
    /// The database cannot be reached: 3.
    Connect(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Failure::Operation(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Connect(_) => 3,
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::Operation(m) | Failure::Usage(m) | Failure::Connect(m) => m,
        }
    }
}

impl From<jobs::Error> for Failure {
    fn from(e: jobs::Error) -> Self {
        Failure::Operation(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {}", failure.message());
            ExitCode::from(failure.code())
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let Some(url) = cli.database_url.as_deref() else {
        return Err(Failure::Usage(
            "no database given: set DATABASE_URL or pass --database-url".to_owned(),
        ));
    };
    if let Command::Web {
        listen,
        token,
        read_only,
        trust_forwarded_host,
        pool_size,
    } = cli.command
    {
        return web(
            url,
            cli.connect_timeout,
            listen,
            token,
            (read_only, trust_forwarded_host),
            pool_size,
        )
        .await;
    }
    let mut conn = connect(url, cli.connect_timeout).await?;
    let result = execute(&mut conn, cli.command).await;
    let _ = conn.close().await;
    result
}

/// Serves the dashboard until Ctrl-C (or SIGTERM).
async fn web(
    url: &str,
    timeout: Duration,
    listen: std::net::SocketAddr,
    token: Option<String>,
    (read_only, trust_forwarded_host): (bool, bool),
    pool_size: u32,
) -> Result<(), Failure> {
    let token = token.filter(|t| !t.is_empty());
    if !listen.ip().is_loopback() && token.is_none() {
        return Err(Failure::Usage(format!(
            "refusing to serve the dashboard on {listen} without an access token: anyone who reaches that address could retry, cancel and discard jobs. Pass --token (or set JOBS_WEB_TOKEN), or listen on a loopback address such as 127.0.0.1:8080"
        )));
    }
    // One connection first: a wrong URL or an unreachable database fails now, with the
    // same messages as every other subcommand.
    connect(url, timeout).await?.close().await.ok();
    let (options, _) = connect_options(url)?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(timeout)
        .connect_lazy_with(options);
    let mut dashboard = jobs_web::Dashboard::new(pool)
        .read_only(read_only)
        .trust_forwarded_host(trust_forwarded_host);
    if let Some(token) = token {
        dashboard = dashboard.token(token);
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Failure::Operation(format!("cannot listen on {listen}: {e}")))?;
    let bound = listener.local_addr().unwrap_or(listen);
    print(&format!(
        "dashboard at http://{bound}/{} (Ctrl-C stops)\n",
        if read_only { " (read-only)" } else { "" }
    ));
    dashboard
        .serve(listener, stop_signal())
        .await
        .map_err(|e| Failure::Operation(format!("the dashboard stopped: {e}")))
}

/// Ctrl-C, or SIGTERM where there is one.
async fn stop_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// A URL's connection options, and how messages name its target (host, port,
/// database and user, never the password).
fn connect_options(url: &str) -> Result<(PgConnectOptions, String), Failure> {
    let redact = |text: String| match password(url) {
        Some(secret) if !secret.is_empty() => text.replace(secret, "***"),
        _ => text,
    };
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    if let Some(scheme) = scheme.filter(|s| !matches!(*s, "postgres" | "postgresql")) {
        return Err(Failure::Connect(format!(
            "cannot connect to the database: the URL's scheme is `{scheme}://`; a PostgreSQL URL starts with postgres:// or postgresql://"
        )));
    }
    let options = PgConnectOptions::from_str(url).map_err(|e| {
        Failure::Connect(redact(format!(
            "cannot connect to the database: the URL is not a valid PostgreSQL URL ({e})"
        )))
    })?;
    let options = options.disable_statement_logging();
    let target = format!(
        "{}:{} (database `{}`, user `{}`)",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or(options.get_username()),
        options.get_username()
    );
    Ok((options, target))
}

/// Opens the one connection the command uses. Messages name the host, port, database
/// and user, never the password.
async fn connect(url: &str, timeout: Duration) -> Result<PgConnection, Failure> {
    let redact = |text: String| match password(url) {
        Some(secret) if !secret.is_empty() => text.replace(secret, "***"),
        _ => text,
    };
    let (options, target) = connect_options(url)?;
    match tokio::time::timeout(timeout, PgConnection::connect_with(&options)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => {
            // The server's message only: sqlx's display of it ends in the source line
            // of PostgreSQL that raised it ("... at line 948").
            let why = match &e {
                sqlx::Error::Database(db) => db.message().to_owned(),
                other => other.to_string(),
            };
            Err(Failure::Connect(redact(format!(
                "cannot connect to the database at {target}: {why}"
            ))))
        }
        Err(_) => Err(Failure::Connect(format!(
            "cannot connect to the database at {target}: no answer within {}",
            output::human(timeout)
        ))),
    }
}

/// The versions of the job table's migrations already applied (none if there is no
/// history yet).
async fn applied_migrations(conn: &mut PgConnection) -> Result<Vec<i64>, Failure> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_jobs_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await
        .map_err(jobs::Error::from)?;
    if !exists {
        return Ok(Vec::new());
    }
    Ok(
        sqlx::query_scalar("SELECT version FROM _jobs_migrations WHERE success")
            .fetch_all(&mut *conn)
            .await
            .map_err(jobs::Error::from)?,
    )
}

/// The password in a URL's user info (`scheme://user:password@host/...`), as written.
fn password(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let userinfo = &authority[..authority.rfind('@')?];
    userinfo.split_once(':').map(|(_, secret)| secret)
}

async fn execute(conn: &mut PgConnection, command: Command) -> Result<(), Failure> {
    match command {
        Command::Migrate => {
            let before = applied_migrations(conn).await?;
            jobs::MIGRATOR
                .run(&mut *conn)
                .await
                .map_err(jobs::Error::from)?;
            let mut applied = Vec::new();
            for m in jobs::MIGRATOR.iter() {
                if !before.contains(&m.version) {
                    applied.push(format!("{} ({})", m.version, m.description));
                }
            }
            if applied.is_empty() {
                print("nothing to apply: the job table is up to date\n");
            } else {
                print(&format!("applied migration {}\n", applied.join(", ")));
            }
        }
        Command::Stats { json } => {
            let stats = admin::stats(&mut *conn).await?;
            if json {
                print(&lines(stats.iter().map(output::stats_json)));
            } else if stats.is_empty() {
                print("no jobs\n");
            } else {
                print(&output::stats_table(&stats));
            }
        }
        Command::History { kind, since, json } => {
            let rows = admin::history(&mut *conn, kind.as_deref(), since).await?;
            if json {
                print(&lines(rows.iter().map(output::minute_json)));
            } else if rows.is_empty() {
                print(&format!(
                    "no runs recorded in the last {}\n",
                    output::human(since)
                ));
            } else {
                print(&output::history_table(&rows));
            }
        }
        Command::List {
            state,
            kind,
            limit,
            after,
            oldest,
            json,
        } => {
            let mut filter = ListFilter::new().limit(limit).order(if oldest {
                Order::OldestFirst
            } else {
                Order::NewestFirst
            });
            if let Some(state) = state {
                filter = filter.state(state.into());
            }
            if let Some(kind) = kind {
                filter = filter.kind(kind);
            }
            if let Some(after) = after {
                filter = filter.after(after);
            }
            let rows = admin::list(&mut *conn, &filter).await?;
            if json {
                print(&lines(rows.iter().map(output::job_json)));
            } else if rows.is_empty() {
                print("no jobs match\n");
            } else {
                print(&output::jobs_table(&rows));
                if rows.len() as i64 == limit
                    && let Some(last) = rows.last()
                {
                    eprintln!("(more may follow: --after {})", last.id);
                }
            }
        }
        Command::Show { id, json } => {
            let Some(job) = admin::get(&mut *conn, id).await? else {
                return Err(no_job(id));
            };
            if json {
                print(&lines([output::job_json(&job)]));
            } else {
                print(&output::job_detail(&job));
            }
        }
        Command::Why { id, json } => {
            let Some(why) = admin::explain(&mut *conn, id).await? else {
                return Err(no_job(id));
            };
            if json {
                print(&lines([output::why_json(&why)]));
            } else {
                print(&output::why_text(&why));
            }
        }
        Command::Retry { id: Some(id), .. } => act(conn, Action::Retry(id)).await?,
        Command::Retry { id: None, kind } => {
            act(conn, Action::RetryKind(kind.unwrap_or_default())).await?
        }
        Command::Cancel { id } => act(conn, Action::Cancel(id)).await?,
        Command::Runtimes { json } => {
            let runtimes = admin::runtimes(&mut *conn).await?;
            if json {
                print(&lines(runtimes.iter().map(output::runtime_json)));
            } else if runtimes.is_empty() {
                print("no runtime registered\n");
            } else {
                print(&output::runtimes_table(&runtimes));
            }
        }
        Command::Pause { kind, force: false } => act(conn, Action::Pause(kind)).await?,
        Command::Pause { kind, force: true } => {
            let running = jobs::admin::pause_forced(&mut *conn, &kind).await?;
            print(&format!(
                "{}\n",
                output::clean(&jobs_web::pause_outcome(&kind, running))
            ));
        }
        Command::Resume { kind } => act(conn, Action::Resume(kind)).await?,
        Command::Discard { id } => act(conn, Action::Discard(id)).await?,
        Command::Limits {
            kind,
            concurrency,
            rate,
            clear,
            json,
        } => {
            let mut set = admin::KindLimits::default();
            set.concurrency = concurrency;
            set.rate = rate.map(|(starts, per)| jobs::Rate { starts, per });
            limits(conn, kind, set, clear, json).await?
        }
        Command::Web { .. } => unreachable!("served by `web`, before a connection is opened"),
        Command::Prune {
            older_than,
            kind,
            batch,
        } => {
            let n = admin::prune(&mut *conn, kind.as_deref(), older_than, batch).await?;
            print(&format!(
                "{n} done job{} older than {} deleted\n",
                plural(n),
                output::human(older_than)
            ));
        }
    }
    Ok(())
}

/// No row for job `id`: never enqueued, or done and deleted (its kind keeps no
/// history), or pruned.
fn no_job(id: i64) -> Failure {
    Failure::Operation(format!(
        "no job with id {id} (a job that succeeded is deleted at once unless its \
         kind keeps history: #[job(retain = \"7d\")])"
    ))
}

/// Runs an operator's action (the dashboard's buttons run the same) and prints what it
/// did.
async fn act(conn: &mut PgConnection, action: Action) -> Result<(), Failure> {
    match jobs_web::perform(conn, &action).await {
        Ok(message) => {
            print(&format!("{}\n", output::clean(&message)));
            Ok(())
        }
        Err(ActionError::Refused(message)) => Err(Failure::Operation(output::clean(&message))),
        Err(e) => Err(Failure::Operation(e.to_string())),
    }
}

/// `jobsctl limits`: sets or clears a kind's limits, then shows them (every kind an
/// operator has limited, without a kind).
async fn limits(
    conn: &mut PgConnection,
    kind: Option<String>,
    set: admin::KindLimits,
    clear: bool,
    json: bool,
) -> Result<(), Failure> {
    let Some(kind) = kind else {
        if set != admin::KindLimits::default() || clear {
            return Err(Failure::Usage(
                "name the kind whose limits to change: jobsctl limits KIND --concurrency N"
                    .to_owned(),
            ));
        }
        let rows = admin::limits(&mut *conn).await?;
        if json {
            print(&lines(rows.iter().map(output::limits_json)));
        } else if rows.is_empty() {
            print(
                "no kind has limits set by an operator (a kind's own global_concurrency attribute is not stored in the database)\n",
            );
        } else {
            print(&output::limits_table(&rows));
        }
        return Ok(());
    };
    if clear {
        let was = admin::clear_limits(&mut *conn, &kind).await?;
        let message = if was {
            format!(
                "limits of `{kind}` cleared: its own attribute applies again, within the runtimes' poll interval"
            )
        } else {
            format!("`{kind}` had no limits set by an operator")
        };
        print(&format!("{}\n", output::clean(&message)));
        return Ok(());
    }
    if set != admin::KindLimits::default() {
        admin::set_limits(&mut *conn, &kind, set).await?;
        let mut what = Vec::new();
        if let Some(n) = set.concurrency {
            what.push(format!("at most {n} running at once"));
        }
        if let Some(r) = set.rate {
            what.push(format!(
                "at most {} starts per {}",
                r.starts,
                output::human(r.per)
            ));
        }
        print(&format!(
            "{}\n",
            output::clean(&format!(
                "`{kind}`: {} across every runtime, within the runtimes' poll interval",
                what.join(" and ")
            ))
        ));
        return Ok(());
    }
    let rows: Vec<_> = admin::limits(&mut *conn)
        .await?
        .into_iter()
        .filter(|r| r.kind == kind)
        .collect();
    if json {
        print(&lines(rows.iter().map(output::limits_json)));
    } else if rows.is_empty() {
        print(&format!(
            "{}\n",
            output::clean(&format!("`{kind}` has no limits set by an operator"))
        ));
    } else {
        print(&output::limits_table(&rows));
    }
    Ok(())
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// JSON values, one per line.
fn lines(values: impl IntoIterator<Item = serde_json::Value>) -> String {
    values.into_iter().map(|v| format!("{v}\n")).collect()
}

/// Writes to stdout; a reader that went away (`jobsctl list | head`) ends the command
/// quietly.
fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    if out
        .write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

#[cfg(test)]
mod tests {
    use super::password;

    #[test]
    fn finds_the_password_of_a_url() {
        assert_eq!(password("postgres://u:s3cret@h:5432/db"), Some("s3cret"));
        assert_eq!(password("postgres://u:p@ss@h/db"), Some("p@ss"));
        assert_eq!(password("postgres://u@h/db"), None);
        assert_eq!(password("postgres://h/db?user=x"), None);
        assert_eq!(password("not a url"), None);
    }
}
