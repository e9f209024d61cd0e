//! Checkpoint persistence, stand-in process restarts and simulated kubelet restarts.

mod common;

use std::os::unix::fs::FileTypeExt;

use common::{RESOURCE, WAIT, plugin, set, start};
use steward_testing_kubelet::testing::{TestPlugin, TestPluginConfig};
use steward_testing_kubelet::{ContainerSpec, Kubelet, KubeletConfig, Phase, PodSpec};

fn pod(name: &str, count: i64) -> PodSpec {
    PodSpec::new("default", name).container(ContainerSpec::new("main").limit(RESOURCE, count))
}

fn is_socket(path: &std::path::Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

#[tokio::test]
async fn checkpoint_survives_a_stand_in_process_restart() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(KubeletConfig::new(dir.path(), "node-1"))
        .await
        .unwrap();
    let mut p = plugin(
        &kubelet,
        TestPluginConfig::new(RESOURCE, "p.sock", &["a", "b", "c"]),
    )
    .await;
    let held = kubelet.add_pod(pod("keeper", 2)).await.unwrap();
    let held_devices = held.devices["main"][RESOURCE].clone();

    // The checkpoint is kubelet's JSON shape and names the allocation.
    let text = std::fs::read_to_string(kubelet.checkpoint_path()).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let entries = json["Data"]["PodDeviceEntries"].as_array().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["PodUID"], held.uid.as_str());
    assert_eq!(entries[0]["ContainerName"], "main");
    assert_eq!(entries[0]["ResourceName"], RESOURCE);
    let ids: Vec<&str> = entries[0]["DeviceIDs"]["-1"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(set(&ids), held_devices);
    assert!(entries[0]["AllocResp"].is_string());
    assert_eq!(
        json["Data"]["RegisteredDevices"][RESOURCE]
            .as_array()
            .unwrap()
            .len(),
        3
    );

    // The process goes away; a new one starts on the same root directory.
    drop(kubelet);
    let kubelet = Kubelet::start(KubeletConfig::new(dir.path(), "node-1"))
        .await
        .unwrap();
    assert_eq!(
        kubelet.allocated(&held.uid).unwrap()["main"][RESOURCE],
        held_devices
    );
    assert_eq!(
        kubelet.allocate_response(&held.uid, "main", RESOURCE),
        Some(held.responses["main"][RESOURCE].clone())
    );
    assert_eq!(kubelet.pod(&held.uid).unwrap().phase, Phase::Running);
    // Startup removed the plugin's socket; resources are unknown until it re-registers.
    assert!(!p.socket_path().exists());
    assert!(kubelet.resources().is_empty());

    p.restart().await.unwrap();
    p.register(kubelet.kubelet_socket()).await.unwrap();
    kubelet
        .wait_for_resource(RESOURCE, |s| s.healthy.len() == 3, WAIT)
        .await
        .unwrap();
    // The restored allocation still holds two devices.
    let err = kubelet.add_pod(pod("greedy", 2)).await.unwrap_err();
    assert!(
        err.to_string().contains("Requested: 2, Available: 1"),
        "{err}"
    );
    let other = kubelet.add_pod(pod("modest", 1)).await.unwrap();
    assert!(other.devices["main"][RESOURCE].is_disjoint(&held_devices));
}

#[tokio::test]
async fn restart_removes_plugin_sockets_and_plugins_re_register() {
    let env = start().await;
    let kubelet = &env.kubelet;
    let mut p = plugin(
        kubelet,
        TestPluginConfig::new(RESOURCE, "p.sock", &["a", "b"]),
    )
    .await;
    p.wait_for_open_streams(1, WAIT).await.unwrap();
    let held = kubelet.add_pod(pod("survivor", 1)).await.unwrap();
    let notes = kubelet.plugin_dir().join("notes.txt");
    std::fs::write(&notes, "not a socket").unwrap();
    assert!(is_socket(p.socket_path()));

    kubelet.restart().await.unwrap();

    assert!(!p.socket_path().exists(), "plugin socket must be deleted");
    assert!(
        is_socket(kubelet.kubelet_socket()),
        "kubelet.sock recreated"
    );
    assert!(is_socket(kubelet.pod_resources_socket()));
    assert!(notes.exists(), "regular files are left alone");
    assert!(kubelet.checkpoint_path().exists());
    assert!(kubelet.resources().is_empty(), "resources forgotten");
    p.wait_for_open_streams(0, WAIT).await.unwrap();
    assert_eq!(kubelet.allocated(&held.uid), Some(held.devices.clone()));

    // The plugin serves again and re-registers.
    p.restart().await.unwrap();
    p.register(kubelet.kubelet_socket()).await.unwrap();
    let st = kubelet
        .wait_for_resource(RESOURCE, |s| s.healthy == set(&["a", "b"]), WAIT)
        .await
        .unwrap();
    assert_eq!(st.registrations, 1);
    p.wait_for_open_streams(1, WAIT).await.unwrap();
    let next = kubelet.add_pod(pod("after", 1)).await.unwrap();
    assert!(next.devices["main"][RESOURCE].is_disjoint(&held.devices["main"][RESOURCE]));
}

#[tokio::test]
async fn deletion_and_corruption_are_handled() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(KubeletConfig::new(dir.path(), "node-1"))
        .await
        .unwrap();
    let _p = plugin(&kubelet, TestPluginConfig::new(RESOURCE, "p.sock", &["a"])).await;
    let first = kubelet.add_pod(pod("first", 1)).await.unwrap();
    kubelet.delete_pod(&first.uid).await.unwrap();
    let text = std::fs::read_to_string(kubelet.checkpoint_path()).unwrap();
    assert!(
        !text.contains(&first.uid),
        "deleted pod left the checkpoint"
    );

    let second = kubelet.add_pod(pod("second", 1)).await.unwrap();
    let path = kubelet.checkpoint_path().to_path_buf();
    drop(kubelet);
    // Tamper with the checkpoint: kubelet logs and carries on without it.
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace(&second.uid, "someone-else")).unwrap();
    let kubelet = Kubelet::start(KubeletConfig::new(dir.path(), "node-1"))
        .await
        .unwrap();
    assert_eq!(kubelet.allocated(&second.uid), None);
    assert_eq!(kubelet.allocated("someone-else"), None);
}

#[tokio::test]
async fn plugin_sockets_left_before_start_are_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let p = TestPlugin::serve(
        &plugin_dir,
        TestPluginConfig::new(RESOURCE, "early.sock", &["a"]),
    )
    .await
    .unwrap();
    assert!(is_socket(p.socket_path()));
    let _kubelet = Kubelet::start(KubeletConfig::new(dir.path(), "node-1"))
        .await
        .unwrap();
    assert!(!p.socket_path().exists());
}
