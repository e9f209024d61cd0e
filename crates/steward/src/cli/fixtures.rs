//! Objects for unit tests, built through their JSON form (k8s-openapi, whose
//! `Time` the metadata uses, is not a dependency of this crate).

use steward_api::{Instance, SlotClaim};

/// Created at 2023-11-14T22:13:20Z (Unix ms 1_700_000_000_000).
pub const CREATED_MS: i64 = 1_700_000_000_000;

pub fn instance(ns: &str, name: &str, capacity: u32, nodes: &[&str]) -> Instance {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "steward.dev/v1alpha1",
        "kind": "Instance",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": format!("uid-{name}"),
            "creationTimestamp": "2023-11-14T22:13:20Z",
        },
        "spec": {
            "configurationName": "cams",
            "deviceId": format!("dev-{name}"),
            "nodes": nodes,
            "capacity": capacity,
            "properties": {"A": "1", "B": "2"},
            "cdiName": format!("steward.dev/cams={name}"),
        }
    }))
    .unwrap()
}

/// Slot `slot` of `instance` claimed by node-a, held by `pod`
/// (`ns/name`) since [`CREATED_MS`] + 10 s.
pub fn claim(ns: &str, instance: &str, slot: u32, pod: Option<&str>) -> SlotClaim {
    let pod = pod.map(|p| {
        let (pns, name) = p.split_once('/').unwrap();
        serde_json::json!({"namespace": pns, "name": name, "uid": format!("uid-{name}")})
    });
    serde_json::from_value(serde_json::json!({
        "apiVersion": "steward.dev/v1alpha1",
        "kind": "SlotClaim",
        "metadata": {
            "name": format!("{instance}-{slot}"),
            "namespace": ns,
            "creationTimestamp": "2023-11-14T22:13:30Z",
        },
        "spec": {
            "instance": instance,
            "slot": slot,
            "node": "node-a",
            "epoch": 1,
            "pod": pod,
            "container": pod.as_ref().map(|_| "main"),
            "since": CREATED_MS + 10_000,
        }
    }))
    .unwrap()
}
