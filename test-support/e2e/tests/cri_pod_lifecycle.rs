//! CRI pod lifecycle against a real containerd (started by the harness, or
//! the one named by `STEWARD_CONTAINERD_SOCK`).
//!
//! Needs root and containerd/runc/busybox-static/CNI plugins (installed on
//! demand). When containerd cannot be started the tests fail; they never
//! skip silently.

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;

use steward_proto::cri::runtime::v1 as cri;
use steward_proto::cri::runtime::v1::runtime_service_client::RuntimeServiceClient;
use steward_testing_containerd::{
    BUSYBOX_IMAGE, ContainerSpec, Containerd, PodNetwork, cleanup_pod, exec_sync, host_cgroup_dir,
    run_pod_with_container,
};
use tonic::transport::Channel;

const MIB_64: i64 = 64 * 1024 * 1024;

fn containerd() -> Arc<Containerd> {
    match Containerd::shared() {
        Ok(c) => c,
        Err(e) => panic!(
            "cannot start or reach containerd for the CRI tests (they need root and the \
             containerd, runc, busybox-static and containernetworking-plugins packages): {e}"
        ),
    }
}

/// Value of a `/proc/<pid>/status` field, e.g. `Cpus_allowed_list`.
fn status_field<'a>(status: &'a str, field: &str) -> Option<&'a str> {
    status.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(":\t"))
            .map(str::trim)
    })
}

/// The container's memory limit: read inside the container (cgroup v1 or
/// v2 file), falling back to the container's cgroup directory on the host.
async fn memory_limit(
    rt: &mut RuntimeServiceClient<Channel>,
    container_id: &str,
    pod_cgroup_parent: &str,
) -> String {
    for file in [
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory.max",
    ] {
        if let Ok(out) = exec_sync(rt, container_id, &["cat", file]).await {
            return out.stdout.trim().to_owned();
        }
    }
    let host =
        host_cgroup_dir("memory", pod_cgroup_parent, container_id).join("memory.limit_in_bytes");
    match std::fs::read_to_string(&host) {
        Ok(s) => s.trim().to_owned(),
        Err(e) => panic!(
            "memory limit visible neither inside the container nor at {}: {e}",
            host.display()
        ),
    }
}

async fn container_state(
    rt: &mut RuntimeServiceClient<Channel>,
    id: &str,
) -> Result<cri::ContainerState, String> {
    let status = rt
        .container_status(cri::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        })
        .await
        .map_err(|e| format!("ContainerStatus {id}: {e}"))?
        .into_inner()
        .status
        .ok_or_else(|| format!("ContainerStatus {id}: no status"))?;
    cri::ContainerState::try_from(status.state).map_err(|e| format!("container state: {e}"))
}

async fn sandbox_ids(rt: &mut RuntimeServiceClient<Channel>) -> Result<Vec<String>, tonic::Status> {
    Ok(rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await?
        .into_inner()
        .items
        .into_iter()
        .map(|s| s.id)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_network_pod_with_cpuset_and_memory_limit() {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    assert!(
        cpus >= 2,
        "this test pins to CPUs 0-1 and needs 2 CPUs, found {cpus}"
    );

    let containerd = containerd();
    let (mut rt, mut images) = containerd.client().await.expect("connect CRI");

    let version = rt
        .version(cri::VersionRequest {
            version: "v1".to_owned(),
        })
        .await
        .expect("Version")
        .into_inner();
    assert_eq!(version.runtime_name, "containerd");
    assert_eq!(version.runtime_api_version, "v1");

    let image = images
        .image_status(cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: BUSYBOX_IMAGE.to_owned(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .expect("ImageStatus")
        .into_inner()
        .image
        .expect("busybox image imported");
    assert!(
        image.repo_tags.iter().any(|t| t == BUSYBOX_IMAGE),
        "{:?}",
        image.repo_tags
    );

    let sandbox = containerd.pod_config("lifecycle", PodNetwork::Host);
    let pod_cgroup = sandbox
        .linux
        .as_ref()
        .map(|l| l.cgroup_parent.clone())
        .unwrap_or_default();
    assert!(pod_cgroup.starts_with(containerd.cgroup_parent()));

    let sandbox_id = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    assert!(
        sandbox_ids(&mut rt)
            .await
            .expect("ListPodSandbox")
            .contains(&sandbox_id)
    );

    let spec = ContainerSpec::new("work").cpuset("0").memory_limit(MIB_64);
    let container_id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(spec.build(&sandbox)),
            sandbox_config: Some(sandbox.clone()),
        })
        .await
        .expect("CreateContainer")
        .into_inner()
        .container_id;
    assert_eq!(
        container_state(&mut rt, &container_id)
            .await
            .expect("container state"),
        cri::ContainerState::ContainerCreated
    );

    rt.start_container(cri::StartContainerRequest {
        container_id: container_id.clone(),
    })
    .await
    .expect("StartContainer");
    assert_eq!(
        container_state(&mut rt, &container_id)
            .await
            .expect("container state"),
        cri::ContainerState::ContainerRunning
    );

    // The cpuset and memory limit given at creation are in force.
    let status = exec_sync(&mut rt, &container_id, &["cat", "/proc/self/status"])
        .await
        .expect("exec cat /proc/self/status");
    assert!(
        status.stdout.contains("Cpus_allowed_list:\t0\n"),
        "Cpus_allowed_list: {:?}",
        status_field(&status.stdout, "Cpus_allowed_list")
    );
    assert_eq!(
        memory_limit(&mut rt, &container_id, &pod_cgroup).await,
        MIB_64.to_string()
    );

    // The host sees the container's cgroup under our private parent.
    let host_cpuset = host_cgroup_dir("cpuset", &pod_cgroup, &container_id);
    assert_eq!(
        std::fs::read_to_string(host_cpuset.join("cpuset.cpus"))
            .map(|s| s.trim().to_owned())
            .ok(),
        Some("0".to_owned()),
        "{}",
        host_cpuset.display()
    );

    let stats = rt
        .container_stats(cri::ContainerStatsRequest {
            container_id: container_id.clone(),
        })
        .await
        .expect("ContainerStats")
        .into_inner()
        .stats
        .expect("stats");
    assert_eq!(stats.attributes.map(|a| a.id), Some(container_id.clone()));
    assert!(stats.memory.is_some(), "no memory stats");

    // Widen the cpuset while it runs.
    rt.update_container_resources(cri::UpdateContainerResourcesRequest {
        container_id: container_id.clone(),
        linux: Some(
            ContainerSpec::new("work")
                .cpuset("0-1")
                .memory_limit(MIB_64)
                .resources(),
        ),
        ..Default::default()
    })
    .await
    .expect("UpdateContainerResources");
    let status = exec_sync(&mut rt, &container_id, &["cat", "/proc/self/status"])
        .await
        .expect("exec after update");
    assert_eq!(
        status_field(&status.stdout, "Cpus_allowed_list"),
        Some("0-1")
    );
    assert_eq!(
        memory_limit(&mut rt, &container_id, &pod_cgroup).await,
        MIB_64.to_string()
    );
    assert_eq!(
        container_state(&mut rt, &container_id)
            .await
            .expect("container state"),
        cri::ContainerState::ContainerRunning
    );

    rt.stop_container(cri::StopContainerRequest {
        container_id: container_id.clone(),
        timeout: 0,
    })
    .await
    .expect("StopContainer");
    assert_eq!(
        container_state(&mut rt, &container_id)
            .await
            .expect("container state"),
        cri::ContainerState::ContainerExited
    );

    rt.remove_container(cri::RemoveContainerRequest {
        container_id: container_id.clone(),
    })
    .await
    .expect("RemoveContainer");
    let gone = rt
        .container_status(cri::ContainerStatusRequest {
            container_id: container_id.clone(),
            verbose: false,
        })
        .await
        .expect_err("container still known after RemoveContainer");
    assert_eq!(gone.code(), tonic::Code::NotFound);
    assert!(
        !host_cpuset.exists(),
        "{} left behind",
        host_cpuset.display()
    );

    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sandbox_id.clone(),
    })
    .await
    .expect("StopPodSandbox");
    let state = rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.clone(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus")
        .into_inner()
        .status
        .map(|s| s.state);
    assert_eq!(state, Some(cri::PodSandboxState::SandboxNotready as i32));

    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sandbox_id.clone(),
    })
    .await
    .expect("RemovePodSandbox");
    assert!(
        !sandbox_ids(&mut rt)
            .await
            .expect("ListPodSandbox")
            .contains(&sandbox_id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cni_pod_gets_its_own_network_namespace() {
    let containerd = containerd();
    let (mut rt, _images) = containerd.client().await.expect("connect CRI");

    let sandbox = containerd.pod_config("cni", PodNetwork::Pod);
    let (sandbox_id, container_id) =
        run_pod_with_container(&mut rt, &sandbox, &ContainerSpec::new("net"))
            .await
            .expect("run pod with CNI network");

    let ip = rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.clone(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus")
        .into_inner()
        .status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .unwrap_or_default();
    let ip: Ipv4Addr = ip.parse().unwrap_or_else(|e| panic!("pod IP {ip:?}: {e}"));
    assert!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}");

    // The address the runtime reports is configured inside the pod...
    let addrs = exec_sync(&mut rt, &container_id, &["ip", "-4", "addr", "show"])
        .await
        .expect("exec ip addr");
    assert!(
        addrs.stdout.contains(&format!("inet {ip}/")),
        "{}",
        addrs.stdout
    );

    // ...which lives in a network namespace other than the host's.
    let inside = exec_sync(&mut rt, &container_id, &["readlink", "/proc/self/ns/net"])
        .await
        .expect("exec readlink");
    let host = std::fs::read_link(Path::new("/proc/self/ns/net")).expect("host netns");
    assert_ne!(inside.stdout.trim(), host.to_string_lossy());

    cleanup_pod(&mut rt, &sandbox_id)
        .await
        .expect("cleanup pod");
    assert!(
        !sandbox_ids(&mut rt)
            .await
            .expect("ListPodSandbox")
            .contains(&sandbox_id)
    );
    let gone = rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.clone(),
            verbose: false,
        })
        .await
        .expect_err("sandbox still known after cleanup");
    assert_eq!(gone.code(), tonic::Code::NotFound);
}
