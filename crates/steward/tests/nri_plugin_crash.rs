//! The real `steward nri-plugin` process against a private containerd
//! 2.1.9 (the containerd harness's `Containerd2`), pods run by a CRI client
//! of the test's own: killed with SIGKILL while it holds an exclusive container
//! and a shared one, then started again on the same state directory, it is
//! synchronised and keeps every assignment: the cgroups stay as they were,
//! the exclusive CPU is given to no one else, and removing the exclusive
//! pod grows the shared pool back (the restored policy knew it). Without an
//! NRI socket (containerd 1.6) it says so once, naming the fix.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use steward_core::cpu::CpuSet;
use steward_proto::cri::runtime::v1 as cri;
use steward_testing_containerd as harness;
use tokio::process::Child;

fn start(dir: &Path, nri: &Path, log: &Path) -> Child {
    common::spawn_logging(common::nri_plugin(dir, nri, "steward-crash"), log).unwrap()
}

fn online() -> CpuSet {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    CpuSet::parse(s.trim()).unwrap()
}

fn container(sandbox: &cri::PodSandboxConfig, name: &str, exclusive: bool) -> cri::ContainerConfig {
    let mut c = harness::ContainerSpec::new(name).build(sandbox);
    c.linux.get_or_insert_with(Default::default).resources = Some(cri::LinuxContainerResources {
        cpu_shares: if exclusive { 1024 } else { 256 },
        cpu_quota: if exclusive { 100_000 } else { 0 },
        cpu_period: if exclusive { 100_000 } else { 0 },
        memory_limit_in_bytes: 32 << 20,
        ..Default::default()
    });
    c
}

type Rt = steward_proto::cri::runtime::v1::runtime_service_client::RuntimeServiceClient<
    tonic::transport::Channel,
>;

async fn run_pod(
    rt: &mut Rt,
    sandbox: &cri::PodSandboxConfig,
    exclusive: bool,
) -> (String, String) {
    let sid = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let cid = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sid.clone(),
            config: Some(container(sandbox, "c", exclusive)),
            sandbox_config: Some(sandbox.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: cid.clone(),
    })
    .await
    .unwrap();
    (sid, cid)
}

fn cpuset(sandbox: &cri::PodSandboxConfig, cid: &str) -> String {
    let parent = sandbox.linux.as_ref().unwrap().cgroup_parent.clone();
    let p = harness::host_cgroup_dir("cpuset", &parent, cid).join("cpuset.cpus");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_owned()
}

async fn inside(rt: &mut Rt, cid: &str) -> String {
    let out = harness::exec_sync(rt, cid, &["cat", "/proc/1/status"])
        .await
        .unwrap();
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|s| s.trim().to_owned())
        .unwrap()
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assignments_survive_a_kill_9_of_the_plugin() {
    let Some(bin) = harness::bin_dir_or_skip("nri_plugin_crash") else {
        return;
    };
    let ctrd = harness::Containerd2::start(bin);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), "policy: { active: static }").unwrap();
    let log1: PathBuf = dir.path().join("plugin1.log");
    let mut plugin = start(dir.path(), &ctrd.nri_sock(), &log1);
    harness::wait_log(&log1, "registered as an NRI plugin", 1).await;
    harness::wait_log(&log1, "synchronized with the runtime", 1).await;

    let (mut rt, _img) = harness::cri_client(ctrd.sock()).await.unwrap();
    let sa = harness::pod_sandbox_config(&ctrd.cgroup_parent, "shared", harness::PodNetwork::Host);
    let (sid_a, a) = run_pod(&mut rt, &sa, false).await;
    let sb = harness::pod_sandbox_config(&ctrd.cgroup_parent, "excl", harness::PodNetwork::Host);
    let (sid_b, b) = run_pod(&mut rt, &sb, true).await;
    let excl = CpuSet::parse(&cpuset(&sb, &b)).unwrap();
    assert_eq!(excl.len(), 1, "{excl}");
    let rest = online().difference(&excl).to_string();
    let excl = excl.to_string();
    assert_eq!(inside(&mut rt, &b).await, excl);
    assert_eq!(cpuset(&sa, &a), rest);

    // SIGKILL: no goodbye, the cache as last saved.
    plugin.start_kill().unwrap();
    plugin.wait().await.unwrap();
    let log2 = dir.path().join("plugin2.log");
    let _plugin = start(dir.path(), &ctrd.nri_sock(), &log2);
    harness::wait_log(&log2, "registered as an NRI plugin", 1).await;
    harness::wait_log(&log2, "synchronized with the runtime", 1).await;
    assert_eq!(cpuset(&sb, &b), excl, "kept across the kill");
    assert_eq!(cpuset(&sa, &a), rest, "kept across the kill");
    assert_eq!(inside(&mut rt, &b).await, excl);

    // The restored policy holds the exclusive CPU: a second exclusive
    // container gets none (2 CPUs: one exclusive, one shared at least).
    let sc = harness::pod_sandbox_config(&ctrd.cgroup_parent, "excl2", harness::PodNetwork::Host);
    let sid_c = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sc.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let refused = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sid_c.clone(),
            config: Some(container(&sc, "c", true)),
            sandbox_config: Some(sc.clone()),
        })
        .await;
    if online().len() <= 2 {
        let e = refused.expect_err("the exclusive CPU is still held");
        eprintln!("after the kill, a second exclusive container: {e:?}");
    }

    // The exclusive pod goes: the pool grows back (the restored policy
    // knew the CPU was exclusive).
    harness::cleanup_pod(&mut rt, &sid_b).await.unwrap();
    let all = online().to_string();
    eventually("the shared pool grew back", || cpuset(&sa, &a) == all).await;
    assert_eq!(inside(&mut rt, &a).await, all);
    for sid in [sid_a, sid_c] {
        harness::cleanup_pod(&mut rt, &sid).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_nri_socket_it_says_so_once_naming_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), "policy: { active: none }").unwrap();
    let log = dir.path().join("plugin.log");
    let mut plugin = start(dir.path(), &dir.path().join("nri.sock"), &log);
    harness::wait_log(&log, "no NRI socket at", 1).await;
    // Retries (every second) stay quiet.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    plugin.start_kill().unwrap();
    plugin.wait().await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("no NRI socket at"))
        .collect();
    eprintln!("{}", lines.join("\n"));
    assert_eq!(lines.len(), 1, "{text}");
    assert!(
        lines[0].contains("containerd 1.6 has no NRI (use the CRI proxy)"),
        "{}",
        lines[0]
    );
}
