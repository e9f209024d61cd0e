//! Agents that follow only the objects labeled with their node
//! (`--select-by-node-labels`), beside the controller whose leader keeps
//! the labels: each still sees what it must of a shared Instance — the
//! other node's claims, and reservations for the other node, even one
//! written without labels.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::time::Duration;

use dp::*;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use steward_api::{PodRef, Reservation, ReservationSpec, SlotClaim, node_label_key};
use steward_leader::{ControllerConfig, run};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_selecting_by_node_labels_see_what_their_shared_instance_needs() {
    let server = api_server().await;
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "steward-system"}}))
            .unwrap();
    Api::<Namespace>::all(server.client())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    for n in ["node-a", "node-b"] {
        let node: k8s_openapi::api::core::v1::Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": n}})).unwrap();
        Api::all(server.client())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let mut controller = ControllerConfig::new("steward-system", "c1");
    controller.lease.retry_period = Duration::from_millis(100);
    controller.resync = Duration::from_millis(100);
    tokio::spawn(run(server.client(), controller, stop.clone()));

    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let b = Node::start(dir.path(), "node-b", Some(server.client())).await;
    let mut agents = Vec::new();
    for n in [&a, &b] {
        let mut cfg = n.agent_config(dir.path(), server.client(), echo(true));
        cfg.select_by_node_labels = true;
        cfg.follow_node_deletions = false;
        agents.push(Agent::start(cfg));
    }
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 2),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a", "node-b"]).await;
    let name = inst.metadata.name.clone().unwrap();
    let namespace = inst.metadata.namespace.clone().unwrap();
    let res = resource(&inst);
    for n in [&a, &b] {
        n.kubelet
            .wait_for_resource(&res, |s| s.healthy.len() == 2, WAIT)
            .await
            .unwrap();
    }
    let labels = |o: &kube::core::ObjectMeta| o.labels.clone().unwrap_or_default();
    let both = [node_label_key("node-a"), node_label_key("node-b")];
    let inst = instance_of(&server, "cams", &["node-a", "node-b"]).await;
    for k in &both {
        assert!(labels(&inst.metadata).contains_key(k), "{inst:?}");
    }

    // A pod on node-a: its claim carries both nodes' labels, so node-b's
    // selected watch shows it and node-b's kubelet sees the slot taken.
    let on_a = a.kubelet.add_pod(pod("on-a", &res)).await.unwrap();
    let taken = slot_of(&a.kubelet, &on_a.uid, &res).unwrap();
    let claim = Api::<SlotClaim>::namespaced(server.client(), &namespace)
        .get(&taken)
        .await
        .unwrap();
    for k in &both {
        assert!(labels(&claim.metadata).contains_key(k), "{claim:?}");
    }
    b.kubelet
        .wait_for_resource(&res, |s| !s.healthy.contains(&taken), WAIT)
        .await
        .unwrap();

    // The other slot reserved for a pod bound for node-b, asked for
    // without labels (as the extender's API path asks): the leader decides
    // it in a second write, labels it, and node-a keeps that slot from its
    // kubelet.
    //
    // Its pod, pending. The decision is left to the leader: a status
    // written here could reach the leader's Reservation watch before the
    // pod reaches its Pod watch (two watches, not ordered between them),
    // and to the leader, which decides only for pods it has seen, a decided
    // Reservation whose pod it does not see is one whose pod is gone: it
    // cancels it. An undecided one waits for its pod's first event.
    let pending: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "elsewhere", "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }))
    .unwrap();
    let pending = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(server.client(), &namespace)
        .create(&PostParams::default(), &pending)
        .await
        .unwrap();
    let uid = pending.metadata.uid.clone().unwrap();
    let reservations: Api<Reservation> = Api::namespaced(server.client(), &namespace);
    let r = Reservation::new(
        "elsewhere",
        ReservationSpec {
            pod: PodRef {
                namespace: namespace.clone(),
                name: "elsewhere".into(),
                uid: uid.clone(),
            },
            slots: [(name.clone(), 1)].into(),
            exclusive_cpus: 0,
            candidates: vec!["node-b".into()],
            cancel: None,
        },
    );
    let r = reservations
        .create(&PostParams::default(), &r)
        .await
        .unwrap();
    assert_eq!(r.metadata.labels, None);
    // Reserved on node-b, on the slot on-a's claim leaves free (a leader
    // deciding before its SlotClaim watch showed that claim moves it
    // there), and labeled with both nodes.
    let deadline = tokio::time::Instant::now() + WAIT;
    let kept = loop {
        let r = reservations.get("elsewhere").await.unwrap();
        let held = r
            .status
            .as_ref()
            .filter(|s| s.phase == "Reserved" && s.node.as_deref() == Some("node-b"))
            .map(|s| s.slots.clone())
            .unwrap_or_default();
        if held.len() == 1
            && !held.contains(&taken)
            && both.iter().all(|k| labels(&r.metadata).contains_key(k))
        {
            break held[0].clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader never reserved and labeled the Reservation: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    a.kubelet
        .wait_for_resource(&res, |s| !s.healthy.contains(&kept), WAIT)
        .await
        .unwrap();

    reservations
        .delete("elsewhere", &DeleteParams::default())
        .await
        .unwrap();
    a.kubelet.delete_pod(&on_a.uid).await.unwrap();
    for n in [&a, &b] {
        n.kubelet
            .wait_for_resource(&res, |s| s.healthy.len() == 2, WAIT)
            .await
            .unwrap();
    }
}
