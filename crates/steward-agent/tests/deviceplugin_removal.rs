//! When an Instance leaves this node, its plugin's ListAndWatch sends every
//! slot Unhealthy as its last list and then ends cleanly, as the module
//! documentation says: seen by a client dialling the plugin socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::time::Duration;

use dp::*;
use steward_agent::deviceplugin::socket_name;
use steward_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use steward_proto::deviceplugin::v1beta1::{Empty, HEALTHY, UNHEALTHY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_instance_ends_its_watch_with_every_slot_unhealthy() {
    let mut s = Single::start(3).await;
    let socket = s
        .node
        .root
        .join("device-plugins")
        .join(socket_name(&s.instance));
    let channel = steward_proto::uds::endpoint()
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(steward_proto::uds::UnixConnector::new(&socket))
        .await
        .unwrap();
    let mut stream = DevicePluginClient::new(channel)
        .list_and_watch(Empty {})
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 3);
    assert!(first.devices.iter().all(|d| d.health == HEALTHY));

    let api: kube::Api<steward_api::Configuration> = kube::Api::namespaced(s.server.client(), NS);
    api.delete("cams", &Default::default()).await.unwrap();

    let mut last = None;
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            match stream.message().await {
                Ok(Some(m)) => last = Some(m),
                Ok(None) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .expect("the watch ends once the Instance is gone");
    ended.expect("the watch ends with OK, not an error");
    let last = last.expect("a list was sent after the removal");
    let mut ids: Vec<_> = last.devices.iter().map(|d| d.id.clone()).collect();
    ids.sort();
    assert_eq!(ids, (0..3).map(|n| s.slot(n)).collect::<Vec<_>>());
    assert!(
        last.devices.iter().all(|d| d.health == UNHEALTHY),
        "last list: {last:?}"
    );
    s.agent.take().unwrap().stop().await.unwrap();
}
