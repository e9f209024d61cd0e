//! Nothing from the API turns into a host path unchecked: an Instance
//! mounting the host's `/` (its Configuration allowed it: `allowedHostPaths`
//! is the Configuration author's to write) is refused by Allocate and left
//! out of the CDI spec under the node's own policy (the default: devices
//! under /dev/, no mounts), while a normal Instance beside it is served.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::collections::BTreeMap;
use std::sync::Arc;

use dp::*;
use futures::StreamExt;
use steward_agent::deviceplugin::{cdi_spec_path, socket_name};
use steward_core::discovery::{Device, Mount};
use steward_discovery::{DeviceStream, DiscoverRequest, DiscoveryError, DiscoveryHandler};
use steward_proto::deviceplugin::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, device_plugin_client::DevicePluginClient,
};

/// Reports one device mounting the host's `/`, then stays quiet.
struct RootGrab;

impl DiscoveryHandler for RootGrab {
    fn name(&self) -> &str {
        "root-grab"
    }
    fn shared(&self) -> bool {
        false
    }
    fn discover(&self, _req: DiscoverRequest) -> Result<DeviceStream, DiscoveryError> {
        let device = Device {
            id: "everything".into(),
            properties: BTreeMap::new(),
            mounts: vec![Mount {
                container_path: "/host".into(),
                host_path: "/".into(),
                read_only: false,
            }],
            device_specs: vec![],
        };
        Ok(futures::stream::iter(vec![Ok(vec![device])])
            .chain(futures::stream::pending())
            .boxed())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_mounting_the_host_root_is_refused_and_a_normal_one_served() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let mut handlers = echo(false);
    handlers.push(Arc::new(RootGrab));
    let _agent = Agent::start(a.agent_config(dir.path(), server.client(), handlers));
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 1),
    )
    .await;
    let mut grab = configuration("grab", "root-grab", "", 1);
    grab.spec.allowed_host_paths = vec!["/".into()];
    create_configuration(&server, &grab).await;

    let bad = instance_of(&server, "grab", &["node-a"]).await;
    assert_eq!(bad.spec.mounts[0].host_path, "/", "the Instance carries it");
    let good = instance_of(&server, "cams", &["node-a"]).await;
    let (bad_res, good_res) = (resource(&bad), resource(&good));
    for res in [&bad_res, &good_res] {
        a.kubelet
            .wait_for_resource(res, |s| s.healthy.len() == 1, WAIT)
            .await
            .unwrap();
    }

    // Allocate of the bad Instance's slot: refused, naming the path and
    // the policy; nothing claimed.
    let bad_name = bad.metadata.name.clone().unwrap();
    let socket = a.root.join("device-plugins").join(socket_name(&bad_name));
    let mut client = DevicePluginClient::new(
        steward_testing_kubelet::connect_unix(&socket)
            .await
            .unwrap(),
    );
    let err = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![format!("{bad_name}-0")],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    let msg = err.message();
    assert!(msg.contains("mount host path \"/\""), "{msg}");
    assert!(msg.contains("allowed mount paths []"), "{msg}");
    assert!(slot_claims(&server).await.is_empty());

    // The normal Instance is served through kubelet as before.
    let admitted = a.kubelet.add_pod(pod("user", &good_res)).await.unwrap();
    let answer = &admitted.responses["main"][&good_res];
    assert!(answer.mounts.is_empty() && answer.devices.is_empty());
    assert_eq!(answer.cdi_devices.len(), 1);
    let slot = slot_of(&a.kubelet, &admitted.uid, &good_res).unwrap();
    wait_bound(&server, &slot, &admitted.uid).await;

    // CDI: the good device is in its spec, the bad one is left out.
    let good_spec = eventually("CDI spec of cams", WAIT, || async {
        std::fs::read_to_string(cdi_spec_path(&a.cdi, NS, "cams")).ok()
    })
    .await;
    assert!(good_spec.contains(&good.metadata.name.clone().unwrap()));
    let bad_spec = std::fs::read_to_string(cdi_spec_path(&a.cdi, NS, "grab")).unwrap_or_default();
    assert!(!bad_spec.contains(&bad_name), "{bad_spec}");
    assert!(!bad_spec.contains("\"hostPath\": \"/\""), "{bad_spec}");
}
