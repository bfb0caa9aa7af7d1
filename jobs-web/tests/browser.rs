//! The dashboard in a real browser: headless Chromium driven through chromedriver
//! (Debian's `chromium` and `chromium-driver`; `.ci/run` installs them). An operator
//! finds a failed job from the overview, reads its error, retries it and confirms;
//! pauses and resumes a kind; a payload, key, kind and error holding markup render
//! inert; the page refreshes itself in place; every link leads to a page of the
//! dashboard, mounted under a prefix and at the root. Without Chromium or chromedriver the tests
//! pass as skipped, saying so, unless `JOBS_REQUIRE_ALL_TESTS` is set (as `.ci/run`
//! does): then they fail.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use fantoccini::{Client, ClientBuilder, Locator};
use jobs_web::Dashboard;
use sqlx::PgPool;

/// A chromedriver process and a headless Chromium session through it.
struct Browser {
    client: Client,
    driver: tokio::process::Child,
}

impl Drop for Browser {
    /// Chromedriver runs in a process group of its own, which the browser it starts
    /// joins: a test that panics before [`Browser::close`] still leaves no browser
    /// behind.
    fn drop(&mut self) {
        if let Some(pid) = self.driver.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
        }
    }
}

/// The program named by the variable `var`, or at the usual Debian path.
fn program(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// Chromium and chromedriver, or `None` when one is missing and the test is to be
/// skipped: it says so and how to install them. Under `JOBS_REQUIRE_ALL_TESTS` (which
/// `.ci/run` sets) a missing program fails the test instead, so that nothing is skipped
/// there.
fn programs() -> Option<(String, String)> {
    let chromedriver = program("JOBS_WEB_CHROMEDRIVER", "/usr/bin/chromedriver");
    let chromium = program("JOBS_WEB_CHROMIUM", "/usr/bin/chromium");
    for path in [&chromedriver, &chromium] {
        if !std::path::Path::new(path).exists() {
            let why = format!(
                "{path} is missing: the browser tests need Chromium and chromedriver \
                 (`apt-get install chromium chromium-driver`; .ci/run installs them), or \
                 JOBS_WEB_CHROMIUM and JOBS_WEB_CHROMEDRIVER naming them"
            );
            if require_all_tests() {
                panic!("{why} (JOBS_REQUIRE_ALL_TESTS is set: nothing may be skipped)");
            }
            println!("skipped: {why}");
            return None;
        }
    }
    Some((chromium, chromedriver))
}

/// Whether `JOBS_REQUIRE_ALL_TESTS` is set (to anything but empty or `0`).
fn require_all_tests() -> bool {
    std::env::var("JOBS_REQUIRE_ALL_TESTS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A browser with JavaScript on, or `None` if the test is skipped (see [`programs`]).
async fn browser() -> Option<Browser> {
    launch(true).await
}

/// A browser with JavaScript on or off, or `None` if the test is skipped.
async fn launch(javascript: bool) -> Option<Browser> {
    let (chromium, chromedriver) = programs()?;
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().unwrap().port()
    };
    let driver = tokio::process::Command::new(&chromedriver)
        .arg(format!("--port={port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .process_group(0)
        .spawn()
        .expect("start chromedriver");
    let url = format!("http://127.0.0.1:{port}");
    let profile = std::env::temp_dir().join(format!("jobs-web-chromium-{}", uuid::Uuid::new_v4()));
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_owned(),
        serde_json::json!({
            "binary": chromium,
            "prefs": {
                "profile.managed_default_content_settings.javascript": if javascript { 1 } else { 2 },
            },
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    // chromedriver takes a moment to listen; the limit only guards against a hang.
    let mut last_error = String::new();
    for _ in 0..300 {
        match ClientBuilder::rustls()
            .expect("a TLS connector")
            .capabilities(capabilities.clone())
            .connect(&url)
            .await
        {
            Ok(client) => {
                return Some(Browser { client, driver });
            }
            Err(e) => last_error = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no browser session through chromedriver at {url}: {last_error}");
}

/// Serves `dashboard` on a loopback port of its own; returns its base URL.
async fn serve(dashboard: Dashboard) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(dashboard.serve(listener, std::future::pending()));
    format!("http://{addr}")
}

impl Browser {
    /// Runs `act` on `css`'s element; a page that refreshes itself may replace the
    /// element between finding it and acting on it, or navigate while it is being
    /// looked for (the browser then aborts the search), and then it is found again.
    async fn on<T, F, Fut>(&self, css: &str, act: F) -> T
    where
        F: Fn(fantoccini::elements::Element) -> Fut,
        Fut: std::future::Future<Output = Result<T, fantoccini::error::CmdError>>,
    {
        let mut last = String::new();
        for _ in 0..20 {
            let found = self
                .client
                .wait()
                .at_most(Duration::from_secs(30))
                .for_element(Locator::Css(css))
                .await;
            let element = match found {
                Ok(element) => element,
                Err(e @ fantoccini::error::CmdError::WaitTimeout) => {
                    panic!("no `{css}` on the page: {e}")
                }
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            match act(element).await {
                Ok(value) => return value,
                Err(e) => last = e.to_string(),
            }
        }
        panic!("`{css}` kept going stale: {last}");
    }

    async fn click(&self, css: &str) {
        self.on(css, |e| async move { e.click().await.map(drop) })
            .await
    }

    async fn text(&self, css: &str) -> String {
        self.on(css, |e| async move { e.text().await }).await
    }

    async fn script(&self, js: &str) -> serde_json::Value {
        self.client.execute(js, vec![]).await.expect("run a script")
    }

    async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_operator_finds_a_failed_job_reads_its_error_and_retries_it(pool: PgPool) {
    insert(&pool, "mail.send", "done", None).await;
    let id = insert(
        &pool,
        "mail.send",
        "failed",
        Some("smtp: 550 mailbox unavailable"),
    )
    .await;
    let base = serve(Dashboard::new(pool.clone())).await;
    let Some(b) = browser().await else {
        return;
    };

    b.client.goto(&base).await.unwrap();
    b.click("tr[data-kind='mail.send'] td.bad a").await;
    b.click(&format!("tr[data-id='{id}'] a")).await;
    let error = b.text("pre.error-text").await;
    assert_eq!(error, "smtp: 550 mailbox unavailable");

    b.click("button[data-action='retry']").await;
    let question = b.text("p.question").await;
    assert!(
        question.starts_with(&format!("Retry job {id}?")),
        "{question}"
    );
    assert_eq!(
        state_of(&pool, id).await.as_deref(),
        Some("failed"),
        "not before confirming"
    );
    b.click("#confirm").await;
    assert_eq!(
        b.text("#outcome").await,
        format!("job {id} is pending again, claimable now")
    );
    assert_eq!(state_of(&pool, id).await.as_deref(), Some("pending"));

    // Back on the job's page, it shows pending and offers a cancel instead.
    b.click(&format!("main a[href$='/jobs/{id}']")).await;
    assert_eq!(b.text("h1 .badge").await, "pending");
    b.close().await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_operator_pauses_and_resumes_a_kind(pool: PgPool) {
    insert(&pool, "report.build", "pending", None).await;
    let base = serve(Dashboard::new(pool.clone())).await;
    let Some(b) = browser().await else {
        return;
    };

    b.client.goto(&base).await.unwrap();
    b.click("tr[data-kind='report.build'] button[data-action='pause']")
        .await;
    assert!(
        b.text("p.question")
            .await
            .starts_with("Pause kind `report.build`?")
    );
    assert!(!paused(&pool, "report.build").await);
    b.click("#confirm").await;
    assert_eq!(
        b.text("#outcome").await,
        "kind `report.build` paused: runtimes stop claiming it within their poll interval"
    );
    assert!(paused(&pool, "report.build").await);

    b.client.goto(&base).await.unwrap();
    assert!(
        b.text("tr[data-kind='report.build'] td")
            .await
            .contains("paused")
    );
    // Resuming loses nothing: no question.
    b.click("tr[data-kind='report.build'] button[data-action='resume']")
        .await;
    assert_eq!(b.text("#outcome").await, "kind `report.build` resumed");
    assert!(!paused(&pool, "report.build").await);
    b.close().await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn markup_from_the_table_renders_inert(pool: PgPool) {
    let script = "<script>window.__pwned = 1</script>";
    let image = "<img src=x onerror=\"window.__pwned = 2\">";
    let id = insert_with(
        &pool,
        &format!("evil{script}"),
        Some(image),
        "failed",
        Some(&format!("{script}{image}")),
        serde_json::json!({ "html": script, "img": image }),
    )
    .await;
    let base = serve(Dashboard::new(pool.clone())).await;
    let Some(b) = browser().await else {
        return;
    };
    for path in [
        "/".to_owned(),
        "/jobs?state=failed".to_owned(),
        format!("/jobs/{id}"),
    ] {
        b.client.goto(&format!("{base}{path}")).await.unwrap();
        // Let an image's error handler run, if one had been created.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pwned = b
            .script("return window.__pwned === undefined ? null : window.__pwned")
            .await;
        assert_eq!(
            pwned,
            serde_json::Value::Null,
            "{path}: markup from the table ran"
        );
        let injected = b
            .script("return document.querySelectorAll('main script, main img').length")
            .await;
        assert_eq!(
            injected,
            serde_json::json!(0),
            "{path}: markup became elements"
        );
        let text = b.text("main").await;
        assert!(
            text.contains("<script>window.__pwned = 1</script>"),
            "{path}: shown as text: {text}"
        );
    }
    b.close().await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn pages_refresh_in_place_and_the_theme_switches(pool: PgPool) {
    insert(&pool, "mail.send", "failed", Some("first")).await;
    let base = serve(Dashboard::new(pool.clone()).refresh_seconds(1)).await;
    let Some(b) = browser().await else {
        return;
    };
    b.client.goto(&base).await.unwrap();
    assert_eq!(b.text("tr[data-kind='mail.send'] td.bad").await, "1");
    // A mark on the window: a reload would lose it, an in-place refresh keeps it.
    b.script("window.__mark = 'kept'; return null").await;
    insert(&pool, "mail.send", "failed", Some("second")).await;
    let mut seen = String::new();
    for _ in 0..300 {
        seen = b.text("tr[data-kind='mail.send'] td.bad").await;
        if seen == "2" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, "2", "the count refreshed");
    assert_eq!(
        b.script("return window.__mark").await,
        serde_json::json!("kept")
    );

    // The refresh can be paused; the switch says so.
    b.click("#live-toggle").await;
    assert_eq!(b.text("#live-toggle").await, "Resume refresh");

    // The theme switch sets the theme and remembers it.
    b.click("#theme-toggle").await;
    let theme = b
        .script("return document.documentElement.getAttribute('data-theme')")
        .await;
    assert!(theme == "dark" || theme == "light", "{theme}");
    b.client.goto(&base).await.unwrap();
    let again = b
        .script("return document.documentElement.getAttribute('data-theme')")
        .await;
    assert_eq!(theme, again, "remembered across pages");
    b.close().await;
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn with_javascript_off_every_page_reads_the_same(pool: PgPool) {
    let id = insert(
        &pool,
        "mail.send",
        "failed",
        Some("smtp: 550 mailbox unavailable"),
    )
    .await;
    let base = serve(Dashboard::new(pool.clone()).refresh_seconds(1)).await;
    let Some(b) = launch(false).await else {
        return;
    };
    b.client.goto(&base).await.unwrap();
    let ran = b.script("return 1").await;
    // WebDriver's own scripts still run; the page's do not: its switches stay hidden.
    assert_eq!(ran, serde_json::json!(1));
    let hidden = b
        .script("return document.getElementById('live-toggle').hidden")
        .await;
    assert_eq!(
        hidden,
        serde_json::json!(true),
        "the page's script did not run"
    );
    b.click("tr[data-kind='mail.send'] td.bad a").await;
    b.click(&format!("tr[data-id='{id}'] a")).await;
    assert_eq!(
        b.text("pre.error-text").await,
        "smtp: 550 mailbox unavailable"
    );
    // The forms work without a script too: the confirmation is a page.
    b.click("button[data-action='retry']").await;
    b.click("#confirm").await;
    assert_eq!(
        b.text("#outcome").await,
        format!("job {id} is pending again, claimable now")
    );
    assert_eq!(state_of(&pool, id).await.as_deref(), Some("pending"));
    b.close().await;
}

/// Serves the dashboard nested under `prefix` in an application's router (at the root
/// when empty); returns the dashboard's URL.
async fn serve_under(pool: &PgPool, prefix: &str) -> String {
    let dashboard = Dashboard::new(pool.clone()).router();
    let app = if prefix.is_empty() {
        dashboard
    } else {
        axum::Router::new()
            .route("/", axum::routing::get(|| async { "the application" }))
            .nest(prefix, dashboard)
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}{prefix}")
}

/// Every link the browser finds on every page it reaches from the overview leads to a
/// page of the dashboard, with the dashboard mounted under a prefix and at the root: the
/// links are resolved by the browser itself, as an operator's clicks are (the brand,
/// "Overview" and the chart's ranges once led under a prefix to its home with a slash,
/// which answered 404).
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn every_link_leads_to_a_page_under_a_prefix_and_at_the_root(pool: PgPool) {
    insert(&pool, "mail.send", "done", None).await;
    insert(&pool, "mail.send", "failed", Some("smtp down")).await;
    insert(&pool, "report.build", "pending", None).await;
    let Some(b) = browser().await else {
        return;
    };
    for prefix in ["/admin/jobs", ""] {
        let base = serve_under(&pool, prefix).await;
        let mut seen = std::collections::BTreeSet::new();
        let mut next = vec![base.clone()];
        while let Some(url) = next.pop() {
            if !seen.insert(url.clone()) || seen.len() > 80 {
                continue;
            }
            b.client.goto(&url).await.unwrap();
            // A page of the dashboard has its brand link; a 404 has an empty body.
            let brand = b
                .script("const a = document.querySelector('a.brand'); return a && a.href")
                .await;
            assert!(
                brand.is_string(),
                "{url} is not a page of the dashboard: {}",
                b.script("return document.body.innerText").await
            );
            let links = b
                .script("return Array.from(document.links, a => a.href.split('#')[0])")
                .await;
            for link in links.as_array().unwrap() {
                let link = link.as_str().unwrap().to_owned();
                assert!(
                    link.starts_with(&base),
                    "{url} links {link}, outside the dashboard at {base}"
                );
                next.push(link);
            }
        }
        assert!(
            seen.len() >= 5,
            "only {} pages reached: {seen:?}",
            seen.len()
        );
    }
    b.close().await;
}
