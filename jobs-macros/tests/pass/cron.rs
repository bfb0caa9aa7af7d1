use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "report.nightly", cron = "0 3 * * *", timezone = "Europe/Paris")]
struct Nightly {}

#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "report.hourly", cron = "@hourly")]
struct Hourly {}

#[jobs::handler]
async fn nightly(_job: Nightly, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[test]
fn cron_settings_reach_the_config() {
    let cron = Nightly::CONFIG.cron.unwrap();
    assert_eq!(
        (cron.expression, cron.timezone),
        ("0 3 * * *", "Europe/Paris")
    );
    assert_eq!(Hourly::CONFIG.cron.unwrap().timezone, "UTC");
    assert_eq!(Nightly {}.key().as_deref(), Some("every"));
}
