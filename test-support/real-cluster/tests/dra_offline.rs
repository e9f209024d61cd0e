//! A prepared DRA device that goes offline and comes back, on the real
//! cluster: kube-controller-manager's garbage collector, the real API
//! server and kubelet's DRA manager, with steward's agent as installed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{Value, json};
use steward_real_cluster::{BUSYBOX, Cluster, eventually};

fn slotclaims_naming(cluster: &Cluster, ns: &str, claim: &str) -> Vec<Value> {
    cluster
        .slotclaims(ns)
        .into_iter()
        .filter(|c| c.to_string().contains(claim))
        .collect()
}

/// Proves: while a pod holds a device through a prepared ResourceClaim, the
/// device going offline (its Instance deleted, and with it — by the garbage
/// collector — every SlotClaim the Instance owns) and coming back (a new
/// Instance) leaves the cluster's record of the held slot in place again: a
/// SlotClaim naming the claim, on the pod's node, without an agent restart.
/// Without it, other nodes of a shared Instance and the reservation
/// controller would count the held slot as free.
#[tokio::test(flavor = "multi_thread")]
async fn a_prepared_device_that_goes_offline_and_comes_back_keeps_its_slotclaim() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("draoff").await;
    // The agent's embedded debug-echo reads the availability file inside
    // its container, where the chart mounts the node's state directory.
    let file = format!("/var/lib/steward/{}-available", ns.name);
    let conf: steward_api::Configuration = serde_json::from_value(json!({
        "apiVersion": "steward.dev/v1alpha1",
        "kind": "Configuration",
        "metadata": {"name": "flaky"},
        "spec": {
            "discoveryHandler": {
                "name": "debug-echo",
                "details": serde_json::to_string(&json!({
                    "descriptions": ["flaky-0"],
                    "availabilityFile": file,
                    "pollInterval": "200ms",
                }))
                .unwrap(),
            },
            "capacity": 1,
        },
    }))
    .unwrap();
    cluster.create_configuration(&ns.name, &conf).await;
    let class = cluster.device_class(&ns.name, "flaky").await;
    cluster.apply(
        &ns.name,
        &json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "flaky-claim"},
            "spec": {"devices": {"requests": [{"name": "d", "exactly": {"deviceClassName": class}}]}},
        }),
    );
    cluster
        .create_pod(
            &ns.name,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "user"},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": "d", "resourceClaimName": "flaky-claim"}],
                    "containers": [{
                        "name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                        "command": ["sleep", "3600"],
                        "resources": {"claims": [{"name": "d"}]},
                    }],
                },
            }),
        )
        .await;
    let pod = cluster
        .running(&ns.name, "user", Duration::from_secs(120))
        .await;
    let node = pod.spec.and_then(|s| s.node_name).unwrap();
    let held = eventually(
        "a SlotClaim for flaky-claim",
        Duration::from_secs(30),
        || async {
            let v = slotclaims_naming(&cluster, &ns.name, "flaky-claim");
            (!v.is_empty()).then_some(v)
        },
    )
    .await;
    let slot = held[0]["metadata"]["name"].as_str().unwrap().to_owned();

    // The device goes offline on the pod's node: its Instance is deleted.
    let host_file = cluster
        .dir
        .join(format!("{node}/steward/{}-available", ns.name));
    std::fs::write(&host_file, "OFFLINE").unwrap();
    eventually(
        &format!("no Instance of flaky on {node}"),
        Duration::from_secs(90),
        || async {
            let on_node = cluster
                .instances_of(&ns.name, "flaky")
                .await
                .into_iter()
                .any(|i| i.spec.nodes.contains(&node));
            (!on_node).then_some(())
        },
    )
    .await;
    // And comes back.
    std::fs::write(&host_file, "").unwrap();
    eventually(
        &format!("the Instance of flaky back on {node}"),
        Duration::from_secs(90),
        || async {
            cluster
                .instances_of(&ns.name, "flaky")
                .await
                .into_iter()
                .any(|i| i.spec.nodes.contains(&node))
                .then_some(())
        },
    )
    .await;
    let back = eventually(
        &format!("SlotClaim {slot} for flaky-claim on {node} again"),
        Duration::from_secs(60),
        || async {
            let v = slotclaims_naming(&cluster, &ns.name, "flaky-claim");
            v.into_iter()
                .find(|c| c["metadata"]["name"] == slot.as_str() && c.to_string().contains(&node))
        },
    )
    .await;
    assert!(back.to_string().contains(&node), "{back}");
    let _ = std::fs::remove_file(&host_file);
}
