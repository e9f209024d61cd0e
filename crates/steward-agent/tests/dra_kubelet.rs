//! The DRA kubelet plugin across a kubelet restart: kubelet's plugin
//! watcher finds the agent's registration socket again and re-registers
//! the driver, and a claim prepared before the restart is unprepared after
//! it (kubelet's checkpoint), freeing exactly its slot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use dp::*;
use steward_testing_apiserver::dra_alloc::allocate_claim;
use steward_testing_kubelet::{ContainerSpec, Phase, PodSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_prepared_before_a_kubelet_restart_is_unprepared_after_it() {
    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let cfg = dra_agent_config(&node, dir.path(), server.client(), echo(false));
    let agent = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 2),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let instance = inst.metadata.name.clone().unwrap();
    let res = resource(&inst);
    wait_dp_and_dra(&node, &res, 2).await;
    wait_for_devices(&server, 2).await;
    create_device_class(&server, "cams").await;
    create_claim(&server.client(), "cam", "cams.default.steward.dev").await;
    let spec = PodSpec::new(NS, "web")
        .resource_claim("cam", "cam")
        .container(ContainerSpec::new("main").claim("cam"));
    let uid = node.kubelet.create_pod_object(&spec).await.unwrap();
    let allocated = allocate_claim(&server.client(), NS, "cam", "web", &uid, "node-a")
        .await
        .unwrap();
    let device = allocation_results(allocated)[0].device.clone();
    node.kubelet.add_pod(spec.uid(&uid)).await.unwrap();
    let held = claim_of(&server, &device).await.expect("prepared");
    assert!(held.spec.resource_claim.is_some());

    // kubelet restarts: the driver registers again, the claim stays held.
    node.kubelet.restart().await.unwrap();
    node.kubelet
        .wait_for_dra_driver("steward.dev", WAIT)
        .await
        .unwrap();
    assert!(
        claim_of(&server, &device)
            .await
            .is_some_and(|c| c.spec.resource_claim.is_some())
    );

    // The pod ends after the restart: unprepared from kubelet's checkpoint.
    node.kubelet
        .terminate_pod(&uid, Phase::Succeeded)
        .await
        .unwrap();
    wait_released(&server, &device).await;
    let other = format!("{instance}-{}", if device.ends_with("-0") { 1 } else { 0 });
    assert!(claim_of(&server, &other).await.is_none());
    agent.stop().await.unwrap();
}
