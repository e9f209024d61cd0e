//! A plugin refuses device ids that are not its own slots, ids named twice
//! and oversized requests: dialled over its socket as a kubelet written
//! apart from the project would, nothing is claimed and a later valid
//! Allocate still works.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::time::Duration;

use dp::*;
use steward_agent::deviceplugin::socket_name;
use steward_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use steward_proto::deviceplugin::v1beta1::{AllocateRequest, ContainerAllocateRequest};

fn request(containers: &[&[&str]]) -> AllocateRequest {
    AllocateRequest {
        container_requests: containers
            .iter()
            .map(|ids| ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            })
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_and_duplicate_ids_are_refused_and_claim_nothing() {
    let s = Single::start(2).await;
    create_configuration(
        &s.server,
        &configuration("mics", "debug-echo", &echo_details(&["mic"]), 1),
    )
    .await;
    let other = instance_of(&s.server, "mics", &["node-a"]).await;
    let other_slot = format!("{}-0", other.metadata.name.clone().unwrap());
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
    let mut plugin = DevicePluginClient::new(channel);
    let own = s.slot(0);

    let err = plugin
        .allocate(request(&[&[other_slot.as_str()]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    assert!(err.message().contains("not a slot of"), "{}", err.message());
    let err = plugin
        .allocate(request(&[&[own.as_str(), own.as_str()]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("named twice"), "{}", err.message());
    let err = plugin
        .allocate(request(&[&[own.as_str()], &[own.as_str()]]))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        tonic::Code::InvalidArgument,
        "across containers too"
    );
    // Nothing was claimed by the refused calls.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(claim_of(&s.server, &other_slot).await.is_none());
    assert!(claim_of(&s.server, &own).await.is_none());

    // An oversized request (over the explicit 4 MiB limit) is refused by
    // the server before any of it is looked at.
    let huge: Vec<String> = (0..100_000)
        .map(|i| format!("{}-{i:0>40}", s.instance))
        .collect();
    let huge_refs: Vec<&str> = huge.iter().map(String::as_str).collect();
    let err = plugin
        .allocate(request(&[huge_refs.as_slice()]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
    assert!(
        claim_of(&s.server, &own).await.is_none(),
        "nothing claimed by the oversized call"
    );

    // A valid Allocate still works and claims its slot.
    let ok = plugin
        .allocate(request(&[&[own.as_str()]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.container_responses.len(), 1);
    eventually("the claim of the valid Allocate", WAIT, || {
        let (server, own) = (&s.server, own.clone());
        async move { claim_of(server, &own).await }
    })
    .await;
}
