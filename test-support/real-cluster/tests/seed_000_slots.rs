//! Seed 000 on the real kubelet: a steward Instance served as a device
//! plugin, its slots granted by kubelet's own device manager, and a slot
//! freed by a deleted pod granted again at once — the last slot included —
//! with no `UnexpectedAdmissionError`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use serde_json::json;
use steward_real_cluster::{Cluster, busybox_pod, debug_echo_configuration, eventually};

/// Proves: kubelet's device manager admits pods asking `steward.dev/<instance>`
/// up to the Instance's capacity; a third pod is not scheduled while both
/// slots are held; when one holder is deleted, the waiting pod is scheduled
/// and admitted by kubelet on the freed (last) slot, and no pod of the story
/// fails admission.
#[tokio::test(flavor = "multi_thread")]
async fn the_last_slot_is_granted_again_by_the_real_kubelet() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("s000").await;
    let configurations = cluster.configurations(&ns.name);
    configurations
        .create(
            &Default::default(),
            &debug_echo_configuration("cams", &["cam-0"], 2),
        )
        .await
        .unwrap();

    // One Instance per node (debug-echo devices are not shared), each served
    // to its node's kubelet: the node's allocatable shows its two slots.
    let instances = eventually(
        "an Instance of cams on every node",
        Duration::from_secs(90),
        || async {
            let list = cluster.instances_of(&ns.name, "cams").await;
            (list.len() == cluster.nodes.len()).then_some(list)
        },
    )
    .await;
    let inst = instances
        .iter()
        .find(|i| i.spec.nodes == vec![cluster.nodes[0].clone()])
        .unwrap_or_else(|| panic!("no Instance on {}", cluster.nodes[0]));
    let name = inst.metadata.name.clone().unwrap();
    let resource = format!("steward.dev/{name}");
    let node = cluster.nodes[0].clone();
    eventually(
        &format!("{node} allocatable {resource} = 2"),
        Duration::from_secs(90),
        || async { (cluster.allocatable(&node, &resource).await == 2).then_some(()) },
    )
    .await;

    let limits = json!({ resource.clone(): "1" });
    for p in ["holder-1", "holder-2"] {
        cluster
            .create_pod(&ns.name, busybox_pod(p, "sleep 3600", limits.clone()))
            .await;
    }
    for p in ["holder-1", "holder-2"] {
        let pod = cluster.running(&ns.name, p, Duration::from_secs(120)).await;
        assert_eq!(
            pod.spec.and_then(|s| s.node_name).as_deref(),
            Some(node.as_str()),
            "{p} runs where the Instance is"
        );
    }

    // Both slots are held: a third pod waits unscheduled.
    cluster
        .create_pod(
            &ns.name,
            busybox_pod("waiter", "sleep 3600", limits.clone()),
        )
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let waiter = cluster.pods(&ns.name).get("waiter").await.unwrap();
    let status = waiter.status.unwrap_or_default();
    assert_eq!(
        status.phase.as_deref(),
        Some("Pending"),
        "the third pod must wait while both slots are held"
    );
    assert!(
        waiter.spec.and_then(|s| s.node_name).is_none(),
        "the third pod must not be bound while both slots are held"
    );

    // Free one: the waiter takes the last slot, admitted by kubelet.
    let freed = Instant::now();
    cluster.delete_pod_now(&ns.name, "holder-1").await;
    cluster
        .running(&ns.name, "waiter", Duration::from_secs(120))
        .await;
    eprintln!(
        "holder-1 deleted → waiter Running on the freed slot in {:?} (Kubernetes {})",
        freed.elapsed(),
        cluster.version
    );

    let failed = cluster.events_with_reason(&ns.name, "UnexpectedAdmissionError");
    assert!(failed.is_empty(), "pods failed admission: {failed:?}");
    let pods = cluster
        .pods(&ns.name)
        .list(&Default::default())
        .await
        .unwrap();
    for p in pods.items {
        let status = p.status.unwrap_or_default();
        assert_ne!(
            status.reason.as_deref(),
            Some("UnexpectedAdmissionError"),
            "pod {:?}: {:?}",
            p.metadata.name,
            status.message
        );
    }
}
