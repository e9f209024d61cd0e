//! An upgrade of the agent on the real cluster: its DaemonSet rolls with
//! `maxSurge` while pods with DRA claims keep starting, and the real
//! kubelet's DRA manager keeps both agents' plugins registered side by side
//! (sockets named per pod, kubelet 1.33+).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use steward_real_cluster::{BUSYBOX, Cluster, debug_echo_configuration, eventually};

const AGENT: &str = "app.kubernetes.io/component=agent";

/// The agent pods: name → (UID, node, ready).
fn agents(cluster: &Cluster) -> BTreeMap<String, (String, String, bool)> {
    let v: Value = serde_json::from_str(&cluster.kubectl(&[
        "get",
        "pods",
        "-n",
        &cluster.release_namespace,
        "-l",
        AGENT,
        "-o",
        "json",
    ]))
    .unwrap();
    v["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let ready = p["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            (
                p["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                (
                    p["metadata"]["uid"].as_str().unwrap_or("").to_owned(),
                    p["spec"]["nodeName"].as_str().unwrap_or("").to_owned(),
                    ready,
                ),
            )
        })
        .collect()
}

fn claimed_pod(name: &str, template: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "cam", "resourceClaimTemplateName": template}],
            "containers": [{
                "name": "c",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "sleep 3600"],
                "resources": {"claims": [{"name": "cam"}]},
            }],
        },
    })
}

/// The SlotClaims of `ns` held by a ResourceClaim: claim name → slot.
fn held(cluster: &Cluster, ns: &str) -> BTreeMap<String, String> {
    cluster
        .slotclaims(ns)
        .iter()
        .filter_map(|c| {
            Some((
                c["spec"]["resourceClaim"]["name"].as_str()?.to_owned(),
                c["metadata"]["name"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// Proves: `kubectl rollout restart` of the agent's DaemonSet (the chart's
/// default off the host network: maxSurge 1, maxUnavailable 0) replaces
/// the agent on both nodes, each new agent starting beside the old one,
/// while a pod with a DRA claim is created every second: every pod runs,
/// kubelet reports no failed NodePrepareResources (no
/// `FailedPrepareDynamicResources` event), the claim prepared before the
/// roll keeps its SlotClaim and its pod is not restarted, and once every
/// pod is deleted after the roll no slot is left held.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_rolls_with_surge_and_no_prepare_is_refused() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("dra-roll").await;
    let strategy: Value = serde_json::from_str(&cluster.kubectl(&[
        "get",
        "daemonset",
        "steward-agent",
        "-n",
        &cluster.release_namespace,
        "-o",
        "jsonpath={.spec.updateStrategy}",
    ]))
    .unwrap();
    assert_eq!(strategy["rollingUpdate"]["maxSurge"], 1, "{strategy}");
    assert_eq!(strategy["rollingUpdate"]["maxUnavailable"], 0, "{strategy}");

    cluster
        .create_configuration(
            &ns.name,
            &debug_echo_configuration("rollcams", &["cam-0"], 12),
        )
        .await;
    let class = cluster.device_class(&ns.name, "rollcams").await;
    cluster.apply(
        &ns.name,
        &json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-cam"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "cam", "exactly": {"deviceClassName": class}}
            ]}}},
        }),
    );
    cluster.apply(&ns.name, &claimed_pod("before", "one-cam"));
    let before = cluster
        .running(&ns.name, "before", Duration::from_secs(120))
        .await;
    let before_uid = before.metadata.uid.clone().unwrap();
    let before_claims = eventually(
        "the first claim's SlotClaim",
        Duration::from_secs(30),
        || async {
            let h = held(&cluster, &ns.name);
            (h.len() == 1).then_some(h)
        },
    )
    .await;

    let old_agents = agents(&cluster);
    assert_eq!(old_agents.len(), cluster.nodes.len(), "{old_agents:?}");
    let old_uids: BTreeSet<String> = old_agents.values().map(|(uid, _, _)| uid.clone()).collect();
    cluster.kubectl(&[
        "rollout",
        "restart",
        "daemonset/steward-agent",
        "-n",
        &cluster.release_namespace,
    ]);

    // A pod with a claim every second until every node's agent is a new one
    // and ready (at most 16: 12 slots on each node).
    let started = Instant::now();
    let mut during = Vec::new();
    let mut saw_two_on_a_node = false;
    loop {
        let now = agents(&cluster);
        let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, node, _) in now.values() {
            *per_node.entry(node.as_str()).or_default() += 1;
        }
        saw_two_on_a_node |= per_node.values().any(|n| *n > 1);
        let rolled = now.len() == cluster.nodes.len()
            && now
                .values()
                .all(|(uid, _, ready)| *ready && !old_uids.contains(uid));
        if rolled {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the agent did not roll within 300 s: {now:?}"
        );
        if during.len() < 16 {
            let name = format!("during-{}", during.len());
            cluster.apply(&ns.name, &claimed_pod(&name, "one-cam"));
            during.push(name);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        saw_two_on_a_node,
        "the new agent ran beside the old one on its node (maxSurge)"
    );
    assert!(!during.is_empty(), "pods were created during the roll");
    // How many prepares the new agents relayed to the old ones (what the
    // roll's timing gave; not asserted).
    let relayed: usize = agents(&cluster)
        .keys()
        .map(|pod| {
            cluster
                .kubectl(&["logs", "-n", &cluster.release_namespace, pod])
                .matches("relayed to the agent before this one")
                .count()
        })
        .sum();
    eprintln!(
        "rolled in {:?} with {} pods created meanwhile, {relayed} prepares relayed",
        started.elapsed(),
        during.len()
    );

    for name in &during {
        cluster
            .running(&ns.name, name, Duration::from_secs(120))
            .await;
    }
    let failed = cluster.events_with_reason(&ns.name, "FailedPrepareDynamicResources");
    assert!(
        failed.is_empty(),
        "NodePrepareResources refused during the roll: {failed:?}"
    );

    // The claim prepared before the roll: still held by the same slot, its
    // pod the same and never restarted.
    let now_held = held(&cluster, &ns.name);
    for (claim, slot) in &before_claims {
        assert_eq!(now_held.get(claim), Some(slot), "{now_held:?}");
    }
    assert_eq!(
        now_held.len(),
        1 + during.len(),
        "one slot per claim: {now_held:?}"
    );
    let before = cluster.pods(&ns.name).get("before").await.unwrap();
    assert_eq!(before.metadata.uid.as_deref(), Some(before_uid.as_str()));
    let restarts: i32 = before
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default()
        .iter()
        .map(|c| c.restart_count)
        .sum();
    assert_eq!(restarts, 0);

    // Every pod deleted: the new agents unprepare what the old ones
    // prepared, and no slot stays held.
    cluster.kubectl(&["delete", "pods", "--all", "-n", &ns.name, "--wait=false"]);
    eventually(
        "every slot of the story released",
        Duration::from_secs(120),
        || async { held(&cluster, &ns.name).is_empty().then_some(()) },
    )
    .await;
}
