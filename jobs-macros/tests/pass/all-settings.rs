// Every key of #[job(...)] at once, with a key over two fields, one of them optional.
#![deny(warnings)]

use std::time::Duration;

use jobs::{Job, JobConfig, JobContext, JobError, Lease};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(
    kind = "report.build",
    key = ["tenant", "report_id"],
    max_attempts = 5,
    backoff = "250ms",
    max_backoff = "1h",
    lease = "2m",
    cancel_on_lease_loss = false,
    timeout = "5m",
    concurrency = 4,
    retain = "7d",
)]
struct BuildReport {
    tenant: String,
    report_id: Option<i64>,
    title: String,
}

#[jobs::handler]
async fn build_report(job: BuildReport, ctx: JobContext) -> Result<(), JobError> {
    if job.title.is_empty() || ctx.is_lease_lost() {
        return Err(JobError::permanent("nothing to build"));
    }
    Ok(())
}

// Attributes may be split over several #[job(...)], and `every` has its own type.
#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "report.sweep")]
#[job(every = "1d", retain = "0s")]
struct SweepReports;

#[test]
fn every_setting_reaches_the_config() {
    let c: JobConfig = BuildReport::CONFIG;
    assert_eq!(BuildReport::KIND, "report.build");
    assert_eq!(c.max_attempts, 5);
    assert_eq!(c.backoff, Duration::from_millis(250));
    assert_eq!(c.max_backoff, Duration::from_secs(3600));
    assert_eq!(c.lease, Lease::Heartbeat(Duration::from_secs(120)));
    assert!(!c.cancel_on_lease_loss);
    assert_eq!(c.timeout, Some(Duration::from_secs(300)));
    assert_eq!(c.concurrency, Some(4));
    assert_eq!(c.retain, Some(Duration::from_secs(7 * 86_400)));
    assert_eq!(c.every, None);

    let job = BuildReport {
        tenant: "acme:eu".to_owned(),
        report_id: Some(7),
        title: "q3".to_owned(),
    };
    assert_eq!(job.key().as_deref(), Some("acme\\:eu:7"));
    let job = BuildReport {
        report_id: None,
        ..job
    };
    assert_eq!(job.key(), None);

    assert_eq!(
        SweepReports::CONFIG.every,
        Some(Duration::from_secs(86_400))
    );
    assert_eq!(SweepReports::CONFIG.retain, Some(Duration::ZERO));
    assert_eq!(
        SweepReports.key().as_deref(),
        Some(jobs::__private::PERIODIC_KEY)
    );
}
