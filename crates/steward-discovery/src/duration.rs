//! Human-readable durations, in Go's `time.ParseDuration` grammar as
//! Kubernetes objects use it (`metav1.Duration`): one or more terms of a
//! decimal number (optionally with a fraction) and a unit, e.g. `200ms`,
//! `1.5s`, `1m30s`, `2h45m`. Units: `ns`, `us` (or `µs`), `ms`, `s`, `m`,
//! `h`. A bare number is refused (the unit is required), as is a sign.

use std::time::Duration;

/// Why a duration was refused; `text` is what was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("duration {text:?}: {reason}")]
pub struct DurationError {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Parses a duration (see the module documentation).
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let t = text.trim();
    let err = |reason| DurationError {
        text: t.to_owned(),
        reason,
    };
    if t.is_empty() {
        return Err(err("is empty"));
    }
    let mut rest = t;
    let mut nanos: f64 = 0.0;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| err("has no unit (use ns, us, ms, s, m or h)"))?;
        let (number, tail) = rest.split_at(end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(err("needs a number before each unit"));
        }
        let value: f64 = number.parse().map_err(|_| err("has a bad number"))?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_end);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(err("has an unknown unit (use ns, us, ms, s, m or h)")),
        };
        nanos += value * scale;
        rest = next;
    }
    if !nanos.is_finite() || nanos > u64::MAX as f64 {
        return Err(err("is out of range"));
    }
    Ok(Duration::from_nanos(nanos.round() as u64))
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
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("7ns"), Ok(Duration::from_nanos(7)));
    }

    #[test]
    fn parses_compound_durations() {
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h45m"), Ok(Duration::from_secs(9900)));
        assert_eq!(parse_duration("1s500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1.5m10s"), Ok(Duration::from_secs(100)));
    }

    #[test]
    fn rejects_garbage_with_a_reason() {
        for bad in [
            "2",
            "s",
            "2 parsecs",
            "1.2.3s",
            "",
            "-1s",
            "1m30",
            "1x",
            ".s",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(!e.to_string().is_empty(), "{bad}");
        }
        assert_eq!(
            parse_duration("1m30").unwrap_err().to_string(),
            "duration \"1m30\": has no unit (use ns, us, ms, s, m or h)"
        );
    }
}
