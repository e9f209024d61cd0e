//! kubelet's own CRI client as the process-level tests drive it: the Go
//! peer `cri-client` started against a CRI endpoint with `-hold`, its JSON
//! lines read one at a time; and what the tests read back from the node
//! meanwhile: a container's cgroup cpuset, the CPUs a resource manager
//! publishes on its pod resources socket.
//!
//! A module of the tests that run the peer (`mod go_cri;`), not part of
//! `common`, which the discovery benchmark includes and which never
//! panics: these helpers do, as test code.
#![allow(dead_code)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use steward_core::cpu::CpuSet;
use steward_proto::cri::runtime::v1 as cri;
use steward_proto::cri::runtime::v1::runtime_service_client::RuntimeServiceClient;
use steward_proto::podresources::v1 as wire;
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use steward_testing_containerd::{
    BUSYBOX_IMAGE, ContainerSpec, OWNER_LABEL, POD_NAMESPACE, host_cgroup_dir,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tonic::transport::Channel;

/// Longest any one step (a CRI call, a line from the peer, a condition)
/// may take: generous, the machines are shared.
pub const WAIT: Duration = Duration::from_secs(120);

/// The calls the peer makes with `-hold`, in order, each answered with one
/// JSON line.
pub const CALLS: &[&str] = &[
    "Version",
    "ImageStatus",
    "RunPodSandbox",
    "PodSandboxStatus",
    "ListPodSandbox",
    "CreateContainer",
    "StartContainer",
    "ContainerStatus",
    "ListContainers",
    "ExecSync",
    "Hold",
    "UpdateContainerResources",
    "Exec",
    "Attach",
    "PortForward",
    "ContainerStats",
    "ListContainerStats",
    "StopContainer",
    "RemoveContainer",
    "StopPodSandbox",
    "RemovePodSandbox",
    "Done",
];

/// kubelet's pod uid label.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

/// A container's cgroup `cpuset.cpus` (cgroup v1, cgroupfs driver).
pub fn cpuset_of(parent: &str, container_id: &str) -> Option<CpuSet> {
    let file = host_cgroup_dir("cpuset", parent, container_id).join("cpuset.cpus");
    let text = std::fs::read_to_string(file).ok()?;
    CpuSet::parse(text.trim()).ok()
}

pub fn cpuset(text: &str) -> CpuSet {
    CpuSet::parse(text).unwrap_or_else(|e| panic!("{text:?} is not a CPU list: {e}"))
}

/// CPUs the resource manager publishes on its pod resources `socket` for
/// pod `name`'s (in [`POD_NAMESPACE`]) container `container`.
pub async fn published(
    socket: &Path,
    name: &str,
    container: &str,
) -> anyhow::Result<Option<CpuSet>> {
    let channel = steward_proto::uds::endpoint()
        .connect_with_connector(steward_proto::uds::UnixConnector::new(socket))
        .await?;
    let pods = PodResourcesListerClient::new(channel)
        .list(wire::ListPodResourcesRequest {})
        .await?
        .into_inner()
        .pod_resources;
    Ok(pods
        .iter()
        .filter(|p| p.namespace == POD_NAMESPACE && p.name == name)
        .flat_map(|p| &p.containers)
        .find(|c| c.name == container)
        .map(|c| {
            c.cpu_ids
                .iter()
                .filter_map(|id| u32::try_from(*id).ok())
                .collect()
        }))
}

/// Whether [`published`] answers `want` (`None`: the container is not
/// published); an unreachable socket is `false`.
pub async fn published_is(
    socket: &Path,
    name: &str,
    container: &str,
    want: Option<&CpuSet>,
) -> bool {
    published(socket, name, container)
        .await
        .is_ok_and(|got| got.as_ref() == want)
}

/// The peer running one exclusive-CPU pod (`-cpus 1 -hold`): its stdin, to
/// let it go on, and its JSON lines.
pub struct Peer {
    pub child: Child,
    stdin: ChildStdin,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Peer {
    /// Starts `peer` against the CRI socket `endpoint`: pod `name` (uid
    /// `uid`) in [`POD_NAMESPACE`] under `<cgroup_root>/kubepods`, container
    /// `main` of [`BUSYBOX_IMAGE`], labelled with this process as
    /// [`OWNER_LABEL`] (swept on drop). Killed when dropped.
    pub fn spawn(peer: &Path, endpoint: &Path, cgroup_root: &str, name: &str, uid: &str) -> Self {
        let mut child = tokio::process::Command::new(peer)
            .arg("-endpoint")
            .arg(format!("unix://{}", endpoint.display()))
            .args(["-image", BUSYBOX_IMAGE])
            .args(["-cgroup-root", cgroup_root])
            .args(["-namespace", POD_NAMESPACE])
            .args(["-name", name, "-uid", uid, "-container", "main"])
            .args(["-cpus", "1", "-hold"])
            .arg("-labels")
            .arg(format!("{OWNER_LABEL}={}", std::process::id()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", peer.display()));
        let stdin = child.stdin.take().expect("the peer's stdin");
        let lines = BufReader::new(child.stdout.take().expect("the peer's stdout")).lines();
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// The peer's next JSON line (`None` at its end); panics on a failed
    /// call or after [`WAIT`] of silence.
    pub async fn next_line(&mut self, seen: &[Value]) -> Option<Value> {
        let line = tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("the peer said nothing for {WAIT:?} after {seen:?}"))
            .expect("reading the peer's stdout")?;
        let value: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line {line:?}: {e}"));
        assert_eq!(
            value["ok"],
            Value::Bool(true),
            "kubelet's CRI client failed: {value} (after {seen:?})"
        );
        Some(value)
    }

    /// Lets a holding peer go on.
    pub async fn go_on(&mut self) {
        use tokio::io::AsyncWriteExt;
        self.stdin.write_all(b"go on\n").await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// Waits for the peer to exit and checks it succeeded.
    pub async fn exited_ok(mut self, seen: &[Value]) {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the peer exits")
            .unwrap();
        assert!(status.success(), "the peer exited {status} after {seen:?}");
    }
}

pub fn field<'a>(line: &'a Value, key: &str) -> &'a str {
    line[key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

/// A running Burstable container (half a CPU) in a pod of its own: the
/// shared pool an exclusive container's CPU is taken from.
pub struct Shared {
    pub name: String,
    pub parent: String,
    pub sandbox_id: String,
    pub container_id: String,
}

/// Runs [`Shared`] in the pod `sb`, through `rt`.
pub async fn start_shared(
    rt: &mut RuntimeServiceClient<Channel>,
    sb: cri::PodSandboxConfig,
) -> Shared {
    let name = sb.metadata.clone().unwrap().name;
    let parent = sb.linux.clone().unwrap().cgroup_parent;
    let mut cfg = ContainerSpec::new("shared")
        .memory_limit(64 << 20)
        .build(&sb);
    if let Some(res) = cfg.linux.as_mut().and_then(|l| l.resources.as_mut()) {
        res.cpu_shares = 512;
    }
    let sandbox_id = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sb.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("RunPodSandbox (shared)")
        .into_inner()
        .pod_sandbox_id;
    let container_id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(cfg),
            sandbox_config: Some(sb),
        })
        .await
        .expect("CreateContainer (shared)")
        .into_inner()
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: container_id.clone(),
    })
    .await
    .expect("StartContainer (shared)");
    Shared {
        name,
        parent,
        sandbox_id,
        container_id,
    }
}
