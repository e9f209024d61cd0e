//! A private containerd 2.1.9 for the NRI tests: the containerd test
//! harness's [`Containerd2`] (started with `scripts/containerd.sh`, in a
//! mount namespace of its own with a private `/run`), re-exported under the
//! names these tests have always used.

#![allow(unused_imports)]

pub use steward_testing_containerd::{
    CONTAINERD2_BIN_ENV as BIN_ENV, Containerd2, bin_dir, bin_dir_or_skip,
};

/// Times `needle` occurs in the log file at `log` (0 while it is missing).
#[allow(dead_code)]
pub fn count_in_log(log: &std::path::Path, needle: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches(needle)
        .count()
}

/// Waits (up to 60 s) until `needle` is in the log at least `n` times;
/// panics with the log otherwise.
#[allow(dead_code)]
pub async fn wait_log(log: &std::path::Path, needle: &str, n: usize) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while count_in_log(log, needle) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{needle:?} not {n} times in the log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
