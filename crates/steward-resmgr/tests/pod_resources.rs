//! The CRI resource manager's assignments on its pod resources socket: pods
//! run through the proxy into real containerd show their CPUs and memory in
//! `List` and on the watch, in an order where an exclusive CPU is never
//! shown held by two pods.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use steward_core::cpu::CpuSet;
use steward_proto::podresources::v1 as wire;
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use steward_testing_containerd::{Containerd, PodNetwork, cleanup_pod};

fn cpus(ids: &[i64]) -> CpuSet {
    ids.iter().map(|i| *i as u32).collect()
}

/// CPUs of each pod (by name) in a client's folded view.
fn pod_cpus(view: &BTreeMap<String, wire::PodResources>) -> BTreeMap<String, CpuSet> {
    view.values()
        .map(|p| {
            let mut all = CpuSet::new();
            for c in &p.containers {
                all.union_with(&cpus(&c.cpu_ids));
            }
            (p.name.clone(), all)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_through_the_proxy_show_their_cpus_and_memory_in_list_and_watch() {
    init_tracing();
    let _serial = SERIAL.lock().await;
    let ctd = Containerd::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = proxy_config(ctd.sock(), dir.path(), "policy: { active: static }");
    let socket = dir.path().join("pod-resources.sock");
    cfg.manager.pod_resources_socket = Some(socket.clone());
    let (proxy, mut rt, _) = start_proxy(cfg).await;

    let channel = steward_proto::uds::endpoint()
        .connect_with_connector(steward_proto::uds::UnixConnector::new(&socket))
        .await
        .unwrap();
    let mut pr = PodResourcesListerClient::new(channel);
    let alloc = pr
        .get_allocatable_resources(wire::AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        !alloc.cpu_ids.is_empty(),
        "the topology's CPUs are allocatable"
    );
    let mut watch = pr
        .list_and_watch(wire::ListAndWatchPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();

    // Burstable first (the whole shared pool), then guaranteed 1 CPU (an
    // exclusive CPU; the shared pool shrinks).
    let sa = ctd.pod_config("prburst", PodNetwork::Host);
    let (sid_a, _a) = run_pod(&mut rt, &sa, container(&sa, "a", 512, 0, 64 << 20)).await;
    let sb = ctd.pod_config("prguar", PodNetwork::Host);
    let (sid_b, b) = run_pod(&mut rt, &sb, container(&sb, "b", 1024, 100_000, 32 << 20)).await;
    let snap = proxy.manager().snapshot().await;
    let excl = CpuSet::parse(&snap.containers[&b].assignment.clone().unwrap().cpus).unwrap();
    let name_a = sa.metadata.as_ref().unwrap().name.clone();
    let name_b = sb.metadata.as_ref().unwrap().name.clone();

    // List: both pods, with their CPUs and the guaranteed one's memory.
    let list = pr
        .list(wire::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let by_name: BTreeMap<&str, &wire::PodResources> = list
        .pod_resources
        .iter()
        .map(|p| (p.name.as_str(), p))
        .collect();
    let pb = by_name
        .get(name_b.as_str())
        .expect("the guaranteed pod is listed");
    assert_eq!(cpus(&pb.containers[0].cpu_ids), excl);
    assert_eq!(pb.containers[0].memory[0].size, 32 << 20);
    // A container on the shared pool is listed with no CPUs and no memory,
    // as kubelet lists one (its CPUs are nobody's own).
    let pa = by_name
        .get(name_a.as_str())
        .expect("the burstable pod is listed");
    assert!(pa.containers[0].cpu_ids.is_empty(), "{pa:?}");
    assert!(pa.containers[0].memory.is_empty(), "{pa:?}");

    // The watch: folded event by event, the exclusive CPU is never shown in
    // two pods, and the folded view ends equal to List.
    let mut view: BTreeMap<String, wire::PodResources> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let e = tokio::time::timeout_at(deadline, watch.next())
            .await
            .expect("the watch reaches List's state")
            .unwrap()
            .unwrap();
        match wire::WatchPodAction::try_from(e.action) {
            Ok(wire::WatchPodAction::Deleted) => {
                view.remove(&e.uid);
            }
            _ => {
                view.insert(e.uid.clone(), e.pod_resources[0].clone());
            }
        }
        let held = pod_cpus(&view);
        if let Some(b_cpus) = held.get(&name_b)
            && !b_cpus.is_empty()
        {
            for (name, c) in &held {
                if name != &name_b {
                    assert!(
                        c.is_disjoint(b_cpus),
                        "{name} shown on {b_cpus} while {name_b} holds it"
                    );
                }
            }
        }
        if held.get(&name_b) == Some(&excl) && held.get(&name_a).is_some_and(|c| c.is_empty()) {
            break;
        }
    }

    // The guaranteed pod goes: DELETED on the watch.
    cleanup_pod(&mut rt, &sid_b).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let e = tokio::time::timeout_at(deadline, watch.next())
            .await
            .expect("a DELETED event")
            .unwrap()
            .unwrap();
        if e.action == wire::WatchPodAction::Deleted as i32 && e.pod_resources[0].name == name_b {
            break;
        }
    }
    cleanup_pod(&mut rt, &sid_a).await.unwrap();
    proxy.shutdown().await;
    assert!(
        !socket.exists(),
        "the pod resources socket is removed on shutdown"
    );
}
