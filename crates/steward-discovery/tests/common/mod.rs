//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use steward_discovery::{Device, DeviceStream, DiscoveryError};
use tokio::sync::oneshot;

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "steward_discovery=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A shutdown trigger and the future a server waits on.
pub fn shutdown_pair() -> (
    oneshot::Sender<()>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = oneshot::channel::<()>();
    (tx, async move {
        let _ = rx.await;
    })
}

/// The next item of `stream`, failing the test after `secs` seconds.
pub async fn next_item(
    stream: &mut DeviceStream,
    secs: u64,
) -> Option<Result<Vec<Device>, DiscoveryError>> {
    tokio::time::timeout(Duration::from_secs(secs), stream.next())
        .await
        .unwrap_or_else(|_| panic!("no stream item within {secs}s"))
}

/// The next list, which must be `Ok`.
pub async fn next_list(stream: &mut DeviceStream, secs: u64) -> Vec<Device> {
    match next_item(stream, secs).await {
        Some(Ok(list)) => list,
        Some(Err(e)) => panic!("stream error: {e}"),
        None => panic!("stream ended"),
    }
}

/// Device ids of a list.
pub fn ids(list: &[Device]) -> Vec<String> {
    list.iter().map(|d| d.id.clone()).collect()
}

/// Polls `cond` every 20 ms until it holds or `secs` pass.
pub async fn wait_until(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}
