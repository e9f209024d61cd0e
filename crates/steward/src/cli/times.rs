//! How the CLI reads and writes times: `--request-timeout`, kubectl's AGE,
//! RFC 3339 timestamps. Parsing and calendar arithmetic are jiff's.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kube::Resource;

/// How long one response may take once connected, by default.
pub const DEFAULT_REQUEST_TIMEOUT: &str = "30s";

/// Why a `--request-timeout` was refused.
#[derive(Debug, thiserror::Error)]
pub enum TimeoutError {
    /// Not a duration.
    #[error("{0}")]
    Duration(#[from] jiff::Error),
    /// Negative durations bound nothing.
    #[error("the timeout must not be negative")]
    Negative,
    /// Zero would mean "no timeout"; the CLI always bounds its calls.
    #[error("the timeout must be more than zero")]
    Zero,
}

/// A `--request-timeout`: a bare number of seconds as kubectl takes it
/// (`7`), or a duration in jiff's friendly format (`500ms`, `30s`, `2m`,
/// `1m30s`, `1h 5m`, `90 seconds`; hours at most) or ISO 8601 (`PT30S`);
/// more than zero.
pub fn parse_request_timeout(s: &str) -> Result<Duration, TimeoutError> {
    let s = s.trim();
    let d = match s.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => {
            let signed: SignedDuration = s.parse()?;
            Duration::try_from(signed).map_err(|_| TimeoutError::Negative)?
        }
    };
    if d.is_zero() {
        return Err(TimeoutError::Zero);
    }
    Ok(d)
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    Timestamp::now().as_millisecond()
}

/// An object's creation time in Unix milliseconds, when the server set it.
pub fn created_ms<K: Resource>(obj: &K) -> Option<i64> {
    obj.meta()
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_millisecond())
}

/// kubectl's AGE: `42s`, `3m12s`, `15m`, `2h5m`, `3d4h`, `400d`, `2y30d`
/// (k8s.io/apimachinery's `HumanDuration`). `<unknown>` without a time.
pub fn age(since_ms: Option<i64>, now_ms: i64) -> String {
    let Some(since) = since_ms else {
        return "<unknown>".into();
    };
    human_duration(now_ms.saturating_sub(since) / 1000)
}

/// apimachinery's `HumanDuration` rounding rules, in whole seconds. Its
/// years are 365 days, not calendar years, so this stays integer arithmetic.
fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return two_units(minutes, "m", seconds % 60, "s");
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        return two_units(hours, "h", minutes % 60, "m");
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return two_units(days, "d", hours % 24, "h");
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return two_units(years, "y", days % 365, "d");
    }
    format!("{years}y")
}

/// `3m12s`, or `3m` when the smaller unit is zero.
fn two_units(big: i64, big_unit: &str, small: i64, small_unit: &str) -> String {
    if small == 0 {
        format!("{big}{big_unit}")
    } else {
        format!("{big}{big_unit}{small}{small_unit}")
    }
}

/// Unix milliseconds as RFC 3339 in UTC, to the second (rounded down):
/// `2025-01-31T08:00:05Z`. Outside jiff's range (years -9999..=9999), the
/// milliseconds as they are.
pub fn rfc3339(ms: i64) -> String {
    match Timestamp::from_millisecond(ms) {
        Ok(t) => t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Err(_) => format!("{ms}ms since the Unix epoch"),
    }
}

/// `2025-01-31T08:00:05Z (3m ago)`, or `<unknown>`.
pub fn when(ms: Option<i64>, now_ms: i64) -> String {
    match ms {
        Some(ms) => format!("{} ({} ago)", rfc3339(ms), age(Some(ms), now_ms)),
        None => "<unknown>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        let cases = [
            (0, "0s"),
            (59, "59s"),
            (119, "119s"),
            (120, "2m"),
            (192, "3m12s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (30 * 3600, "30h"),
            (3 * 86_400 + 4 * 3600, "3d4h"),
            (400 * 86_400, "400d"),
            (3 * 365 * 86_400 + 30 * 86_400, "3y30d"),
            (10 * 365 * 86_400, "10y"),
        ];
        for (secs, want) in cases {
            assert_eq!(age(Some(0), secs * 1000), want, "{secs}s");
        }
        assert_eq!(age(Some(1500), 0), "0s");
        assert_eq!(age(Some(5000), 0), "<invalid>");
        assert_eq!(age(None, 0), "<unknown>");
    }

    #[test]
    fn request_timeouts_parse_like_kubectl_and_jiff() {
        let ok = |s: &str| parse_request_timeout(s).unwrap();
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("7"), Duration::from_secs(7));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("1m 30s"), Duration::from_secs(90));
        assert_eq!(ok("PT30S"), Duration::from_secs(30));
        assert_eq!(ok("90 seconds"), Duration::from_secs(90));
        let err = |s: &str| parse_request_timeout(s).unwrap_err();
        assert!(matches!(err("0"), TimeoutError::Zero));
        assert!(matches!(err("0s"), TimeoutError::Zero));
        assert!(matches!(err("-1s"), TimeoutError::Negative));
        assert!(matches!(err("s"), TimeoutError::Duration(_)));
        assert!(matches!(err("5 fortnights"), TimeoutError::Duration(_)));
        assert!(matches!(err("1d"), TimeoutError::Duration(_)));
    }

    #[test]
    fn rfc3339_is_utc_to_the_second() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_999), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(-1000), "1969-12-31T23:59:59Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
        assert_eq!(
            rfc3339(i64::MAX),
            format!("{}ms since the Unix epoch", i64::MAX)
        );
    }
}
