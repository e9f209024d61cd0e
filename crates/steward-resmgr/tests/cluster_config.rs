//! Cluster configuration source and node publisher against the API server
//! stand-in (no containerd).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use steward_core::cpu::{Cpu, CpuSet, MemoryKind, NumaNode, PolicyConfig, PolicyKind, Topology};
use steward_kube::Change;
use steward_resmgr::cluster_config::{self, ClusterUpdate, ConfigSelector, ConfigSources};
use steward_resmgr::node_publisher::{NodePublisher, Publication};
use steward_resmgr::{ClusterConfig, FileConfig, Metrics};
use steward_testing_apiserver::ApiServer;

type Updates = Pin<Box<dyn Stream<Item = ClusterUpdate> + Send>>;
type TestResult = Result<(), Box<dyn std::error::Error>>;

const NS: &str = "kube-system";

fn cm(name: &str, doc: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "namespace": NS },
        "data": { "config.yaml": doc },
    }))
    .unwrap()
}

async fn next(updates: &mut Updates) -> ClusterUpdate {
    tokio::time::timeout(Duration::from_secs(10), updates.next())
        .await
        .expect("a cluster update within 10 s")
        .expect("the update stream does not end")
}

async fn nothing_within(updates: &mut Updates, d: Duration) {
    if let Ok(u) = tokio::time::timeout(d, updates.next()).await {
        panic!("unexpected update {u:?}");
    }
}

fn policy_of(u: &ClusterUpdate) -> (String, PolicyKind) {
    match u {
        ClusterUpdate::Config { configmap, config } => (configmap.clone(), config.policy.active),
        ClusterUpdate::Fallback => panic!("expected a configuration, got the fallback"),
    }
}

/// A ConfigMap `name` was added or changed; `doc: None` has no document.
fn upsert(s: &mut ConfigSelector, name: &str, doc: Option<&str>) {
    let map = match doc {
        Some(d) => cm(name, d),
        None => serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "namespace": NS },
        }))
        .unwrap(),
    };
    s.apply(Change::Applied(map)).unwrap();
}

/// The ConfigMap `name` was deleted.
fn remove(s: &mut ConfigSelector, name: &str) {
    s.apply(Change::Deleted(cm(name, ""))).unwrap();
}

#[test]
fn selection_prefers_node_then_group_then_default() {
    let mut s = ConfigSelector::new("n1");
    assert_eq!(s.resolve(), None);
    upsert(&mut s, "steward-resmgr.default", Some("d"));
    upsert(&mut s, "steward-resmgr.group.blue", Some("b"));
    upsert(&mut s, "steward-resmgr.node.n2", Some("other node"));
    assert_eq!(s.resolve().unwrap().name, "steward-resmgr.default");
    s.set_group(Some("blue".into()));
    assert_eq!(s.resolve().unwrap().name, "steward-resmgr.group.blue");
    s.set_group(Some("red".into()));
    assert_eq!(
        s.resolve().unwrap().name,
        "steward-resmgr.default",
        "a group without a ConfigMap falls back to the default"
    );
    s.set_group(Some("blue".into()));
    upsert(&mut s, "steward-resmgr.node.n1", None);
    let sel = s.resolve().unwrap();
    assert_eq!(sel.name, "steward-resmgr.node.n1");
    assert_eq!(sel.document, None);
    remove(&mut s, "steward-resmgr.node.n1");
    assert_eq!(s.resolve().unwrap().document.as_deref(), Some("b"));
    remove(&mut s, "steward-resmgr.group.blue");
    remove(&mut s, "steward-resmgr.default");
    assert_eq!(s.resolve(), None);

    // changed() reports each resolution once.
    let mut s = ConfigSelector::new("n1");
    assert_eq!(s.changed(), Some(None));
    assert_eq!(s.changed(), None);
    upsert(&mut s, "steward-resmgr.default", Some("x"));
    assert!(s.changed().is_some());
    upsert(&mut s, "steward-resmgr.group.g", Some("unused"));
    assert_eq!(
        s.changed(),
        None,
        "a ConfigMap that does not apply changes nothing"
    );
}

fn topology() -> Topology {
    let cpus = (0..4)
        .map(|id| Cpu {
            id,
            socket: 0,
            die: 0,
            core: id / 2,
            node: id / 2,
            isolated: id == 3,
        })
        .collect();
    let nodes = (0..2)
        .map(|id| NumaNode {
            id,
            memory_bytes: 1 << 30,
            kind: MemoryKind::Dram,
            distances: BTreeMap::new(),
        })
        .collect();
    Topology::new(cpus, CpuSet::new(), nodes).unwrap()
}

#[tokio::test]
async fn cluster_source_and_node_publisher_against_the_apiserver() -> TestResult {
    let server = ApiServer::start().await?;
    let client = server.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "n1",
            "labels": { "resmgr.steward.dev/group": "blue", "keep": "me" },
            "annotations": { "other.example/a": "b" },
        },
        "status": { "capacity": { "cpu": "4" } },
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let pp = PostParams::default();
    maps.create(
        &pp,
        &cm("steward-resmgr.default", "policy: { active: static }"),
    )
    .await?;
    maps.create(
        &pp,
        &cm("steward-resmgr.group.blue", "policy: { active: balloons }"),
    )
    .await?;
    maps.create(&pp, &cm("unrelated", "not: [yaml")).await?;

    let mut c = ClusterConfig::new(client.clone(), "n1");
    c.publish_retry = Duration::from_millis(100);
    let mut updates: Updates = Box::pin(cluster_config::watch(&c, Metrics::default()));

    // Group ConfigMap first (node's group label), then live changes.
    let first = next(&mut updates).await;
    assert_eq!(
        policy_of(&first),
        ("steward-resmgr.group.blue".to_owned(), PolicyKind::Balloons)
    );
    let mut sources = ConfigSources::new(FileConfig::default());
    let applied = sources.cluster_changed(first).expect("applied");
    assert_eq!(applied.policy.active, PolicyKind::Balloons);

    maps.patch(
        "steward-resmgr.group.blue",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({
            "data": { "config.yaml": "policy: { active: balloons, config: { reserved_cpus: \"0\" } }" }
        })),
    )
    .await?;
    let u = next(&mut updates).await;
    let applied = sources
        .cluster_changed(u)
        .expect("a parameter change is applied");
    assert_eq!(applied.policy.config.reserved_cpus.to_string(), "0");

    // Node ConfigMap wins; a bad one is refused and nothing is sent.
    maps.create(
        &pp,
        &cm("steward-resmgr.node.n1", "policy: { active: fastest }"),
    )
    .await?;
    nothing_within(&mut updates, Duration::from_millis(500)).await;
    maps.patch(
        "steward-resmgr.node.n1",
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({ "data": { "config.yaml": "policy: { active: topology-aware }" } }),
        ),
    )
    .await?;
    assert_eq!(
        policy_of(&next(&mut updates).await),
        (
            "steward-resmgr.node.n1".to_owned(),
            PolicyKind::TopologyAware
        )
    );

    // Group label changes while the node ConfigMap exists: nothing changes;
    // after deleting it the new group (no ConfigMap) resolves to the default.
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "labels": { "resmgr.steward.dev/group": "red" } } })),
        )
        .await?;
    nothing_within(&mut updates, Duration::from_millis(300)).await;
    maps.delete("steward-resmgr.node.n1", &DeleteParams::default())
        .await?;
    assert_eq!(
        policy_of(&next(&mut updates).await),
        ("steward-resmgr.default".to_owned(), PolicyKind::Static)
    );
    maps.create(
        &pp,
        &cm("steward-resmgr.group.red", "policy: { active: none }"),
    )
    .await?;
    assert_eq!(
        policy_of(&next(&mut updates).await),
        ("steward-resmgr.group.red".to_owned(), PolicyKind::None)
    );
    maps.delete("steward-resmgr.group.red", &DeleteParams::default())
        .await?;
    maps.delete("steward-resmgr.default", &DeleteParams::default())
        .await?;
    let mut last = next(&mut updates).await;
    if last != ClusterUpdate::Fallback {
        // The two deletes may be seen one at a time.
        assert_eq!(policy_of(&last).0, "steward-resmgr.default");
        last = next(&mut updates).await;
    }
    assert_eq!(last, ClusterUpdate::Fallback);
    assert_eq!(
        sources.cluster_changed(last),
        Some(FileConfig::default()),
        "with no ConfigMap the file rules again"
    );

    // Publisher: only our keys, others untouched; live updates.
    let topo = topology();
    let cfg = PolicyConfig {
        reserved_cpus: CpuSet::parse("0")?,
        ..PolicyConfig::default()
    };
    let (tx, rx) = tokio::sync::watch::channel(Some(Publication::new(
        &topo,
        PolicyKind::Static,
        &cfg,
        &Default::default(),
    )));
    let task = tokio::spawn(NodePublisher::new(&c).run(rx, c.publish_retry, Metrics::default()));
    let n = wait_for_node(&nodes, |n| {
        label(n, "resmgr.steward.dev/policy") == Some("static") && capacity(n).is_some()
    })
    .await?;
    assert_eq!(label(&n, "keep"), Some("me"));
    assert_eq!(label(&n, "resmgr.steward.dev/group"), Some("red"));
    let ann = n.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(ann.get("other.example/a").map(String::as_str), Some("b"));
    assert_eq!(
        ann.get("resmgr.steward.dev/policy").map(String::as_str),
        Some("static")
    );
    let summary: serde_json::Value = serde_json::from_str(&ann["resmgr.steward.dev/topology"])?;
    assert_eq!(summary["sockets"], serde_json::json!([0]));
    assert_eq!(summary["numa_nodes"][1]["cpus"], "2-3");
    assert_eq!(summary["numa_nodes"][1]["memory_bytes"], 1u64 << 30);
    assert_eq!(summary["isolated_cpus"], "3");
    assert_eq!(summary["reserved_cpus"], "0");
    // Free exclusive CPUs per NUMA node: node 0 (0-1) loses reserved 0,
    // node 1 (2-3) isolated 3, and the shared pool keeps one.
    let free: steward_core::reservation::NodeCpus =
        serde_json::from_str(&ann[steward_core::reservation::NODE_CPUS_ANNOTATION])?;
    assert_eq!(free.free.values().sum::<u32>(), 1, "{free:?}");
    let cap = n
        .status
        .clone()
        .and_then(|s| s.capacity)
        .unwrap_or_default();
    assert_eq!(
        cap.get("cpu").map(|q| q.0.as_str()),
        Some("4"),
        "foreign capacity kept"
    );
    assert_eq!(
        cap.get("resmgr.steward.dev/exclusive-cpus")
            .map(|q| q.0.as_str()),
        Some("2"),
        "4 online - reserved 0 - isolated 3"
    );

    tx.send(Some(Publication::new(
        &topo,
        PolicyKind::Balloons,
        &cfg,
        &Default::default(),
    )))?;
    let n = wait_for_node(&nodes, |n| {
        label(n, "resmgr.steward.dev/policy") == Some("balloons")
    })
    .await?;
    assert_eq!(
        n.metadata
            .annotations
            .unwrap_or_default()
            .get("resmgr.steward.dev/policy")
            .map(String::as_str),
        Some("balloons")
    );

    // An outage is retried.
    server.set_available(false);
    tx.send(Some(Publication::new(
        &topo,
        PolicyKind::TopologyAware,
        &cfg,
        &Default::default(),
    )))?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.set_available(true);
    wait_for_node(&nodes, |n| {
        label(n, "resmgr.steward.dev/policy") == Some("topology-aware")
    })
    .await?;
    task.abort();
    server.shutdown().await;
    Ok(())
}

fn capacity(n: &Node) -> Option<String> {
    n.status
        .as_ref()?
        .capacity
        .as_ref()?
        .get("resmgr.steward.dev/exclusive-cpus")
        .map(|q| q.0.clone())
}

fn label<'a>(n: &'a Node, key: &str) -> Option<&'a str> {
    n.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

async fn wait_for_node(
    nodes: &Api<Node>,
    ok: impl Fn(&Node) -> bool,
) -> Result<Node, Box<dyn std::error::Error>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(n) = nodes.get("n1").await
            && ok(&n)
        {
            return Ok(n);
        }
        if tokio::time::Instant::now() > deadline {
            return Err("the node did not reach the expected state within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
