//! Human-readable durations used in discovery details (`"200ms"`, `"2s"`,
//! `"1.5s"`, `"1m"`, `"1h"`).

use std::time::Duration;

/// Parses `<number><unit>` with unit `ms`, `s`, `m` or `h`; the number may
/// have a fractional part. A bare number is refused (the unit is required).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("duration {text:?} has no unit (use ms, s, m or h)"))?;
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(format!("duration {text:?} does not start with a number"));
    }
    let value: f64 = number
        .parse()
        .map_err(|e| format!("duration {text:?}: bad number {number:?}: {e}"))?;
    let millis_per_unit = match unit {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        other => {
            return Err(format!(
                "duration {text:?}: unknown unit {other:?} (use ms, s, m or h)"
            ));
        }
    };
    let millis = value * millis_per_unit;
    if !millis.is_finite() || millis > (u64::MAX / 2) as f64 {
        return Err(format!("duration {text:?} is out of range"));
    }
    Ok(Duration::from_micros((millis * 1_000.0).round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration(" 1h "), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_duration("2").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("2 parsecs").is_err());
        assert!(parse_duration("1.2.3s").is_err());
        assert!(parse_duration("").is_err());
    }
}
