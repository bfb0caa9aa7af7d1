//! The `jobsctl` binary against a real database: output, exit codes and messages.
#![allow(missing_docs)]

use std::process::Output;

use sqlx::PgPool;

/// The URL of the test's own database: `DATABASE_URL` with its database replaced.
fn url_of(pool: &PgPool) -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set");
    let options = pool.connect_options();
    let db = options.get_database().expect("a test database");
    let start = base.find("://").expect("a URL") + 3;
    let (head, tail) = base.split_at(start);
    let (authority, rest) = tail.split_at(tail.find('/').unwrap_or(tail.len()));
    let query = rest.find('?').map_or("", |i| &rest[i..]);
    format!("{head}{authority}/{db}{query}")
}

/// Runs `jobsctl args...` against `url`, off the async runtime.
async fn jobs(url: &str, args: &[&str]) -> Output {
    let url = url.to_owned();
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_jobsctl"))
            .args(&args)
            .env("DATABASE_URL", url)
            .output()
            .expect("run the jobsctl binary")
    })
    .await
    .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

async fn insert(pool: &PgPool, kind: &str, state: &str, error: Option<&str>) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO jobs (kind, state, attempts, max_attempts, payload, last_error, finished_at) \
         VALUES ($1, $2, 3, 3, '{\"n\": 1}', $3, CASE WHEN $2 IN ('done', 'failed') THEN now() END) \
         RETURNING id",
    )
    .bind(kind)
    .bind(state)
    .bind(error)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn stats_on_an_empty_database(pool: PgPool) {
    let out = jobs(&url_of(&pool), &["stats"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "no jobs\n");

    let out = jobs(&url_of(&pool), &["stats", "--json"]).await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout(&out), "");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn stats_prints_an_aligned_table(pool: PgPool) {
    insert(&pool, "email.send", "failed", Some("smtp: timeout")).await;
    insert(&pool, "email.send", "pending", None).await;
    insert(&pool, "report.build", "done", None).await;
    let out = jobs(&url_of(&pool), &["stats"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[0].starts_with("KIND"), "{text}");
    assert!(lines[1].starts_with("email.send "), "{text}");
    assert!(lines[3].starts_with("(all)"), "{text}");
    // Right-aligned counts: every line's FAILED column ends at the same place.
    let end = lines[0].find("FAILED").unwrap() + "FAILED".len();
    assert_eq!(&lines[1][end - 1..end], "1", "{text}");
    assert_eq!(&lines[2][end - 1..end], "0", "{text}");

    let out = jobs(&url_of(&pool), &["stats", "--json"]).await;
    let rows: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["kind"], "email.send");
    assert_eq!(rows[0]["ready"], 1);
    assert_eq!(rows[0]["failed"], 1);
    assert!(rows[0]["lag_seconds"].is_f64());
    assert_eq!(rows[1]["lag_seconds"], serde_json::Value::Null);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn list_failed_as_json(pool: PgPool) {
    let first = insert(&pool, "email.send", "failed", Some("smtp: timeout")).await;
    insert(&pool, "email.send", "pending", None).await;
    let second = insert(&pool, "report.build", "failed", Some("line 1\nline 2")).await;

    let out = jobs(&url_of(&pool), &["list", "--state", "failed", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rows: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["id"], second);
    assert_eq!(rows[0]["last_error"], "line 1\nline 2");
    assert_eq!(rows[1]["id"], first);
    assert_eq!(rows[1]["state"], "failed");
    assert_eq!(rows[1]["kind"], "email.send");
    assert_eq!(rows[1]["payload"]["n"], 1);
    assert!(rows[1]["finished_at"].as_str().unwrap().ends_with('Z'));

    // The table: a header and a row per job, the error cut to its first line.
    let out = jobs(&url_of(&pool), &["list", "--state", "failed"]).await;
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(text.contains("smtp: timeout"), "{text}");
    assert!(text.contains("line 1 …"), "{text}");

    // Paging.
    let out = jobs(
        &url_of(&pool),
        &[
            "list",
            "--limit",
            "1",
            "--after",
            &second.to_string(),
            "--json",
        ],
    )
    .await;
    let row: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(row["state"], "pending");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn retry_of_an_id_makes_the_job_pending(pool: PgPool) {
    let id = insert(&pool, "email.send", "failed", Some("smtp: timeout")).await;
    let out = jobs(&url_of(&pool), &["retry", &id.to_string()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("pending again"), "{}", stdout(&out));
    let (state, attempts): (String, i32) =
        sqlx::query_as("SELECT state, attempts FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), attempts), ("pending", 0));

    // Now pending: a second retry is refused, saying why.
    let out = jobs(&url_of(&pool), &["retry", &id.to_string()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        format!("error: no failed job with id {id} (job {id} is pending)\n")
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn retry_kind_show_cancel_discard_prune(pool: PgPool) {
    let url = url_of(&pool);
    insert(&pool, "a", "failed", Some("x")).await;
    insert(&pool, "a", "failed", Some("y")).await;
    let out = jobs(&url, &["retry", "--kind", "a"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "2 failed jobs of kind `a` pending again\n");

    let pending = insert(&pool, "b", "pending", None).await;
    let out = jobs(&url, &["show", &pending.to_string()]).await;
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout(&out).contains("state         pending"),
        "{}",
        stdout(&out)
    );
    let out = jobs(&url, &["show", &pending.to_string(), "--json"]).await;
    let job: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(job["id"], pending);

    let out = jobs(&url, &["cancel", &pending.to_string()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!("job {pending} cancelled before it ran\n")
    );
    let running = insert(&pool, "b", "running", None).await;
    let out = jobs(&url, &["cancel", &running.to_string()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("cancelled while running"),
        "{}",
        stdout(&out)
    );
    let out = jobs(&url, &["cancel", &running.to_string()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no live job") && stderr(&out).contains("is cancelled"),
        "{}",
        stderr(&out)
    );

    let failed = insert(&pool, "b", "failed", Some("z")).await;
    let out = jobs(&url, &["discard", &failed.to_string()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    sqlx::query(
        "INSERT INTO jobs (kind, state, max_attempts, payload, finished_at) \
         SELECT 'c', 'done', 1, '{}', now() - interval '8 days' FROM generate_series(1, 30)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let out = jobs(&url, &["prune", "--older-than", "7d", "--batch", "7"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "30 done jobs older than 7d deleted\n");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn unknown_id_fails_with_a_clear_message(pool: PgPool) {
    let url = url_of(&pool);
    for (args, message) in [
        (
            &["retry", "424242"][..],
            "error: no failed job with id 424242\n",
        ),
        (
            &["discard", "424242"],
            "error: no failed job with id 424242\n",
        ),
        (&["cancel", "424242"], "error: no live job with id 424242\n"),
        (
            &["show", "424242"],
            "error: no job with id 424242 (a job that succeeded is deleted at once unless its \
             kind keeps history: #[job(retain = \"7d\")])\n",
        ),
        (
            &["why", "424242"],
            "error: no job with id 424242 (a job that succeeded is deleted at once unless its \
             kind keeps history: #[job(retain = \"7d\")])\n",
        ),
    ] {
        let out = jobs(&url, args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(stderr(&out), message, "{args:?}");
        assert_eq!(stdout(&out), "", "{args:?}");
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn why_says_a_pending_job_waits_for_its_paused_kind_and_a_runtime(pool: PgPool) {
    let url = url_of(&pool);
    let first = insert(&pool, "email.send", "pending", None).await;
    let second = insert(&pool, "email.send", "pending", None).await;
    let out = jobs(&url, &["pause", "email.send", "--force"]).await;
    assert!(out.status.success(), "{}", stderr(&out));

    let out = jobs(&url, &["why", &second.to_string()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], format!("job {second} (email.send, pending):"));
    assert!(
        lines[1].starts_with("  its kind is paused since "),
        "{text}"
    );
    assert_eq!(lines[2], "  no runtime claims its kind: none is alive");
    assert_eq!(lines[3], "  behind 1 due jobs of its kind in claim order");
    assert_eq!(lines.len(), 4, "{text}");

    let out = jobs(&url, &["why", &first.to_string(), "--json"]).await;
    let why: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(why["id"], first);
    assert_eq!(why["state"], "pending");
    let codes: Vec<&str> = why["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["paused", "no_runtime"]);
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn pause_refuses_a_kind_nobody_declared_unless_forced(pool: PgPool) {
    let url = url_of(&pool);
    let out = jobs(&url, &["pause", "no.such.kind"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "error: no kind `no.such.kind` here: no runtime has declared it and no job carries it \
         (a typo?); pause it anyway with `jobsctl pause --force` or jobs::admin::pause_forced\n"
    );
    // Nothing written: no phantom row in stats.
    assert_eq!(stdout(&jobs(&url, &["stats"]).await), "no jobs\n");

    // A kind a runtime declared, or a job carries, pauses.
    sqlx::query(
        "INSERT INTO jobs_runtimes (id, host, pid, version, kinds, concurrency)
         VALUES (gen_random_uuid(), 'h', 1, '0', ARRAY['declared.kind'], 4)",
    )
    .execute(&pool)
    .await
    .unwrap();
    insert(&pool, "carried.kind", "done", None).await;
    for kind in ["declared.kind", "carried.kind"] {
        let out = jobs(&url, &["pause", kind]).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(
            stdout(&out),
            format!("kind `{kind}` paused: runtimes stop claiming it within their poll interval\n")
        );
    }

    let out = jobs(&url, &["pause", "--force", "no.such.kind"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "kind `no.such.kind` paused: runtimes stop claiming it within their poll interval\n"
    );
    // Paused now, so known: pausing it again says so, without --force.
    let out = jobs(&url, &["pause", "no.such.kind"]).await;
    assert_eq!(stdout(&out), "kind `no.such.kind` was already paused\n");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn usage_errors_exit_2(pool: PgPool) {
    let url = url_of(&pool);
    for args in [
        &["retry"][..],
        &["retry", "1", "--kind", "a"],
        &["list", "--state", "lost"],
        &["list", "--limit", "0"],
        &["prune", "--older-than", "7 fortnights"],
        &["frobnicate"],
    ] {
        let out = jobs(&url, args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn no_database_url_is_a_usage_error() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_jobsctl"))
        .arg("stats")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: no database given: set DATABASE_URL or pass --database-url\n"
    );
}

#[tokio::test]
async fn unreachable_database_exits_3_naming_the_host_not_the_password() {
    // Port 1 on the loopback: nothing listens there, the connection is refused.
    let out = jobs("postgres://ops:hunter2@127.0.0.1:1/app", &["stats"]).await;
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert!(
        err.starts_with("error: cannot connect to the database at 127.0.0.1:1"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");

    for bad in ["not a url", "postgres://ops:hunter2@127.0.0.1:99999/app"] {
        let out = jobs(bad, &["list"]).await;
        assert_eq!(out.status.code(), Some(3), "{bad}");
        let err = stderr(&out);
        assert!(err.starts_with("error: cannot connect"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}

#[sqlx::test(migrations = false)]
async fn migrate_creates_the_job_table(pool: PgPool) {
    let url = url_of(&pool);
    let out = jobs(&url, &["stats"]).await;
    assert_eq!(out.status.code(), Some(1), "no job table yet");
    assert_eq!(
        stderr(&out),
        "error: the job table does not exist in the database this connection uses: create it with `jobs::migrate(&pool)` at start, or run `jobsctl migrate` against that database\n"
    );

    let out = jobs(&url, &["migrate"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "applied migration 1 (create jobs), 2 (end unbounded claims), 3 (attempt history), 4 (paused kinds), 5 (runtimes), 6 (checkpoints), 7 (cancelled), 8 (throughput), 9 (priority), 10 (spaced analyze), 11 (limits), 12 (partitions), 13 (late commits), 14 (trace), 15 (declared limits), 16 (output), 17 (start margins)\n"
    );
    let out = jobs(&url, &["migrate"]).await;
    assert_eq!(
        stdout(&out),
        "nothing to apply: the job table is up to date\n"
    );
    let out = jobs(&url, &["stats"]).await;
    assert_eq!(stdout(&out), "no jobs\n", "{}", stderr(&out));
}

#[tokio::test]
async fn a_misspelled_url_scheme_is_an_error() {
    let out = jobs("postgress://ops:hunter2@127.0.0.1:5432/app", &["stats"]).await;
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert!(
        err.contains("the URL's scheme is `postgress://`; a PostgreSQL URL starts with postgres:// or postgresql://"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn failures_are_told_apart(pool: PgPool) {
    let cases = [
        ("permanent: bad input", "permanent"),
        ("timed out after 5s", "timeout"),
        ("handler panicked: boom", "panic"),
        (
            "lease expired: the worker running attempt 3 stopped renewing its claim",
            "lease expired (its worker died or stalled)",
        ),
        ("smtp: 550 mailbox unavailable", "out of attempts"),
    ];
    let mut ids = Vec::new();
    for (error, _) in cases {
        ids.push(insert(&pool, "a", "failed", Some(error)).await);
    }
    for (id, (_, kind)) in ids.iter().zip(cases) {
        let out = jobs(&url_of(&pool), &["show", &id.to_string()]).await;
        let text = stdout(&out);
        assert!(text.contains(&format!("failure       {kind}\n")), "{text}");
        let out = jobs(&url_of(&pool), &["show", &id.to_string(), "--json"]).await;
        let row: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
        assert_eq!(row["failure"], kind);
    }
    let out = jobs(&url_of(&pool), &["list", "--state", "failed"]).await;
    let text = stdout(&out);
    assert!(text.contains("out of attempts: smtp: 550"), "{text}");
    assert!(text.contains("permanent: bad input"), "{text}");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn terminal_escapes_in_the_table_are_shown_escaped(pool: PgPool) {
    sqlx::query(
        "INSERT INTO jobs (kind, key, state, attempts, max_attempts, payload, last_error, finished_at) \
         VALUES ('k\u{1b}[31m', 'key\u{1b}]0;title\u{7}', 'failed', 1, 1, '{}', 'oops\u{1b}[2J', now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    for args in [&["list"][..], &["show", "1"]] {
        let out = jobs(&url_of(&pool), args).await;
        let text = stdout(&out);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{args:?}: {text:?}"
        );
        assert!(text.contains("\\u{1b}"), "{args:?}: {text}");
    }
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn show_prints_the_attempt_history(pool: PgPool) {
    let url = url_of(&pool);
    let id = insert(&pool, "h", "failed", Some("permanent: <no>")).await;
    sqlx::query(
        "UPDATE jobs SET errors = jsonb_build_array( \
           jsonb_build_object('attempt', 1, 'at', now(), 'kind', 'panic', 'message', 'handler panicked: oh', 'runtime', gen_random_uuid()), \
           jsonb_build_object('attempt', 2, 'at', now(), 'kind', 'permanent', 'message', E'permanent: <no>\\u001b[2J', 'runtime', NULL)) \
         WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    let out = jobs(&url, &["show", &id.to_string()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("attempt history (2, oldest first)"), "{text}");
    assert!(text.contains("panic"), "{text}");
    assert!(text.contains("handler panicked: oh"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "control characters are escaped: {text}"
    );
    let out = jobs(&url, &["show", &id.to_string(), "--json"]).await;
    let job: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(job["errors"][0]["kind"], "panic");
    assert_eq!(job["errors"][1]["attempt"], 2);
    assert!(job["errors"][1]["runtime"].is_null());
    assert!(job["checkpoint"].is_null());
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn show_tells_a_cancel_from_a_failure_and_marks_retries_in_the_history(pool: PgPool) {
    let url = url_of(&pool);
    let by_operator = insert(&pool, "c", "pending", None).await;
    jobs(&url, &["cancel", &by_operator.to_string()]).await;
    let by_handler = insert(
        &pool,
        "c",
        "cancelled",
        Some("cancelled: the order was withdrawn"),
    )
    .await;
    for (id, said) in [
        (by_operator, "cancelled by an operator"),
        (by_handler, "cancelled by its handler"),
    ] {
        let text = stdout(&jobs(&url, &["show", &id.to_string()]).await);
        assert!(text.contains(&format!("failure       {said}\n")), "{text}");
        assert!(!text.contains("failure       error"), "{text}");
    }

    // Two operator retries: the attempts count from 1 three times, and the history
    // says where each count starts again.
    let id = insert(&pool, "h", "failed", Some("smtp down")).await;
    sqlx::query(
        "UPDATE jobs SET errors = jsonb_build_array( \
           jsonb_build_object('attempt', 1, 'at', now(), 'kind', 'error', 'message', 'smtp down'), \
           jsonb_build_object('attempt', 1, 'at', now(), 'kind', 'error', 'message', 'smtp down'), \
           jsonb_build_object('attempt', 1, 'at', now(), 'kind', 'error', 'message', 'smtp down')) \
         WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    let text = stdout(&jobs(&url, &["show", &id.to_string()]).await);
    assert_eq!(
        text.matches("-- attempts counted from 1 again: retried, or a new request --")
            .count(),
        2,
        "{text}"
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn show_prints_the_checkpoint(pool: PgPool) {
    let url = url_of(&pool);
    let id = insert(&pool, "c", "failed", Some("gave up")).await;
    sqlx::query("UPDATE jobs SET checkpoint = '{\"after\": \"item-41\\u001b\"}' WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    let out = jobs(&url, &["show", &id.to_string()]).await;
    let text = stdout(&out);
    assert!(
        text.contains("checkpoint    {\"after\":\"item-41\\u001b\"}"),
        "{text}"
    );
    let out = jobs(&url, &["show", &id.to_string(), "--json"]).await;
    let job: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(job["checkpoint"]["after"], "item-41\u{1b}");
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn history_prints_runs_per_kind_and_minute(pool: PgPool) {
    let url = url_of(&pool);
    let out = jobs(&url, &["history"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "no runs recorded in the last 1h\n");
    // What a runtime writes: a minute with 10 runs in bucket 24 (up to
    // 100 µs * 2^(24/4) = 6.4 ms) and one in bucket 37 (up to about 61 ms).
    sqlx::query(
        "INSERT INTO jobs_throughput (kind, minute, succeeded, failed, retried, cancelled, run_time_buckets) \
         VALUES ('mail.send', date_trunc('minute', now()), 10, 1, 2, 0, \
                 array_fill(0::bigint, ARRAY[24]) || ARRAY[10::bigint] || array_fill(0::bigint, ARRAY[12]) || ARRAY[1::bigint])",
    )
    .execute(&pool)
    .await
    .unwrap();
    let out = jobs(&url, &["history", "--since", "10m"]).await;
    let text = stdout(&out);
    assert!(text.starts_with("MINUTE"), "{text}");
    assert!(text.contains("mail.send"), "{text}");
    assert!(
        text.contains("6.4ms  60ms  60ms"),
        "p50 at the 10 runs' bucket, p95 and p99 (the 11th of 11) at the slow one's: {text}"
    );
    let out = jobs(&url, &["history", "--kind", "mail.send", "--json"]).await;
    let row: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(row["succeeded"], 10);
    assert_eq!(row["retried"], 2);
    assert!((row["p50_seconds"].as_f64().unwrap() - 0.0064).abs() < 1e-6);
}

#[tokio::test]
async fn web_refuses_a_public_address_without_a_token() {
    // Refused before any connection: the database here does not even exist.
    let out = jobs(
        "postgres://postgres@127.0.0.1:1/none",
        &["web", "--listen", "0.0.0.0:0"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with(
            "error: refusing to serve the dashboard on 0.0.0.0:0 without an access token"
        ),
        "{err}"
    );
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn web_serves_the_dashboard_until_stopped(pool: PgPool) {
    use std::io::{BufRead as _, Read as _, Write as _};
    let id = insert(&pool, "mail.send", "failed", Some("smtp down")).await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_jobsctl"))
        .args(["web", "--listen", "127.0.0.1:0", "--read-only"])
        .env("DATABASE_URL", url_of(&pool))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let address = first
        .strip_prefix("dashboard at http://")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("the address it serves on: {first}"))
        .to_owned();
    let page = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(&address).unwrap();
        write!(
            stream,
            "GET /jobs/{id} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut page = String::new();
        stream.read_to_string(&mut page).unwrap();
        page
    })
    .await
    .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("smtp down"), "{page}");
    assert!(page.contains("read-only"), "{page}");
    assert!(!page.contains("method=\"post\""), "{page}");
}

/// A database the server does not have: the server's message, without the source line
/// of PostgreSQL that raised it.
#[tokio::test]
async fn a_missing_database_is_named_in_the_servers_words() {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set");
    let start = base.find("://").expect("a URL") + 3;
    let authority = &base[start..start + base[start..].find('/').unwrap_or(base.len() - start)];
    let url = format!("{}{authority}/jobs_no_such_database", &base[..start]);
    let out = jobs(&url, &["stats"]).await;
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert!(
        err.contains("database \"jobs_no_such_database\" does not exist"),
        "{err}"
    );
    assert!(!err.contains(" at line "), "{err}");
}

/// The SQL blocks of the README's "Privileges" section: the runtime's grants (to
/// `app_runtime`), then the operators' (to `app_operator`).
fn readme_grants() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let section = readme.split("\n## Privileges\n").nth(1).unwrap();
    let section = section.split("\n## ").next().unwrap();
    section
        .split("```sql\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap().to_owned())
        .collect()
}

/// Every command but `migrate` and `web` works for an operator whose role has exactly
/// the README's grants (the runtime's and the operators'), and nothing through PUBLIC.
#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn every_command_runs_with_the_operators_documented_grants(pool: PgPool) {
    let failed = insert(&pool, "email.send", "failed", Some("smtp: timeout")).await;
    let discarded = insert(&pool, "email.send", "failed", Some("smtp: timeout")).await;
    let pending = insert(&pool, "email.send", "pending", None).await;
    insert(&pool, "report.build", "done", None).await;
    // Roles are cluster-wide: named after this test's own database.
    let db = pool
        .connect_options()
        .get_database()
        .unwrap()
        .to_lowercase();
    let role: String = format!("ops{db}").chars().take(60).collect();
    let grants = readme_grants();
    assert_eq!(grants.len(), 2);
    let setup = format!(
        "REVOKE ALL ON SCHEMA public FROM PUBLIC; CREATE ROLE {role} LOGIN; {} {}",
        grants[0].replace("app_runtime", &role),
        grants[1].replace("app_operator", &role)
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(setup))
        .execute(&pool)
        .await
        .unwrap();
    let options = pool.connect_options();
    let url = format!(
        "postgres://{role}@{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap()
    );
    let (failed, discarded, pending) = (
        failed.to_string(),
        discarded.to_string(),
        pending.to_string(),
    );
    let commands: [&[&str]; 15] = [
        &["stats"],
        &["history"],
        &["list", "--state", "failed"],
        &["show", &failed],
        &["why", &pending],
        &["retry", &failed],
        &["cancel", &pending],
        &["discard", &discarded],
        &["runtimes"],
        &["pause", "email.send"],
        &["resume", "email.send"],
        &[
            "limits",
            "email.send",
            "--concurrency",
            "2",
            "--rate",
            "10/1s",
        ],
        &["limits"],
        &["limits", "email.send", "--clear"],
        &["prune", "--older-than", "1s"],
    ];
    for args in commands {
        let out = jobs(&url, args).await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "jobsctl {args:?}: {}",
            stderr(&out)
        );
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP OWNED BY {role}; DROP ROLE {role}"
    )))
    .execute(&pool)
    .await
    .unwrap();
}

/// The job tables in a schema of the application's own: the URL's `options` set the
/// `search_path`, and every command works there.
#[sqlx::test(migrations = false)]
async fn a_url_with_a_search_path_works_in_that_schema(pool: PgPool) {
    sqlx::query("CREATE SCHEMA app_jobs")
        .execute(&pool)
        .await
        .unwrap();
    let url = url_of(&pool);
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}options=-c%20search_path%3Dapp_jobs");
    for args in [&["migrate"][..], &["stats"], &["list"]] {
        let out = jobs(&url, args).await;
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    }
    let schema: Option<String> = sqlx::query_scalar(
        "SELECT table_schema::text FROM information_schema.tables WHERE table_name = 'jobs'",
    )
    .fetch_optional(&pool)
    .await
    .unwrap();
    assert_eq!(schema.as_deref(), Some("app_jobs"));
}
