//! An unchanged pod served through DRA's extended resources (KEP-5004) on
//! the real cluster: the pod asks `steward.dev/<instance>: 1` as it would of
//! a device plugin, and the real kube-scheduler serves it from steward's
//! ResourceSlices through the Instance's DeviceClass instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{Value, json};
use steward_real_cluster::{BUSYBOX, Cluster, debug_echo_configuration, eventually};

/// Proves: for a Configuration with `draExtendedResources`, the controller
/// writes one DeviceClass per Instance carrying `extendedResourceName:
/// steward.dev/<instance>`, the real API server keeps the field (the
/// Configuration's `DRAExtendedResources` condition is True), the agent
/// registers no device plugin for it (the node advertises no such
/// resource); a pod asking `steward.dev/<instance>: 1` in its limits, with
/// no claim of its own, is placed by the real kube-scheduler on the
/// Instance's node with a ResourceClaim it makes (annotated
/// `resource.kubernetes.io/extended-resource-claim`), kubelet prepares it
/// through steward's kubelet plugin, the container gets the device's CDI
/// environment, the slot is a SlotClaim naming that claim, and deleting the
/// pod frees it.
#[tokio::test(flavor = "multi_thread")]
async fn an_unchanged_pod_is_served_through_dras_extended_resources() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("dra-ext").await;
    let mut conf = debug_echo_configuration("legacy", &["cam-0"], 1);
    conf.spec.dra_extended_resources = true;
    cluster.create_configuration(&ns.name, &conf).await;
    let node = cluster.nodes[0].clone();
    let inst = cluster.instance_on(&ns.name, "legacy", &node).await;
    let instance = inst.metadata.name.clone().unwrap();
    let resource = format!("steward.dev/{instance}");

    let class_name = format!("{instance}.{}.instance.steward.dev", ns.name);
    let class: Value = eventually(
        &format!("DeviceClass {class_name} with its extended resource"),
        Duration::from_secs(60),
        || async {
            let out = std::process::Command::new(&cluster.kubectl)
                .arg("--kubeconfig")
                .arg(&cluster.kubeconfig)
                .args(["get", "deviceclass", &class_name, "-o", "json"])
                .output()
                .ok()?;
            let class: Value = serde_json::from_slice(&out.stdout).ok()?;
            (class["spec"]["extendedResourceName"] == resource.as_str()).then_some(class)
        },
    )
    .await;
    assert_eq!(
        class["metadata"]["annotations"]["steward.dev/instance"],
        format!("{}/{instance}", ns.name).as_str(),
        "{class}"
    );
    eventually(
        "the Configuration's DRAExtendedResources condition True",
        Duration::from_secs(60),
        || async {
            let c = cluster.configurations(&ns.name).get("legacy").await.ok()?;
            c.status?
                .conditions
                .iter()
                .any(|c| c.type_ == "DRAExtendedResources" && c.status == "True")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        cluster.allocatable(&node, &resource).await,
        0,
        "no device plugin registered for an Instance served through DRA"
    );

    cluster.apply(
        &ns.name,
        &json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "legacy-app"},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "restartPolicy": "Never",
                "containers": [{
                    "name": "c",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "env; sleep 3600"],
                    "resources": {"limits": {resource.as_str(): "1"}},
                }],
            },
        }),
    );
    let pod = cluster
        .running(&ns.name, "legacy-app", Duration::from_secs(120))
        .await;
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node.as_str()),
        "placed on the Instance's node"
    );
    let logs = eventually(
        "the container's environment",
        Duration::from_secs(30),
        || async {
            let logs = cluster.kubectl(&["logs", "-n", &ns.name, "legacy-app"]);
            logs.contains("STORY=").then_some(logs)
        },
    )
    .await;
    assert!(
        logs.contains("STORY=legacy") && logs.contains("DEBUG_ECHO_DESCRIPTION=cam-0"),
        "the CDI device's environment reaches the container: {logs}"
    );

    let claims: Value = serde_json::from_str(&cluster.kubectl(&[
        "get",
        "resourceclaims",
        "-n",
        &ns.name,
        "-o",
        "json",
    ]))
    .unwrap();
    let items = claims["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 1, "one claim, the scheduler's: {claims}");
    let claim = &items[0];
    assert_eq!(
        claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"], "true",
        "{claim}"
    );
    let result = &claim["status"]["allocation"]["devices"]["results"][0];
    assert_eq!(result["driver"], "steward.dev", "{claim}");
    let claim_name = claim["metadata"]["name"].as_str().unwrap().to_owned();
    eventually(
        &format!("the slot held by ResourceClaim {claim_name}"),
        Duration::from_secs(30),
        || async {
            cluster
                .slotclaims(&ns.name)
                .iter()
                .any(|c| c["spec"]["resourceClaim"]["name"] == claim_name.as_str())
                .then_some(())
        },
    )
    .await;

    cluster.delete_pod_now(&ns.name, "legacy-app").await;
    eventually("the slot released", Duration::from_secs(60), || async {
        cluster.slotclaims(&ns.name).is_empty().then_some(())
    })
    .await;
}
