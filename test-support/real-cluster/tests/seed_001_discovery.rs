//! Seed 001 on the real cluster: a Configuration becomes Instances on both
//! nodes, each served to its node's kubelet as a device plugin, and a pod
//! admitted on each node sees the device's properties in its environment.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::json;
use steward_real_cluster::{Cluster, busybox_pod, debug_echo_configuration, eventually};

/// Proves: the agents on both kubelet nodes turn one Configuration (created
/// through the real API server, its CRD schema and CEL rules applied there)
/// into an Instance per node and device; every kubelet advertises each of its
/// Instances as `steward.dev/<instance>`; a pod asking one runs on that node
/// (placed by the real scheduler) and reads, inside its container, the
/// device's discovery property and the Configuration's broker property.
#[tokio::test(flavor = "multi_thread")]
async fn a_configuration_becomes_device_plugins_on_both_kubelets() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("s001").await;
    cluster
        .create_configuration(
            &ns.name,
            &debug_echo_configuration("sensors", &["sensor-0", "sensor-1"], 1),
        )
        .await;

    let want = 2 * cluster.nodes.len();
    let instances = eventually(
        &format!("{want} Instances of sensors (2 devices on each node)"),
        Duration::from_secs(90),
        || async {
            let list = cluster.instances_of(&ns.name, "sensors").await;
            (list.len() == want).then_some(list)
        },
    )
    .await;

    for node in &cluster.nodes {
        let mine: Vec<_> = instances
            .iter()
            .filter(|i| i.spec.nodes == vec![node.clone()])
            .collect();
        assert_eq!(mine.len(), 2, "two Instances on {node}: {instances:?}");
        for inst in &mine {
            let resource = format!("steward.dev/{}", inst.metadata.name.as_deref().unwrap());
            cluster.wait_allocatable(node, &resource, 1).await;
        }
        // A pod on each node, through the real scheduler and kubelet.
        let inst = mine[0];
        let name = inst.metadata.name.clone().unwrap();
        let description = inst
            .spec
            .properties
            .get("DEBUG_ECHO_DESCRIPTION")
            .cloned()
            .unwrap_or_else(|| panic!("Instance {name} has no DEBUG_ECHO_DESCRIPTION"));
        let pod = format!(
            "reader-{}",
            node.replace(|c: char| !c.is_ascii_alphanumeric(), "")
        );
        cluster
            .create_pod(
                &ns.name,
                busybox_pod(
                    &pod,
                    "env; sleep 3600",
                    json!({ format!("steward.dev/{name}"): "1" }),
                ),
            )
            .await;
        let running = cluster
            .running(&ns.name, &pod, Duration::from_secs(120))
            .await;
        assert_eq!(
            running.spec.and_then(|s| s.node_name).as_deref(),
            Some(node.as_str())
        );
        let logs = eventually(
            &format!("{pod}'s environment in its log"),
            Duration::from_secs(30),
            || async {
                let logs = cluster.kubectl(&["logs", "-n", &ns.name, &pod]);
                logs.contains("STORY=").then_some(logs)
            },
        )
        .await;
        assert!(
            logs.contains(&format!("DEBUG_ECHO_DESCRIPTION={description}")),
            "{pod} sees its device's property: {logs}"
        );
        assert!(
            logs.contains("STORY=sensors"),
            "{pod} sees the broker property: {logs}"
        );
    }
}
