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
    cluster.wait_allocatable(&node, &resource, 2).await;

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

/// Proves: with both slots of an Instance held by running pods, a restart of
/// the node's kubelet (its device-manager checkpoint re-read, the plugins
/// registering again) and the agent's pod deleted and recreated by its
/// DaemonSet neither grant a slot twice (a third pod stays unscheduled; the
/// holders keep running; each slot keeps one SlotClaim naming its holder)
/// nor lose one (the slot freed afterwards is granted to the waiting pod).
#[tokio::test(flavor = "multi_thread")]
async fn kubelet_and_agent_restarts_neither_double_grant_nor_lose_a_slot() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("s000r").await;
    cluster
        .create_configuration(
            &ns.name,
            &debug_echo_configuration("lenses", &["lens-0"], 2),
        )
        .await;
    let node = cluster.nodes[0].clone();
    let inst = cluster.instance_on(&ns.name, "lenses", &node).await;
    let resource = format!("steward.dev/{}", inst.metadata.name.clone().unwrap());
    cluster.wait_allocatable(&node, &resource, 2).await;
    let limits = json!({ resource.clone(): "1" });
    for p in ["holder-1", "holder-2"] {
        cluster
            .create_pod(&ns.name, busybox_pod(p, "sleep 3600", limits.clone()))
            .await;
    }
    for p in ["holder-1", "holder-2"] {
        cluster.running(&ns.name, p, Duration::from_secs(120)).await;
    }
    let claims_held = || {
        let mut holders: Vec<String> = cluster
            .slotclaims(&ns.name)
            .iter()
            .filter_map(|c| c["spec"]["pod"]["name"].as_str().map(str::to_owned))
            .collect();
        holders.sort();
        holders
    };
    eventually(
        "a SlotClaim per holder",
        Duration::from_secs(30),
        || async { (claims_held() == ["holder-1", "holder-2"]).then_some(()) },
    )
    .await;

    // kubelet restarted.
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kube-cluster.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("restart-kubelet")
        .arg(&cluster.dir)
        .arg(&node)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "restart-kubelet: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The agent's pod on the node deleted; its DaemonSet makes a new one.
    let agents = cluster.kubectl(&[
        "get",
        "pods",
        "-n",
        &cluster.release_namespace,
        "-l",
        "app.kubernetes.io/component=agent",
        "--field-selector",
        &format!("spec.nodeName={node}"),
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    let old_agent = agents.trim().to_owned();
    cluster.kubectl(&[
        "delete",
        "pod",
        "-n",
        &cluster.release_namespace,
        &old_agent,
        "--wait=true",
    ]);
    eventually(
        &format!("a new agent pod Ready on {node}"),
        Duration::from_secs(120),
        || async {
            let out = cluster.kubectl(&[
                "get", "pods", "-n", &cluster.release_namespace,
                "-l", "app.kubernetes.io/component=agent",
                "--field-selector", &format!("spec.nodeName={node}"),
                "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ]);
            out.lines()
                .any(|l| !l.starts_with(&old_agent) && l.ends_with("True"))
                .then_some(())
        },
    )
    .await;
    eventually(
        &format!("{node} Ready"),
        Duration::from_secs(120),
        || async {
            let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
                kube::Api::all(cluster.client.clone());
            nodes
                .get(&node)
                .await
                .ok()
                .filter(steward_real_cluster::node_ready)
                .map(|_| ())
        },
    )
    .await;
    for p in ["holder-1", "holder-2"] {
        cluster.running(&ns.name, p, Duration::from_secs(10)).await;
    }

    // No double grant: a third pod waits while both slots are held.
    cluster
        .create_pod(
            &ns.name,
            busybox_pod("waiter", "sleep 3600", limits.clone()),
        )
        .await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let waiter = cluster.pods(&ns.name).get("waiter").await.unwrap();
    assert!(
        waiter.spec.and_then(|s| s.node_name).is_none(),
        "the third pod must not be placed while both slots are held"
    );
    assert_eq!(
        claims_held(),
        ["holder-1", "holder-2"],
        "each slot keeps its SlotClaim"
    );

    // No slot lost: the freed one goes to the waiter.
    cluster.delete_pod_now(&ns.name, "holder-1").await;
    cluster
        .running(&ns.name, "waiter", Duration::from_secs(120))
        .await;
    let failed = cluster.events_with_reason(&ns.name, "UnexpectedAdmissionError");
    assert!(failed.is_empty(), "pods failed admission: {failed:?}");
}
