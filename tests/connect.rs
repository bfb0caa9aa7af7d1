//! `jobs::connect`: a pool whose mistakes are said at once, in words.

use sqlx::PgPool;

/// The URL of the test's database with `user` and `database` put in.
fn url(pool: &PgPool, user: &str, database: &str) -> String {
    let options = pool.connect_options();
    format!(
        "postgres://{user}:s3cret@{}:{}/{database}",
        options.get_host(),
        options.get_port()
    )
}

#[sqlx::test(migrator = "jobs::MIGRATOR")]
async fn a_pool_that_cannot_connect_says_where_and_why_at_once(pool: PgPool) {
    let db = pool.connect_options().get_database().unwrap().to_owned();
    let user = pool.connect_options().get_username().to_owned();

    // A database that does not exist: the server's words, the target, no password.
    let e = jobs::connect(&url(&pool, &user, "no_such_database"))
        .await
        .unwrap_err();
    assert!(matches!(e, jobs::Error::Connect(_)), "{e:?}");
    let said = e.to_string();
    assert!(
        said.contains("database \"no_such_database\" does not exist"),
        "{said}"
    );
    assert!(
        said.contains("(database `no_such_database`, user `"),
        "{said}"
    );
    assert!(!said.contains("s3cret"), "{said}");

    // A role that does not exist.
    let e = jobs::connect(&url(&pool, "nobody_here", &db))
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("role \"nobody_here\" does not exist"),
        "{e}"
    );

    // Not a URL.
    let e = jobs::connect("mysql://x@y/z").await.unwrap_err();
    assert!(matches!(e, jobs::Error::Connect(_)), "{e:?}");

    // The right one: a pool that works.
    let good = jobs::connect(&url(&pool, &user, &db)).await.unwrap();
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&good)
        .await
        .unwrap();
    assert_eq!(one, 1);
    good.close().await;
}
