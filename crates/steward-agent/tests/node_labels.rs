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
use steward_api::{
    PodRef, Reservation, ReservationSpec, ReservationStatus, SlotClaim, node_label_key,
};
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

    // The other slot reserved for a pod bound for node-b, written without
    // labels (as a controller before them did): the leader labels it, and
    // node-a keeps that slot from its kubelet.
    let free = [0, 1]
        .iter()
        .map(|i| format!("{name}-{i}"))
        .find(|s| *s != taken)
        .unwrap();
    // Its pod, pending (the leader cancels a decided Reservation whose
    // pod it does not see).
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
    let mut r = reservations
        .create(&PostParams::default(), &r)
        .await
        .unwrap();
    assert_eq!(r.metadata.labels, None);
    r.status = Some(ReservationStatus {
        phase: "Reserved".into(),
        node: Some("node-b".into()),
        slots: vec![free.clone()],
        observed_generation: r.metadata.generation,
        ..ReservationStatus::default()
    });
    // The leader may decide it first; either way it ends Reserved with
    // node labels.
    let _ = reservations
        .replace_status("elsewhere", &PostParams::default(), &r)
        .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let r = reservations.get("elsewhere").await.unwrap();
        let reserved = r.status.as_ref().is_some_and(|s| s.phase == "Reserved");
        if reserved && both.iter().all(|k| labels(&r.metadata).contains_key(k)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader never labeled the Reservation: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = reservations
        .get("elsewhere")
        .await
        .unwrap()
        .status
        .unwrap()
        .slots;
    let kept = held[0].clone();
    if kept != taken {
        a.kubelet
            .wait_for_resource(&res, |s| !s.healthy.contains(&kept), WAIT)
            .await
            .unwrap();
    }

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
