//! Seed 002 on the real kube-scheduler: pods asking exclusive CPUs race for
//! the two nodes through steward's extender (in kube-scheduler's own
//! configuration, called with kube-scheduler's own bytes), while the leading
//! controller's pod is deleted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use steward_real_cluster::{BUSYBOX, Cluster, eventually};

const PODS: usize = 4;

fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"limits": {
                    "cpu": "1", "memory": "32Mi",
                    "resmgr.steward.dev/exclusive-cpus": "1",
                }},
            }],
        },
    })
}

fn reservations(cluster: &Cluster, ns: &str) -> Vec<Value> {
    let v: Value = serde_json::from_str(&cluster.kubectl(&[
        "get",
        "reservations.steward.dev",
        "-n",
        ns,
        "-o",
        "json",
    ]))
    .unwrap();
    v["items"].as_array().cloned().unwrap_or_default()
}

/// Proves: kube-scheduler sends pods asking `resmgr.steward.dev/exclusive-cpus`
/// to steward's extender (its managedResources), the controller decides a
/// Reservation for each placed pod, and with the leading controller's pod
/// deleted while the pods race: no node runs more such pods than its CPUs
/// (one whole CPU each, next to the node's own pods), every Running pod runs
/// where its Reservation put it, no Reservation stays Requested, and a pod
/// left waiting is placed once a running one is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn pods_race_for_exclusive_cpus_through_the_extender_while_the_leader_dies() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("s002").await;
    let leases = cluster.kubectl(&[
        "get",
        "lease",
        "-n",
        &cluster.release_namespace,
        "steward-controller",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    let leader = leases.trim().to_owned();
    assert!(!leader.is_empty(), "a controller leads");

    for i in 0..PODS {
        cluster
            .create_pod(&ns.name, pod(&format!("racer-{i}")))
            .await;
    }
    // The leader goes while the scheduler asks the extender about the pods.
    cluster.kubectl(&[
        "delete",
        "pod",
        "-n",
        &cluster.release_namespace,
        &leader,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);

    // One whole CPU per pod: each node (2 CPUs, a little of them requested
    // by its own pods) takes one racer.
    let pods = cluster.pods(&ns.name);
    let placed = eventually(
        "one racer Running on each node",
        Duration::from_secs(180),
        || async {
            let list = pods.list(&Default::default()).await.ok()?;
            let running: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .collect();
            (running.len() == cluster.nodes.len()).then_some(running)
        },
    )
    .await;
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for p in &placed {
        *per_node
            .entry(p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap())
            .or_default() += 1;
    }
    assert!(
        per_node.values().all(|n| *n == 1),
        "one racer per node: {per_node:?}"
    );

    // Every Running pod is where its Reservation put it; nothing stays
    // Requested once the new leader has caught up.
    eventually(
        "every racer's Reservation decided",
        Duration::from_secs(90),
        || async {
            let rs = reservations(&cluster, &ns.name);
            rs.iter()
                .all(|r| r["status"]["phase"] != "Requested" && !r["status"].is_null())
                .then_some(())
        },
    )
    .await;
    for p in &placed {
        let name = p.metadata.name.clone().unwrap();
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
        // Reserved on the pod's node, then consumed once the pod holds it.
        let r = eventually(
            &format!("{name}'s Reservation consumed"),
            Duration::from_secs(60),
            || async {
                reservations(&cluster, &ns.name)
                    .into_iter()
                    .find(|r| r["spec"]["pod"]["name"] == name.as_str())
                    .filter(|r| r["status"]["conditions"].to_string().contains("Consumed"))
            },
        )
        .await;
        assert_eq!(r["status"]["phase"], "Reserved", "{r}");
        assert_eq!(
            r["status"]["node"],
            node.as_str(),
            "{name} runs where its Reservation holds its CPUs: {r}"
        );
        assert_eq!(r["status"]["cpus"], 1, "{r}");
    }
    let failed = cluster.events_with_reason(&ns.name, "UnexpectedAdmissionError");
    assert!(failed.is_empty(), "pods failed admission: {failed:?}");

    // A waiting racer is placed once a running one goes.
    let gone = placed[0].metadata.name.clone().unwrap();
    cluster.delete_pod_now(&ns.name, &gone).await;
    eventually(
        "a waiting racer Running in the freed place",
        Duration::from_secs(180),
        || async {
            let list = pods.list(&Default::default()).await.ok()?;
            let running = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            (running == cluster.nodes.len()).then_some(())
        },
    )
    .await;
}
