// Not async.
#[jobs::test]
fn not_async(_pool: jobs::sqlx::PgPool) {}

// No pool.
#[jobs::test]
async fn no_pool() {}

// A result.
#[jobs::test]
async fn returns(_pool: jobs::sqlx::PgPool) -> Result<(), String> {
    Ok(())
}

fn main() {}
