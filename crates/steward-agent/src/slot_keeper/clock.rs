//! The wall clock of slot claims: milliseconds since the Unix epoch, so
//! claim times survive agent restarts. The device plugins and DRA read it
//! too (settle windows, the DRA safety net).

use std::time::{SystemTime, UNIX_EPOCH};

use steward_core::Millis;

/// Wall-clock milliseconds: claim times survive agent restarts.
pub fn now() -> Millis {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    Millis(u64::try_from(ms).unwrap_or(u64::MAX))
}
