//! Exclusive CPUs as DRA devices on the real cluster: the resource
//! manager's driver `cpu.steward.dev` publishes each node's CPUs with the
//! standard `resource.kubernetes.io/numaNode`, kube-scheduler's own
//! allocator places one claim asking a steward device and a CPU on one NUMA
//! node (`matchAttribute`), kubelet prepares both drivers' halves, and the
//! NRI plugin pins the container to the claim's CPU from the one CPU ledger.
//! No extender is in the path: the pod asks no extended resource.
//!
//! The tier's node b has two NUMA nodes (a sysfs topology the resource
//! manager reads, `scripts/real-cluster`), node a one; the device is on NUMA
//! node 1 on both nodes, so only b can align them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use steward_real_cluster::{
    BUSYBOX, CPU_DRIVER, Cluster, NUMA_ATTRIBUTE, aligned_claim_spec, debug_echo_on_numa,
    eventually,
};

const NUMA: &str = NUMA_ATTRIBUTE;

/// node → CPU → NUMA node, from the CPU devices each node publishes.
fn cpu_devices(cluster: &Cluster) -> BTreeMap<String, BTreeMap<u32, i64>> {
    let slices: Value =
        serde_json::from_str(&cluster.kubectl(&["get", "resourceslices", "-o", "json"])).unwrap();
    let mut out: BTreeMap<String, BTreeMap<u32, i64>> = BTreeMap::new();
    for s in slices["items"].as_array().into_iter().flatten() {
        if s["spec"]["driver"] != CPU_DRIVER {
            continue;
        }
        let node = s["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        for d in s["spec"]["devices"].as_array().into_iter().flatten() {
            let cpu: u32 = d["name"]
                .as_str()
                .and_then(|n| n.strip_prefix("cpu-"))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("a CPU device's name: {d}"));
            let numa = d["attributes"][NUMA]["int"]
                .as_i64()
                .unwrap_or_else(|| panic!("{cpu} has no {NUMA}: {d}"));
            out.entry(node.clone()).or_default().insert(cpu, numa);
        }
    }
    out
}

/// A claim template of [`aligned_claim_spec`].
fn aligned(name: &str, class: &str, cpus: u32) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": aligned_claim_spec(class, cpus)},
    })
}

fn pod(name: &str, template: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "aligned", "resourceClaimTemplateName": template}],
            "containers": [{
                "name": "c",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"claims": [{"name": "aligned"}]},
            }],
        },
    })
}

/// Proves: kube-scheduler alone places a claim for a device and a CPU with
/// `matchAttribute` on `resource.kubernetes.io/numaNode` on the only node
/// where both share a NUMA node; the container's cgroup cpuset is exactly
/// the allocated CPU and that CPU's NUMA node is the device's; a BestEffort
/// pod on the node is moved off that CPU while the claim is prepared and
/// gets it back after; a claim that cannot fit on one NUMA node stays
/// unscheduled with the scheduler's reason.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_scheduler_aligns_a_device_and_its_cpus_on_one_numa_node() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("dra-cpus").await;

    // Each node publishes its CPUs; exactly one has a CPU on NUMA node 1.
    let published = eventually(
        "CPU devices of cpu.steward.dev on every node, NUMA node 1 on one",
        Duration::from_secs(90),
        || async {
            let d = cpu_devices(&cluster);
            let on_1: Vec<&String> = d
                .iter()
                .filter(|(_, cpus)| cpus.values().any(|n| *n == 1))
                .map(|(node, _)| node)
                .collect();
            (cluster.nodes.iter().all(|n| d.contains_key(n)) && on_1.len() == 1).then_some(d)
        },
    )
    .await;
    let (two_numa, cpus) = published
        .iter()
        .find(|(_, cpus)| cpus.values().any(|n| *n == 1))
        .map(|(n, c)| (n.clone(), c.clone()))
        .unwrap();
    let numa1: BTreeSet<u32> = cpus
        .iter()
        .filter(|(_, n)| **n == 1)
        .map(|(c, _)| *c)
        .collect();
    let all: BTreeSet<u32> = cpus.keys().copied().collect();

    // A BestEffort pod on that node shares every CPU to begin with.
    let witness = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "witness"},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeName": two_numa,
            "containers": [{"name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"]}],
        },
    });
    cluster.create_pod(&ns.name, witness).await;
    cluster
        .running(&ns.name, "witness", Duration::from_secs(120))
        .await;
    eventually(
        "the witness on every CPU",
        Duration::from_secs(60),
        || async { (cluster.cpuset(&ns.name, "witness") == all).then_some(()) },
    )
    .await;

    cluster
        .create_configuration(&ns.name, &debug_echo_on_numa("numa-acc", &["acc-0"], 1, 1))
        .await;
    let class = cluster.device_class(&ns.name, "numa-acc").await;
    cluster.apply(&ns.name, &aligned("acc-and-cpu", &class, 1));
    cluster.apply(&ns.name, &pod("aligned", "acc-and-cpu"));
    let running = cluster
        .running(&ns.name, "aligned", Duration::from_secs(120))
        .await;
    let node = running
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap();
    assert_eq!(
        node, two_numa,
        "only {two_numa} has a CPU on the device's NUMA node"
    );

    // The allocation: one steward device and one CPU, both on NUMA node 1.
    let claims: Value = serde_json::from_str(&cluster.kubectl(&[
        "get",
        "resourceclaims",
        "-n",
        &ns.name,
        "-o",
        "json",
    ]))
    .unwrap();
    let results = claims["items"][0]["status"]["allocation"]["devices"]["results"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let cpu_results: Vec<u32> = results
        .iter()
        .filter(|r| r["driver"] == CPU_DRIVER)
        .map(|r| r["device"].as_str().unwrap()[4..].parse().unwrap())
        .collect();
    assert_eq!(cpu_results.len(), 1, "one CPU allocated: {results:?}");
    assert!(
        results.iter().any(|r| r["driver"] == "steward.dev"),
        "a steward device allocated: {results:?}"
    );
    assert!(
        numa1.contains(&cpu_results[0]),
        "CPU {} is on NUMA node 1",
        cpu_results[0]
    );

    // The container runs on exactly that CPU; the witness no longer does.
    let mine = eventually(
        "the claim's CPU pinned",
        Duration::from_secs(30),
        || async {
            let s = cluster.cpuset(&ns.name, "aligned");
            (!s.is_empty()).then_some(s)
        },
    )
    .await;
    assert_eq!(
        mine,
        BTreeSet::from([cpu_results[0]]),
        "the container's cpuset"
    );
    eventually(
        "the witness moved off the claim's CPU",
        Duration::from_secs(30),
        || async {
            let w = cluster.cpuset(&ns.name, "witness");
            (!w.contains(&cpu_results[0]) && !w.is_empty()).then_some(())
        },
    )
    .await;

    // The claim gone, the CPU goes back to the shared pool.
    cluster.delete_pod_now(&ns.name, "aligned").await;
    eventually(
        "the witness back on every CPU",
        Duration::from_secs(90),
        || async { (cluster.cpuset(&ns.name, "witness") == all).then_some(()) },
    )
    .await;

    // Two CPUs and the device on one NUMA node fit nowhere.
    cluster.apply(
        &ns.name,
        &aligned("acc-and-two", &class, numa1.len() as u32 + 1),
    );
    cluster.apply(&ns.name, &pod("too-big", "acc-and-two"));
    let why = eventually("too-big unschedulable", Duration::from_secs(60), || async {
        let p: Value = serde_json::from_str(
            &cluster.kubectl(&["get", "pod", "-n", &ns.name, "too-big", "-o", "json"]),
        )
        .unwrap();
        p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "PodScheduled" && c["reason"] == "Unschedulable")
            .map(|c| c["message"].as_str().unwrap_or_default().to_owned())
    })
    .await;
    assert!(
        why.contains("cannot allocate all claims") || why.contains("resourceclaim"),
        "the scheduler's reason names the claim: {why}"
    );
}
