//! Cron fire times across daylight-saving changes, in two zones: a schedule whose hour
//! is a wildcard or a step keeps its cadence in real time through the autumn's repeated
//! hour and across the spring's skipped one; a schedule that names its hour fires once.
//! (Pure computation: no database.)

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use jobs::CronSchedule;

/// The fire times of `expression` in `zone` from `start` (exclusive) to `end`.
fn fires(
    expression: &'static str,
    zone: &'static str,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    let schedule = CronSchedule {
        expression,
        timezone: zone,
    };
    let mut out = Vec::new();
    let mut at = start;
    while let Some(next) = schedule.next_after(at) {
        assert!(next > at, "{expression} in {zone}: {next} after {at}");
        if next > end {
            break;
        }
        out.push(next);
        at = next;
    }
    out
}

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

/// The gaps between consecutive fire times.
fn gaps(times: &[DateTime<Utc>]) -> Vec<TimeDelta> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

/// A change's month, day and hour, in UTC.
type Change = (u32, u32, u32);

/// The nights of 2026's changes: (zone, autumn change, spring change), in UTC.
const ZONES: [(&str, Change, Change); 2] = [
    // Paris: 03:00 CEST -> 02:00 CET on 25 October, 02:00 CET -> 03:00 CEST on 29 March.
    ("Europe/Paris", (10, 25, 1), (3, 29, 1)),
    // New York: 02:00 EDT -> 01:00 EST on 1 November, 02:00 EST -> 03:00 EDT on 8 March.
    ("America/New_York", (11, 1, 6), (3, 8, 7)),
];

#[test]
fn interval_schedules_keep_their_cadence_through_the_repeated_hour() {
    for (zone, (mo, d, h), _) in ZONES {
        let change = utc(2026, mo, d, h, 0);
        let (start, end) = (change - TimeDelta::hours(4), change + TimeDelta::hours(4));
        for (expression, every) in [
            ("*/15 * * * *", TimeDelta::minutes(15)),
            ("0 * * * *", TimeDelta::hours(1)),
            ("@hourly", TimeDelta::hours(1)),
        ] {
            let times = fires(expression, zone, start, end);
            for (i, gap) in gaps(&times).into_iter().enumerate() {
                assert_eq!(gap, every, "{expression} in {zone}, gap {i}: {times:?}");
            }
            // The repeated hour's second occurrence fires too.
            assert!(times.contains(&change), "{expression} in {zone}: {times:?}");
        }
    }
}

#[test]
fn a_step_over_the_hours_fires_at_every_instant_its_local_time_matches() {
    // Paris repeats 02:xx: `0 */2` fires at 02:00 CEST and again at 02:00 CET.
    let times = fires(
        "0 */2 * * *",
        "Europe/Paris",
        utc(2026, 10, 24, 21, 0),
        utc(2026, 10, 25, 5, 0),
    );
    assert_eq!(
        times,
        [
            utc(2026, 10, 24, 22, 0),
            utc(2026, 10, 25, 0, 0),
            utc(2026, 10, 25, 1, 0),
            utc(2026, 10, 25, 3, 0),
            utc(2026, 10, 25, 5, 0),
        ]
    );
    // New York repeats 01:xx, an odd hour: no even hour occurs twice.
    let times = fires(
        "0 */2 * * *",
        "America/New_York",
        utc(2026, 11, 1, 2, 0),
        utc(2026, 11, 1, 10, 0),
    );
    assert_eq!(
        times,
        [
            utc(2026, 11, 1, 4, 0),
            utc(2026, 11, 1, 7, 0),
            utc(2026, 11, 1, 9, 0),
        ]
    );
}

#[test]
fn interval_schedules_keep_their_cadence_across_the_skipped_hour() {
    for (zone, _, (mo, d, h)) in ZONES {
        let change = utc(2026, mo, d, h, 0);
        let (start, end) = (change - TimeDelta::hours(4), change + TimeDelta::hours(4));
        for (expression, every) in [
            ("*/15 * * * *", TimeDelta::minutes(15)),
            ("0 * * * *", TimeDelta::hours(1)),
        ] {
            let times = fires(expression, zone, start, end);
            assert_eq!(
                gaps(&times),
                vec![every; times.len() - 1],
                "{expression} in {zone}: {times:?}"
            );
        }
    }
}

#[test]
fn a_schedule_that_names_its_hour_fires_once_in_the_repeated_hour() {
    for (zone, (mo, d, h), _) in ZONES {
        let change = utc(2026, mo, d, h, 0);
        // The local hour that occurs twice: 02:xx in Paris, 01:xx in New York.
        let repeated = if zone == "Europe/Paris" {
            "30 2 * * *"
        } else {
            "30 1 * * *"
        };
        let times = fires(
            repeated,
            zone,
            change - TimeDelta::hours(6),
            change + TimeDelta::hours(6),
        );
        assert_eq!(
            times,
            [change - TimeDelta::minutes(30)],
            "{repeated} in {zone}: its first occurrence"
        );
        // Every quarter of that one hour, once each: in its first occurrence only.
        let quarters = if zone == "Europe/Paris" {
            "*/15 2 * * *"
        } else {
            "*/15 1 * * *"
        };
        let times = fires(
            quarters,
            zone,
            change - TimeDelta::hours(6),
            change + TimeDelta::hours(6),
        );
        assert_eq!(times.len(), 4, "{quarters} in {zone}: {times:?}");
        assert!(
            times.iter().all(|t| *t < change),
            "{quarters} in {zone}: {times:?}"
        );
        // Asked from inside the second occurrence, the next fire is the next day's.
        let schedule = CronSchedule {
            expression: repeated,
            timezone: zone,
        };
        let next = schedule
            .next_after(change + TimeDelta::minutes(10))
            .unwrap();
        // (a day and an hour after the first occurrence: the next day is on winter time)
        assert_eq!(
            next,
            change - TimeDelta::minutes(30) + TimeDelta::hours(25),
            "{repeated} in {zone}"
        );
    }
}

#[test]
fn a_schedule_that_names_a_skipped_time_fires_just_after_the_gap() {
    for (zone, _, (mo, d, h)) in ZONES {
        let change = utc(2026, mo, d, h, 0);
        let schedule = CronSchedule {
            expression: "30 2 * * *",
            timezone: zone,
        };
        assert_eq!(
            schedule.next_after(change - TimeDelta::hours(3)),
            Some(change),
            "{zone}"
        );
    }
}
