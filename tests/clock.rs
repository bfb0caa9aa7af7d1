//! No application clock enters a comparison: no statement takes a time from the
//! application (durations come in as milliseconds and are added to the database's
//! `now()`), and the library never reads the wall clock.

use sqlx::{Executor, PgPool, TypeInfo};

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn no_statement_takes_a_time_parameter(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let statements = jobs::__private::statements();
    assert!(statements.len() >= 20, "every statement is listed");
    for (name, sql) in statements {
        let described = (&mut *conn)
            .describe(sqlx::SqlSafeStr::into_sql_str(sql))
            .await
            .unwrap_or_else(|e| panic!("{name} does not prepare: {e}"));
        let Some(sqlx::Either::Left(params)) = described.parameters() else {
            panic!("{name}: PostgreSQL reports parameter types");
        };
        for (i, ty) in params.iter().enumerate() {
            // The one exception: an enqueue at an instant the application chose
            // (`EnqueueOptions::at`), stored as the job's run-after as given (or now,
            // if past). It is the value the database clock is compared with, never a
            // clock reading of the application's.
            if (["ENQUEUE_ONE", "ENQUEUE_MANY"].contains(&name) && i == 6)
                || (["ENQUEUE_UNKEYED", "ENQUEUE_ONE_UNKEYED"].contains(&name) && i == 5)
            {
                continue;
            }
            let ty = ty.name().to_ascii_uppercase();
            assert!(
                ![
                    "TIMESTAMPTZ",
                    "TIMESTAMP",
                    "DATE",
                    "TIME",
                    "TIMETZ",
                    "INTERVAL"
                ]
                .iter()
                .any(|t| ty.starts_with(t)),
                "{name} takes a time as parameter ${}: {ty}",
                i + 1
            );
        }
    }
}

#[test]
fn the_library_never_reads_the_wall_clock() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("jobs/src");
    let mut files = vec![root];
    let mut checked = 0;
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for clock in [
            "SystemTime",
            "Utc::now",
            "Local::now",
            "OffsetDateTime::now",
            "UNIX_EPOCH",
        ] {
            assert!(
                !text.contains(clock),
                "{} reads the wall clock ({clock})",
                path.display()
            );
        }
        checked += 1;
    }
    assert!(checked >= 10);
}
