//! containerd restarts under a running proxy: calls fail with UNAVAILABLE
//! while it is down without touching the cache, and once it is back the
//! proxy re-syncs and keeps managing the containers that survived.
//! Runs on a private containerd (1.6, or 2.x in the suite's 2.x round),
//! restarted with `scripts/containerd.sh start` on the same state directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use steward_core::cpu::CpuSet;
use steward_proto::cri::runtime::v1 as cri;
use steward_testing_containerd::{
    Containerd, Containerd2, PodNetwork, SOCK_ENV, bin_dir_or_skip, cleanup_pod, runtime_version,
    scripts_dir,
};

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        !s.lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_restart_mid_way() {
    init_tracing();
    // A private containerd it may restart, of the version the suite's round
    // attaches to: 2.x in the round against containerd 2.x, else 1.6.
    let attached_v2 = match std::env::var_os(SOCK_ENV).filter(|s| !s.is_empty()) {
        Some(sock) => runtime_version(std::path::Path::new(&sock))
            .await
            .unwrap()
            .major()
            .is_some_and(|m| m >= 2),
        None => false,
    };
    let (ctd, _private2) = if attached_v2 {
        let Some(bin) = bin_dir_or_skip("runtime_restart") else {
            return;
        };
        let c2 = Containerd2::start(bin);
        let ctd = Containerd::attach(c2.sock(), c2.cgroup_parent.clone());
        (ctd, Some(c2))
    } else {
        (Containerd::start().unwrap(), None)
    };
    let (state_dir, pid) = match &_private2 {
        Some(c2) => (c2.dir.path().to_path_buf(), c2.pid),
        None => (ctd.state_dir().unwrap().to_path_buf(), ctd.pid().unwrap()),
    };
    let dir = tempfile::tempdir().unwrap();
    let (proxy, mut rt, _) = start_proxy(proxy_config(
        ctd.sock(),
        dir.path(),
        "policy: { active: static }",
    ))
    .await;
    let online = CpuSet::parse(
        std::fs::read_to_string("/sys/devices/system/cpu/online")
            .unwrap()
            .trim(),
    )
    .unwrap();

    let sa = ctd.pod_config("ra", PodNetwork::Host);
    let (sid_a, a) = run_pod(&mut rt, &sa, container(&sa, "a", 512, 0, 32 << 20)).await;
    let sb = ctd.pod_config("rb", PodNetwork::Host);
    let (sid_b, b) = run_pod(&mut rt, &sb, container(&sb, "b", 1024, 100_000, 32 << 20)).await;
    let before = proxy.manager().snapshot().await;
    let assigned = proxy.manager().assignments().await;
    let shared = before.containers[&a].assignment.clone().unwrap().cpus;
    assert_eq!(cpus_inside(&mut rt, &a).await, shared);
    let resyncs = proxy.manager().metrics().event_count("resync");

    // containerd goes away (its shims and containers stay).
    Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .unwrap();
    eventually(30, "containerd exited", || async move { !alive(pid) }).await;

    let e = rt
        .version(cri::VersionRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    let sc = ctd.pod_config("rc", PodNetwork::Host);
    let e = create(
        &mut rt,
        &sid_a,
        &sa,
        container(&sa, "late", 256, 0, 32 << 20),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert_eq!(
        proxy.manager().snapshot().await.containers,
        before.containers
    );
    assert_eq!(
        proxy.manager().assignments().await,
        assigned,
        "allocation rolled back"
    );

    // Back again, same state directory.
    let out = Command::new(scripts_dir().join("containerd.sh"))
        .arg("start")
        .arg(&state_dir)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let m = proxy.manager().clone();
    eventually(60, "re-sync after the runtime came back", || {
        let m = m.clone();
        async move { m.metrics().event_count("resync") > resyncs && m.upstream().is_healthy() }
    })
    .await;
    let after = proxy.manager().snapshot().await;
    assert_eq!(
        after.containers.keys().collect::<Vec<_>>(),
        before.containers.keys().collect::<Vec<_>>()
    );
    assert_eq!(proxy.manager().assignments().await, assigned);

    // Still fully managed: a new pod through the proxy, and the exclusive
    // pod leaving gives the shared one every CPU again.
    let (sid_c, c) = run_pod(&mut rt, &sc, container(&sc, "c", 256, 0, 32 << 20)).await;
    assert_eq!(cpus_inside(&mut rt, &c).await, shared);
    cleanup_pod(&mut rt, &sid_b).await.unwrap();
    assert_eq!(cpus_inside(&mut rt, &a).await, online.to_string());
    assert_eq!(cpus_inside(&mut rt, &c).await, online.to_string());
    let _ = b;
    cleanup_pod(&mut rt, &sid_c).await.unwrap();
    cleanup_pod(&mut rt, &sid_a).await.unwrap();
    assert!(proxy.manager().assignments().await.is_empty());
    proxy.shutdown().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(ctd);
}
