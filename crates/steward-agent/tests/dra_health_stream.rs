//! A fault discovery reports, on the agent's DRA resource health stream:
//! the whole agent (discovery, Instances in the API server stand-in, the
//! slot keeper, the kubelet plugin's socket) with debug-echo's
//! availability file saying `FATAL …`, then recovering — the stream says
//! UNHEALTHY with the handler's reason, then HEALTHY, on the same stream
//! and the same agent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::path::Path;

use dp::*;
use steward_agent::dra::DraPluginConfig;
use steward_core::dra::device_name;
use steward_proto::dra_health::v1alpha1::{
    HealthStatus, NodeWatchResourcesRequest, NodeWatchResourcesResponse,
    dra_resource_health_client::DraResourceHealthClient,
};
use steward_proto::pluginregistration::v1::{InfoRequest, registration_client::RegistrationClient};
use steward_proto::uds::{UnixConnector, endpoint};
use tonic::transport::Channel;

async fn channel(path: &Path) -> Channel {
    eventually(&format!("socket {}", path.display()), WAIT, || async {
        endpoint()
            .connect_with_connector(UnixConnector::new(path))
            .await
            .ok()
    })
    .await
}

/// (device, health, message) of every device of a report.
fn states(m: &NodeWatchResourcesResponse) -> Vec<(String, i32, String)> {
    m.devices
        .iter()
        .map(|d| {
            (
                d.device.clone().unwrap().device_name,
                d.health,
                d.message.clone(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_fault_is_unhealthy_with_its_reason_until_it_clears() {
    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    let avail = dir.path().join("health");
    std::fs::write(&avail, "ONLINE").unwrap();
    let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let mut cfg = node.agent_config(dir.path(), server.client(), echo(false));
    let dra = DraPluginConfig::new(&node.root);
    cfg.dra_plugin = Some(dra.clone());
    let agent = Agent::start(cfg);
    let details = format!(
        "{}availabilityFile: {}\n",
        echo_details(&["cam"]),
        avail.display()
    );
    create_configuration(&server, &configuration("cams", "debug-echo", &details, 1)).await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let dev = device_name(&inst.metadata.name.clone().unwrap(), 0);
    let mut reg = RegistrationClient::new(channel(&dra.registration_socket()).await);
    let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
    let mut health = DraResourceHealthClient::new(channel(Path::new(&info.endpoint)).await)
        .node_watch_resources(NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let healthy = HealthStatus::Healthy as i32;
    let unhealthy = HealthStatus::Unhealthy as i32;
    let mut until = async |what: &str, want: Vec<(String, i32, String)>| loop {
        let m = tokio::time::timeout(WAIT, health.message())
            .await
            .unwrap_or_else(|_| panic!("no health report: {what}"))
            .unwrap()
            .unwrap();
        if states(&m) == want {
            break;
        }
    };
    until("healthy", vec![(dev.clone(), healthy, String::new())]).await;
    std::fs::write(&avail, "FATAL ECC error").unwrap();
    until(
        "fatal",
        vec![(
            dev.clone(),
            unhealthy,
            "the device reports a fatal fault: ECC error".into(),
        )],
    )
    .await;
    std::fs::write(&avail, "transient: link flapping").unwrap();
    until(
        "transient",
        vec![(
            dev.clone(),
            unhealthy,
            "the device reports a transient fault: link flapping".into(),
        )],
    )
    .await;
    std::fs::write(&avail, "ONLINE").unwrap();
    until("healthy again", vec![(dev.clone(), healthy, String::new())]).await;
    agent.stop().await.unwrap();
}
