//! End to end through both stand-ins and the real runtime: a device plugin
//! registers with the kubelet stand-in over the device plugin v1beta1 wire,
//! a pod is admitted (Allocate called over the wire), the pod is mirrored
//! into the API server stand-in, and the container is then run in the real
//! containerd through CRI with what Allocate answered — the environment and
//! device the plugin handed out are checked from inside the container.
//! The CDI devices of the answer reach the container too: on containerd 2.x
//! the stand-in passes them in `ContainerConfig.CDI_devices` and containerd
//! injects them from its spec directory; on 1.6 (no CDI) the stand-in
//! applies them itself. The spec's environment, device nodes and mounts are
//! checked from inside on both.
#![allow(clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use steward_proto::cri::runtime::v1 as cri;
use steward_proto::deviceplugin::v1beta1::{ContainerAllocateResponse, DeviceSpec};
use steward_testing_apiserver::ApiServer;
use steward_testing_containerd::{ContainerSpec, Containerd, PodNetwork, cleanup_pod, exec_sync};
use steward_testing_kubelet::cdi::{self, Injection};
use steward_testing_kubelet::testing::{TestPlugin, TestPluginConfig};
use steward_testing_kubelet::{ContainerSpec as KubeletContainer, Kubelet, KubeletConfig, PodSpec};

const RESOURCE: &str = "steward.dev/e2e-device";
/// The CDI kind the test plugin names its devices with.
const CDI_KIND: &str = "example.com/test";
/// The spec file this test writes (one name: a rerun replaces it).
const CDI_SPEC_FILE: &str = "steward-e2e-kubelet-to-containerd.json";

/// A CDI spec for the test plugin's devices: an env entry for the kind and
/// one per device, a device node backed by `/dev/null`, and a read-only bind
/// mount of a directory holding a file that names the device.
fn write_cdi_spec(spec_dir: &std::path::Path, mounts_dir: &std::path::Path, ids: &[&str]) {
    let devices: Vec<serde_json::Value> = ids
        .iter()
        .map(|id| {
            let src = mounts_dir.join(id);
            std::fs::create_dir_all(&src).expect("mount source");
            std::fs::write(src.join("device"), id).expect("mount source file");
            serde_json::json!({
                "name": id,
                "containerEdits": {
                    "env": [format!("STEWARD_CDI_DEVICE={id}")],
                    "deviceNodes": [{"path": format!("/dev/steward-cdi-{id}"), "hostPath": "/dev/null"}],
                    "mounts": [{"hostPath": src, "containerPath": "/steward-cdi", "options": ["ro", "bind"]}]
                }
            })
        })
        .collect();
    let spec = serde_json::json!({
        "cdiVersion": "0.6.0",
        "kind": CDI_KIND,
        "containerEdits": {"env": ["STEWARD_CDI_KIND=example.com/test"]},
        "devices": devices,
    });
    std::fs::create_dir_all(spec_dir).expect("CDI spec dir");
    std::fs::write(spec_dir.join(CDI_SPEC_FILE), spec.to_string()).expect("CDI spec");
}

fn containerd() -> Arc<Containerd> {
    match Containerd::shared() {
        Ok(c) => c,
        Err(e) => {
            panic!("cannot start or reach containerd (needs root and the containerd packages): {e}")
        }
    }
}

/// The CRI container config kubelet would build from the device plugin's
/// answer: envs, device nodes and annotations carried over.
fn apply_allocation(
    mut config: cri::ContainerConfig,
    alloc: &ContainerAllocateResponse,
) -> cri::ContainerConfig {
    for (key, value) in &alloc.envs {
        config.envs.push(cri::KeyValue {
            key: key.clone(),
            value: value.clone().into_bytes(),
        });
    }
    for dev in &alloc.devices {
        config.devices.push(cri::Device {
            container_path: dev.container_path.clone(),
            host_path: dev.host_path.clone(),
            permissions: dev.permissions.clone(),
        });
    }
    config.annotations.extend(alloc.annotations.clone());
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_pod_runs_in_containerd_with_the_allocated_device() {
    let ctrd = containerd();
    let api = ApiServer::start().await.expect("API server stand-in");
    let root = tempfile::tempdir().expect("tempdir");
    let kubelet = Kubelet::start(KubeletConfig {
        root_dir: root.path().to_path_buf(),
        node_name: "e2e-node".into(),
        api: Some(api.client()),
    })
    .await
    .expect("kubelet stand-in");

    // A plugin with two devices; its Allocate answers an env var and a device node.
    let plugin = TestPlugin::serve(
        kubelet.plugin_dir(),
        TestPluginConfig::new(RESOURCE, "e2e.sock", &["dev-a", "dev-b"]),
    )
    .await
    .expect("test plugin");
    plugin
        .register(kubelet.kubelet_socket())
        .await
        .expect("register");
    kubelet
        .wait_for_resource(RESOURCE, |s| s.healthy.len() == 2, Duration::from_secs(10))
        .await
        .expect("both devices healthy");

    let admitted = kubelet
        .add_pod(
            PodSpec::new("default", "e2e-pod")
                .container(KubeletContainer::new("main").limit(RESOURCE, 1)),
        )
        .await
        .expect("pod admitted");
    let granted: Vec<String> = admitted
        .devices
        .get("main")
        .and_then(|r| r.get(RESOURCE))
        .map(|ids| ids.iter().cloned().collect())
        .unwrap_or_default();
    assert_eq!(granted.len(), 1, "one device granted: {granted:?}");
    assert_eq!(
        plugin.calls().allocate,
        vec![granted.clone()],
        "Allocate went over the wire with the granted id"
    );

    // The pod is in the API server, bound to the node and Running.
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    let pod = pods.get("e2e-pod").await.expect("mirrored pod");
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("e2e-node")
    );
    assert_eq!(pod.metadata.uid.as_deref(), Some(admitted.uid.as_str()));
    kubelet
        .wait_for_pod(
            &admitted.uid,
            |p| p.is_some_and(|p| p.phase == steward_testing_kubelet::Phase::Running),
            Duration::from_secs(5),
        )
        .await
        .expect("running");

    // Run it for real with what the plugin answered, plus an env and a device
    // node of our own so the check below does not depend on the plugin's defaults.
    let mut alloc = kubelet
        .allocate_response(&admitted.uid, "main", RESOURCE)
        .expect("allocate response kept");
    // The test plugin names host device nodes that do not exist on this
    // machine: keep the container paths it chose, backed by /dev/null.
    assert!(
        !alloc.devices.is_empty(),
        "the plugin answered device specs"
    );
    for dev in &mut alloc.devices {
        dev.host_path = "/dev/null".into();
    }
    let plugin_device_path = alloc.devices[0].container_path.clone();
    alloc
        .envs
        .insert("STEWARD_E2E_DEVICE".into(), granted[0].clone());
    alloc.devices.push(DeviceSpec {
        container_path: "/dev/steward-e2e".into(),
        host_path: "/dev/null".into(),
        permissions: "rw".into(),
    });
    let envs_expected: BTreeMap<String, String> = alloc.envs.clone().into_iter().collect();

    // The answer's CDI devices: the runtime injects them (2.x) or the
    // stand-in applies them (1.6).
    let cdi_ids: Vec<String> = alloc.cdi_devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(
        cdi_ids,
        [format!("{CDI_KIND}={}", granted[0])],
        "the answer names the granted device by CDI"
    );
    let (cdi_dir, injection) = steward_e2e::cdi::target(&ctrd, &root.path().join("cdi")).await;
    write_cdi_spec(
        &cdi_dir,
        &root.path().join("cdi-mounts"),
        &["dev-a", "dev-b"],
    );
    let expected = cdi::resolve(&[&cdi_dir], &cdi_ids).expect("the CDI devices resolve");

    let (mut rt, _img) = ctrd.client().await.expect("CRI client");
    let sandbox = ctrd.pod_config("e2e-kubelet", PodNetwork::Host);
    let sandbox_id = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    let mut config = apply_allocation(ContainerSpec::new("main").build(&sandbox), &alloc);
    let applied = cdi::pass_devices(&mut config, &cdi_ids, &[&cdi_dir], injection)
        .expect("the CDI devices are passed on");
    match injection {
        Injection::Runtime => assert!(
            applied.is_none() && config.cdi_devices.len() == 1,
            "the runtime gets the CDI ids and nothing else"
        ),
        Injection::StandIn => assert!(
            config.cdi_devices.is_empty(),
            "a runtime without CDI gets the edits, not the ids"
        ),
    }
    let result = async {
        let id = rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.clone(),
                config: Some(config),
                sandbox_config: Some(sandbox.clone()),
            })
            .await?
            .into_inner()
            .container_id;
        rt.start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await?;
        Ok::<_, tonic::Status>(id)
    }
    .await;
    let container_id = match result {
        Ok(id) => id,
        Err(status) => {
            let _ = cleanup_pod(&mut rt, &sandbox_id).await;
            panic!("creating the container failed: {status}");
        }
    };

    let env = exec_sync(&mut rt, &container_id, &["env"])
        .await
        .expect("env");
    for (k, v) in &envs_expected {
        assert!(
            env.stdout.lines().any(|l| l == format!("{k}={v}")),
            "{k}={v} missing from container env:\n{}",
            env.stdout
        );
    }
    let ls = exec_sync(&mut rt, &container_id, &["ls", "-l", "/dev/steward-e2e"])
        .await
        .expect("device node");
    assert!(
        ls.stdout.starts_with('c'),
        "a character device node: {}",
        ls.stdout
    );
    let ls = exec_sync(&mut rt, &container_id, &["ls", "-l", &plugin_device_path])
        .await
        .expect("the plugin's device node");
    assert!(
        ls.stdout.starts_with('c'),
        "the plugin's device path is a device node: {}",
        ls.stdout
    );

    // What the CDI spec says, from inside: env, device node, mount.
    steward_e2e::cdi::assert_edits_inside(&mut rt, &container_id, &expected).await;
    let marker = exec_sync(&mut rt, &container_id, &["cat", "/steward-cdi/device"])
        .await
        .expect("the CDI mount");
    assert_eq!(
        marker.stdout, granted[0],
        "the granted device's directory is mounted"
    );

    cleanup_pod(&mut rt, &sandbox_id).await.expect("cleanup");
    let _ = std::fs::remove_file(cdi_dir.join(CDI_SPEC_FILE));

    // Pod terminated → its device is reusable by the next pod.
    kubelet
        .terminate_pod(&admitted.uid, steward_testing_kubelet::Phase::Succeeded)
        .await
        .expect("terminate");
    let second = kubelet
        .add_pod(
            PodSpec::new("default", "e2e-pod-2")
                .container(KubeletContainer::new("main").limit(RESOURCE, 2)),
        )
        .await
        .expect("both devices free again");
    assert_eq!(
        second
            .devices
            .get("main")
            .and_then(|r| r.get(RESOURCE))
            .map(|s| s.len()),
        Some(2)
    );
    kubelet.shutdown().await;
    api.shutdown().await;
}
