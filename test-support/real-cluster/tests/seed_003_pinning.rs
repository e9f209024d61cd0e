//! Seed 003 on the real kubelet: Guaranteed pods pinned by `steward
//! nri-plugin` (installed by the chart as a DaemonSet) while kubelet's CPU
//! manager policy is `none`, read back from inside the containers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{Value, json};
use steward_real_cluster::{BUSYBOX, Cluster, cpus_of, eventually};

/// Proves: the resource manager finds, on the real kubelet's own pod
/// resources API, that kubelet pins nothing (CPU manager `none`); there a
/// Guaranteed pod asking one whole CPU gets one CPU of its own — its
/// container's cgroup cpuset (read inside the container through the real
/// kubelet's exec) is one CPU — and a BestEffort pod already running on the
/// node is moved off it (the shared pool shrinks); when the Guaranteed pod is
/// deleted the shared pool grows back to every CPU.
#[tokio::test(flavor = "multi_thread")]
async fn guaranteed_pods_are_pinned_by_the_nri_plugin_under_the_real_kubelet() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("s003").await;
    let node = cluster.nodes[0].clone();
    let all = cpus_of(&std::fs::read_to_string("/sys/fs/cgroup/cpuset/cpuset.cpus").unwrap());
    assert!(all.len() >= 2, "the machine needs two CPUs, has {all:?}");
    // Each resource manager asked the real kubelet's pod resources API at
    // its start whether kubelet's CPU manager pins, and was told it does not.
    let pods = cluster.kubectl(&[
        "get",
        "pods",
        "-n",
        &cluster.release_namespace,
        "-l",
        "app.kubernetes.io/component=nri-plugin",
        "-o",
        "name",
    ]);
    for pod in pods.split_whitespace() {
        let logs = cluster.kubectl(&["logs", "-n", &cluster.release_namespace, pod]);
        assert!(
            logs.contains("kubelet's CPU manager assigns no CPU (policy none)"),
            "{pod} did not check kubelet's CPU manager: {logs}"
        );
    }

    cluster
        .create_pod(&ns.name, pod("shared", &node, json!(null)))
        .await;
    cluster
        .running(&ns.name, "shared", Duration::from_secs(120))
        .await;
    // On every CPU while nothing on the node holds one of its own.
    eventually(
        "the BestEffort pod on every CPU",
        Duration::from_secs(60),
        || async { (cluster.cpuset(&ns.name, "shared") == all).then_some(()) },
    )
    .await;

    cluster
        .create_pod(
            &ns.name,
            pod("pinned", &node, json!({"cpu": "1", "memory": "64Mi"})),
        )
        .await;
    let p = cluster
        .running(&ns.name, "pinned", Duration::from_secs(120))
        .await;
    assert_eq!(
        p.status.and_then(|s| s.qos_class).as_deref(),
        Some("Guaranteed")
    );
    let mine = cluster.cpuset(&ns.name, "pinned");
    assert_eq!(mine.len(), 1, "one exclusive CPU: {mine:?}");
    let shrunk = eventually(
        "the shared pool without the pinned CPU",
        Duration::from_secs(30),
        || async {
            let s = cluster.cpuset(&ns.name, "shared");
            s.is_disjoint(&mine).then_some(s)
        },
    )
    .await;
    assert!(!shrunk.is_empty(), "the shared pool keeps a CPU");

    cluster.delete_pod_now(&ns.name, "pinned").await;
    eventually(
        "the shared pool back on every CPU",
        Duration::from_secs(30),
        || async { (cluster.cpuset(&ns.name, "shared") == all).then_some(()) },
    )
    .await;
}

fn pod(name: &str, node: &str, limits: Value) -> Value {
    let resources = if limits.is_null() {
        json!({})
    } else {
        json!({"limits": limits})
    };
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
                "resources": resources,
            }],
        },
    })
}
