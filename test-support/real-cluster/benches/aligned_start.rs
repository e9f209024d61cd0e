//! A device and a CPU on one NUMA node, two ways, on the real cluster (the
//! one `scripts/real-cluster up` starts), each against the other in the
//! same run, interleaved, on the tier's two-NUMA node:
//!
//! - **DRA**: a ResourceClaim asking a steward device and one CPU of
//!   `cpu.steward.dev` with `matchAttribute` on the NUMA node, and a pod
//!   using it; claim created → pod Running. kube-scheduler's allocator
//!   places it alone; kubelet prepares both drivers; the NRI plugin pins.
//! - **extender**: the same device through its device plugin and one
//!   exclusive CPU (`resmgr.steward.dev/exclusive-cpus`, Guaranteed):
//!   kube-scheduler asks steward's extender, whose leader writes a
//!   Reservation; kubelet allocates the slot; the NRI plugin pins. Pod
//!   created → Running. The baseline.
//!
//! `STEWARD_BENCH_SMOKE=1`: 2 rounds; otherwise `STEWARD_BENCH_ROUNDS`
//! (default 20). Run by hand: `eval "$(scripts/real-cluster up DIR)"; cargo
//! bench -p steward-real-cluster --bench aligned_start`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use kube::api::DeleteParams;
use serde_json::{Value, json};
use steward_real_cluster::bench::{delete_gracefully, line, rounds};
use steward_real_cluster::{
    BUSYBOX, CPU_DRIVER, Cluster, aligned_claim_spec, debug_echo_on_numa, eventually,
};

/// A pod on `node` (or wherever the scheduler likes, for `None`) with
/// `limits` and the pod-level claims `claims` (name → ResourceClaim).
fn pod(name: &str, node: Option<&str>, limits: Value, claim: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"limits": limits},
            }],
        },
    });
    if let Some(node) = node {
        p["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    }
    if let Some(claim) = claim {
        p["spec"]["resourceClaims"] = json!([{"name": "aligned", "resourceClaimName": claim}]);
        p["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "aligned"}]);
    }
    p
}

/// The node publishing a CPU on NUMA node 1.
fn two_numa_node(cluster: &Cluster) -> Option<String> {
    let slices: Value =
        serde_json::from_str(&cluster.kubectl(&["get", "resourceslices", "-o", "json"])).ok()?;
    slices["items"].as_array()?.iter().find_map(|s| {
        let on_1 = s["spec"]["driver"] == CPU_DRIVER
            && s["spec"]["devices"].as_array()?.iter().any(|d| {
                d["attributes"]["resource.kubernetes.io/numaNode"]["int"].as_i64() == Some(1)
            });
        on_1.then(|| s["spec"]["nodeName"].as_str().map(str::to_owned))
            .flatten()
    })
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let rounds = rounds();
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("bench-aligned").await;
    let node = eventually(
        "a node with two NUMA nodes",
        Duration::from_secs(90),
        || async { two_numa_node(&cluster) },
    )
    .await;
    cluster
        .create_configuration(
            &ns.name,
            &debug_echo_on_numa("alignbench", &["acc-0"], 1, 1),
        )
        .await;
    let class = cluster.device_class(&ns.name, "alignbench").await;
    let inst = cluster.instance_on(&ns.name, "alignbench", &node).await;
    let resource = format!("steward.dev/{}", inst.metadata.name.clone().unwrap());
    let claims = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        cluster.client.clone(),
        &ns.name,
        &kube::discovery::ApiResource {
            group: "resource.k8s.io".into(),
            version: "v1".into(),
            api_version: "resource.k8s.io/v1".into(),
            kind: "ResourceClaim".into(),
            plural: "resourceclaims".into(),
        },
    );

    let (mut dra, mut extender) = (vec![], vec![]);
    for i in 0..rounds {
        // The slot free at kubelet (the last round's holder is gone).
        eventually("the slot allocatable", Duration::from_secs(90), || async {
            (cluster.allocatable(&node, &resource).await == 1).then_some(())
        })
        .await;
        let name = format!("ext-{i}");
        let limits = json!({
            resource.clone(): "1", "cpu": "1", "memory": "32Mi",
            "resmgr.steward.dev/exclusive-cpus": "1",
        });
        let t = Instant::now();
        cluster
            .create_pod(&ns.name, pod(&name, Some(&node), limits, None))
            .await;
        cluster
            .running(&ns.name, &name, Duration::from_secs(120))
            .await;
        extender.push(t.elapsed());
        delete_gracefully(&cluster, &ns.name, &name).await;

        eventually("the slot allocatable", Duration::from_secs(90), || async {
            (cluster.allocatable(&node, &resource).await == 1).then_some(())
        })
        .await;
        let name = format!("dra-{i}");
        let claim: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": aligned_claim_spec(&class, 1),
        }))
        .unwrap();
        let t = Instant::now();
        claims
            .create(&Default::default(), &claim)
            .await
            .unwrap_or_else(|e| panic!("ResourceClaim {name}: {e}"));
        cluster
            .create_pod(&ns.name, pod(&name, None, json!({}), Some(&name)))
            .await;
        cluster
            .running(&ns.name, &name, Duration::from_secs(120))
            .await;
        dra.push(t.elapsed());
        delete_gracefully(&cluster, &ns.name, &name).await;
        let _ = claims.delete(&name, &DeleteParams::default()).await;
        eventually("the claim gone", Duration::from_secs(60), || async {
            matches!(claims.get_opt(&name).await, Ok(None)).then_some(())
        })
        .await;
    }
    println!("aligned_start on Kubernetes {} ({node})", cluster.version);
    line(
        "start: device + CPU on one NUMA node, DRA (claim created) vs extender (pod created)",
        &dra,
        &extender,
    );
}
