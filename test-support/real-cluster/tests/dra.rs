//! DRA on the real cluster: kube-scheduler's own allocator over steward's
//! ResourceSlices, kubelet's own DRA manager calling steward's
//! NodePrepareResources, containerd 2.1.9 injecting the CDI device, and the
//! slot held in steward's one ledger (a SlotClaim naming the claim).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{Value, json};
use steward_real_cluster::{BUSYBOX, Cluster, debug_echo_configuration, eventually};

/// Proves: the controller's DeviceClass for a Configuration is accepted by
/// the real API server (its CEL selector compiled there); a pod whose claim
/// template asks one device of that class is scheduled by the real
/// kube-scheduler onto a node whose ResourceSlice publishes a matching
/// device, kubelet prepares the claim through steward's kubelet plugin, the
/// container sees the device's properties only through its CDI spec (DRA
/// hands out no environment of its own), the slot is recorded as a
/// SlotClaim naming the ResourceClaim, and deleting the pod releases it.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_scheduler_allocates_and_kubelet_prepares_a_steward_device() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("dra").await;
    cluster
        .create_configuration(&ns.name, &debug_echo_configuration("gpus", &["gpu-0"], 1))
        .await;
    let class = cluster.device_class(&ns.name, "gpus").await;
    // Each node publishes its own gpu-0 (debug-echo devices are not shared).
    eventually(
        "a steward.dev device of gpus in each node's ResourceSlices",
        Duration::from_secs(90),
        || async {
            let slices = slices(&cluster);
            let nodes: Vec<String> = slices
                .iter()
                .filter(|s| {
                    s["spec"]["devices"].as_array().is_some_and(|d| {
                        d.iter().any(|d| {
                            d["attributes"]["steward.dev/configuration"]["string"] == "gpus"
                                || d["attributes"]["configuration"]["string"] == "gpus"
                        })
                    })
                })
                .filter_map(|s| s["spec"]["nodeName"].as_str().map(str::to_owned))
                .collect();
            cluster
                .nodes
                .iter()
                .all(|n| nodes.contains(n))
                .then_some(())
        },
    )
    .await;

    cluster.apply(
        &ns.name,
        &json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": class}}
            ]}}},
        }),
    );
    cluster.apply(
        &ns.name,
        &json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "trainer"},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "restartPolicy": "Never",
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                "containers": [{
                    "name": "c",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "env; sleep 3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }],
            },
        }),
    );
    let pod = cluster
        .running(&ns.name, "trainer", Duration::from_secs(120))
        .await;
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
    let logs = eventually("trainer's environment", Duration::from_secs(30), || async {
        let logs = cluster.kubectl(&["logs", "-n", &ns.name, "trainer"]);
        logs.contains("STORY=").then_some(logs)
    })
    .await;
    assert!(
        logs.contains("DEBUG_ECHO_DESCRIPTION=gpu-0") && logs.contains("STORY=gpus"),
        "the CDI device's environment reaches the container: {logs}"
    );

    // The claim kube-scheduler allocated, and steward's record of the slot.
    let claims: Value = serde_json::from_str(&cluster.kubectl(&[
        "get",
        "resourceclaims",
        "-n",
        &ns.name,
        "-o",
        "json",
    ]))
    .unwrap();
    let claim = &claims["items"][0];
    let results = &claim["status"]["allocation"]["devices"]["results"];
    assert_eq!(results[0]["driver"], "steward.dev", "{claim}");
    let device = results[0]["device"].as_str().unwrap().to_owned();
    let claim_name = claim["metadata"]["name"].as_str().unwrap().to_owned();
    let slotclaims = eventually(
        &format!("a SlotClaim for ResourceClaim {claim_name}"),
        Duration::from_secs(30),
        || async {
            let held: Vec<Value> = cluster
                .slotclaims(&ns.name)
                .into_iter()
                .filter(|c| c.to_string().contains(&claim_name))
                .collect();
            (!held.is_empty()).then_some(held)
        },
    )
    .await;
    assert!(
        slotclaims[0].to_string().contains(&node),
        "the SlotClaim names the node that prepared {device}: {}",
        slotclaims[0]
    );

    // Deleting the pod unprepares the claim and frees the slot.
    cluster.delete_pod_now(&ns.name, "trainer").await;
    eventually(
        "the SlotClaim released after the pod is gone",
        Duration::from_secs(90),
        || async {
            let held = cluster.slotclaims(&ns.name);
            (!held.iter().any(|c| c.to_string().contains(&claim_name))).then_some(())
        },
    )
    .await;
}

fn slices(cluster: &Cluster) -> Vec<Value> {
    let v: Value = serde_json::from_str(&cluster.kubectl(&[
        "get",
        "resourceslices",
        "--field-selector",
        "spec.driver=steward.dev",
        "-o",
        "json",
    ]))
    .unwrap();
    v["items"].as_array().cloned().unwrap_or_default()
}

/// Proves: a slot held through the device plugin is tainted in the
/// ResourceSlice (`steward.dev/held`, NoSchedule) as the real API server
/// stores it, the real kube-scheduler does not allocate it to a claim while
/// the taint is there (the claim's pod stays unscheduled), and once the
/// device-plugin pod is deleted the taint goes and the claim is allocated
/// that device and its pod runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_held_through_the_device_plugin_is_tainted_and_not_allocated() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("drataint").await;
    cluster
        .create_configuration(&ns.name, &debug_echo_configuration("held", &["held-0"], 1))
        .await;
    let node = cluster.nodes[0].clone();
    let inst = cluster.instance_on(&ns.name, "held", &node).await;
    let name = inst.metadata.name.clone().unwrap();
    let resource = format!("steward.dev/{name}");
    cluster.wait_allocatable(&node, &resource, 1).await;
    cluster
        .create_pod(
            &ns.name,
            steward_real_cluster::busybox_pod(
                "holder",
                "sleep 3600",
                json!({ resource.clone(): "1" }),
            ),
        )
        .await;
    cluster
        .running(&ns.name, "holder", Duration::from_secs(120))
        .await;
    let taint_of = |slices: Vec<Value>| -> Option<Value> {
        slices.iter().find_map(|s| {
            s["spec"]["devices"]
                .as_array()?
                .iter()
                .find_map(|d| (d["name"].as_str()?.starts_with(&name)).then(|| d["taints"].clone()))
        })
    };
    let taints = eventually(
        "the held slot's taint in the ResourceSlice",
        Duration::from_secs(30),
        || async {
            taint_of(slices(&cluster)).filter(|t| t.to_string().contains("steward.dev/held"))
        },
    )
    .await;
    assert!(taints.to_string().contains("NoSchedule"), "{taints}");

    let class = cluster.device_class(&ns.name, "held").await;
    cluster.apply(
        &ns.name,
        &json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "wants-held"},
            "spec": {"devices": {"requests": [{"name": "d", "exactly": {
                "deviceClassName": class,
                "selectors": [{"cel": {"expression": format!(
                    "device.attributes[\"steward.dev\"].instance == \"{name}\""
                )}}],
            }}]}},
        }),
    );
    cluster.apply(
        &ns.name,
        &json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "claimer"},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "d", "resourceClaimName": "wants-held"}],
                "containers": [{
                    "name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "d"}]},
                }],
            },
        }),
    );
    // While the device plugin holds the slot: not allocated, not placed.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let claim: Value = serde_json::from_str(&cluster.kubectl(&[
        "get",
        "resourceclaim",
        "-n",
        &ns.name,
        "wants-held",
        "-o",
        "json",
    ]))
    .unwrap();
    assert!(
        claim["status"]["allocation"].is_null(),
        "a tainted slot must not be allocated: {claim}"
    );
    let claimer = cluster.pods(&ns.name).get("claimer").await.unwrap();
    assert!(
        claimer.spec.and_then(|s| s.node_name).is_none(),
        "claimer placed on a held slot"
    );

    // The holder goes: the taint goes, the claim gets the device.
    cluster.delete_pod_now(&ns.name, "holder").await;
    cluster
        .running(&ns.name, "claimer", Duration::from_secs(120))
        .await;
    let claim: Value = serde_json::from_str(&cluster.kubectl(&[
        "get",
        "resourceclaim",
        "-n",
        &ns.name,
        "wants-held",
        "-o",
        "json",
    ]))
    .unwrap();
    let device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        .as_str()
        .unwrap_or("");
    assert!(device.starts_with(&name), "{claim}");
}
