//! kubelet's own CRI client in front of the real runtime: the Go peer
//! `cri-client` (k8s.io/cri-client's RemoteRuntimeService and
//! RemoteImageService, as kubelet dials its runtime) drives the real
//! `steward cri-proxy` process, which relays to containerd, through one
//! exclusive-CPU pod's life — image status, sandbox, create/start, status
//! and lists, ExecSync, UpdateContainerResources, the streaming URLs
//! (Exec, Attach, PortForward), stats, stop and removal.
//!
//! From outside, the test checks that every call succeeded, that the
//! exclusive container ran on one CPU which is the one in its cgroup and the
//! one the proxy publishes on its pod resources socket, that a shared
//! container's pool shrank by that CPU while it ran and grew back after, and
//! that nothing of the peer's pod is left in containerd.
//!
//! Needs a containerd (`STEWARD_CONTAINERD_SOCK`, set by the test command)
//! and the built peer (`STEWARD_GO_PEERS`); outside CI either missing is a
//! loud skip, under CI a failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod go_cri;

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::Arc;

use common::{Proc, eventually};
use go_cri::{CALLS, POD_UID_LABEL, Peer, WAIT, cpuset, cpuset_of, field, published};
use serde_json::Value;
use steward_core::cpu::CpuSet;
use steward_proto::cri::runtime::v1 as cri;
use steward_testing_containerd::{
    Containerd, PodNetwork, SOCK_ENV, cleanup_pod, cri_client, own_pods, unique_name,
};

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
}

/// The shared containerd, or `None` (loudly) outside CI when none is
/// configured.
fn containerd() -> Option<Arc<Containerd>> {
    let configured = std::env::var_os(SOCK_ENV).is_some_and(|s| !s.is_empty());
    if !configured && !in_ci() {
        eprintln!(
            "SKIPPED: no containerd configured; start one with `scripts/containerd.sh start DIR` and export {SOCK_ENV}"
        );
        return None;
    }
    match Containerd::shared() {
        Ok(c) => Some(c),
        Err(e) => panic!("cannot reach containerd for the CRI client test: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_cri_client_runs_an_exclusive_pod_through_the_proxy() {
    let Some(peer) = steward_testing_gopeers::binary("cri-client") else {
        return;
    };
    // Dropped last: sweeps every pod labelled with this process, the
    // peer's included, also when the test panics.
    let Some(ctd) = containerd() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        "policy: { active: static }\n",
    )
    .unwrap();
    let cri_sock = dir.path().join("cri.sock");
    let pr_sock = dir.path().join("pr.sock");
    let args: Vec<OsString> = vec![
        "cri-proxy".into(),
        "--listen".into(),
        cri_sock.clone().into(),
        "--runtime".into(),
        ctd.sock().into(),
        "--state-dir".into(),
        dir.path().join("state").into(),
        "--config".into(),
        dir.path().join("config.yaml").into(),
        "--pod-resources-socket".into(),
        pr_sock.clone().into(),
        "--verify-interval".into(),
        "0s".into(),
    ];
    // Killed by pid when dropped (before the sweep above).
    let _proxy = Proc::spawn("cri-proxy", &args, &[], dir.path().join("cri-proxy.log")).unwrap();
    eventually("the proxy's sockets", WAIT, || async {
        (cri_sock.exists() && pr_sock.exists()).then_some(())
    })
    .await
    .unwrap();
    let (mut rt, _) = cri_client(&cri_sock).await.unwrap();
    let (mut direct, _) = ctd.client().await.unwrap();

    // A shared (Burstable, half a CPU) container, through the proxy.
    let shared =
        go_cri::start_shared(&mut rt, ctd.pod_config("gocri-shared", PodNetwork::Host)).await;
    let (shared_name, shared_parent, shared_sid, shared_cid) = (
        shared.name,
        shared.parent,
        shared.sandbox_id,
        shared.container_id,
    );
    let pool = cpuset_of(&shared_parent, &shared_cid).expect("the shared container's cpuset");
    assert!(
        pool.len() >= 2,
        "the shared pool {pool} must have room for one exclusive CPU"
    );
    // A container on the shared pool is published with no CPUs, as kubelet
    // reports one (its CPUs are nobody's own); its cgroup holds the pool.
    let none = CpuSet::default();
    eventually("the shared container published", WAIT, || async {
        (published(&pr_sock, &shared_name, "shared")
            .await
            .ok()
            .flatten()
            .as_ref()
            == Some(&none))
        .then_some(())
    })
    .await
    .unwrap();

    // kubelet's CRI client, through the proxy.
    let name = unique_name("gocri");
    let uid = format!("uid-{name}");
    let mut peer = Peer::spawn(&peer, &cri_sock, ctd.cgroup_parent(), &name, &uid);
    let mut seen: Vec<Value> = Vec::new();
    let mut exclusive: Option<CpuSet> = None;
    let mut parent = String::new();
    while let Some(line) = peer.next_line(&seen).await {
        match field(&line, "call") {
            "RunPodSandbox" => parent = field(&line, "cgroup_parent").to_owned(),
            "ExecSync" => {
                let cpus = cpuset(field(&line, "cpus_allowed_list"));
                assert_eq!(cpus.len(), 1, "one exclusive CPU seen inside: {line}");
                assert!(
                    pool.contains(cpus.iter().next().unwrap()),
                    "{cpus} in {pool}"
                );
                exclusive = Some(cpus);
            }
            "Hold" => {
                let cid = field(&line, "container_id");
                let excl = exclusive.clone().expect("ExecSync before Hold");
                // The cgroup holds what the container saw, and what the
                // proxy publishes for it.
                assert_eq!(
                    cpuset_of(&parent, cid).as_ref(),
                    Some(&excl),
                    "{parent}/{cid}"
                );
                eventually("the exclusive CPU published", WAIT, || async {
                    (published(&pr_sock, &name, "main")
                        .await
                        .ok()
                        .flatten()
                        .as_ref()
                        == Some(&excl))
                    .then_some(())
                })
                .await
                .unwrap();
                // The shared container lost that CPU while it runs.
                let shrunk = pool.difference(&excl);
                eventually("the shared pool shrank", WAIT, || async {
                    (cpuset_of(&shared_parent, &shared_cid).as_ref() == Some(&shrunk)
                        && published(&pr_sock, &shared_name, "shared")
                            .await
                            .ok()
                            .flatten()
                            .as_ref()
                            == Some(&none))
                    .then_some(())
                })
                .await
                .unwrap();
                peer.go_on().await;
            }
            "UpdateContainerResources" => assert_eq!(
                Some(cpuset(field(&line, "cpus_allowed_list"))),
                exclusive,
                "kubelet's update kept the exclusive CPU: {line}"
            ),
            "Exec" | "Attach" | "PortForward" => {
                let url = field(&line, "url");
                assert!(url.starts_with("http://"), "a streaming URL: {line}");
            }
            _ => {}
        }
        seen.push(line);
    }
    peer.exited_ok(&seen).await;
    let calls: Vec<&str> = seen.iter().map(|l| field(l, "call")).collect();
    assert_eq!(calls, CALLS, "{seen:?}");
    eprintln!(
        "kubelet's CRI client through the proxy: {} calls, exclusive CPU {}, streaming URLs {:?}",
        calls.len(),
        exclusive
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        seen.iter()
            .filter_map(|l| l["url"].as_str())
            .collect::<Vec<_>>()
    );

    // Removed: the pool grows back and the pod is no longer published.
    eventually("the shared pool grew back", WAIT, || async {
        (cpuset_of(&shared_parent, &shared_cid).as_ref() == Some(&pool)
            && published(&pr_sock, &shared_name, "shared")
                .await
                .ok()
                .flatten()
                .as_ref()
                == Some(&none)
            && published(&pr_sock, &name, "main").await.ok() == Some(None))
        .then_some(())
    })
    .await
    .unwrap();

    // Nothing of the peer's pod is left in the runtime.
    let by_uid = HashMap::from([(POD_UID_LABEL.to_owned(), uid.clone())]);
    let sandboxes = direct
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: by_uid.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(sandboxes.is_empty(), "left in containerd: {sandboxes:?}");
    let containers = direct
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: by_uid,
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(containers.is_empty(), "left in containerd: {containers:?}");

    cleanup_pod(&mut rt, &shared_sid).await.unwrap();
    let left = own_pods(&mut direct, &std::process::id().to_string())
        .await
        .unwrap();
    assert!(left.is_empty(), "pods of this test left: {left:?}");
    // The pod cgroup kubelet would remove (containerd leaves it).
    for controller in ["cpuset", "cpu", "cpuacct", "memory", "pids", "blkio"] {
        let _ = std::fs::remove_dir(format!("/sys/fs/cgroup/{controller}{parent}"));
    }
}
