//! Durations written as strings in attributes: `"250ms"`, `"30s"`, `"5m"`, `"1h"`, `"7d"`.

/// Parses a duration string into whole milliseconds, or says what is wrong with it.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    const EXPECTED: &str = "expected a whole number and a unit (ms, s, m, h or d), \
         such as \"250ms\", \"30s\", \"5m\", \"1h\" or \"7d\"";
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
    fn parses_each_unit() {
        assert_eq!(parse_millis("250ms"), Ok(250));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("5m"), Ok(300_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert_eq!(parse_millis("7d"), Ok(604_800_000));
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "30",
            "s",
            "3x",
            "1.5s",
            "-1s",
            "30 s",
            "30 seconds",
            "30S",
            "99999999999999999999s",
        ] {
            assert!(parse_millis(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn suggests_the_short_unit() {
        assert_eq!(
            parse_millis("30 seconds"),
            Err("`30 seconds` is not a duration: write \"30s\"".to_owned())
        );
        assert_eq!(
            parse_millis("5MIN"),
            Err("`5MIN` is not a duration: write \"5m\"".to_owned())
        );
        assert_eq!(
            parse_millis("2 h"),
            Err("`2 h` has a space before its unit: write \"2h\"".to_owned())
        );
    }
}
