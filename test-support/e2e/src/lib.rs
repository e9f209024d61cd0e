//! End-to-end tests across the stand-ins, containerd and steward

pub mod cdi;
pub mod chart;

use std::future::Future;
use std::time::Duration;

/// Polls `f` every 25 ms until it returns `Some`, panicking with `what`
/// after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
