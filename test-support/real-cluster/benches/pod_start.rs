//! Pod start and slot release on the real kubelet (the cluster
//! `scripts/real-cluster up` starts, steward installed by helm), each against
//! its baseline measured in the same run:
//!
//! - **start**: pod created → Running, for a pod asking one steward device
//!   (device plugin) and one exclusive CPU (Guaranteed: pinned by the NRI
//!   plugin), against a plain BestEffort pod on the same node; interleaved.
//! - **release**: pod deleted → its SlotClaim gone (the slot free in the
//!   cluster's view), against a plain pod deleted → pod object gone (kubelet
//!   has stopped it: nothing can free a slot before that; the floor).
//!
//! `STEWARD_BENCH_SMOKE=1`: 2 rounds (the test command's real-cluster tier
//! runs it so); otherwise `STEWARD_BENCH_ROUNDS` (default 20). Run by hand:
//! `eval "$(scripts/real-cluster up DIR)"; cargo bench -p steward-real-cluster --bench pod_start`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use kube::api::DeleteParams;
use serde_json::{Value, json};
use steward_real_cluster::bench::{delete_gracefully, line, rounds};
use steward_real_cluster::{BUSYBOX, Cluster, debug_echo_configuration, eventually};

/// Grace 1 s, deleted gracefully: the pod object stays until kubelet has
/// stopped its containers, so the next round never starts while the last
/// one's exclusive CPU is still held. (A pod deleted with grace 0 is gone
/// from the API before kubelet stops it; a new pod's exclusive CPU is then
/// refused by the NRI plugin until the old container stops, and kubelet
/// retries after its back-off: 10 s and more.)
fn pod(name: &str, node: &str, limits: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"limits": limits},
            }],
        },
    })
}

fn slotclaim_count(cluster: &Cluster, ns: &str) -> usize {
    cluster.slotclaims(ns).len()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let rounds = rounds();
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("bench").await;
    let node = cluster.nodes[0].clone();
    cluster
        .create_configuration(
            &ns.name,
            &debug_echo_configuration("benchdev", &["bench-0"], 1),
        )
        .await;
    let inst = cluster.instance_on(&ns.name, "benchdev", &node).await;
    let resource = format!("steward.dev/{}", inst.metadata.name.clone().unwrap());
    cluster.wait_allocatable(&node, &resource, 1).await;
    let pods = cluster.pods(&ns.name);

    let (mut plain, mut steward, mut gone, mut freed) = (vec![], vec![], vec![], vec![]);
    for i in 0..rounds {
        // Plain pod: start, then delete → object gone (the release floor).
        let name = format!("plain-{i}");
        let t = Instant::now();
        cluster
            .create_pod(&ns.name, pod(&name, &node, json!({})))
            .await;
        cluster
            .running(&ns.name, &name, Duration::from_secs(120))
            .await;
        plain.push(t.elapsed());
        let t = Instant::now();
        delete_gracefully(&cluster, &ns.name, &name).await;
        gone.push(t.elapsed());

        // Device + exclusive CPU: start, then delete → SlotClaim gone.
        let name = format!("dev-{i}");
        let limits = json!({resource.clone(): "1", "cpu": "1", "memory": "32Mi"});
        // The previous round's slot must be free at kubelet too.
        eventually(
            "the slot allocatable again",
            Duration::from_secs(60),
            || async { (cluster.allocatable(&node, &resource).await == 1).then_some(()) },
        )
        .await;
        let t = Instant::now();
        cluster
            .create_pod(&ns.name, pod(&name, &node, limits))
            .await;
        cluster
            .running(&ns.name, &name, Duration::from_secs(120))
            .await;
        steward.push(t.elapsed());
        eventually("the SlotClaim written", Duration::from_secs(30), || async {
            (slotclaim_count(&cluster, &ns.name) == 1).then_some(())
        })
        .await;
        let t = Instant::now();
        let _ = pods.delete(&name, &DeleteParams::default()).await;
        eventually("the SlotClaim gone", Duration::from_secs(60), || async {
            (slotclaim_count(&cluster, &ns.name) == 0).then_some(())
        })
        .await;
        freed.push(t.elapsed());
        delete_gracefully(&cluster, &ns.name, &name).await;
    }
    println!("pod_start on Kubernetes {} ({node})", cluster.version);
    line(
        "start: device + exclusive CPU vs plain pod",
        &steward,
        &plain,
    );
    line(
        "release: pod deleted → SlotClaim gone vs pod object gone",
        &freed,
        &gone,
    );
}
