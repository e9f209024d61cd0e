//! Nothing from the API turns into a host path unchecked: an Instance
//! mounting the host's `/` (its Configuration allowed it: `allowedHostPaths`
//! is the Configuration author's to write) is refused by Allocate and left
//! out of the CDI spec under the node's own policy (the default: devices
//! under /dev/, no mounts), while a normal Instance beside it is served.
//! The policy is each agent's own (`AgentConfig::host_paths`): two agents
//! in one process apply their own to the same Instance.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::collections::BTreeMap;
use std::sync::Arc;

use dp::*;
use futures::StreamExt;
use steward_agent::deviceplugin::{cdi_spec_path, socket_name};
use steward_agent::host_paths::HostPathPolicy;
use steward_core::discovery::{Device, Mount};
use steward_discovery::{DeviceStream, DiscoverRequest, DiscoveryError, DiscoveryHandler};
use steward_proto::deviceplugin::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, device_plugin_client::DevicePluginClient,
};

/// Reports one device `id` with one mount, then stays quiet.
struct OneMount {
    name: &'static str,
    shared: bool,
    id: &'static str,
    mount: Mount,
}

impl DiscoveryHandler for OneMount {
    fn name(&self) -> &str {
        self.name
    }
    fn shared(&self) -> bool {
        self.shared
    }
    fn discover(&self, _req: DiscoverRequest) -> Result<DeviceStream, DiscoveryError> {
        let device = Device {
            id: self.id.into(),
            properties: BTreeMap::new(),
            mounts: vec![self.mount.clone()],
            device_specs: vec![],
        };
        Ok(futures::stream::iter(vec![Ok(vec![device])])
            .chain(futures::stream::pending())
            .boxed())
    }
}

/// Reports one device mounting the host's `/`.
fn root_grab() -> OneMount {
    OneMount {
        name: "root-grab",
        shared: false,
        id: "everything",
        mount: Mount {
            container_path: "/host".into(),
            host_path: "/".into(),
            read_only: false,
        },
    }
}

/// Reports one device (shared by every node running it) mounting the
/// host's `/etc`.
fn etc_mount() -> OneMount {
    OneMount {
        name: "etc-mount",
        shared: true,
        id: "etc",
        mount: Mount {
            container_path: "/host-etc".into(),
            host_path: "/etc".into(),
            read_only: true,
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_mounting_the_host_root_is_refused_and_a_normal_one_served() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let mut handlers = echo(false);
    handlers.push(Arc::new(root_grab()));
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

/// One Instance mounting `/etc`, served by two agents in this process:
/// node-a keeps the default policy (no mounts) and refuses its Allocate
/// and leaves it out of its CDI spec; node-b's operator allowed mounts
/// under /etc/, and node-b answers with the mount and puts it in its spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_in_one_process_apply_their_own_host_path_policies() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    // node-b's host root: where its host's `/` is seen.
    let host_b = dir.path().join("node-b-host");
    std::fs::create_dir_all(host_b.join("etc")).unwrap();
    let a = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let b = Node::start(dir.path(), "node-b", Some(server.client())).await;
    let handlers = || -> Vec<Arc<dyn DiscoveryHandler>> { vec![Arc::new(etc_mount())] };
    let cfg_a = a.agent_config(dir.path(), server.client(), handlers());
    assert_eq!(cfg_a.host_paths, HostPathPolicy::default());
    let mut cfg_b = b.agent_config(dir.path(), server.client(), handlers());
    cfg_b.host_paths =
        HostPathPolicy::new(&host_b, &["/dev/".into()], &["/etc/".into()], false).unwrap();
    let _agent_a = Agent::start(cfg_a);
    let _agent_b = Agent::start(cfg_b);
    let mut etc = configuration("etc", "etc-mount", "", 2);
    etc.spec.allowed_host_paths = vec!["/etc".into()];
    create_configuration(&server, &etc).await;

    let inst = instance_of(&server, "etc", &["node-a", "node-b"]).await;
    assert_eq!(inst.spec.mounts[0].host_path, "/etc");
    let name = inst.metadata.name.clone().unwrap();
    let res = resource(&inst);
    for node in [&a, &b] {
        node.kubelet
            .wait_for_resource(&res, |s| s.healthy.len() == 2, WAIT)
            .await
            .unwrap();
    }

    // node-a: refused under the default policy, nothing claimed.
    let socket = a.root.join("device-plugins").join(socket_name(&name));
    let mut client = DevicePluginClient::new(
        steward_testing_kubelet::connect_unix(&socket)
            .await
            .unwrap(),
    );
    let err = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![format!("{name}-0")],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    let msg = err.message();
    assert!(msg.contains("mount host path \"/etc\""), "{msg}");
    assert!(msg.contains("allowed mount paths []"), "{msg}");
    assert!(slot_claims(&server).await.is_empty());

    // node-b: the same Instance is allocated, with the mount.
    let admitted = b.kubelet.add_pod(pod("user", &res)).await.unwrap();
    let answer = &admitted.responses["main"][&res];
    assert_eq!(answer.mounts.len(), 1, "{answer:?}");
    assert_eq!(answer.mounts[0].host_path, "/etc");
    assert_eq!(answer.mounts[0].container_path, "/host-etc");
    assert!(answer.mounts[0].read_only);
    let slot = slot_of(&b.kubelet, &admitted.uid, &res).unwrap();
    wait_bound(&server, &slot, &admitted.uid).await;

    // CDI: in node-b's spec, left out of node-a's.
    let spec_b = eventually("node-b's CDI spec with the device", WAIT, || async {
        std::fs::read_to_string(cdi_spec_path(&b.cdi, NS, "etc"))
            .ok()
            .filter(|s| s.contains(&name))
    })
    .await;
    assert!(spec_b.contains("\"hostPath\": \"/etc\""), "{spec_b}");
    let spec_a = eventually("node-a's CDI spec", WAIT, || async {
        std::fs::read_to_string(cdi_spec_path(&a.cdi, NS, "etc")).ok()
    })
    .await;
    assert!(!spec_a.contains(&name), "{spec_a}");
    assert!(!spec_a.contains("hostPath"), "{spec_a}");
}
