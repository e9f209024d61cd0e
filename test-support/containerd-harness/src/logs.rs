//! Waiting on a process's log file: how the NRI tests see a plugin
//! register, synchronise or refuse (the plugin logs to a file the test
//! reads).

use std::path::Path;
use std::time::Duration;

/// Times `needle` occurs in the log file at `log` (0 while it is missing).
pub fn count_in_log(log: &Path, needle: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches(needle)
        .count()
}

/// Waits (up to 60 s) until `needle` is in the log at least `n` times;
/// panics with the log otherwise.
pub async fn wait_log(log: &Path, needle: &str, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while count_in_log(log, needle) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{needle:?} not {n} times in the log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
