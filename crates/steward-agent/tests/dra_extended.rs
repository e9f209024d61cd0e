//! One unchanged pod spec, `steward.dev/<instance>: 1`, served through the
//! device plugin on one node and through DRA on another (KEP-5004), over
//! the real wires: a shared Instance of a Configuration with
//! `draExtendedResources` seen by two nodes. node-a's agent runs the DRA
//! driver, so it registers no device plugin for the Instance and the
//! controller's class (`extendedResourceName`) lets the stand-in scheduler
//! allocate a device there in a claim it makes for the pod; node-b's agent
//! runs device plugins only. Both slots are then held, one per path, and
//! neither path grants a slot the other holds: node-b's kubelet sees the
//! DRA-held slot unhealthy, and the slot node-b holds is published with a
//! `NoSchedule` taint, which the scheduler honours (until it is freed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use dp::*;
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use steward_api::Instance;
use steward_testing_apiserver::dra_alloc::AllocError;
use steward_testing_apiserver::dra_extended::schedule_extended_resources;
use steward_testing_kubelet::{ContainerSpec, Error as KubeletError, PodSpec};

/// Waits until device `device` of the published slices carries steward's
/// held taint (`held`) or none.
async fn wait_taint(server: &steward_testing_apiserver::ApiServer, device: &str, held: bool) {
    let slices: Api<ResourceSlice> = Api::all(server.client());
    eventually(&format!("{device} tainted: {held}"), WAIT, || async {
        let items = slices.list(&Default::default()).await.ok()?.items;
        let d = items
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| d.name == device)?;
        let taints = d.taints.clone().unwrap_or_default();
        let tainted = taints
            .iter()
            .any(|t| t.key == steward_core::dra::HELD_TAINT_KEY && t.effect == "NoSchedule");
        (tainted == held).then_some(())
    })
    .await;
}

/// Waits until Configuration `cams` has the DRAExtendedResources condition
/// with `status`.
async fn wait_condition(server: &steward_testing_apiserver::ApiServer, status: &str) {
    let configs: Api<steward_api::Configuration> = Api::namespaced(server.client(), NS);
    eventually(&format!("DRAExtendedResources {status}"), WAIT, || async {
        let c = configs.get("cams").await.ok()?;
        c.status?
            .conditions
            .iter()
            .any(|c| c.type_ == steward_api::CONDITION_DRA_EXTENDED_RESOURCES && c.status == status)
            .then_some(())
    })
    .await;
}

/// The pod spec every pod of this test uses, whichever node runs it.
fn unchanged(name: &str, resource: &str) -> PodSpec {
    PodSpec::new(NS, name).container(ContainerSpec::new("main").limit(resource, 1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pod_spec_is_served_by_the_device_plugin_and_by_dra_never_both() {
    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    let (events, _events_task) =
        steward_kube::EventSink::start(server.client(), "steward-controller", "test");
    let classes = tokio::spawn(steward_leader::deviceclass::maintain(
        server.client(),
        events,
    ));
    let classes = tokio_util::task::AbortOnDropHandle::new(classes);

    let node_a = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let node_b = Node::start(dir.path(), "node-b", Some(server.client())).await;
    node_a.kubelet.mirror_node().await.unwrap();
    node_b.kubelet.mirror_node().await.unwrap();
    let agent_a = Agent::start(dra_agent_config(
        &node_a,
        dir.path(),
        server.client(),
        echo(true),
    ));
    let agent_b = Agent::start(node_b.agent_config(dir.path(), server.client(), echo(true)));

    let mut cfg = configuration("cams", "debug-echo", &echo_details(&["cam"]), 2);
    cfg.spec.dra_extended_resources = true;
    create_configuration(&server, &cfg).await;
    let inst = instance_of(&server, "cams", &["node-a", "node-b"]).await;
    let instance = inst.metadata.name.clone().unwrap();
    let res = resource(&inst);

    // node-b offers the resource through its device plugin; node-a through
    // DRA only, which the Instance's status says.
    node_b
        .kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 2, WAIT)
        .await
        .unwrap();
    let instances: Api<Instance> = Api::namespaced(server.client(), NS);
    eventually("node-a served through DRA", WAIT, || async {
        let i = instances.get(&instance).await.ok()?;
        let s = i.status?;
        let a = s.nodes.iter().find(|n| n.node == "node-a")?;
        let b = s.nodes.iter().find(|n| n.node == "node-b")?;
        (a.through_dra && !a.registered && b.registered).then_some(())
    })
    .await;
    assert!(
        node_a.kubelet.resource(&res).is_none(),
        "node-a's kubelet must not have a device plugin for {res}"
    );
    let nodes: Api<KubeNode> = Api::all(server.client());
    eventually("node-b's allocatable has the resource", WAIT, || async {
        let n = nodes.get("node-b").await.ok()?;
        n.status?.allocatable?.contains_key(&res).then_some(())
    })
    .await;
    let a_allocatable = nodes
        .get("node-a")
        .await
        .unwrap()
        .status
        .and_then(|s| s.allocatable);
    assert!(
        !a_allocatable.is_some_and(|a| a.contains_key(&res)),
        "node-a must not offer {res} as a device-plugin resource"
    );
    // The controller's class for the Instance, and its devices published.
    let class_name = format!("{instance}.{NS}.instance.steward.dev");
    let class: DeviceClass = eventually("the Instance's DeviceClass", WAIT, || async {
        Api::<DeviceClass>::all(server.client())
            .get_opt(&class_name)
            .await
            .ok()?
    })
    .await;
    assert_eq!(
        class.spec.extended_resource_name.as_deref(),
        Some(res.as_str())
    );
    wait_condition(&server, "True").await;
    node_a
        .kubelet
        .wait_for_dra_driver("steward.dev", WAIT)
        .await
        .unwrap();
    wait_for_devices(&server, 2).await;

    // The same spec on node-b: the scheduler leaves it to the device plugin.
    let on_b = unchanged("on-b", &res);
    let b_uid = node_b.kubelet.create_pod_object(&on_b).await.unwrap();
    let none = schedule_extended_resources(&server.client(), NS, "on-b", "node-b")
        .await
        .unwrap();
    assert!(none.is_none(), "node-b has a device plugin: {none:?}");
    let b_pod = node_b
        .kubelet
        .add_pod(on_b.clone().uid(&b_uid))
        .await
        .unwrap();
    let b_slot = b_pod.devices["main"][&res].iter().next().unwrap().clone();
    assert!(b_pod.cdi_devices.is_empty(), "{b_pod:?}");
    wait_bound(&server, &b_slot, &b_uid).await;

    // The same spec on node-a: a claim for the pod, allocated and prepared.
    let on_a = unchanged("on-a", &res);
    let a_uid = node_a.kubelet.create_pod_object(&on_a).await.unwrap();
    let claim = schedule_extended_resources(&server.client(), NS, "on-a", "node-a")
        .await
        .unwrap()
        .expect("node-a serves the resource through DRA");
    let result = &claim
        .status
        .as_ref()
        .unwrap()
        .allocation
        .as_ref()
        .unwrap()
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[0];
    assert_eq!(result.driver, "steward.dev");
    assert_eq!(result.request, "c0-e0");
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    let status = pods.get("on-a").await.unwrap().status.unwrap();
    let mapping = status.extended_resource_claim_status.unwrap();
    assert_eq!(
        mapping.resource_claim_name,
        claim.metadata.name.clone().unwrap()
    );
    assert_eq!(mapping.request_mappings[0].resource_name, res);
    let a_pod = node_a
        .kubelet
        .add_pod(on_a.clone().uid(&a_uid))
        .await
        .unwrap();
    assert!(
        a_pod.devices.is_empty(),
        "no device plugin on node-a: {a_pod:?}"
    );
    let cdi = &a_pod.cdi_devices["main"];
    assert_eq!(cdi.len(), 1, "{a_pod:?}");
    // The device the scheduler picked is the other slot, and the ledger
    // holds it for the pod on node-a.
    let a_slot = result.device.clone();
    assert_ne!(a_slot, b_slot);
    let held = claim_of(&server, &a_slot).await.expect("DRA slot claimed");
    assert!(held.spec.resource_claim.is_some(), "{held:?}");
    assert_eq!(slot_claims(&server).await.len(), 2);

    // Both slots held. node-b's kubelet sees no free device: a third pod is
    // refused there. The slot node-b's device plugin holds is tainted in the
    // ResourceSlice, so the scheduler allocates nothing on node-a either.
    node_b
        .kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 1, WAIT)
        .await
        .unwrap();
    let third_b = node_b.kubelet.add_pod(unchanged("third-b", &res)).await;
    assert!(
        matches!(third_b, Err(KubeletError::Admission { .. })),
        "{third_b:?}"
    );
    wait_taint(&server, &b_slot, true).await;
    let third_a = unchanged("third-a", &res);
    node_a.kubelet.create_pod_object(&third_a).await.unwrap();
    let refused = schedule_extended_resources(&server.client(), NS, "third-a", "node-a").await;
    match refused {
        Err(AllocError::Unsatisfiable { message, .. }) => {
            assert!(message.contains("1 tainted"), "{message}");
        }
        other => panic!("node-b's held slot was allocatable: {other:?}"),
    }
    assert_stays_bound(
        &server,
        &b_slot,
        &b_uid,
        std::time::Duration::from_millis(300),
    )
    .await;

    // The DRA pod goes: its slot comes back, and node-b's device plugin
    // hands it to the pod that was refused.
    // Deleting the pod takes its claim along (ownerReference).
    node_a.kubelet.delete_pod(&a_uid).await.unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(server.client(), NS);
    let claim_name = claim.metadata.name.clone().unwrap();
    eventually("the pod's claim garbage-collected", WAIT, || async {
        claims
            .get_opt(&claim_name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    wait_released(&server, &a_slot).await;
    node_b
        .kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 2, WAIT)
        .await
        .unwrap();
    let again = node_b
        .kubelet
        .add_pod(unchanged("again-b", &res))
        .await
        .unwrap();
    assert_eq!(
        again.devices["main"][&res].iter().next(),
        Some(&a_slot),
        "the slot DRA held"
    );
    wait_taint(&server, &a_slot, true).await;
    // A slot freed on the device-plugin path loses its taint.
    node_b.kubelet.delete_pod(&b_uid).await.unwrap();
    wait_released(&server, &b_slot).await;
    wait_taint(&server, &b_slot, false).await;

    // node-a's kubelet never had a device plugin for the resource.
    assert!(node_a.kubelet.resource(&res).is_none());
    drop(classes);
    agent_a.stop().await.unwrap();
    agent_b.stop().await.unwrap();
}

/// A Kubernetes 1.35 cluster at its defaults (DRAExtendedResource and
/// DRADeviceTaints off: the API server drops both fields). The controller
/// finds `extendedResourceName` dropped and writes no Instance classes, so
/// node-a's agent keeps the device plugin and the same pod spec is served
/// by it; the slices' taints are dropped too, and neither the classes nor
/// the slices are written again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kubernetes_1_35_the_device_plugin_serves_and_nothing_is_rewritten() {
    use steward_testing_apiserver::dra::DraFeatures;
    let server = api_server().await;
    server.serve_dra_with(DraFeatures::kubernetes_1_35());
    let dir = tempfile::tempdir().unwrap();
    let (events, _events_task) =
        steward_kube::EventSink::start(server.client(), "steward-controller", "test");
    let classes = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
        steward_leader::deviceclass::maintain(server.client(), events),
    ));
    let node_a = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let agent_a = Agent::start(dra_agent_config(
        &node_a,
        dir.path(),
        server.client(),
        echo(false),
    ));
    let mut cfg = configuration("cams", "debug-echo", &echo_details(&["cam"]), 2);
    cfg.spec.dra_extended_resources = true;
    create_configuration(&server, &cfg).await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let res = resource(&inst);
    node_a
        .kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 2, WAIT)
        .await
        .unwrap();
    wait_for_devices(&server, 2).await;
    let pod = node_a
        .kubelet
        .add_pod(unchanged("on-a", &res))
        .await
        .unwrap();
    let slot = pod.devices["main"][&res].iter().next().unwrap().clone();
    wait_bound(&server, &slot, &pod.uid).await;

    // Settled: the Configuration's class only, the slices without taints,
    // and no more writes of either over a while.
    let instance_class = format!("{}.{NS}.instance.steward.dev", inst.metadata.name.unwrap());
    let all_classes: Api<DeviceClass> = Api::all(server.client());
    eventually("the Configuration's class alone", WAIT, || async {
        let names: Vec<String> = all_classes
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        (names == ["cams.default.steward.dev"]).then_some(())
    })
    .await;
    assert!(
        all_classes
            .get_opt(&instance_class)
            .await
            .unwrap()
            .is_none()
    );
    wait_condition(&server, "False").await;
    wait_taint(&server, &slot, false).await;
    let writes = |s: &steward_testing_apiserver::ApiServer| {
        let st = s.stats();
        (
            st.writes_for("deviceclasses.resource.k8s.io"),
            st.writes_for("resourceslices.resource.k8s.io"),
        )
    };
    let before = writes(&server);
    assert!(before.0 > 0 && before.1 > 0, "{before:?}");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        writes(&server),
        before,
        "classes or slices rewritten in a loop"
    );
    assert!(node_a.kubelet.resource(&res).is_some());

    drop(classes);
    agent_a.stop().await.unwrap();
}
