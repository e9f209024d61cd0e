//! The pod resources server through a real unix socket and a tonic client:
//! the KEP's test plan for List/Get/GetAllocatableResources, and bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use common::*;
use steward_core::ledger::{Allocatable, Source};
use steward_podresources::WatchLimits;
use steward_podresources::serve::ServeOptions;
use steward_proto::podresources::v1 as wire;

fn names(resp: &wire::ListPodResourcesResponse) -> Vec<String> {
    resp.pod_resources.iter().map(|p| p.name.clone()).collect()
}

#[tokio::test]
async fn list_covers_pods_without_devices_some_containers_and_init_containers() {
    let server = unlimited().await;
    // No devices at all.
    server.hub.upsert(Source::Kubelet, pod_with("plain", &[]));
    // Devices in one container of two.
    let mut some = pod_with("some", &["cam-0"]);
    some.container_mut("sidecar");
    server.hub.upsert(Source::Slots, some);
    // Devices on an init container, CPUs on the main one.
    let mut init = pod_with("init", &[]);
    init.containers.remove("main");
    init.container_mut("setup")
        .add_devices("steward.dev/cam", ["cam-1"], &BTreeSet::new());
    server.hub.upsert(Source::Slots, init);
    server.hub.upsert(
        Source::Cri,
        with_cpus(pod_with("init", &[]), "main", &[2, 3], true),
    );

    let mut c = client(&server).await;
    let list = c
        .list(wire::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names(&list), vec!["init", "plain", "some"]);
    let some = &list.pod_resources[2];
    let main = some.containers.iter().find(|c| c.name == "main").unwrap();
    assert_eq!(main.devices[0].device_ids, vec!["cam-0"]);
    assert_eq!(main.devices[0].topology.as_ref().unwrap().nodes[0].id, 0);
    let side = some
        .containers
        .iter()
        .find(|c| c.name == "sidecar")
        .unwrap();
    assert!(side.devices.is_empty());
    let init = &list.pod_resources[0];
    let setup = init.containers.iter().find(|c| c.name == "setup").unwrap();
    assert_eq!(setup.devices[0].device_ids, vec!["cam-1"]);
    let main = init.containers.iter().find(|c| c.name == "main").unwrap();
    assert_eq!(main.cpu_ids, vec![2, 3]);

    let got = c
        .get(wire::GetPodResourcesRequest {
            pod_name: "some".into(),
            pod_namespace: "ns".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.pod_resources.unwrap().name, "some");
}

#[tokio::test]
async fn get_of_an_unknown_pod_is_not_found_and_empty_names_are_invalid() {
    let server = unlimited().await;
    let mut c = client(&server).await;
    let err = c
        .get(wire::GetPodResourcesRequest {
            pod_name: "ghost".into(),
            pod_namespace: "ns".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.message().contains("ghost"));
    let err = c
        .get(wire::GetPodResourcesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn allocatable_merges_steward_devices_with_kubelets_and_cri_topology() {
    let server = unlimited().await;
    server
        .hub
        .set_steward_resources(BTreeSet::from(["steward.dev/cam".to_string()]));
    let mut slots = Allocatable::default();
    slots.devices.insert(
        "steward.dev/cam".into(),
        [("cam-0".to_string(), BTreeSet::from([1]))].into(),
    );
    server.hub.replace_allocatable(Source::Slots, slots);
    let mut kubelet = Allocatable::default();
    kubelet.devices.insert(
        "vendor.com/gpu".into(),
        [("g0".to_string(), BTreeSet::new())].into(),
    );
    kubelet.devices.insert(
        "steward.dev/cam".into(),
        [("stale".to_string(), BTreeSet::new())].into(),
    );
    kubelet.cpus = (0..4).collect();
    server.hub.replace_allocatable(Source::Kubelet, kubelet);
    let cri = Allocatable {
        cpus: (1..4).collect(),
        ..Allocatable::default()
    };
    server.hub.replace_allocatable(Source::Cri, cri);

    let mut c = client(&server).await;
    let a = c
        .get_allocatable_resources(wire::AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<(String, Vec<String>)> = a
        .devices
        .iter()
        .map(|d| (d.resource_name.clone(), d.device_ids.clone()))
        .collect();
    assert_eq!(
        ids,
        vec![
            ("steward.dev/cam".to_string(), vec!["cam-0".to_string()]),
            ("vendor.com/gpu".to_string(), vec!["g0".to_string()]),
        ]
    );
    assert_eq!(a.cpu_ids, vec![1, 2, 3]);
}

#[tokio::test]
async fn calls_beyond_the_rate_limit_are_resource_exhausted() {
    let server = start(WatchLimits::default(), ServeOptions { qps: 1.0, burst: 3 }).await;
    let mut c = client(&server).await;
    let mut codes = Vec::new();
    for _ in 0..6 {
        codes.push(match c.list(wire::ListPodResourcesRequest {}).await {
            Ok(_) => tonic::Code::Ok,
            Err(s) => s.code(),
        });
    }
    assert_eq!(&codes[..3], &[tonic::Code::Ok; 3]);
    assert!(
        codes[3..].contains(&tonic::Code::ResourceExhausted),
        "{codes:?}"
    );
    let m = server.hub.metrics();
    let v1 = steward_podresources::metrics::ApiVersion {
        server_api_version: "v1",
    };
    assert_eq!(m.requests_list.get_or_create(&v1).get(), 6);
    assert!(m.errors_list.get_or_create(&v1).get() >= 1);
}
