//! Helpers shared by the integration tests: a proxy in front of a real
//! containerd, CRI clients, pod/container builders, read-back helpers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use steward_proto::cri::runtime::v1 as cri;
use steward_proto::cri::runtime::v1::image_service_client::ImageServiceClient;
use steward_proto::cri::runtime::v1::runtime_service_client::RuntimeServiceClient;
use steward_resmgr::{Proxy, ProxyConfig};
use steward_testing_containerd::{ContainerSpec, cri_client, exec_sync, host_cgroup_dir};
use tonic::transport::Channel;

/// One proxy per runtime at a time: a proxy adopts every container it finds
/// in its runtime, so tests sharing a containerd take turns.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub type Rt = RuntimeServiceClient<Channel>;
pub type Img = ImageServiceClient<Channel>;

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "steward_resmgr=info".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Proxy settings for a test: socket and state under `dir`, the config
/// file `dir/config.yaml` (written from `config`), fast probes, no
/// periodic read-back (tests call it).
pub fn proxy_config(runtime: &Path, dir: &Path, config: &str) -> ProxyConfig {
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join("config.yaml");
    std::fs::write(&file, config).unwrap();
    let mut cfg = ProxyConfig::new(dir.join("proxy.sock"), runtime, dir.join("state"));
    cfg.manager.config_file = Some(file);
    cfg.runtime_probe = Duration::from_millis(100);
    cfg.manager.config_poll = Duration::from_millis(100);
    cfg.manager.verify_interval = Duration::ZERO;
    cfg.runtime_timeout = Duration::from_secs(10);
    cfg
}

pub async fn start_proxy(cfg: ProxyConfig) -> (Proxy, Rt, Img) {
    let proxy = Proxy::start(cfg).await.expect("proxy starts");
    let (rt, img) = cri_client(proxy.socket())
        .await
        .expect("client connects to the proxy");
    (proxy, rt, img)
}

/// A busybox container config with kubelet-style resources.
pub fn container(
    sandbox: &cri::PodSandboxConfig,
    name: &str,
    shares: i64,
    quota: i64,
    memory: i64,
) -> cri::ContainerConfig {
    let mut cfg = ContainerSpec::new(name).build(sandbox);
    let linux = cfg.linux.get_or_insert_with(Default::default);
    linux.resources = Some(cri::LinuxContainerResources {
        cpu_shares: shares,
        cpu_quota: quota,
        cpu_period: if quota > 0 { 100_000 } else { 0 },
        memory_limit_in_bytes: memory,
        oom_score_adj: 0,
        ..Default::default()
    });
    cfg
}

pub async fn run_sandbox(rt: &mut Rt, sandbox: &cri::PodSandboxConfig) -> String {
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(sandbox.clone()),
        runtime_handler: String::new(),
    })
    .await
    .expect("RunPodSandbox")
    .into_inner()
    .pod_sandbox_id
}

pub async fn create(
    rt: &mut Rt,
    sandbox_id: &str,
    sandbox: &cri::PodSandboxConfig,
    config: cri::ContainerConfig,
) -> Result<String, tonic::Status> {
    rt.create_container(cri::CreateContainerRequest {
        pod_sandbox_id: sandbox_id.to_owned(),
        config: Some(config),
        sandbox_config: Some(sandbox.clone()),
    })
    .await
    .map(|r| r.into_inner().container_id)
}

pub async fn start(rt: &mut Rt, id: &str) {
    rt.start_container(cri::StartContainerRequest {
        container_id: id.to_owned(),
    })
    .await
    .expect("StartContainer");
}

/// Sandbox + one started container. Returns (sandbox id, container id).
pub async fn run_pod(
    rt: &mut Rt,
    sandbox: &cri::PodSandboxConfig,
    config: cri::ContainerConfig,
) -> (String, String) {
    let sid = run_sandbox(rt, sandbox).await;
    let cid = create(rt, &sid, sandbox, config)
        .await
        .expect("CreateContainer");
    start(rt, &cid).await;
    (sid, cid)
}

/// `Cpus_allowed_list` of the container's main process, seen from inside.
pub async fn cpus_inside(rt: &mut Rt, cid: &str) -> String {
    let out = exec_sync(rt, cid, &["cat", "/proc/1/status"])
        .await
        .expect("exec");
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|s| s.trim().to_owned())
        .expect("Cpus_allowed_list in /proc/1/status")
}

/// The memory limit the container sees for itself (cgroup v1 inside).
pub async fn memory_inside(rt: &mut Rt, cid: &str) -> u64 {
    let out = exec_sync(
        rt,
        cid,
        &["cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes"],
    )
    .await
    .expect("exec");
    out.stdout.trim().parse().expect("a number")
}

pub fn cgroup_file(
    controller: &str,
    sandbox: &cri::PodSandboxConfig,
    cid: &str,
    file: &str,
) -> PathBuf {
    let parent = sandbox.linux.as_ref().unwrap().cgroup_parent.clone();
    host_cgroup_dir(controller, &parent, cid).join(file)
}

pub fn read_cgroup(
    controller: &str,
    sandbox: &cri::PodSandboxConfig,
    cid: &str,
    file: &str,
) -> String {
    let p = cgroup_file(controller, sandbox, cid, file);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
        .trim()
        .to_owned()
}

/// Poll `f` until it returns true (or panic after `secs`).
pub async fn eventually<F, Fut>(secs: u64, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if f().await {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Containers the runtime itself has for a sandbox.
pub async fn runtime_containers(direct: &mut Rt, sandbox_id: &str) -> Vec<cri::Container> {
    direct
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                pod_sandbox_id: sandbox_id.to_owned(),
                ..Default::default()
            }),
        })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers
}
