//! Shared helpers for the stand-in's integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

pub mod dra;

use steward_testing_kubelet::testing::{TestPlugin, TestPluginConfig};
use steward_testing_kubelet::{Kubelet, KubeletConfig};

pub const RESOURCE: &str = "example.com/dev";
pub const WAIT: Duration = Duration::from_secs(10);

pub struct Env {
    // Keeps the directory alive for the test's duration.
    pub dir: tempfile::TempDir,
    pub kubelet: Kubelet,
}

pub async fn start() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(KubeletConfig::new(dir.path(), "node-1"))
        .await
        .unwrap();
    Env { dir, kubelet }
}

/// Serves a plugin, registers it and waits until the stand-in has seen its
/// whole device list.
pub async fn plugin(kubelet: &Kubelet, config: TestPluginConfig) -> TestPlugin {
    let expected = config.devices.len();
    let resource = config.resource_name.clone();
    let plugin = TestPlugin::serve(kubelet.plugin_dir(), config)
        .await
        .unwrap();
    plugin.register(kubelet.kubelet_socket()).await.unwrap();
    kubelet
        .wait_for_resource(
            &resource,
            |s| s.connected && s.healthy.len() + s.unhealthy.len() == expected,
            WAIT,
        )
        .await
        .unwrap();
    plugin
}

pub fn set(ids: &[&str]) -> std::collections::BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}
