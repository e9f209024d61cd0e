//! In-place resize of a pinned container on the real kubelet (CPU manager
//! policy `none`, in-place resize GA since 1.35): kubelet sends the new
//! resources to the runtime, and the NRI plugin re-places the container
//! from the one CPU ledger: exclusive CPUs grown or shrunk, the shared pool
//! adjusted; a resize that cannot fit is refused whole and reported in the
//! pod's resize status.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use steward_real_cluster::{BUSYBOX, CPU_DRIVER, Cluster, cpus_of, eventually};

fn pod(name: &str, node: &str, limits: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{
                "name": "c",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": if limits.is_null() { json!({}) } else { json!({"limits": limits}) },
                "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
            }],
        },
    })
}

/// `kubectl patch --subresource resize`: the container's CPU request and
/// limit set to `cpu`.
fn resize(cluster: &Cluster, ns: &str, name: &str, cpu: &str) {
    let patch = json!({"spec": {"containers": [{
        "name": "c",
        "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}},
    }]}});
    cluster.kubectl(&[
        "patch",
        "pod",
        "-n",
        ns,
        name,
        "--subresource",
        "resize",
        "--type",
        "strategic",
        "-p",
        &patch.to_string(),
    ]);
}

/// The pod's object as JSON.
fn pod_json(cluster: &Cluster, ns: &str, name: &str) -> Value {
    serde_json::from_str(&cluster.kubectl(&["get", "pod", "-n", ns, name, "-o", "json"])).unwrap()
}

/// The CPU limit kubelet says the running container has.
fn applied_cpu(p: &Value) -> Option<String> {
    p["status"]["containerStatuses"][0]["resources"]["limits"]["cpu"]
        .as_str()
        .map(str::to_owned)
}

/// Proves: a Guaranteed container pinned to one exclusive CPU, resized to
/// half a CPU, leaves its exclusive CPU (it runs on the shared pool, which
/// grows back to every CPU); resized to one CPU again, it is given one
/// exclusive CPU and the shared pool shrinks; once a DRA claim holds a CPU
/// of the node (the one ledger), growing it from half a CPU to one
/// exclusive CPU would leave no shared CPU and is refused by the NRI
/// plugin: the pod's `PodResizeInProgress` condition says so, kubelet keeps
/// the old resources, and neither container's CPUs change.
#[tokio::test(flavor = "multi_thread")]
async fn a_pinned_container_is_resized_in_place_by_the_nri_plugin() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("resize").await;
    let node = cluster.nodes[0].clone();
    let all = cpus_of(&std::fs::read_to_string("/sys/fs/cgroup/cpuset/cpuset.cpus").unwrap());
    assert!(all.len() >= 2, "the machine needs two CPUs, has {all:?}");

    cluster
        .create_pod(&ns.name, pod("shared", &node, json!(null)))
        .await;
    cluster
        .running(&ns.name, "shared", Duration::from_secs(120))
        .await;
    cluster
        .create_pod(
            &ns.name,
            pod("pinned", &node, json!({"cpu": "1", "memory": "64Mi"})),
        )
        .await;
    cluster
        .running(&ns.name, "pinned", Duration::from_secs(120))
        .await;
    let one = cluster.cpuset(&ns.name, "pinned");
    assert_eq!(one.len(), 1, "one exclusive CPU: {one:?}");
    eventually(
        "the shared pool without it",
        Duration::from_secs(30),
        || async {
            cluster
                .cpuset(&ns.name, "shared")
                .is_disjoint(&one)
                .then_some(())
        },
    )
    .await;

    // Shrink: half a CPU is not exclusive; it shares, and so does the pool.
    resize(&cluster, &ns.name, "pinned", "500m");
    eventually(
        "the resized container on the shared pool",
        Duration::from_secs(60),
        || async {
            let p = pod_json(&cluster, &ns.name, "pinned");
            (applied_cpu(&p).as_deref() == Some("500m")
                && cluster.cpuset(&ns.name, "pinned") == all
                && cluster.cpuset(&ns.name, "shared") == all)
                .then_some(())
        },
    )
    .await;

    // Grow: one CPU again, exclusive again.
    resize(&cluster, &ns.name, "pinned", "1");
    eventually(
        "one exclusive CPU again",
        Duration::from_secs(60),
        || async {
            let p = pod_json(&cluster, &ns.name, "pinned");
            let mine = cluster.cpuset(&ns.name, "pinned");
            (applied_cpu(&p).as_deref() == Some("1")
                && mine.len() == 1
                && cluster.cpuset(&ns.name, "shared").is_disjoint(&mine))
            .then_some(())
        },
    )
    .await;

    // A CPU claimed through DRA leaves one CPU for everything else, which
    // must stay shared: growing a shared container to an exclusive CPU no
    // longer fits. The resize is refused whole.
    resize(&cluster, &ns.name, "pinned", "500m");
    eventually("shared again", Duration::from_secs(60), || async {
        (cluster.cpuset(&ns.name, "pinned") == all).then_some(())
    })
    .await;
    cluster.apply(
        &ns.name,
        &json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-cpu"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "cpu", "exactly": {"deviceClassName": CPU_DRIVER, "count": 1}},
            ]}}},
        }),
    );
    let mut holder = pod("holder", &node, json!(null));
    holder["spec"]["resourceClaims"] =
        json!([{"name": "cpu", "resourceClaimTemplateName": "one-cpu"}]);
    holder["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "cpu"}]});
    cluster.create_pod(&ns.name, holder).await;
    cluster
        .running(&ns.name, "holder", Duration::from_secs(120))
        .await;
    let claimed = cluster.cpuset(&ns.name, "holder");
    assert_eq!(claimed.len(), 1, "the claim's one CPU: {claimed:?}");
    let shared: BTreeSet<u32> = eventually(
        "the shared container off the claimed CPU",
        Duration::from_secs(30),
        || async {
            let s = cluster.cpuset(&ns.name, "pinned");
            (s.is_disjoint(&claimed) && !s.is_empty()).then_some(s)
        },
    )
    .await;

    resize(&cluster, &ns.name, "pinned", "1");
    let why = eventually(
        "the resize reported as failed",
        Duration::from_secs(60),
        || async {
            let p = pod_json(&cluster, &ns.name, "pinned");
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "PodResizeInProgress" && c["reason"] == "Error")
                .map(|c| c["message"].as_str().unwrap_or_default().to_owned())
        },
    )
    .await;
    assert!(!why.is_empty(), "the condition has a message");
    let p = pod_json(&cluster, &ns.name, "pinned");
    assert_eq!(
        applied_cpu(&p).as_deref(),
        Some("500m"),
        "kubelet keeps the resources it had: {}",
        p["status"]
    );
    assert_eq!(
        cluster.cpuset(&ns.name, "pinned"),
        shared,
        "the container keeps its CPUs: nothing half-applied"
    );
    assert_eq!(
        cluster.cpuset(&ns.name, "holder"),
        claimed,
        "the claim keeps its CPU"
    );
}
