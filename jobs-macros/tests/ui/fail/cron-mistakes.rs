use jobs::Job;
use serde::{Deserialize, Serialize};

// Not a cron expression (61 is no minute).
#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "report.nightly", cron = "61 3 * * *")]
struct BadExpression {}

// Not a time zone.
#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "report.morning", cron = "0 8 * * *", timezone = "Europe/Lutece")]
struct BadZone {}

// A time zone without a schedule.
#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "report.zone", timezone = "Europe/Paris")]
struct ZoneAlone {}

// Both schedules.
#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "report.both", cron = "0 3 * * *", every = "1h")]
struct Both {}

// A key: the runtime keeps one live job of the kind.
#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "report.keyed", key = "tenant", cron = "0 3 * * *")]
struct Keyed {
    tenant: String,
}

// Six fields, seconds first: 25 is no hour.
#[derive(Job, Serialize, Deserialize, Default)]
#[job(kind = "report.hourly", cron = "0 0 25 * * *")]
struct BadHour {}

fn main() {}
