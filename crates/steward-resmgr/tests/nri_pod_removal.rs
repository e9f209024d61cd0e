//! Pods whose removal containerd 2.1.9 never announces over NRI: after a
//! containerd restart its NRI layer knows the states of containers only
//! (its Synchronize records them), so a pod that predates the restart gets
//! neither StopPodSandbox nor RemovePodSandbox, only its containers'
//! events. Against a real private containerd 2.1.9: the plugin forgets
//! such a pod with its last container instead of keeping it cached until
//! the next Synchronize; a pod created after the restart goes as before.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use std::path::Path;
use std::time::Duration;

use common::{container, eventually, init_tracing, run_pod};
use steward_resmgr::ManagerConfig;
use steward_resmgr::nri::{NriConfig, NriPlugin};
use steward_testing_containerd as harness;

fn plugin_config(ctrd: &harness::Containerd2, dir: &Path) -> NriConfig {
    let file = dir.join("config.yaml");
    std::fs::write(&file, "policy: { active: static }").unwrap();
    let mut cfg = ManagerConfig::new(dir.join("state"));
    cfg.config_file = Some(file);
    cfg.verify_interval = Duration::ZERO;
    let mut nri = NriConfig::new(cfg);
    nri.socket = ctrd.nri_sock();
    nri.name = "steward-removal".into();
    nri.reconnect = Duration::from_millis(100);
    nri
}

async fn gone(plugin: &NriPlugin, sid: &str, what: &str) {
    let m = plugin.manager().clone();
    let sid = sid.to_owned();
    eventually(20, what, || {
        let (m, sid) = (m.clone(), sid.clone());
        async move { !m.snapshot().await.pods.contains_key(&sid) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_from_before_a_runtime_restart_is_forgotten_when_removed() {
    let Some(bin) = harness::bin_dir_or_skip("nri_pod_removal") else {
        return;
    };
    init_tracing();
    let mut ctrd = harness::Containerd2::start(bin);
    let dir = tempfile::tempdir().unwrap();
    let plugin = NriPlugin::start(plugin_config(&ctrd, dir.path()))
        .await
        .unwrap();
    assert!(plugin.registered(1, Duration::from_secs(20)).await);
    let (mut rt, _img) = harness::cri_client(ctrd.sock()).await.unwrap();
    let sa = harness::pod_sandbox_config(&ctrd.cgroup_parent, "old", harness::PodNetwork::Host);
    let (sid_a, a) = run_pod(&mut rt, &sa, container(&sa, "a", 512, 0, 32 << 20)).await;

    ctrd.restart();
    assert!(
        plugin.registered(2, Duration::from_secs(30)).await,
        "no reconnect after the runtime restarted:\n{}",
        ctrd.log()
    );
    let (mut rt, _img) = harness::cri_client(ctrd.sock()).await.unwrap();
    let snap = plugin.manager().snapshot().await;
    assert!(snap.pods.contains_key(&sid_a) && snap.containers.contains_key(&a));

    // Created after the restart: its removal is announced.
    let sb = harness::pod_sandbox_config(&ctrd.cgroup_parent, "new", harness::PodNetwork::Host);
    let (sid_b, _b) = run_pod(&mut rt, &sb, container(&sb, "b", 512, 0, 32 << 20)).await;
    harness::cleanup_pod(&mut rt, &sid_b).await.unwrap();
    gone(
        &plugin,
        &sid_b,
        "the pod created after the restart forgotten",
    )
    .await;

    // From before it: only its container's events come.
    harness::cleanup_pod(&mut rt, &sid_a).await.unwrap();
    gone(&plugin, &sid_a, "the pod from before the restart forgotten").await;
    assert!(
        !plugin
            .manager()
            .snapshot()
            .await
            .containers
            .contains_key(&a)
    );
    plugin.shutdown().await;
}
