//! The node's side of exclusive-CPU reservations, through the proxy into a
//! real containerd with the API server stand-in: the proxy publishes the
//! CPUs it can still hand out per NUMA node and who holds some, and CPUs
//! reserved on this node for a pod are refused to another pod's container
//! and given to that pod's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;
use steward_api::{PodRef, Reservation, ReservationSpec, ReservationStatus};
use steward_core::cpu::CpuSet;
use steward_core::reservation::{NODE_CPUS_ANNOTATION, NodeCpus};
use steward_resmgr::ClusterConfig;
use steward_testing_apiserver::ApiServer;
use steward_testing_containerd::{Containerd, PodNetwork, cleanup_pod};

const NODE: &str = "n1";

async fn published(nodes: &Api<Node>) -> Option<NodeCpus> {
    let n = nodes.get(NODE).await.ok()?;
    let a = n.metadata.annotations?.get(NODE_CPUS_ANNOTATION)?.clone();
    Some(serde_json::from_str(&a).expect("the annotation parses"))
}

async fn published_when(nodes: &Api<Node>, what: &str, ok: impl Fn(&NodeCpus) -> bool) -> NodeCpus {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let got = published(nodes).await;
        if let Some(c) = got.as_ref().filter(|c| ok(c)) {
            return c.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never published {what}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpus_reserved_for_a_pod_are_refused_to_others_and_given_to_it() {
    init_tracing();
    let _serial = SERIAL.lock().await;
    let api = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let nodes: Api<Node> = Api::all(api.client());
    let node: Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NODE}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();

    let ctd = Containerd::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = proxy_config(ctd.sock(), dir.path(), "policy: { active: static }");
    let mut cluster = ClusterConfig::new(api.client(), NODE);
    cluster.initial_timeout = Duration::from_secs(1);
    cluster.publish_retry = Duration::from_millis(100);
    cfg.manager.cluster = Some(cluster);
    let (proxy, mut rt, _) = start_proxy(cfg).await;

    let before = published_when(&nodes, "free CPUs", |_| true).await;
    assert!(before.holders.is_empty(), "{before:?}");
    let Some((numa, free)) = before
        .free
        .iter()
        .map(|(k, n)| (*k, *n))
        .max_by_key(|(k, n)| (*n, std::cmp::Reverse(*k)))
        .filter(|(_, n)| *n > 0)
    else {
        eprintln!("SKIP: this machine has no CPU to hand out exclusively ({before:?})");
        proxy.shutdown().await;
        return;
    };
    let n = i64::from(free);

    // The controller reserved `free` CPUs on that NUMA node for pod "held".
    let held = ctd.pod_config("held", PodNetwork::Host);
    let uid = held.metadata.as_ref().unwrap().uid.clone();
    let rs: Api<Reservation> = Api::namespaced(api.client(), "default");
    let spec = ReservationSpec {
        pod: PodRef {
            namespace: "default".into(),
            name: "held".into(),
            uid: uid.clone(),
        },
        slots: Default::default(),
        exclusive_cpus: free,
        candidates: vec![NODE.into()],
        cancel: None,
    };
    let mut r = rs
        .create(&PostParams::default(), &Reservation::new("held", spec))
        .await
        .unwrap();
    r.status = Some(ReservationStatus {
        phase: "Reserved".into(),
        node: Some(NODE.into()),
        cpus: free,
        numa_node: Some(numa),
        ..ReservationStatus::default()
    });
    rs.replace_status("held", &PostParams::default(), &r)
        .await
        .unwrap();
    eventually(20, "the proxy holds the reserved CPUs", || async {
        proxy.manager().holds().await.get(&uid) == Some(&(numa, free))
    })
    .await;

    // Another pod's Guaranteed container asking for them is refused.
    let other = ctd.pod_config("other", PodNetwork::Host);
    let sid_other = run_sandbox(&mut rt, &other).await;
    let refused = create(
        &mut rt,
        &sid_other,
        &other,
        container(&other, "c", 1024 * n, 100_000 * n, 32 << 20),
    )
    .await
    .expect_err("the reserved CPUs went to another pod");
    assert!(
        refused.message().contains("reserved for other pods"),
        "{refused:?}"
    );
    cleanup_pod(&mut rt, &sid_other).await.unwrap();

    // The pod they are held for gets them, on that NUMA node.
    let (sid, cid) = run_pod(
        &mut rt,
        &held,
        container(&held, "c", 1024 * n, 100_000 * n, 32 << 20),
    )
    .await;
    let asg = proxy.manager().snapshot().await.containers[&cid]
        .assignment
        .clone()
        .unwrap();
    assert!(asg.exclusive, "{asg:?}");
    let cpus = CpuSet::parse(&asg.cpus).unwrap();
    assert_eq!(cpus.len(), free as usize);
    assert_eq!(cpus_inside(&mut rt, &cid).await, cpus.to_string());

    // The node names the pod and no longer counts those CPUs as free: the
    // controller's cue that the reservation is consumed.
    let running = published_when(&nodes, "the pod as a holder", |c| c.holders.contains(&uid)).await;
    assert_eq!(running.free.get(&numa), Some(&0), "{running:?}");

    cleanup_pod(&mut rt, &sid).await.unwrap();
    published_when(&nodes, "the CPUs free again", |c| c == &before).await;
    proxy.shutdown().await;
}
