//! End to end through both stand-ins and the real runtime: a device plugin
//! registers with the kubelet stand-in over the device plugin v1beta1 wire,
//! a pod is admitted (Allocate called over the wire), the pod is mirrored
//! into the API server stand-in, and the container is then run in the real
//! containerd through CRI with what Allocate answered — the environment and
//! device the plugin handed out are checked from inside the container.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use steward_proto::cri::runtime::v1 as cri;
use steward_proto::deviceplugin::v1beta1::{ContainerAllocateResponse, DeviceSpec};
use steward_testing_apiserver::ApiServer;
use steward_testing_containerd::{ContainerSpec, Containerd, PodNetwork, cleanup_pod, exec_sync};
use steward_testing_kubelet::testing::{TestPlugin, TestPluginConfig};
use steward_testing_kubelet::{ContainerSpec as KubeletContainer, Kubelet, KubeletConfig, PodSpec};

const RESOURCE: &str = "steward.dev/e2e-device";

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
    let config = apply_allocation(ContainerSpec::new("main").build(&sandbox), &alloc);
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

    cleanup_pod(&mut rt, &sandbox_id).await.expect("cleanup");

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
