//! The agent's pod resources server over its device-plugin slots: a pod
//! admitted by a kubelet (stand-in, real device-plugin gRPC) shows its slot
//! in `List` and on the watch; deleting it is a DELETED event; the KEP's D1
//! order holds when the freed slot goes to the next pod.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::time::Duration;

use dp::*;
use futures::StreamExt;
use steward_agent::pod_resources::PodResourcesConfig;
use steward_proto::podresources::v1 as wire;
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;

async fn next_event(
    stream: &mut tonic::Streaming<wire::ListAndWatchPodResourcesResponse>,
) -> wire::ListAndWatchPodResourcesResponse {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("an event in time")
        .unwrap()
        .unwrap()
}

/// The next event about `name` (others — e.g. kubelet's report of pods
/// without devices — are skipped).
async fn next_about(
    stream: &mut tonic::Streaming<wire::ListAndWatchPodResourcesResponse>,
    name: &str,
) -> wire::ListAndWatchPodResourcesResponse {
    loop {
        let e = next_event(stream).await;
        if e.pod_resources.first().is_some_and(|p| p.name == name) {
            return e;
        }
    }
}

fn devices(e: &wire::ListAndWatchPodResourcesResponse) -> Vec<String> {
    e.pod_resources[0]
        .containers
        .iter()
        .flat_map(|c| c.devices.iter().flat_map(|d| d.device_ids.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_show_in_list_and_on_the_watch_in_capacity_order() {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let mut cfg = node.agent_config(dir.path(), server.client(), echo(false));
    let socket = dir.path().join("steward-pod-resources.sock");
    let mut pr = PodResourcesConfig::new(&socket);
    pr.kubelet_socket = Some(node.root.join("pod-resources").join("kubelet.sock"));
    pr.kubelet_poll = Duration::from_millis(200);
    cfg.pod_resources = Some(pr);
    let _agent = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 1),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let res = resource(&inst);
    let slot = format!("{}-0", inst.metadata.name.clone().unwrap());
    node.kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 1, WAIT)
        .await
        .unwrap();

    let channel = eventually("the pod resources socket", WAIT, || {
        let socket = socket.clone();
        async move {
            steward_proto::uds::endpoint()
                .connect_with_connector(steward_proto::uds::UnixConnector::new(&socket))
                .await
                .ok()
        }
    })
    .await;
    let mut client = PodResourcesListerClient::new(channel);
    // kubelet's view and this socket's are fed separately: the slot shows
    // here once the agent's view has it, not necessarily when kubelet does
    // (a CI run under load read it empty right after kubelet had it).
    eventually(
        "the slot allocatable on the pod resources socket",
        WAIT,
        || {
            let mut client = client.clone();
            let (res, slot) = (res.clone(), slot.clone());
            async move {
                let alloc = client
                    .get_allocatable_resources(wire::AllocatableResourcesRequest {})
                    .await
                    .ok()?
                    .into_inner();
                alloc
                    .devices
                    .iter()
                    .any(|d| d.resource_name == res && d.device_ids == [slot.clone()])
                    .then_some(())
            }
        },
    )
    .await;
    let mut watch = client
        .list_and_watch(wire::ListAndWatchPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();

    // Pod a is admitted and gets the only slot.
    let a = node.kubelet.add_pod(pod("a", &res)).await.unwrap();
    wait_bound(&server, &slot, &a.uid).await;
    let e = loop {
        let e = next_about(&mut watch, "a").await;
        if devices(&e) == [slot.clone()] {
            break e;
        }
    };
    assert_eq!(e.uid, a.uid);
    let list = client
        .list(wire::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let listed = list
        .pod_resources
        .iter()
        .find(|p| p.name == "a")
        .expect("a is listed");
    assert_eq!(listed.containers[0].devices[0].resource_name, res);
    assert_eq!(
        listed.containers[0].devices[0].device_ids,
        std::slice::from_ref(&slot)
    );

    // a is deleted and b gets the slot: a loses it strictly before b shows it.
    node.kubelet.delete_pod(&a.uid).await.unwrap();
    let b = node.kubelet.add_pod(pod("b", &res)).await.unwrap();
    wait_bound(&server, &slot, &b.uid).await;
    let mut a_has_it = true;
    loop {
        let e = next_event(&mut watch).await;
        let name = e.pod_resources[0].name.clone();
        let has = devices(&e).contains(&slot) && e.action != wire::WatchPodAction::Deleted as i32;
        if name == "a" {
            a_has_it = has;
        }
        if name == "b" && has {
            assert!(!a_has_it, "b shown holding {slot} while a still held it");
            break;
        }
    }
}
