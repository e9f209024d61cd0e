//! Seed 004 on the real kubelet: steward's pod resources (List, Get,
//! GetAllocatableResources and the watch) against **kubelet's own**
//! pod-resources socket for the same pods, field by field.
//!
//! Differences, each asserted below as what it is:
//! - CPUs and memory: kubelet's CPU and memory managers run policy `none`
//!   here (steward's resource manager pins instead), so kubelet reports no
//!   `cpu_ids` and no `memory`; steward reports the exclusive CPU its NRI
//!   plugin gave the Guaranteed container.
//! - Everything else — pods, containers, device-plugin devices (resource
//!   name and device ids) and DRA claims — must be the same.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use steward_proto::podresources::v1::{
    AllocatableResourcesRequest, ContainerResources, GetPodResourcesRequest,
    ListAndWatchPodResourcesRequest, ListPodResourcesRequest, PodResources, WatchPodAction,
};
use steward_real_cluster::{BUSYBOX, Cluster, debug_echo_configuration, eventually};
use tonic::transport::Channel;

async fn client(socket: &Path) -> PodResourcesListerClient<Channel> {
    let channel = steward_proto::uds::endpoint()
        .connect_with_connector(steward_proto::uds::UnixConnector::new(socket))
        .await
        .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
    PodResourcesListerClient::new(channel).max_decoding_message_size(64 << 20)
}

/// Devices of a container as (resource, sorted ids), sorted.
fn devices(c: &ContainerResources) -> Vec<(String, Vec<String>)> {
    let mut d: Vec<_> = c
        .devices
        .iter()
        .map(|d| {
            let mut ids = d.device_ids.clone();
            ids.sort();
            (d.resource_name.clone(), ids)
        })
        .collect();
    d.sort();
    d
}

/// A claim's device: (driver, pool, device).
type ClaimDevice = (String, String, String);

/// Claims of a container as (claim, its devices).
fn claims(c: &ContainerResources) -> Vec<(String, Vec<ClaimDevice>)> {
    let mut out: Vec<_> = c
        .dynamic_resources
        .iter()
        .map(|r| {
            let mut devs: Vec<_> = r
                .claim_resources
                .iter()
                .map(|c| {
                    (
                        c.driver_name.clone(),
                        c.pool_name.clone(),
                        c.device_name.clone(),
                    )
                })
                .collect();
            devs.sort();
            (format!("{}/{}", r.claim_namespace, r.claim_name), devs)
        })
        .collect();
    out.sort();
    out
}

fn by_container(p: &PodResources) -> BTreeMap<String, &ContainerResources> {
    p.containers.iter().map(|c| (c.name.clone(), c)).collect()
}

/// Proves: for a pod holding a steward device through the device plugin and
/// one exclusive CPU, and a pod holding a steward device through a DRA
/// claim, steward's List and Get report the same pods, containers, devices
/// and claims as kubelet's own List and Get; steward's allocatable devices
/// include every steward device kubelet reports as allocatable; steward adds
/// the exclusive CPU kubelet (policy none) does not know; and steward's watch
/// sends the pod's deletion.
#[tokio::test(flavor = "multi_thread")]
async fn steward_pod_resources_match_kubelets_own() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("s004").await;
    let node = cluster.nodes[0].clone();
    let short = node.trim_start_matches("node-");
    let sockets = cluster
        .dir
        .join(format!("node-{short}/kubelet/pod-resources"));
    let kubelet_sock = sockets.join("kubelet.sock");
    let steward_sock = sockets.join("steward.sock");

    cluster
        .create_configuration(
            &ns.name,
            &debug_echo_configuration("probes", &["probe-0", "probe-1"], 1),
        )
        .await;
    let instances = eventually(
        &format!("two Instances of probes on {node}"),
        Duration::from_secs(90),
        || async {
            let list: Vec<_> = cluster
                .instances_of(&ns.name, "probes")
                .await
                .into_iter()
                .filter(|i| i.spec.nodes == vec![node.clone()])
                .collect();
            (list.len() == 2).then_some(list)
        },
    )
    .await;
    let dp_resource = format!(
        "steward.dev/{}",
        instances[0].metadata.name.as_deref().unwrap()
    );
    cluster.wait_allocatable(&node, &dp_resource, 1).await;

    // A pod with a device-plugin device and one exclusive CPU.
    cluster
        .create_pod(
            &ns.name,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "dp"},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{
                        "name": "work", "image": BUSYBOX, "imagePullPolicy": "Never",
                        "command": ["sleep", "3600"],
                        "resources": {"limits": {dp_resource.clone(): "1", "cpu": "1", "memory": "64Mi"}},
                    }, {
                        "name": "side", "image": BUSYBOX, "imagePullPolicy": "Never",
                        "command": ["sleep", "3600"],
                        "resources": {"limits": {"cpu": "100m", "memory": "32Mi"}},
                    }],
                },
            }),
        )
        .await;
    // A pod with a device through a DRA claim of the Configuration's class.
    let class = cluster.device_class(&ns.name, "probes").await;
    cluster.apply(
        &ns.name,
        &json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "probe-claim"},
            // The other Instance's device: a slot the device-plugin pod
            // may take is never offered to this claim (the scheduler does
            // not see device-plugin use; see docs/DRA.md).
            "spec": {"devices": {"requests": [{"name": "p", "exactly": {
                "deviceClassName": class,
                "selectors": [{"cel": {"expression": format!(
                    "device.attributes[\"steward.dev\"].instance == \"{}\"",
                    instances[1].metadata.name.as_deref().unwrap()
                )}}],
            }}]}},
        }),
    );
    cluster
        .create_pod(
            &ns.name,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "dra"},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "resourceClaims": [{"name": "p", "resourceClaimName": "probe-claim"}],
                    "containers": [{
                        "name": "work", "image": BUSYBOX, "imagePullPolicy": "Never",
                        "command": ["sleep", "3600"],
                        "resources": {"claims": [{"name": "p"}]},
                    }],
                },
            }),
        )
        .await;
    for p in ["dp", "dra"] {
        cluster.running(&ns.name, p, Duration::from_secs(120)).await;
    }

    let mut kubelet = client(&kubelet_sock).await;
    let mut steward = client(&steward_sock).await;

    // List, field by field, for the story's pods. steward's view follows
    // kubelet's with a poll (agent.podResources.kubeletPoll): wait for it.
    let list = |c: &mut PodResourcesListerClient<Channel>| {
        let mut c = c.clone();
        let ns = ns.name.clone();
        async move {
            let mut pods: Vec<PodResources> = c
                .list(ListPodResourcesRequest {})
                .await
                .unwrap()
                .into_inner()
                .pod_resources
                .into_iter()
                .filter(|p| p.namespace == ns)
                .collect();
            pods.sort_by(|a, b| a.name.cmp(&b.name));
            pods
        }
    };
    let kubelet_pods = eventually(
        "kubelet's List naming both pods",
        Duration::from_secs(30),
        || {
            let f = list(&mut kubelet);
            async move {
                let pods = f.await;
                (pods.len() == 2
                    && pods.iter().all(|p| {
                        p.containers
                            .iter()
                            .any(|c| !c.devices.is_empty() || !c.dynamic_resources.is_empty())
                    }))
                .then_some(pods)
            }
        },
    )
    .await;
    let steward_pods = eventually(
        "steward's List with what kubelet reports",
        Duration::from_secs(40),
        || {
            let f = list(&mut steward);
            let want = kubelet_pods.clone();
            async move {
                let pods = f.await;
                let same = pods.len() == want.len()
                    && pods.iter().zip(&want).all(|(s, k)| {
                        let (sc, kc) = (by_container(s), by_container(k));
                        s.name == k.name
                            && sc.len() == kc.len()
                            && kc.iter().all(|(n, k)| {
                                sc.get(n).is_some_and(|s| {
                                    devices(s) == devices(k) && claims(s) == claims(k)
                                })
                            })
                    });
                same.then_some(pods)
            }
        },
    )
    .await;

    for (s, k) in steward_pods.iter().zip(&kubelet_pods) {
        for (name, kc) in by_container(k) {
            let sc = by_container(s)[&name];
            assert_eq!(devices(sc), devices(kc), "{}/{name} devices", s.name);
            assert_eq!(claims(sc), claims(kc), "{}/{name} claims", s.name);
            // kubelet's CPU and memory managers are `none` here.
            assert!(
                kc.cpu_ids.is_empty(),
                "kubelet (policy none) pins nothing: {kc:?}"
            );
            assert!(
                kc.memory.is_empty(),
                "kubelet (policy none) reports no memory: {kc:?}"
            );
        }
    }
    let dp = steward_pods.iter().find(|p| p.name == "dp").unwrap();
    let work = by_container(dp)["work"];
    assert_eq!(
        work.cpu_ids.len(),
        1,
        "steward reports the exclusive CPU its NRI plugin gave dp/work: {work:?}"
    );
    assert!(
        by_container(dp)["side"].cpu_ids.is_empty(),
        "a fractional container has no exclusive CPU: {:?}",
        by_container(dp)["side"]
    );
    let dra = steward_pods.iter().find(|p| p.name == "dra").unwrap();
    assert_eq!(
        claims(by_container(dra)["work"])[0].1[0].0,
        "steward.dev",
        "the DRA claim's device is steward's"
    );

    // Get, both sides, the same devices and claims.
    for p in ["dp", "dra"] {
        let req = GetPodResourcesRequest {
            pod_name: p.into(),
            pod_namespace: ns.name.clone(),
        };
        let k = kubelet
            .get(req.clone())
            .await
            .unwrap()
            .into_inner()
            .pod_resources
            .unwrap();
        let s = steward
            .get(req)
            .await
            .unwrap()
            .into_inner()
            .pod_resources
            .unwrap();
        for (name, kc) in by_container(&k) {
            let sc = by_container(&s)[&name];
            assert_eq!(devices(sc), devices(kc), "Get {p}/{name} devices");
            assert_eq!(claims(sc), claims(kc), "Get {p}/{name} claims");
        }
    }

    // Allocatable: every steward device kubelet counts, steward counts too.
    let ka = kubelet
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let sa = steward
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let ids = |devs: &[steward_proto::podresources::v1::ContainerDevices], r: &str| {
        let mut v: Vec<String> = devs
            .iter()
            .filter(|d| d.resource_name == r)
            .flat_map(|d| d.device_ids.clone())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        ids(&sa.devices, &dp_resource),
        ids(&ka.devices, &dp_resource),
        "allocatable slots of {dp_resource}"
    );
    assert!(!ids(&ka.devices, &dp_resource).is_empty());

    // The watch (steward only: kubelet has none): the pod's deletion.
    let mut watch = steward
        .list_and_watch(ListAndWatchPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    cluster.delete_pod_now(&ns.name, "dp").await;
    let deleted = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(ev) = watch.next().await {
            let ev = ev.unwrap();
            if ev.action == WatchPodAction::Deleted as i32
                && ev
                    .pod_resources
                    .iter()
                    .any(|p| p.name == "dp" && p.namespace == ns.name)
            {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(deleted, Ok(true), "steward's watch sends dp's deletion");
}
