//! Device plugins end to end: discovery → Instance → plugin registered with
//! the kubelet stand-in → admission → pod deleted → slot Healthy again,
//! over the real wires (API server stand-in, device plugin v1beta1 and
//! podresources v1 on unix sockets).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::time::Duration;

use dp::*;
use steward_agent::deviceplugin::{
    SLOTS_ANNOTATION, cdi_qualified_name, cdi_spec_path, socket_name,
};
use steward_proto::deviceplugin::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    PreferredAllocationRequest, device_plugin_client::DevicePluginClient,
};
use steward_testing_kubelet::{ContainerSpec, PodSpec, UNEXPECTED_ADMISSION_ERROR};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_cycle_two_nodes_share_one_slot() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let b = Node::start(dir.path(), "node-b", Some(server.client())).await;
    let agent_a = Agent::start(a.agent_config(dir.path(), server.client(), echo(true)));
    let agent_b = Agent::start(b.agent_config(dir.path(), server.client(), echo(true)));
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 1),
    )
    .await;

    let inst = instance_of(&server, "cams", &["node-a", "node-b"]).await;
    let name = inst.metadata.name.clone().unwrap();
    let res = resource(&inst);
    let slot = format!("{name}-0");
    for node in [&a, &b] {
        let state = node
            .kubelet
            .wait_for_resource(&res, |s| s.healthy.contains(&slot), WAIT)
            .await
            .unwrap();
        assert_eq!(state.capacity(), 1, "one slot: {state:?}");
        assert!(state.get_preferred_allocation_available);
    }

    // Admission on node-a: the slot is claimed in the cluster by node-a.
    let admitted = a.kubelet.add_pod(pod("user-a", &res)).await.unwrap();
    let answer = &admitted.responses["main"][&res];
    assert_eq!(
        answer
            .envs
            .get("DEBUG_ECHO_DESCRIPTION")
            .map(String::as_str),
        Some("cam")
    );
    assert_eq!(
        answer.envs.get("BROKER_MODE").map(String::as_str),
        Some("fast")
    );
    assert_eq!(answer.annotations.get(SLOTS_ANNOTATION), Some(&slot));
    assert_eq!(answer.cdi_devices.len(), 1);
    // Named by the Instance's namespace too: a Configuration of the same
    // name in another namespace has other devices.
    assert_eq!(
        answer.cdi_devices[0].name,
        cdi_qualified_name(NS, &inst.spec.configuration_name, &name)
    );
    assert_eq!(
        answer.cdi_devices[0].name,
        format!("steward.dev/cams={NS}_{name}")
    );
    let claim = eventually("claim bound to user-a", WAIT, || async {
        claim_of(&server, &slot)
            .await
            .filter(|c| c.spec.pod.as_ref().is_some_and(|p| p.uid == admitted.uid))
    })
    .await;
    assert_eq!(claim.spec.node, "node-a");

    // CDI spec: one device per Instance, with its environment.
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cdi_spec_path(&a.cdi, NS, "cams")).unwrap()).unwrap();
    assert_eq!(spec["cdiVersion"], "0.6.0");
    assert_eq!(spec["kind"], "steward.dev/cams");
    assert_eq!(spec["devices"][0]["name"], format!("{NS}_{name}"));
    let env: Vec<String> =
        serde_json::from_value(spec["devices"][0]["containerEdits"]["env"].clone()).unwrap();
    assert!(
        env.contains(&"DEBUG_ECHO_DESCRIPTION=cam".to_string()),
        "{env:?}"
    );

    // node-b may not use the slot now: Unhealthy there, its pod is refused.
    b.kubelet
        .wait_for_resource(
            &res,
            |s| s.unhealthy.contains(&slot) && s.healthy.is_empty(),
            WAIT,
        )
        .await
        .unwrap();
    let refused = b.kubelet.add_pod(pod("user-b", &res)).await.unwrap_err();
    assert!(
        refused.to_string().contains(UNEXPECTED_ADMISSION_ERROR),
        "{refused}"
    );

    // Pod deleted on node-a → slot Healthy again on node-b at once.
    let t = std::time::Instant::now();
    a.kubelet.delete_pod(&admitted.uid).await.unwrap();
    b.kubelet
        .wait_for_resource(&res, |s| s.healthy.contains(&slot), WAIT)
        .await
        .unwrap();
    let reclaim = t.elapsed();
    assert!(reclaim < Duration::from_secs(5), "reclaim took {reclaim:?}");
    let again = b.kubelet.add_pod(pod("user-b2", &res)).await.unwrap();
    let claim = eventually("claim bound to user-b2", WAIT, || async {
        claim_of(&server, &slot)
            .await
            .filter(|c| c.spec.pod.as_ref().is_some_and(|p| p.uid == again.uid))
    })
    .await;
    assert_eq!(claim.spec.node, "node-b");
    a.kubelet
        .wait_for_resource(&res, |s| s.unhealthy.contains(&slot), WAIT)
        .await
        .unwrap();

    // The plugin goes away with its Instance (Configuration deleted).
    let api: kube::Api<steward_api::Configuration> = kube::Api::namespaced(server.client(), NS);
    api.delete("cams", &Default::default()).await.unwrap();
    a.kubelet
        .wait_for_resource(&res, |s| !s.connected, WAIT)
        .await
        .unwrap();
    assert!(
        !a.root
            .join("device-plugins")
            .join(socket_name(&name))
            .exists()
    );
    agent_a.stop().await.unwrap();
    agent_b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_refuses_unknown_ids_and_prefers_free_slots() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let _agent = Agent::start(a.agent_config(dir.path(), server.client(), echo(false)));
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 2),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let name = inst.metadata.name.clone().unwrap();
    let res = resource(&inst);
    a.kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 2, WAIT)
        .await
        .unwrap();

    let socket = a.root.join("device-plugins").join(socket_name(&name));
    let channel = steward_testing_kubelet::connect_unix(&socket)
        .await
        .unwrap();
    let mut client = DevicePluginClient::new(channel);
    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.get_preferred_allocation_available);

    for bad in [
        "nope-0".to_string(),
        format!("{name}-2"),
        format!("{name}-x"),
    ] {
        let err = client
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: vec![bad.clone()],
                }],
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound, "{bad}: {err:?}");
        assert!(err.message().contains("unknown device"), "{err:?}");
    }
    // Nothing was claimed by the refused calls.
    assert!(slot_claims(&server).await.is_empty());

    // A slot held by a pod is preferred last.
    let admitted = a.kubelet.add_pod(pod("holder", &res)).await.unwrap();
    let held = slot_of(&a.kubelet, &admitted.uid, &res).unwrap();
    eventually("claim of the held slot", WAIT, || async {
        claim_of(&server, &held).await
    })
    .await;
    let free = if held.ends_with("-0") {
        format!("{name}-1")
    } else {
        format!("{name}-0")
    };
    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: vec![held.clone(), free.clone()],
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(preferred.container_responses[0].device_i_ds, vec![free]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_and_main_container_reuse_one_slot() {
    // akri#843: kubelet allocates the init container's device again for the
    // main container of the same pod; both Allocates must succeed.
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let _agent = Agent::start(a.agent_config(dir.path(), server.client(), echo(false)));
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 1),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let res = resource(&inst);
    let slot = format!("{}-0", inst.metadata.name.clone().unwrap());
    a.kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 1, WAIT)
        .await
        .unwrap();
    let spec = PodSpec::new(NS, "two-step")
        .init_container(ContainerSpec::new("init").limit(&res, 1))
        .container(ContainerSpec::new("main").limit(&res, 1));
    let admitted = a.kubelet.add_pod(spec).await.unwrap();
    assert_eq!(admitted.devices["init"][&res].iter().next(), Some(&slot));
    assert_eq!(admitted.devices["main"][&res].iter().next(), Some(&slot));
    assert_eq!(
        admitted.responses["init"][&res]
            .envs
            .get("DEBUG_ECHO_DESCRIPTION")
            .map(String::as_str),
        Some("cam")
    );
    assert_eq!(
        admitted.responses["main"][&res]
            .envs
            .get("DEBUG_ECHO_DESCRIPTION")
            .map(String::as_str),
        Some("cam")
    );
    let claim = eventually("claim bound to the pod's main container", WAIT, || async {
        claim_of(&server, &slot)
            .await
            .filter(|c| c.spec.pod.as_ref().is_some_and(|p| p.uid == admitted.uid))
    })
    .await;
    assert_eq!(claim.spec.container.as_deref(), Some("main"));
    // Released when the pod is deleted.
    a.kubelet.delete_pod(&admitted.uid).await.unwrap();
    eventually("claim released", WAIT, || async {
        claim_of(&server, &slot).await.is_none().then_some(())
    })
    .await;
}

/// Sets the capacity of Configuration `cams` and waits until the node's
/// kubelet sees the plugin advertise that many slots.
async fn resize(s: &Single, capacity: u32) {
    set_capacity(&s.server, "cams", capacity).await;
    s.node
        .kubelet
        .wait_for_resource(
            &s.res,
            |st| st.connected && st.capacity() == capacity as usize,
            WAIT,
        )
        .await
        .unwrap();
}

/// An operator edits the Configuration's capacity: the Instance is resized
/// in place (same object), the device plugin re-advertises the new number
/// of slots, and a pod holding a slot keeps it even when the capacity
/// shrinks below it, until the pod ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_edit_resizes_the_instance_and_its_plugin_and_keeps_held_slots() {
    let s = Single::start(2).await;
    let api: kube::Api<steward_api::Instance> = kube::Api::namespaced(s.server.client(), NS);
    let uid = api.get(&s.instance).await.unwrap().metadata.uid;

    // A pod holds the higher slot: the other one is taken first.
    let p0 = s.node.kubelet.add_pod(pod("p0", &s.res)).await.unwrap();
    let p1 = s.node.kubelet.add_pod(pod("p1", &s.res)).await.unwrap();
    let held = slot_of(&s.node.kubelet, &p1.uid, &s.res).unwrap();
    assert_eq!(held, s.slot(1), "second pod gets the second slot");
    wait_bound(&s.server, &held, &p1.uid).await;
    s.node.kubelet.delete_pod(&p0.uid).await.unwrap();
    wait_released(&s.server, &s.slot(0)).await;

    // Grow: 2 → 3.
    resize(&s, 3).await;
    let inst = api.get(&s.instance).await.unwrap();
    assert_eq!(inst.spec.capacity, 3);
    assert_eq!(inst.metadata.uid, uid, "resized in place, not recreated");
    let grown = s.node.kubelet.add_pod(pod("p2", &s.res)).await.unwrap();
    let grown_slot = slot_of(&s.node.kubelet, &grown.uid, &s.res).unwrap();
    wait_bound(&s.server, &grown_slot, &grown.uid).await;
    s.node.kubelet.delete_pod(&grown.uid).await.unwrap();
    wait_released(&s.server, &grown_slot).await;

    // Shrink below the held slot: 3 → 1. Slot 1 stays p1's.
    resize(&s, 1).await;
    assert_eq!(api.get(&s.instance).await.unwrap().spec.capacity, 1);
    assert_stays_bound(&s.server, &held, &p1.uid, Duration::from_millis(300)).await;

    // The pod ends: its slot beyond the capacity is released, and the one
    // slot left is usable.
    s.node.kubelet.delete_pod(&p1.uid).await.unwrap();
    wait_released(&s.server, &held).await;
    let last = s.node.kubelet.add_pod(pod("p3", &s.res)).await.unwrap();
    assert_eq!(slot_of(&s.node.kubelet, &last.uid, &s.res), Some(s.slot(0)));
    wait_bound(&s.server, &s.slot(0), &last.uid).await;
}
