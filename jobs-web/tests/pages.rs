//! The dashboard's pages and actions over HTTP, against a real database: what each page
//! shows, keyset paging, forgery protection, the access token, read-only mode and
//! mounting under a prefix. (tests/browser.rs drives the same pages in Chromium.)

mod common;

use axum::Router;
use axum::http::StatusCode;
use common::*;
use jobs_web::Dashboard;
use sqlx::PgPool;

fn app(pool: &PgPool) -> Router {
    Dashboard::new(pool.clone()).router()
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_overview_counts_each_kind_by_state(pool: PgPool) {
    for _ in 0..3 {
        insert(&pool, "mail.send", "pending", None).await;
    }
    insert(&pool, "mail.send", "failed", Some("smtp down")).await;
    insert(&pool, "mail.send", "done", None).await;
    insert(&pool, "report.build", "running", None).await;
    insert(&pool, "report.build", "cancelled", None).await;
    jobs::admin::pause_forced(&pool, "idle.kind").await.unwrap();
    sqlx::query(
        "INSERT INTO jobs_runtimes (id, host, pid, version, kinds, concurrency)
         VALUES (gen_random_uuid(), 'h', 1, '0', ARRAY['mail.send', 'new.kind'], 4)",
    )
    .execute(&pool)
    .await
    .unwrap();

    let page = get(&app(&pool), "/", None).await;
    assert_eq!(page.status, StatusCode::OK);
    let row = |kind: &str| {
        let start = page
            .body
            .find(&format!("<tr data-kind=\"{kind}\""))
            .unwrap_or_else(|| panic!("a row for {kind}: {}", page.body));
        let end = page.body[start..].find("</tr>").unwrap() + start;
        page.body[start..end].to_owned()
    };
    let mail = row("mail.send");
    assert!(
        mail.contains("state=pending&amp;order=run\">3</a>"),
        "{mail}"
    );
    assert!(mail.contains("state=failed\">1</a>"), "{mail}");
    assert!(mail.contains("state=done\">1</a>"), "{mail}");
    assert!(mail.contains("data-action=\"retry-kind\""), "{mail}");
    let report = row("report.build");
    assert!(report.contains("state=running\">1</a>"), "{report}");
    assert!(report.contains("state=cancelled\">1</a>"), "{report}");
    assert!(
        !report.contains("retry-kind"),
        "no failed job, no retry-all: {report}"
    );
    let new = row("new.kind");
    assert!(
        new.contains("data-action=\"pause\""),
        "a claimed kind without jobs: {new}"
    );
    let idle = row("idle.kind");
    assert!(idle.contains("paused"), "{idle}");
    assert!(idle.contains("data-action=\"resume\""), "{idle}");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_overview_shows_the_limits_operators_set_beside_the_running_count(pool: PgPool) {
    insert(&pool, "llm.embed", "running", None).await;
    insert(&pool, "llm.embed", "running", None).await;
    jobs::admin::set_limits(
        &pool,
        "llm.embed",
        jobs::admin::KindLimits::default()
            .concurrency(8)
            .rate(600, std::time::Duration::from_secs(60)),
    )
    .await
    .unwrap();
    // A kind with a limit and no job yet shows too.
    jobs::admin::set_limits(
        &pool,
        "webhook.deliver",
        jobs::admin::KindLimits::default().concurrency(1),
    )
    .await
    .unwrap();
    let page = get(&app(&pool), "/", None).await;
    assert_eq!(page.status, StatusCode::OK);
    let row = |kind: &str| {
        let start = page
            .body
            .find(&format!("<tr data-kind=\"{kind}\""))
            .unwrap_or_else(|| panic!("a row for {kind}: {}", page.body));
        let end = page.body[start..].find("</tr>").unwrap() + start;
        page.body[start..end].to_owned()
    };
    let embed = row("llm.embed");
    assert!(embed.contains("state=running\">2</a>"), "{embed}");
    assert!(embed.contains(" / 8"), "{embed}");
    assert!(embed.contains("limit 8"), "{embed}");
    assert!(embed.contains("rate 600/1m"), "{embed}");
    let webhook = row("webhook.deliver");
    assert!(webhook.contains("limit 1"), "{webhook}");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn counts_stop_at_the_cap(pool: PgPool) {
    sqlx::query(
        "INSERT INTO jobs (kind, state, max_attempts, payload, finished_at)
         SELECT 'bulk', 'done', 1, '{}', now() FROM generate_series(1, $1)",
    )
    .bind(jobs_web::COUNT_CAP as i32 + 5)
    .execute(&pool)
    .await
    .unwrap();
    let page = get(&app(&pool), "/", None).await;
    assert!(
        page.body
            .contains(&format!("state=done\">{}+</a>", jobs_web::COUNT_CAP)),
        "{}",
        page.body
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_job_page_shows_payload_attempts_and_times(pool: PgPool) {
    let id = insert_with(
        &pool,
        "mail.send",
        Some("user-7"),
        "failed",
        Some("smtp: 421 try later"),
        serde_json::json!({"to": "a@example.com", "n": 7}),
    )
    .await;
    let page = get(&app(&pool), &format!("/jobs/{id}"), None).await;
    assert_eq!(page.status, StatusCode::OK);
    for expected in [
        "&quot;to&quot;: &quot;a@example.com&quot;",
        "smtp: 421 try later",
        "Attempt 3",
        "user-7",
        "3 of 3",
        "data-action=\"retry\"",
        "data-action=\"discard\"",
        "Finished",
    ] {
        assert!(page.body.contains(expected), "{expected}: {}", page.body);
    }
    assert!(
        !page.body.contains("data-action=\"cancel\""),
        "a failed job cannot be cancelled"
    );

    let missing = get(&app(&pool), "/jobs/999999", None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.body.contains("There is no job 999999"));
    let bad = get(&app(&pool), "/jobs/abc", None).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

/// A done job's page shows its handler's output (a kind that keeps done rows).
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_done_jobs_page_shows_its_output(pool: PgPool) {
    let id = insert(&pool, "video.transcode", "done", None).await;
    sqlx::query(
        "UPDATE jobs SET output = '{\"url\": \"https://cdn.example/1080.mp4\"}' WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    let page = get(&app(&pool), &format!("/jobs/{id}"), None).await;
    assert!(page.body.contains("<h2>Output</h2>"), "{}", page.body);
    assert!(
        page.body.contains("https://cdn.example/1080.mp4"),
        "{}",
        page.body
    );
}

/// A pending job's page says why it waits (`jobs::admin::explain`); another's does not.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_pending_jobs_page_says_why_it_waits(pool: PgPool) {
    let id = insert(&pool, "mail.send", "pending", None).await;
    jobs::admin::pause_forced(&pool, "mail.send").await.unwrap();
    let page = get(&app(&pool), &format!("/jobs/{id}"), None).await;
    assert_eq!(page.status, StatusCode::OK);
    for expected in [
        "Why it waits",
        "<li data-reason=\"paused\">its kind is paused since ",
        "<li data-reason=\"no_runtime\">no runtime claims its kind: none is alive</li>",
    ] {
        assert!(page.body.contains(expected), "{expected}: {}", page.body);
    }
    let failed = insert(&pool, "mail.send", "failed", Some("smtp down")).await;
    let page = get(&app(&pool), &format!("/jobs/{failed}"), None).await;
    assert!(!page.body.contains("Why it waits"));
}

/// The ids on a listing page, in order.
fn ids(body: &str) -> Vec<i64> {
    body.match_indices("<tr data-id=\"")
        .map(|(at, m)| {
            let rest = &body[at + m.len()..];
            rest[..rest.find('"').unwrap()].parse().unwrap()
        })
        .collect()
}

/// The ids of every page of a listing, following its next links from `start`.
async fn every_page(app: &Router, start: &str) -> Vec<i64> {
    let mut seen = Vec::new();
    let mut next = Some(start.to_owned());
    while let Some(url) = next {
        let page = get(app, &url, None).await;
        assert_eq!(page.status, StatusCode::OK, "{url}: {}", page.body);
        seen.extend(ids(&page.body));
        next = next_link(&page.body);
    }
    seen
}

/// The pages that show a job: the overview, its page, the failed list.
fn pages_of(id: i64) -> [String; 3] {
    [
        "/".to_owned(),
        format!("/jobs/{id}"),
        "/jobs?state=failed".to_owned(),
    ]
}

/// The next page's link, unescaped.
fn next_link(body: &str) -> Option<String> {
    let at = body.find("rel=\"next\"")?;
    let start = body[..at].rfind("href=\"")? + 6;
    let end = body[start..].find('"')? + start;
    Some(body[start..end].replace("&amp;", "&"))
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn listings_page_by_keyset_without_gaps_or_repeats(pool: PgPool) {
    let mut failed = Vec::new();
    for i in 0..120 {
        insert(&pool, "a", "done", None).await;
        failed.push(
            insert(
                &pool,
                if i % 2 == 0 { "a" } else { "b" },
                "failed",
                Some("x"),
            )
            .await,
        );
    }
    let app = app(&pool);
    for (start, expected) in [
        ("/jobs?state=failed", failed.clone()),
        (
            "/jobs?state=failed&kind=b",
            failed.iter().copied().skip(1).step_by(2).collect(),
        ),
    ] {
        let seen = every_page(&app, start).await;
        let mut want = expected;
        want.reverse();
        assert_eq!(seen, want, "{start}: newest first, every job once");
    }
    // Unfiltered: every row, newest first.
    let seen = every_page(&app, "/jobs").await;
    assert_eq!(seen.len(), 240);
    assert!(seen.windows(2).all(|w| w[0] > w[1]));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn pending_jobs_list_by_run_time_across_priorities(pool: PgPool) {
    // Run times out of id order, in two priorities.
    let mut expected = Vec::new();
    for i in 0..70i64 {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO jobs (kind, max_attempts, payload, priority, run_after)
             VALUES ('k', 1, '{}', $1, now() + $2 * interval '1 second') RETURNING id",
        )
        .bind((i % 2) as i16)
        .bind((70 - i) as f64)
        .fetch_one(&pool)
        .await
        .unwrap();
        expected.push((70 - i, id));
    }
    expected.sort();
    let expected: Vec<i64> = expected.into_iter().map(|(_, id)| id).collect();
    let app = app(&pool);
    assert_eq!(
        every_page(&app, "/jobs?state=pending&order=run").await,
        expected
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_key_search_reads_a_bounded_window_and_offers_the_next(pool: PgPool) {
    let needle = insert_with(
        &pool,
        "k",
        Some("needle"),
        "done",
        None,
        serde_json::json!({}),
    )
    .await;
    // Push the needle far below the newest ids: a window of the newest ids misses it.
    sqlx::query("SELECT setval(pg_get_serial_sequence('jobs', 'id'), $1)")
        .bind(needle + 120_000)
        .execute(&pool)
        .await
        .unwrap();
    insert(&pool, "k", "done", None).await;
    let app = app(&pool);
    let first = get(&app, "/jobs?key=needle", None).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(ids(&first.body).is_empty());
    assert!(
        first.body.contains("Searched the ids down to"),
        "{}",
        first.body
    );
    let mut url = next_link(&first.body).expect("a link to search older ids");
    let mut found = Vec::new();
    for _ in 0..5 {
        let page = get(&app, &url, None).await;
        found.extend(ids(&page.body));
        match next_link(&page.body) {
            Some(next) => url = next,
            None => break,
        }
    }
    assert_eq!(found, vec![needle]);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_id_search_opens_the_job_and_bad_filters_are_refused(pool: PgPool) {
    let id = insert(&pool, "k", "pending", None).await;
    let app = app(&pool);
    let found = get(&app, &format!("/jobs?id={id}"), None).await;
    assert_eq!(found.status, StatusCode::SEE_OTHER);
    assert_eq!(found.location(), Some(format!("/jobs/{id}").as_str()));
    assert_eq!(
        get(&app, "/jobs?id=x1", None).await.status,
        StatusCode::BAD_REQUEST
    );
    let state = get(&app, "/jobs?state=lost", None).await;
    assert_eq!(state.status, StatusCode::BAD_REQUEST);
    assert!(state.body.contains("`lost` is not a state"));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_action_asks_then_runs_and_says_what_it_did(pool: PgPool) {
    let id = insert(&pool, "mail.send", "failed", Some("smtp down")).await;
    let app = app(&pool);
    let (cookie, csrf) = session(&app, &format!("/jobs/{id}")).await;
    let target = id.to_string();
    let form = [
        ("csrf", csrf.as_str()),
        ("action", "retry"),
        ("target", target.as_str()),
    ];

    let asked = post(&app, "/action", &form, Some(&cookie), &[]).await;
    assert_eq!(asked.status, StatusCode::OK);
    assert!(
        asked.body.contains(&format!("Retry job {id}?")),
        "{}",
        asked.body
    );
    assert!(asked.body.contains("name=\"confirmed\" value=\"yes\""));
    assert_eq!(
        state_of(&pool, id).await.as_deref(),
        Some("failed"),
        "asking changes nothing"
    );

    let mut confirmed = form.to_vec();
    confirmed.push(("confirmed", "yes"));
    let done = post(&app, "/action", &confirmed, Some(&cookie), &[]).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert!(
        done.body
            .contains(&format!("job {id} is pending again, claimable now"))
    );
    assert_eq!(state_of(&pool, id).await.as_deref(), Some("pending"));

    // The same action again: refused, saying why, as the tool does.
    let again = post(&app, "/action", &confirmed, Some(&cookie), &[]).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert!(
        again
            .body
            .contains(&format!("no failed job with id {id} (job {id} is pending)")),
        "{}",
        again.body
    );

    // Resume is not destructive: it runs at once.
    jobs::admin::pause(&pool, "mail.send").await.unwrap();
    let resumed = post(
        &app,
        "/action",
        &[
            ("csrf", csrf.as_str()),
            ("action", "resume"),
            ("target", "mail.send"),
        ],
        Some(&cookie),
        &[],
    )
    .await;
    assert!(
        resumed.body.contains("kind `mail.send` resumed"),
        "{}",
        resumed.body
    );
    assert!(!paused(&pool, "mail.send").await);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_forged_request_changes_nothing(pool: PgPool) {
    let id = insert(&pool, "mail.send", "failed", Some("smtp down")).await;
    let app = app(&pool);
    let (cookie, csrf) = session(&app, "/").await;
    let target = id.to_string();
    let form = |token: &str| {
        vec![
            ("csrf".to_owned(), token.to_owned()),
            ("action".to_owned(), "discard".to_owned()),
            ("target".to_owned(), target.clone()),
            ("confirmed".to_owned(), "yes".to_owned()),
        ]
    };
    // No cookie (another site's POST does not carry it: SameSite=Lax), a token that is
    // not the cookie's, no token at all, and the right token from another origin.
    type Headers<'a> = &'a [(&'a str, &'a str)];
    let evil = [("origin", "https://evil.example")];
    // A cookie the dashboard did not issue (planted from a sibling subdomain, say) with
    // the same value in the form; and a client naming the other site as the forwarded
    // host, which the dashboard does not trust unless told.
    let planted = "0123456789abcdef0123456789abcdef";
    let planted_cookie = format!("jobs_web_csrf={planted}");
    let (nonce, _) = csrf.split_once('.').expect("a signed token");
    let forged = format!("{nonce}.{}", "0".repeat(64));
    let forged_cookie = format!("jobs_web_csrf={forged}");
    let evil_forwarded = [
        ("origin", "https://evil.example"),
        ("x-forwarded-host", "evil.example"),
    ];
    let attempts: [(Option<&str>, _, Headers); 7] = [
        (None, form(&csrf), &[]),
        (Some(&cookie), form(planted), &[]),
        (Some(&cookie), form(""), &[]),
        (Some(&cookie), form(&csrf), &evil),
        (Some(&planted_cookie), form(planted), &[]),
        (Some(&forged_cookie), form(&forged), &[]),
        (Some(&cookie), form(&csrf), &evil_forwarded),
    ];
    for (cookie, form, headers) in attempts {
        let fields: Vec<(&str, &str)> =
            form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let answer = post(&app, "/action", &fields, cookie, headers).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{form:?} {headers:?}");
        assert_eq!(state_of(&pool, id).await.as_deref(), Some("failed"));
    }
    // The genuine one, from the dashboard's own origin, goes through.
    let genuine = form(&csrf);
    let fields: Vec<(&str, &str)> = genuine
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let ok = post(
        &app,
        "/action",
        &fields,
        Some(&cookie),
        &[("origin", "http://dash.test")],
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert_eq!(state_of(&pool, id).await, None, "discarded");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn read_only_shows_no_action_and_refuses_every_change(pool: PgPool) {
    let id = insert(&pool, "mail.send", "failed", Some("smtp down")).await;
    let app = Dashboard::new(pool.clone()).read_only(true).router();
    for path in pages_of(id) {
        let page = get(&app, &path, None).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(
            !page.body.contains("method=\"post\""),
            "{path}: {}",
            page.body
        );
        assert!(page.body.contains("read-only"));
    }
    let (cookie, csrf) = session(&app, "/").await;
    let target = id.to_string();
    let answer = post(
        &app,
        "/action",
        &[
            ("csrf", &csrf),
            ("action", "discard"),
            ("target", &target),
            ("confirmed", "yes"),
        ],
        Some(&cookie),
        &[],
    )
    .await;
    assert!(answer.status.is_client_error(), "{}", answer.status);
    assert_eq!(state_of(&pool, id).await.as_deref(), Some("failed"));
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn an_access_token_guards_every_page_but_the_sign_in(pool: PgPool) {
    let app = Dashboard::new(pool.clone()).token("s3cret-token").router();
    let anonymous = get(&app, "/", None).await;
    assert_eq!(anonymous.status, StatusCode::SEE_OTHER);
    assert_eq!(anonymous.location(), Some("/login"));
    assert_eq!(get(&app, "/jobs", None).await.status, StatusCode::SEE_OTHER);
    assert_eq!(get(&app, "/login", None).await.status, StatusCode::OK);
    assert_eq!(
        get(&app, "/assets/app.css", None).await.status,
        StatusCode::OK
    );
    let refused = post(
        &app,
        "/action",
        &[("action", "pause"), ("target", "k")],
        None,
        &[],
    )
    .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert!(!paused(&pool, "k").await);

    let wrong = post(&app, "/login", &[("token", "guess")], None, &[]).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.cookie("jobs_web_token").is_none());
    let signed = post(&app, "/login", &[("token", "s3cret-token")], None, &[]).await;
    assert_eq!(signed.status, StatusCode::SEE_OTHER);
    let token = signed
        .cookie("jobs_web_token")
        .expect("signing in sets the cookie");
    let cookie = format!("jobs_web_token={token}");
    assert_eq!(get(&app, "/", Some(&cookie)).await.status, StatusCode::OK);
    assert_eq!(
        get(&app, "/", Some("jobs_web_token=s3cret-tokeN"))
            .await
            .status,
        StatusCode::SEE_OTHER
    );

    // A script sends the token as a bearer header.
    use tower::ServiceExt as _;
    let request = axum::http::Request::get("/")
        .header("authorization", "Bearer s3cret-token")
        .body(axum::body::Body::empty())
        .unwrap();
    assert_eq!(
        app.clone().oneshot(request).await.unwrap().status(),
        StatusCode::OK
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn mounted_under_a_prefix_every_link_and_cookie_stays_under_it(pool: PgPool) {
    let id = insert(&pool, "mail.send", "failed", Some("smtp down")).await;
    let app = Router::new()
        .route("/", axum::routing::get(|| async { "the application" }))
        .nest("/admin/jobs", Dashboard::new(pool.clone()).router());
    assert_eq!(get(&app, "/", None).await.body, "the application");
    let page = get(&app, "/admin/jobs", None).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("href=\"/admin/jobs/assets/app.css"));
    assert!(page.body.contains("action=\"/admin/jobs/action\""));
    assert!(
        page.body
            .contains("href=\"/admin/jobs/jobs?kind=mail.send&amp;state=failed\"")
    );
    let cookie = page
        .headers
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap()
        .to_owned();
    assert!(cookie.contains("Path=/admin/jobs"), "{cookie}");
    let job = get(&app, &format!("/admin/jobs/jobs/{id}"), None).await;
    assert_eq!(job.status, StatusCode::OK);
    assert!(job.body.contains("smtp down"));
    assert_eq!(
        get(&app, "/admin/jobs/assets/app.js", None).await.status,
        StatusCode::OK
    );
    // Every link of every page answers, under the prefix and at the root (the brand,
    // "Overview" and the chart's ranges linked `/admin/jobs/`, which answered 404).
    let root = Router::new().merge(Dashboard::new(pool.clone()).router());
    for (app, prefix) in [(&app, "/admin/jobs"), (&root, "")] {
        for page in pages_of(id) {
            let path = match page.as_str() {
                "/" if !prefix.is_empty() => prefix.to_owned(),
                _ => format!("{prefix}{page}"),
            };
            let body = get(app, &path, None).await.body;
            for link in body.split("href=\"").skip(1) {
                let link = link.split('"').next().unwrap().replace("&amp;", "&");
                let home = link == prefix || link.starts_with(&format!("{prefix}?"));
                assert!(
                    home || link.starts_with(&format!("{prefix}/")),
                    "{path}: {link}"
                );
                let followed = get(app, &link, None).await;
                assert_eq!(followed.status, StatusCode::OK, "{path} links {link}");
            }
        }
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn what_the_table_holds_is_escaped_everywhere(pool: PgPool) {
    let evil = "<script>document.title='pwned'</script>";
    let id = insert_with(
        &pool,
        "k<script>x</script>",
        Some("<img src=x onerror=alert(1)>"),
        "failed",
        Some(evil),
        serde_json::json!({"html": evil}),
    )
    .await;
    let app = app(&pool);
    for path in pages_of(id) {
        let page = get(&app, &path, None).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(
            !page.body.contains("<script>document"),
            "{path}: {}",
            page.body
        );
        assert!(!page.body.contains("<img src=x"), "{path}");
        assert!(!page.body.contains("<script>x"), "{path}");
    }
    let job = get(&app, &format!("/jobs/{id}"), None).await;
    assert!(job.body.contains("&lt;script&gt;document.title="));
    // A second wall: the browser runs no script but the dashboard's own, and no other
    // site may frame the page.
    let policy = job.headers["content-security-policy"].to_str().unwrap();
    assert!(policy.contains("default-src 'self'"), "{policy}");
    assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
    assert_eq!(job.headers["x-frame-options"], "DENY");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_chart_adds_up_the_throughput_history_of_its_range(pool: PgPool) {
    // Two kinds in the last hour, one 20 hours ago, one out of every range.
    sqlx::query(
        "INSERT INTO jobs_throughput (kind, minute, succeeded, failed)
         VALUES ('a', date_trunc('minute', now()) - interval '5 minutes', 10, 1),
                ('b', date_trunc('minute', now()) - interval '5 minutes', 5, 0),
                ('a', date_trunc('minute', now()) - interval '20 hours', 100, 7),
                ('a', date_trunc('minute', now()) - interval '2 days', 1000, 70)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let app = app(&pool);
    let hour = get(&app, "/", None).await;
    assert!(
        hour.body.contains("In all: 15 succeeded, 1 failed."),
        "{}",
        hour.body
    );
    assert!(hour.body.contains("Peak 16 per minute"), "{}", hour.body);
    let day = get(&app, "/?hours=24", None).await;
    assert!(
        day.body.contains("In all: 115 succeeded, 8 failed."),
        "{}",
        day.body
    );
    assert!(day.body.contains("Peak 107 per 4 minutes"), "{}", day.body);
    // An unknown range falls back to the default.
    let odd = get(&app, "/?hours=5", None).await;
    assert!(odd.body.contains("In all: 15 succeeded, 1 failed."));
}

#[sqlx::test(migrations = false)]
async fn an_unmigrated_database_says_what_to_run(pool: PgPool) {
    let app = app(&pool);
    for path in ["/", "/jobs", "/jobs?state=failed", "/jobs/1"] {
        let page = get(&app, path, None).await;
        assert_eq!(page.status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert!(
            page.body.contains("<code>jobsctl migrate</code>")
                || page.body.contains("`jobsctl migrate`"),
            "{path}: {}",
            page.body
        );
        assert!(!page.body.contains("did not answer"), "{path}");
    }
    // Half-way: the job table without the tables of later migrations.
    sqlx::raw_sql(include_str!("../../migrations/0001_create_jobs.sql"))
        .execute(&pool)
        .await
        .unwrap();
    let page = get(&app, "/", None).await;
    assert_eq!(page.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(page.body.contains("`jobsctl migrate`"), "{}", page.body);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_job_page_marks_where_a_retry_restarted_the_attempts(pool: PgPool) {
    let id = insert(&pool, "mail.send", "failed", Some("smtp down")).await;
    sqlx::query(
        "UPDATE jobs SET errors = jsonb_build_array( \
           jsonb_build_object('attempt', 1, 'at', now(), 'kind', 'error', 'message', 'a'), \
           jsonb_build_object('attempt', 2, 'at', now(), 'kind', 'error', 'message', 'b'), \
           jsonb_build_object('attempt', 1, 'at', now(), 'kind', 'error', 'message', 'c')) \
         WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    let page = get(&app(&pool), &format!("/jobs/{id}"), None).await;
    assert_eq!(
        page.body.matches("Attempts counted from 1 again").count(),
        1,
        "{}",
        page.body
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_large_payload_is_cut_on_the_job_page_and_served_whole_apart(pool: PgPool) {
    let blob = "y".repeat(2 * 1024 * 1024);
    let id = insert_with(
        &pool,
        "mail.send",
        None,
        "failed",
        Some("too big"),
        serde_json::json!({ "blob": blob }),
    )
    .await;
    let app = app(&pool);
    let page = get(&app, &format!("/jobs/{id}"), None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.len() < 64 * 1024, "{} bytes", page.body.len());
    assert!(
        page.body.contains("more bytes not shown"),
        "{}",
        &page.body[..2000]
    );
    let href = format!("/jobs/{id}/payload");
    assert!(page.body.contains(&format!("href=\"{href}\"")));
    let whole = get(&app, &href, None).await;
    assert_eq!(whole.status, StatusCode::OK);
    let value: serde_json::Value = serde_json::from_str(&whole.body).unwrap();
    assert_eq!(value["blob"].as_str().map(str::len), Some(blob.len()));

    // A small payload is shown whole, with no link.
    let small = insert(&pool, "mail.send", "failed", Some("x")).await;
    let page = get(&app, &format!("/jobs/{small}"), None).await;
    assert!(!page.body.contains("more bytes not shown"));
    assert_eq!(
        get(&app, "/jobs/424242/payload", None).await.status,
        StatusCode::NOT_FOUND
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_planted_forgery_cookie_is_replaced_and_forwarded_hosts_count_only_when_trusted(
    pool: PgPool,
) {
    // A page requested with a cookie the dashboard did not issue gets a token of its
    // own, not the planted one.
    let id = insert(&pool, "mail.send", "failed", Some("smtp down")).await;
    let app = app(&pool);
    let page = get(
        &app,
        &format!("/jobs/{id}"),
        Some("jobs_web_csrf=0123456789abcdef0123456789abcdef"),
    )
    .await;
    let issued = page.cookie("jobs_web_csrf").expect("a fresh token");
    assert_ne!(issued, "0123456789abcdef0123456789abcdef");
    assert!(
        page.body.contains(&format!("value=\"{issued}\"")),
        "{}",
        page.body
    );

    // Behind a proxy that rewrites Host and sets X-Forwarded-Host, told so.
    let behind = Dashboard::new(pool.clone())
        .trust_forwarded_host(true)
        .router();
    let (cookie, csrf) = session(&behind, "/").await;
    let target = id.to_string();
    let fields = [
        ("csrf", csrf.as_str()),
        ("action", "discard"),
        ("target", target.as_str()),
        ("confirmed", "yes"),
    ];
    let proxied = [
        ("origin", "https://jobs.example.com"),
        ("x-forwarded-host", "jobs.example.com"),
    ];
    let ok = post(&behind, "/action", &fields, Some(&cookie), &proxied).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert_eq!(state_of(&pool, id).await, None, "discarded");
}

/// A page whose reads fail part-way drops the reads still in flight (the page answers
/// with the first error). A read dropped while its `BEGIN` was on the wire must not
/// hand its connection back to the pool inside a transaction: the next borrower's
/// statements would run in it, and after its first error every statement on that
/// connection would fail ("current transaction is aborted").
#[sqlx::test(migrations = false)]
async fn failed_pages_leave_no_connection_in_a_transaction(pool: PgPool) {
    let app = app(&pool);
    for _ in 0..200 {
        let page = get(&app, "/", None).await;
        assert_eq!(page.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!page.body.contains("did not answer"), "{}", page.body);
    }
    // Connections go back to the pool in tasks of their own: wait until all are idle.
    while pool.num_idle() < pool.size() as usize {
        tokio::task::yield_now().await;
    }
    let stuck: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stuck, 0, "connections left inside a transaction");
}

/// The README's "Privileges" section: its SQL blocks (the runtime's grants, then the
/// operators'), and the text of its read-only line.
fn readme_privileges() -> (Vec<String>, String) {
    let readme = include_str!("../../README.md");
    let section = readme.split("\n## Privileges\n").nth(1).unwrap();
    let section = section.split("\n## ").next().unwrap();
    let blocks = section
        .split("```sql\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap().to_owned())
        .collect();
    (blocks, section.to_owned())
}

/// A login role named after the test's database, given `grants`, and a pool as it.
async fn role_with(pool: &PgPool, suffix: &str, grants: &str) -> (String, PgPool) {
    let db = pool
        .connect_options()
        .get_database()
        .unwrap()
        .to_lowercase();
    let role: String = format!("{suffix}{db}").chars().take(60).collect();
    let setup = format!(
        "REVOKE ALL ON SCHEMA public FROM PUBLIC; CREATE ROLE {role} LOGIN; {}",
        grants.replace("ROLE", &role)
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(setup))
        .execute(pool)
        .await
        .unwrap();
    let own = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect_with(pool.connect_options().as_ref().clone().username(&role))
        .await
        .unwrap();
    (role, own)
}

async fn drop_role(pool: &PgPool, role: &str, own: PgPool) {
    own.close().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP OWNED BY {role}; DROP ROLE {role}"
    )))
    .execute(pool)
    .await
    .unwrap();
}

/// The dashboard under the README's grants: every page, and an action, for an
/// operator; every page of a read-only dashboard for a role with the read-only grants
/// the README lists.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn the_dashboard_runs_with_the_documented_grants(pool: PgPool) {
    let id = insert(&pool, "mail.send", "failed", Some("smtp down")).await;
    // A pending job of a kind with limits: its page says why it waits, which reads the
    // kind's running jobs and the rate's window (`jobs_starts`).
    let waiting = insert(&pool, "mail.digest", "pending", None).await;
    jobs::admin::set_limits(
        &pool,
        "mail.digest",
        jobs::admin::KindLimits::default()
            .concurrency(1)
            .rate(10, std::time::Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let pages = || pages_of(id).into_iter().chain([format!("/jobs/{waiting}")]);
    let (blocks, text) = readme_privileges();
    let operator_grants = format!(
        "{} {}",
        blocks[0].replace("app_runtime", "ROLE"),
        blocks[1].replace("app_operator", "ROLE")
    );
    let (role, own) = role_with(&pool, "op", &operator_grants).await;
    let app = Dashboard::new(own.clone()).router();
    for path in pages() {
        let page = get(&app, &path, None).await;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.body);
    }
    let (cookie, csrf) = session(&app, &format!("/jobs/{id}")).await;
    let pause = [
        ("csrf", csrf.as_str()),
        ("action", "pause"),
        ("target", "mail.send"),
        ("confirmed", "yes"),
    ];
    let paused_page = post(&app, "/action", &pause, Some(&cookie), &[]).await;
    assert_eq!(paused_page.status, StatusCode::OK, "{}", paused_page.body);
    assert!(paused(&pool, "mail.send").await);
    drop_role(&pool, &role, own).await;

    // "A read-only dashboard ... needs `USAGE` on the schema and `SELECT` on ...".
    let line = text
        .split("A read-only dashboard")
        .nth(1)
        .unwrap()
        .split("\n\n")
        .next()
        .unwrap();
    let tables: Vec<&str> = line
        .split("`SELECT`")
        .nth(1)
        .unwrap()
        .split("`.")
        .next()
        .unwrap()
        .split('`')
        .skip(1)
        .step_by(2)
        .collect();
    assert!(tables.contains(&"jobs"), "{tables:?}");
    let read_only = format!(
        "GRANT USAGE ON SCHEMA public TO ROLE; GRANT SELECT ON {} TO ROLE;",
        tables.join(", ")
    );
    let (role, own) = role_with(&pool, "ro", &read_only).await;
    let app = Dashboard::new(own.clone()).read_only(true).router();
    for path in pages() {
        let page = get(&app, &path, None).await;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.body);
    }
    let page = get(&app, &format!("/jobs/{waiting}"), None).await;
    assert!(page.body.contains("Why it waits"), "{}", page.body);
    drop_role(&pool, &role, own).await;
}
