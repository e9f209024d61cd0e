//! A shared Instance as one DRA device with consumable capacity
//! (KEP-5075), over the real wires: the agent publishes an Instance of
//! three slots as one device that allows multiple allocations, its free
//! slots the capacity `slots`; the stand-in scheduler fits allocations on
//! it by what they consume; kubelet prepares each through the DRA plugin,
//! which picks a distinct slot in the same ledger the device plugin uses.
//! A slot the device plugin holds leaves the capacity, and comes back when
//! freed. On a cluster without the feature the agent goes back to one
//! device per slot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::collections::BTreeSet;

use dp::*;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim, ResourceSlice};
use kube::Api;
use steward_api::Instance;
use steward_core::dra::{Layout, SLOTS_CAPACITY};
use steward_testing_apiserver::ApiServer;
use steward_testing_apiserver::dra::DraFeatures;
use steward_testing_apiserver::dra_alloc::{AllocError, allocate_claim, unreserve_claim};
use steward_testing_kubelet::{ContainerSpec, PodSpec};

/// The published devices: (name, allowMultipleAllocations, capacity
/// `slots`).
async fn devices(server: &ApiServer) -> Vec<(String, bool, Option<String>)> {
    let slices: Api<ResourceSlice> = Api::all(server.client());
    let items = slices.list(&Default::default()).await.unwrap().items;
    items
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| {
            (
                d.name.clone(),
                d.allow_multiple_allocations == Some(true),
                d.capacity
                    .as_ref()
                    .and_then(|c| c.get(SLOTS_CAPACITY))
                    .map(|c| c.value.0.clone()),
            )
        })
        .collect()
}

/// Waits until the one published device has `slots` of capacity.
async fn wait_capacity(server: &ApiServer, device: &str, slots: &str) {
    eventually(&format!("{device} with {slots} slots"), WAIT, || async {
        let all = devices(server).await;
        (all == [(device.to_owned(), true, Some(slots.to_owned()))]).then_some(())
    })
    .await;
}

/// A pod using ResourceClaim `claim`, created, allocated on node-a and
/// admitted; returns its UID and the allocation result.
async fn claim_pod(
    server: &ApiServer,
    node: &Node,
    claim: &str,
) -> Result<(String, DeviceRequestAllocationResult), AllocError> {
    create_claim(&server.client(), claim, "cams.default.steward.dev").await;
    let spec = PodSpec::new(NS, format!("pod-{claim}"))
        .resource_claim("cam", claim)
        .container(ContainerSpec::new("main").claim("cam"));
    let uid = node.kubelet.create_pod_object(&spec).await.unwrap();
    let allocated = allocate_claim(
        &server.client(),
        NS,
        claim,
        &format!("pod-{claim}"),
        &uid,
        "node-a",
    )
    .await?;
    let result = allocation_results(allocated).remove(0);
    let pod = node.kubelet.add_pod(spec.uid(&uid)).await.unwrap();
    assert_eq!(pod.cdi_devices["main"].len(), 1, "{pod:?}");
    Ok((uid, result))
}

/// An API server with `features`, node-a (its Node mirrored) and its agent
/// publishing consumable devices, and the Instance of a three-slot
/// Configuration `cams` it sees.
async fn consumable_node(
    features: DraFeatures,
) -> (ApiServer, tempfile::TempDir, Node, Agent, Instance) {
    let server = api_server().await;
    server.serve_dra_with(features);
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
    node.kubelet.mirror_node().await.unwrap();
    let mut cfg = dra_agent_config(&node, dir.path(), server.client(), echo(false));
    cfg.dra_layout = Layout::Consumable;
    let agent = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 3),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    (server, dir, node, agent, inst)
}

/// The slots held for ResourceClaims, by claim name.
async fn dra_slots(server: &ApiServer) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = slot_claims(server)
        .await
        .into_iter()
        .filter_map(|c| {
            let h = c.spec.resource_claim.clone()?;
            Some((h.name, c.spec.slot_id()))
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_device_of_three_slots_is_shared_by_claims_up_to_its_free_slots() {
    let (server, _dir, node, agent, inst) = consumable_node(DraFeatures::default()).await;
    let instance = inst.metadata.name.clone().unwrap();
    let res = resource(&inst);
    let device = steward_core::dra::consumable_device_name(&instance);
    wait_dp_and_dra(&node, &res, 3).await;
    wait_capacity(&server, &device, "3").await;
    create_device_class(&server, "cams").await;

    // A device-plugin pod takes one slot: it leaves the capacity.
    let dp_pod = node.kubelet.add_pod(pod("dp", &res)).await.unwrap();
    let dp_slot = dp_pod.devices["main"][&res].iter().next().unwrap().clone();
    wait_bound(&server, &dp_slot, &dp_pod.uid).await;
    wait_capacity(&server, &device, "2").await;

    // Two claims share the device, each consuming one slot under its own
    // share; the ledger gives each a distinct slot, neither the plugin's.
    let (uid1, r1) = claim_pod(&server, &node, "c1").await.unwrap();
    let (_uid2, r2) = claim_pod(&server, &node, "c2").await.unwrap();
    for r in [&r1, &r2] {
        assert_eq!(r.device, device);
        let consumed = r.consumed_capacity.clone().unwrap_or_default();
        assert_eq!(consumed[SLOTS_CAPACITY].0, "1", "{r:?}");
    }
    let (s1, s2) = (r1.share_id.clone().unwrap(), r2.share_id.clone().unwrap());
    assert_ne!(s1, s2);
    let held = dra_slots(&server).await;
    assert_eq!(held.len(), 2, "{held:?}");
    let slots: BTreeSet<&str> = held.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(slots.len(), 2, "{held:?}");
    assert!(!slots.contains(dp_slot.as_str()), "{held:?}");
    let recorded = claim_of(&server, &held[0].1).await.unwrap();
    assert_eq!(recorded.spec.resource_claim.unwrap().share_id, s1);
    // Every slot is held: the device plugin sees only its own as healthy
    // (the claims' are unhealthy to it), the scheduler fits no third claim.
    node.kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 1, WAIT)
        .await
        .unwrap();
    match claim_pod(&server, &node, "c3").await {
        Err(AllocError::Unsatisfiable { message, .. }) => {
            assert!(message.contains("capacity"), "{message}")
        }
        other => panic!("a third claim fit on two slots: {other:?}"),
    }

    // The device-plugin pod goes: its slot is capacity again, and the third
    // claim gets it.
    node.kubelet.delete_pod(&dp_pod.uid).await.unwrap();
    wait_released(&server, &dp_slot).await;
    wait_capacity(&server, &device, "3").await;
    let pods = PodSpec::new(NS, "pod-c3")
        .resource_claim("cam", "c3")
        .container(ContainerSpec::new("main").claim("cam"));
    let c3_uid = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(server.client(), NS)
        .get("pod-c3")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    allocate_claim(&server.client(), NS, "c3", "pod-c3", &c3_uid, "node-a")
        .await
        .unwrap();
    node.kubelet.add_pod(pods.uid(&c3_uid)).await.unwrap();
    let held = dra_slots(&server).await;
    assert_eq!(
        held.iter()
            .find(|(c, _)| c == "c3")
            .map(|(_, s)| s.as_str()),
        Some(dp_slot.as_str()),
        "{held:?}"
    );

    // A claim's pod ends: exactly its slot is freed, and the device plugin
    // may hand it out again.
    let c1_slot = held.iter().find(|(c, _)| c == "c1").unwrap().1.clone();
    node.kubelet.delete_pod(&uid1).await.unwrap();
    unreserve_claim(&server.client(), NS, "c1", &uid1)
        .await
        .unwrap();
    wait_released(&server, &c1_slot).await;
    assert_eq!(dra_slots(&server).await.len(), 2);
    node.kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 1, WAIT)
        .await
        .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(server.client(), NS);
    assert!(
        claims
            .get("c1")
            .await
            .unwrap()
            .status
            .unwrap()
            .allocation
            .is_none()
    );
    agent.stop().await.unwrap();
}

/// On a cluster where `DRAConsumableCapacity` is off (Kubernetes 1.35's
/// default), the API server drops `allowMultipleAllocations`: the agent
/// says so once and publishes one device per slot, and stops rewriting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_feature_the_slices_go_back_to_one_device_per_slot() {
    let (server, _dir, _node, agent, inst) = consumable_node(DraFeatures::kubernetes_1_35()).await;
    let instance = inst.metadata.name.clone().unwrap();
    eventually("one device per slot", WAIT, || async {
        let mut names: Vec<String> = devices(&server)
            .await
            .into_iter()
            .filter(|(_, multiple, _)| !multiple)
            .map(|(n, _, _)| n)
            .collect();
        names.sort();
        let want: Vec<String> = (0..3)
            .map(|n| steward_core::dra::device_name(&instance, n))
            .collect();
        (names == want).then_some(())
    })
    .await;
    let writes = || server.stats().writes_for("resourceslices.resource.k8s.io");
    let before = writes();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(writes(), before, "slices rewritten in a loop");
    assert_eq!(devices(&server).await.len(), 3);
    agent.stop().await.unwrap();
}
