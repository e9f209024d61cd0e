//! The DRA allocator over the stand-in: exact counts, CEL selectors on
//! attributes, no device handed out twice, node scoping, errors; and the
//! ResourceClaim status subresource it writes through.
// Test helpers: panicking on an unexpected API answer is the point.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use common::ApiServer;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, Device, DeviceAttribute, DeviceClaim, DeviceClass, DeviceClassSpec,
    DeviceRequest, DeviceSelector, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use steward_testing_apiserver::dra_alloc::{
    AllocError, allocate_claim, deallocate_claim, unreserve_claim,
};

const DRIVER: &str = "steward.dev";

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    }
}

fn device(name: &str, configuration: &str) -> Device {
    Device {
        name: name.into(),
        attributes: Some(
            [
                (
                    "configuration".to_string(),
                    DeviceAttribute {
                        string: Some(configuration.into()),
                        ..Default::default()
                    },
                ),
                (
                    "other.io/slot".to_string(),
                    DeviceAttribute {
                        int: Some(name.len() as i64),
                        ..Default::default()
                    },
                ),
            ]
            .into_iter()
            .collect(),
        ),
        ..Default::default()
    }
}

fn slice_spec(pool: &str, generation: i64, devices: Vec<Device>) -> ResourceSliceSpec {
    ResourceSliceSpec {
        driver: DRIVER.into(),
        pool: ResourcePool {
            name: pool.into(),
            generation,
            resource_slice_count: 1,
        },
        devices: Some(devices),
        ..Default::default()
    }
}

async fn put_slice(api: &ApiServer, name: &str, spec: ResourceSliceSpec) {
    let slices: Api<ResourceSlice> = Api::all(api.client());
    slices
        .create(
            &PostParams::default(),
            &ResourceSlice {
                metadata: meta(name),
                spec,
            },
        )
        .await
        .unwrap();
}

fn cel(expr: &str) -> DeviceSelector {
    DeviceSelector {
        cel: Some(CELDeviceSelector {
            expression: expr.into(),
        }),
    }
}

async fn put_class(api: &ApiServer, name: &str, selectors: &[&str]) {
    let classes: Api<DeviceClass> = Api::all(api.client());
    classes
        .create(
            &PostParams::default(),
            &DeviceClass {
                metadata: meta(name),
                spec: DeviceClassSpec {
                    selectors: Some(selectors.iter().map(|s| cel(s)).collect()),
                    ..Default::default()
                },
            },
        )
        .await
        .unwrap();
}

fn request(name: &str, class: &str, count: Option<i64>, selectors: &[&str]) -> DeviceRequest {
    DeviceRequest {
        name: name.into(),
        exactly: Some(ExactDeviceRequest {
            device_class_name: class.into(),
            count,
            selectors: (!selectors.is_empty()).then(|| selectors.iter().map(|s| cel(s)).collect()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn put_claim(api: &ApiServer, name: &str, requests: Vec<DeviceRequest>) {
    let claims: Api<ResourceClaim> = Api::default_namespaced(api.client());
    claims
        .create(
            &PostParams::default(),
            &ResourceClaim {
                metadata: meta(name),
                spec: ResourceClaimSpec {
                    devices: Some(DeviceClaim {
                        requests: Some(requests),
                        ..Default::default()
                    }),
                },
                status: None,
            },
        )
        .await
        .unwrap();
}

fn devices_of(claim: &ResourceClaim) -> Vec<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .map(|r| r.iter().map(|r| r.device.clone()).collect())
        .unwrap_or_default()
}

fn reserved_uids(claim: &ResourceClaim) -> Vec<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .map(|r| r.iter().map(|r| r.uid.clone()).collect())
        .unwrap_or_default()
}

async fn dra_server() -> ApiServer {
    let api = ApiServer::start().await.unwrap();
    api.serve_dra();
    api
}

const CAM: &str = r#"device.attributes["steward.dev"].configuration == "cam""#;

#[tokio::test]
async fn exact_counts_selectors_and_no_device_twice() {
    let api = dra_server().await;
    let client = api.client();
    put_slice(
        &api,
        "n1-slice",
        ResourceSliceSpec {
            node_name: Some("n1".into()),
            ..slice_spec(
                "n1",
                1,
                vec![
                    device("d0", "cam"),
                    device("d1", "cam"),
                    device("d2", "mic"),
                ],
            )
        },
    )
    .await;
    put_class(&api, "steward", &[r#"device.driver == "steward.dev""#]).await;
    put_claim(
        &api,
        "two-cams",
        vec![request("cams", "steward", Some(2), &[CAM])],
    )
    .await;
    put_claim(
        &api,
        "one-cam",
        vec![request("cam", "steward", None, &[CAM])],
    )
    .await;
    put_claim(&api, "anything", vec![request("any", "steward", None, &[])]).await;

    let a = allocate_claim(&client, "default", "two-cams", "pa", "uid-a", "n1")
        .await
        .unwrap();
    assert_eq!(devices_of(&a), ["d0", "d1"]);
    assert_eq!(reserved_uids(&a), ["uid-a"]);
    let status = a.status.as_ref().unwrap();
    let reserved = &status.reserved_for.as_ref().unwrap()[0];
    assert_eq!(
        (reserved.resource.as_str(), reserved.name.as_str()),
        ("pods", "pa")
    );
    let results = status
        .allocation
        .as_ref()
        .unwrap()
        .devices
        .as_ref()
        .unwrap();
    let r0 = &results.results.as_ref().unwrap()[0];
    assert_eq!(
        (r0.request.as_str(), r0.driver.as_str(), r0.pool.as_str()),
        ("cams", DRIVER, "n1")
    );
    let sel = status
        .allocation
        .as_ref()
        .unwrap()
        .node_selector
        .as_ref()
        .unwrap();
    let field = &sel.node_selector_terms[0].match_fields.as_ref().unwrap()[0];
    assert_eq!(field.key, "metadata.name");
    assert_eq!(field.values.as_deref(), Some(&["n1".to_string()][..]));
    // What was written is what the API server has.
    let claims: Api<ResourceClaim> = Api::default_namespaced(client.clone());
    assert_eq!(
        devices_of(&claims.get("two-cams").await.unwrap()),
        ["d0", "d1"]
    );

    // Both cams are taken: the request cannot be satisfied, and says why.
    let err = allocate_claim(&client, "default", "one-cam", "pb", "uid-b", "n1")
        .await
        .unwrap_err();
    match &err {
        AllocError::Unsatisfiable {
            request, message, ..
        } => {
            assert_eq!(request, "cam");
            assert!(
                message.contains("0 free") && message.contains("2 more are allocated"),
                "{message}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("default/one-cam"), "{err}");
    assert!(devices_of(&claims.get("one-cam").await.unwrap()).is_empty());

    // A request without selectors gets the remaining device.
    let c = allocate_claim(&client, "default", "anything", "pc", "uid-c", "n1")
        .await
        .unwrap();
    assert_eq!(devices_of(&c), ["d2"]);

    // Releasing the first claim frees its cams.
    let released = deallocate_claim(&client, "default", "two-cams")
        .await
        .unwrap();
    assert!(released.status.as_ref().unwrap().allocation.is_none());
    assert!(reserved_uids(&released).is_empty());
    let b = allocate_claim(&client, "default", "one-cam", "pb", "uid-b", "n1")
        .await
        .unwrap();
    assert_eq!(devices_of(&b), ["d0"]);
}

#[tokio::test]
async fn node_scoping_and_pool_generations() {
    let api = dra_server().await;
    let client = api.client();
    let on = |node: &str| Some(node.to_string());
    put_slice(
        &api,
        "n1",
        ResourceSliceSpec {
            node_name: on("n1"),
            ..slice_spec("n1", 1, vec![device("n1-a", "cam")])
        },
    )
    .await;
    put_slice(
        &api,
        "n2",
        ResourceSliceSpec {
            node_name: on("n2"),
            ..slice_spec("n2", 1, vec![device("n2-a", "cam")])
        },
    )
    .await;
    // An outdated generation of n2's pool is ignored.
    put_slice(
        &api,
        "n2-old",
        ResourceSliceSpec {
            node_name: on("n2"),
            ..slice_spec("n2", 0, vec![device("n2-stale", "cam")])
        },
    )
    .await;
    let selector = |node: &str| NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.into()]),
            }]),
            ..Default::default()
        }],
    };
    put_slice(
        &api,
        "shared-n2",
        ResourceSliceSpec {
            node_selector: Some(selector("n2")),
            ..slice_spec("shared-a", 1, vec![device("sh-a", "cam")])
        },
    )
    .await;
    let by_label = NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "kubernetes.io/hostname".into(),
                operator: "In".into(),
                values: Some(vec!["n1".into()]),
            }]),
            ..Default::default()
        }],
    };
    put_slice(
        &api,
        "shared-n1",
        ResourceSliceSpec {
            node_selector: Some(by_label),
            ..slice_spec("shared-b", 1, vec![device("sh-b", "cam")])
        },
    )
    .await;
    put_slice(
        &api,
        "everywhere",
        ResourceSliceSpec {
            all_nodes: Some(true),
            ..slice_spec("global", 1, vec![device("g", "cam")])
        },
    )
    .await;
    put_class(&api, "steward", &[r#"device.driver == "steward.dev""#]).await;
    put_claim(&api, "all-n2", vec![request("r", "steward", None, &[])]).await;
    let all_mode = DeviceRequest {
        exactly: Some(ExactDeviceRequest {
            allocation_mode: Some("All".into()),
            ..request("r", "steward", None, &[]).exactly.unwrap()
        }),
        ..request("r", "steward", None, &[])
    };
    put_claim(&api, "every-n2", vec![all_mode]).await;
    put_claim(&api, "n1-four", vec![request("r", "steward", Some(4), &[])]).await;

    let all = allocate_claim(&client, "default", "every-n2", "p", "uid-1", "n2")
        .await
        .unwrap();
    let got: BTreeSet<String> = devices_of(&all).into_iter().collect();
    let want: BTreeSet<String> = ["g", "n2-a", "sh-a"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(got, want);

    // n1 sees n1-a, sh-b (hostname label) and g, which is taken by now.
    let err = allocate_claim(&client, "default", "n1-four", "p", "uid-2", "n1")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AllocError::Unsatisfiable { message, .. } if message.contains("2 free") && message.contains("1 more")),
        "{err}"
    );
    deallocate_claim(&client, "default", "every-n2")
        .await
        .unwrap();
    let err = allocate_claim(&client, "default", "n1-four", "p", "uid-2", "n1")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("3 free"), "{err}");
}

#[tokio::test]
async fn reservations_errors_and_release() {
    let api = dra_server().await;
    let client = api.client();
    put_slice(
        &api,
        "s",
        ResourceSliceSpec {
            node_name: Some("n1".into()),
            ..slice_spec("n1", 1, vec![device("d0", "cam"), device("d1", "mic")])
        },
    )
    .await;
    put_class(&api, "steward", &[r#"device.driver == "steward.dev""#]).await;
    put_class(&api, "careless", &[]).await;
    put_claim(&api, "shared", vec![request("r", "steward", None, &[CAM])]).await;

    // A second pod only joins reservedFor; the allocation stays.
    let first = allocate_claim(&client, "default", "shared", "p1", "uid-1", "n1")
        .await
        .unwrap();
    let again = allocate_claim(&client, "default", "shared", "p1", "uid-1", "n1")
        .await
        .unwrap();
    assert_eq!(reserved_uids(&again), ["uid-1"]);
    let second = allocate_claim(&client, "default", "shared", "p2", "uid-2", "n1")
        .await
        .unwrap();
    assert_eq!(reserved_uids(&second), ["uid-1", "uid-2"]);
    assert_eq!(devices_of(&second), devices_of(&first));
    // ... but not on another node.
    let err = allocate_claim(&client, "default", "shared", "p3", "uid-3", "n2")
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("cannot be used on node n2"),
        "{err}"
    );

    // The resourceclaim controller's release: the last consumer deallocates.
    let one_left = unreserve_claim(&client, "default", "shared", "uid-1")
        .await
        .unwrap();
    assert_eq!(reserved_uids(&one_left), ["uid-2"]);
    assert_eq!(devices_of(&one_left), ["d0"]);
    let none_left = unreserve_claim(&client, "default", "shared", "uid-2")
        .await
        .unwrap();
    assert!(none_left.status.as_ref().unwrap().allocation.is_none());

    // A missing attribute is a CEL run-time error, like kube-scheduler's.
    put_claim(
        &api,
        "typo",
        vec![request(
            "r",
            "steward",
            None,
            &[r#"device.attributes["steward.dev"].configurashun == "cam""#],
        )],
    )
    .await;
    let err = allocate_claim(&client, "default", "typo", "p", "uid-4", "n1")
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("CEL runtime error: no such key: configurashun"),
        "{err}"
    );
    // Syntax outside the supported subset is refused when compiling.
    put_claim(
        &api,
        "unsupported",
        vec![request(
            "r",
            "steward",
            None,
            &[r#"has(device.attributes["steward.dev"].x)"#],
        )],
    )
    .await;
    let err = allocate_claim(&client, "default", "unsupported", "p", "uid-5", "n1")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("CEL compile error"), "{err}");
    put_claim(&api, "no-class", vec![request("r", "missing", None, &[])]).await;
    let err = allocate_claim(&client, "default", "no-class", "p", "uid-6", "n1")
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("DeviceClass missing does not exist"),
        "{err}"
    );
    // A class without selectors accepts any device; d0 is free again.
    put_claim(&api, "careless", vec![request("r", "careless", None, &[])]).await;
    let got = allocate_claim(&client, "default", "careless", "p", "uid-7", "n1")
        .await
        .unwrap();
    assert_eq!(devices_of(&got), ["d0"]);
}

#[tokio::test]
async fn concurrent_allocations_never_share_a_device() {
    let api = dra_server().await;
    let client = api.client();
    let devices = (0..4).map(|i| device(&format!("d{i}"), "cam")).collect();
    put_slice(
        &api,
        "s",
        ResourceSliceSpec {
            node_name: Some("n1".into()),
            ..slice_spec("n1", 1, devices)
        },
    )
    .await;
    put_class(&api, "steward", &[r#"device.driver == "steward.dev""#]).await;
    for i in 0..5 {
        put_claim(
            &api,
            &format!("c{i}"),
            vec![request("r", "steward", None, &[CAM])],
        )
        .await;
    }
    let runs = (0..5).map(|i| {
        let client = client.clone();
        tokio::spawn(async move {
            allocate_claim(
                &client,
                "default",
                &format!("c{i}"),
                "p",
                &format!("uid-{i}"),
                "n1",
            )
            .await
        })
    });
    let mut got = Vec::new();
    let mut failed = 0;
    for r in futures::future::join_all(runs).await {
        match r.unwrap() {
            Ok(c) => got.extend(devices_of(&c)),
            Err(AllocError::Unsatisfiable { .. }) => failed += 1,
            Err(e) => panic!("{e}"),
        }
    }
    let distinct: BTreeSet<&String> = got.iter().collect();
    assert_eq!((got.len(), distinct.len(), failed), (4, 4, 1), "{got:?}");
}

#[tokio::test]
async fn claim_status_is_a_subresource_with_optimistic_concurrency() {
    let api = dra_server().await;
    let client = api.client();
    put_class(&api, "steward", &[]).await;
    put_claim(&api, "c", vec![request("r", "steward", None, &[])]).await;
    let claims: Api<ResourceClaim> = Api::default_namespaced(client.clone());
    let read = claims.get("c").await.unwrap();
    let mut with_status = read.clone();
    with_status.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
        reserved_for: Some(vec![
            k8s_openapi::api::resource::v1::ResourceClaimConsumerReference {
                resource: "pods".into(),
                name: "p".into(),
                uid: "u".into(),
                ..Default::default()
            },
        ]),
        ..Default::default()
    });
    // The main resource ignores status (the label change moves the
    // resourceVersion on).
    with_status.metadata.labels = Some([("k".to_string(), "v".to_string())].into());
    let main = claims
        .replace("c", &PostParams::default(), &with_status)
        .await
        .unwrap();
    assert!(reserved_uids(&main).is_empty());
    assert_ne!(
        main.metadata.resource_version,
        read.metadata.resource_version
    );
    // A status write with the stale resourceVersion is refused.
    let err = claims
        .replace_status("c", &PostParams::default(), &with_status)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.is_conflict()),
        "{err:?}"
    );
    with_status.metadata.resource_version = main.metadata.resource_version.clone();
    let written = claims
        .replace_status("c", &PostParams::default(), &with_status)
        .await
        .unwrap();
    assert_eq!(reserved_uids(&written), ["u"]);
}
