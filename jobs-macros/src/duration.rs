//! Durations written as strings in attributes: `"250ms"`, `"30s"`, `"5m"`, `"1h"`, `"7d"`.

/// Parses a duration string into whole milliseconds, or says what is wrong with it.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    const EXPECTED: &str =
        "expected a duration such as \"250ms\", \"30s\", \"5m\", \"1h\" or \"7d\"";
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` has no unit: {EXPECTED}"))?;
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(format!("`{text}` does not start with a number: {EXPECTED}"));
    }
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is too large: {EXPECTED}"))?;
    let per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("`{unit}` is not a unit: {EXPECTED}")),
    };
    number
        .checked_mul(per_unit)
        .ok_or_else(|| format!("`{text}` is too large: {EXPECTED}"))
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
        for bad in ["", "30", "s", "3x", "1.5s", "-1s", "99999999999999999999s"] {
            assert!(parse_millis(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
