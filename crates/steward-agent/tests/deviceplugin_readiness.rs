//! What `/readyz` reports for the agent: the Configurations applied, the
//! slot ledger recovered, and every device plugin registered with kubelet.
//! With kubelet gone the plugin's condition says why it is not ready; when
//! kubelet comes back it registers and the agent is ready again. The
//! Instance's status says the same to the cluster: its `Ready` condition and
//! this node's `status.nodes` entry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::time::Duration;

use dp::*;
use steward_testing_kubelet::{Kubelet, KubeletConfig};

async fn wait_report(
    readiness: &steward_nodeio::Readiness,
    what: &str,
    f: impl Fn(bool, &str) -> bool,
) -> String {
    eventually(what, WAIT, || async {
        let (ok, text) = readiness.report();
        f(ok, &text).then_some(text)
    })
    .await
}

fn instances(server: &steward_testing_apiserver::ApiServer) -> kube::Api<steward_api::Instance> {
    kube::Api::namespaced(server.client(), NS)
}

/// Waits for the Instance's `Ready` condition to have `status`; returns
/// status, reason and message.
async fn wait_ready_condition(
    server: &steward_testing_apiserver::ApiServer,
    name: &str,
    status: &str,
) -> (String, String, String) {
    let api = instances(server);
    eventually(&format!("Instance {name} Ready={status}"), WAIT, || {
        let api = api.clone();
        async move {
            let inst = api.get(name).await.ok()?;
            let c = inst
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == steward_api::CONDITION_READY)?;
            (c.status == status).then_some((c.status, c.reason, c.message))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_kubelet_registration() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let cfg = node.agent_config(dir.path(), server.client(), echo(false));
    let readiness = cfg.readiness.clone();
    let (ok, text) = readiness.report();
    assert!(ok, "nothing is asked of an agent not started: {text}");
    let agent = Agent::start(cfg);
    wait_report(&readiness, "ready with no Configuration", |ok, _| ok).await;

    // kubelet goes away; a Configuration gives this node a plugin to serve.
    let Node { kubelet, root, .. } = node;
    drop(kubelet);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 1),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let name = inst.metadata.name.clone().unwrap();
    let text = wait_report(&readiness, "not ready while kubelet is gone", |ok, text| {
        !ok && text.contains(&format!("device-plugin/{name}: "))
    })
    .await;
    assert!(
        text.contains("registration with kubelet failed") || text.contains("not registered"),
        "{text}"
    );
    // The metrics the alerts StewardDevicePluginNotRegistered and
    // StewardSlotsUnhealthy watch: served, not registered, its slot Healthy.
    let dpm = agent.metrics.device_plugins.clone();
    let slots = |health: &str| {
        dpm.slots
            .get_or_create(&steward_agent::deviceplugin::SlotHealthLabels {
                steward_instance: name.clone(),
                health: health.into(),
            })
            .get()
    };
    assert_eq!(dpm.plugins.get(), 1);
    assert_eq!(dpm.registered.get(), 0);
    assert_eq!((slots("Healthy"), slots("Unhealthy")), (1, 0));
    let (status, reason, message) = wait_ready_condition(&server, &name, "False").await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", "NotServed"));
    assert!(message.starts_with("node node-a: "), "{message}");
    assert!(
        message.contains("registration with kubelet failed") || message.contains("not registered"),
        "{message}"
    );

    // kubelet is back: the plugin registers and the agent is ready.
    let kubelet = Kubelet::start(KubeletConfig {
        root_dir: root,
        node_name: "node-a".into(),
        api: Some(server.client()),
    })
    .await
    .unwrap();
    wait_report(&readiness, "ready once registered again", |ok, _| ok).await;
    assert_eq!((dpm.plugins.get(), dpm.registered.get()), (1, 1));
    let (_, reason, message) = wait_ready_condition(&server, &name, "True").await;
    assert_eq!(reason, "Served");
    assert_eq!(message, "registered with kubelet on node-a");
    let status = instances(&server).get(&name).await.unwrap().status.unwrap();
    assert_eq!(status.nodes.len(), 1);
    assert!(status.nodes[0].registered && status.nodes[0].node == "node-a");
    assert_eq!(status.nodes[0].message, None);
    assert!(
        readiness.names().contains(&format!("device-plugin/{name}")),
        "{:?}",
        readiness.names()
    );
    assert!(
        kubelet
            .wait_for_resource(&resource(&inst), |s| s.connected, Duration::from_secs(5))
            .await
            .is_ok()
    );

    // The Instance goes: its condition goes with the plugin.
    let api: kube::Api<steward_api::Configuration> = kube::Api::namespaced(server.client(), NS);
    api.delete("cams", &Default::default()).await.unwrap();
    kubelet
        .wait_for_resource(&resource(&inst), |s| !s.connected, WAIT)
        .await
        .unwrap();
    let gone = format!("device-plugin/{name}");
    eventually("the plugin's condition removed", WAIT, || async {
        (!readiness.names().contains(&gone)).then_some(())
    })
    .await;
    assert!(readiness.report().0);
    eventually("the plugin no longer counted", WAIT, || async {
        (dpm.plugins.get() == 0 && dpm.registered.get() == 0).then_some(())
    })
    .await;
    agent.stop().await.unwrap();
}
