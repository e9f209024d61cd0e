//! Cluster-level behaviour: two nodes contending for a shared device's
//! slots, and the API server going away.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dp::*;
use steward_testing_kubelet::{Kubelet, UNEXPECTED_ADMISSION_ERROR};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_contending_never_double_grant() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let b = Node::start(dir.path(), "node-b", Some(server.client())).await;
    let _agent_a = Agent::start(a.agent_config(dir.path(), server.client(), echo(true)));
    let _agent_b = Agent::start(b.agent_config(dir.path(), server.client(), echo(true)));
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 2),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a", "node-b"]).await;
    let res = resource(&inst);
    for n in [&a, &b] {
        n.kubelet
            .wait_for_resource(&res, |s| s.healthy.len() == 2, WAIT)
            .await
            .unwrap();
    }

    // Both nodes admit and delete pods as fast as they can; a checker
    // samples both kubelets' live allocations all along.
    let nodes = Arc::new([a, b]);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checker = {
        let nodes = nodes.clone();
        let stop = stop.clone();
        let res = res.clone();
        tokio::spawn(async move {
            let mut samples = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut holders: BTreeMap<String, String> = BTreeMap::new();
                for n in nodes.iter() {
                    for p in n.kubelet.pods() {
                        if p.phase != steward_testing_kubelet::Phase::Running {
                            continue;
                        }
                        if let Some(slot) = slot_of(&n.kubelet, &p.uid, &res)
                            && let Some(other) =
                                holders.insert(slot.clone(), format!("{}/{}", n.name, p.uid))
                        {
                            panic!(
                                "slot {slot} held by {other} and {}/{} at once",
                                n.name, p.uid
                            );
                        }
                    }
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            samples
        })
    };
    let worker = |i: usize| {
        let nodes = nodes.clone();
        let res = res.clone();
        async move {
            let k: &Kubelet = &nodes[i].kubelet;
            let (mut ok, mut refused) = (0, 0);
            for round in 0..25 {
                match k
                    .add_pod(pod(&format!("{}-{round}", nodes[i].name), &res))
                    .await
                {
                    Ok(p) => {
                        ok += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        k.delete_pod(&p.uid).await.unwrap();
                    }
                    Err(e) => {
                        // Losing the race is allowed; the reason must be
                        // the slot or its health, never a double grant.
                        let text = e.to_string();
                        assert!(
                            text.contains(UNEXPECTED_ADMISSION_ERROR),
                            "unexpected refusal: {text}"
                        );
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            (ok, refused)
        }
    };
    let (ra, rb) = tokio::join!(worker(0), worker(1));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = checker.await.unwrap();
    assert!(samples > 10, "checker ran {samples} times");
    assert!(ra.0 > 0 && rb.0 > 0, "both nodes got slots: {ra:?} {rb:?}");
    // Every SlotClaim names one node; when everything is deleted, nothing
    // stays claimed and both nodes see both slots Healthy again.
    eventually("all claims released", WAIT, || async {
        slot_claims(&server).await.is_empty().then_some(())
    })
    .await;
    for n in nodes.iter() {
        n.kubelet
            .wait_for_resource(&res, |s| s.healthy.len() == 2, WAIT)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_down_local_device_allocates_shared_fails_closed() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    // kubelet does not mirror pods here: the API server is down while pods
    // are admitted.
    let a = Node::start(dir.path(), "node-a", None).await;
    let peer = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = peer.local_addr().unwrap().port();
    let accept = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = peer.accept().await {
            held.push(sock);
        }
    });
    let mut handlers = echo(false);
    // The peer listens on loopback, which the tcp-probe handler probes
    // only where the node's operator allows it.
    handlers.push(Arc::new(
        steward_discovery::handlers::network::TcpProbe::with_scope(
            steward_discovery::handlers::network::ProbeScope::new(["127.0.0.1".parse().unwrap()]),
        ),
    ));
    let mut cfg = a.agent_config(dir.path(), server.client(), handlers);
    if let Some(dp) = cfg.device_plugins.as_mut() {
        dp.op_timeout = Duration::from_millis(500);
    }
    let _agent = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("local", "debug-echo", &echo_details(&["cam"]), 1),
    )
    .await;
    create_configuration(
        &server,
        &configuration(
            "net",
            "tcp-probe",
            &format!(
                "targets: [\"127.0.0.1\"]\nports: [{port}]\ninterval: 200ms\ntimeout: 200ms\n"
            ),
            1,
        ),
    )
    .await;
    let local = instance_of(&server, "local", &["node-a"]).await;
    let shared = instance_of(&server, "net", &["node-a"]).await;
    assert!(shared.spec.shared && !local.spec.shared);
    let (local_res, shared_res) = (resource(&local), resource(&shared));
    for r in [&local_res, &shared_res] {
        a.kubelet
            .wait_for_resource(r, |s| s.healthy.len() == 1, WAIT)
            .await
            .unwrap();
    }

    server.set_available(false);
    let admitted = a
        .kubelet
        .add_pod(pod("uses-local", &local_res))
        .await
        .unwrap();
    assert_eq!(
        admitted.responses["main"][&local_res]
            .envs
            .get("DEBUG_ECHO_DESCRIPTION")
            .map(String::as_str),
        Some("cam")
    );
    let refused = a
        .kubelet
        .add_pod(pod("uses-shared", &shared_res))
        .await
        .unwrap_err();
    let text = refused.to_string();
    assert!(text.contains(UNEXPECTED_ADMISSION_ERROR), "{text}");
    assert!(text.contains("fail closed"), "{text}");

    // Back: the local claim reaches the cluster; the shared slot was never
    // claimed.
    server.set_available(true);
    let slot = format!("{}-0", local.metadata.name.clone().unwrap());
    let claim = eventually("local claim synced", WAIT, || async {
        claim_of(&server, &slot).await
    })
    .await;
    assert_eq!(claim.spec.node, "node-a");
    let shared_slot = format!("{}-0", shared.metadata.name.clone().unwrap());
    assert!(claim_of(&server, &shared_slot).await.is_none());
    // And the shared device allocates again.
    a.kubelet
        .add_pod(pod("uses-shared-later", &shared_res))
        .await
        .unwrap();
    eventually("shared claim", WAIT, || async {
        claim_of(&server, &shared_slot).await
    })
    .await;
    accept.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_reserved_for_another_node_is_kept_from_this_kubelet() {
    use kube::Api;
    use kube::api::{DeleteParams, PostParams};
    use steward_api::{PodRef, Reservation, ReservationSpec, ReservationStatus};

    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let _agent_a = Agent::start(a.agent_config(dir.path(), server.client(), echo(true)));
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 2),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let name = inst.metadata.name.clone().unwrap();
    let ns = inst.metadata.namespace.clone().unwrap();
    let res = resource(&inst);
    a.kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 2, WAIT)
        .await
        .unwrap();

    // The controller reserved slot 0 for a pod bound for node-b.
    let reservations: Api<Reservation> = Api::namespaced(server.client(), &ns);
    let mut r = Reservation::new(
        "elsewhere",
        ReservationSpec {
            pod: PodRef {
                namespace: ns.clone(),
                name: "elsewhere".into(),
                uid: "uid-elsewhere".into(),
            },
            slots: [(name.clone(), 1)].into(),
            exclusive_cpus: 0,
            candidates: vec!["node-b".into()],
            cancel: None,
        },
    );
    r = reservations
        .create(&PostParams::default(), &r)
        .await
        .unwrap();
    let slot0 = format!("{name}-0");
    r.status = Some(ReservationStatus {
        phase: "Reserved".into(),
        node: Some("node-b".into()),
        slots: vec![slot0.clone()],
        observed_generation: r.metadata.generation,
        ..ReservationStatus::default()
    });
    reservations
        .replace_status("elsewhere", &PostParams::default(), &r)
        .await
        .unwrap();

    // node-a's kubelet sees it Unhealthy; the other slot stays usable.
    let seen = a
        .kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 1, WAIT)
        .await
        .unwrap();
    assert!(!seen.healthy.contains(&slot0), "{seen:?}");
    // A pod on node-a gets the other slot.
    let admitted = a.kubelet.add_pod(pod("local", &res)).await.unwrap();
    assert_ne!(
        slot_of(&a.kubelet, &admitted.uid, &res).as_deref(),
        Some(slot0.as_str())
    );

    // Released: usable again.
    reservations
        .delete("elsewhere", &DeleteParams::default())
        .await
        .unwrap();
    a.kubelet
        .wait_for_resource(&res, |s| s.healthy.contains(&slot0), WAIT)
        .await
        .unwrap();
}
