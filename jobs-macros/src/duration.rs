//! Durations written as strings in attributes, in the grammar of the `humantime` crate,
//! which the `jobsctl` tool reads too: a number and a unit, or a sum of them:
//! `"250ms"`, `"30s"`, `"5m"`, `"1h30m"`, `"7d"`, `"2 weeks"`.

const EXPECTED: &str = "expected a number and a unit (ms, s, m, h, d, w), or a sum of them, \
     such as \"250ms\", \"30s\", \"5m\", \"1h30m\" or \"7d\"";

/// Parses a duration string into whole milliseconds, or says what is wrong with it.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    match humantime::parse_duration(text.trim()) {
        Ok(d) if d.subsec_nanos() % 1_000_000 != 0 => Err(format!(
            "`{}` is not a whole number of milliseconds: the smallest unit is ms",
            text.trim()
        )),
        Ok(d) => u64::try_from(d.as_millis())
            .map_err(|_| format!("`{}` is too large: {EXPECTED}", text.trim())),
        // The common mistakes get a message of their own; anything else, humantime's.
        Err(e) => Err(explain(text)
            .err()
            .unwrap_or_else(|| format!("`{}` is not a duration ({e}): {EXPECTED}", text.trim()))),
    }
}

/// Says what is wrong with a duration the grammar refused, for the common mistakes: no
/// number, no unit, an upper-case or unknown unit.
fn explain(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("the duration is empty: {EXPECTED}"));
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, rest) = text.split_at(split);
    let unit = rest.trim_start();
    if number.is_empty() {
        return Err(format!("`{text}` does not start with a number: {EXPECTED}"));
    }
    if unit.is_empty() {
        return Err(format!("`{text}` has no unit: {EXPECTED}"));
    }
    let Some(per_unit) = per_unit(unit) else {
        return Err(if let Some(short) = short_name(unit) {
            format!("`{text}` is not a duration: write \"{number}{short}\"")
        } else if unit.starts_with(['.', ',']) {
            format!(
                "`{text}` is not a whole number: use a smaller unit, such as \"1500ms\" for 1.5 seconds"
            )
        } else {
            format!("`{unit}` is not a unit: {EXPECTED}")
        });
    };
    if unit.len() != rest.len() {
        return Err(format!(
            "`{text}` has a space before its unit: write \"{number}{unit}\""
        ));
    }
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is too large: {EXPECTED}"))?;
    number
        .checked_mul(per_unit)
        .ok_or_else(|| format!("`{text}` is too large: {EXPECTED}"))
}

/// Milliseconds per unit.
fn per_unit(unit: &str) -> Option<u64> {
    Some(match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    })
}

/// The unit meant by a spelled-out or upper-case one: `seconds` and `S` are `s`.
fn short_name(unit: &str) -> Option<&'static str> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "ms" | "millisecond" | "milliseconds" | "millis" | "msec" | "msecs" => "ms",
        "s" | "second" | "seconds" | "sec" | "secs" => "s",
        "m" | "minute" | "minutes" | "min" | "mins" => "m",
        "h" | "hour" | "hours" | "hr" | "hrs" => "h",
        "d" | "day" | "days" => "d",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn parses_each_unit_and_sums() {
        assert_eq!(parse_millis("250ms"), Ok(250));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("5m"), Ok(300_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert_eq!(parse_millis("7d"), Ok(604_800_000));
        assert_eq!(parse_millis("1h30m"), Ok(5_400_000));
        assert_eq!(parse_millis("1h 30m"), Ok(5_400_000));
        assert_eq!(parse_millis("2 weeks"), Ok(1_209_600_000));
        assert_eq!(parse_millis("1.5s"), Ok(1_500));
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "30",
            "s",
            "3x",
            "-1s",
            "30S",
            "10us",
            "99999999999999999999s",
        ] {
            assert!(parse_millis(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn explains_common_mistakes() {
        assert_eq!(
            parse_millis("30 Seconds"),
            Err("`30 Seconds` is not a duration: write \"30s\"".to_owned())
        );
        assert_eq!(
            parse_millis("5MIN"),
            Err("`5MIN` is not a duration: write \"5m\"".to_owned())
        );
        assert!(
            parse_millis("30")
                .unwrap_err()
                .starts_with("`30` has no unit")
        );
        assert!(
            parse_millis("10us")
                .unwrap_err()
                .contains("not a whole number of milliseconds")
        );
    }
}
