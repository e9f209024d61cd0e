//! Two nodes' agents publishing ResourceSlices against the API server
//! stand-in: a pool per node, a shared Instance published once, writes only
//! on change with the pool generation moving, a shared pool handed over to
//! its next writer, and a node's slices removed when its agent stops; the
//! standard topology attributes, and a claim aligning a device with another
//! driver's by them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, Device, DeviceAttribute, DeviceClaim, DeviceClass, DeviceClassSpec,
    DeviceConstraint, DeviceRequest, DeviceSelector, ExactDeviceRequest, ResourceClaim,
    ResourceClaimSpec, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use steward_agent::dra::{WRITER_LABEL, publish};
use steward_api::{Instance, InstanceSpec};
use steward_testing_apiserver::ApiServer;
use steward_testing_apiserver::dra_alloc::allocate_claim;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";

struct Agent {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Agent {
    fn start(api: &ApiServer, node: &str) -> Self {
        let stop = CancellationToken::new();
        // The agent's shared watches of the Instances and SlotClaims.
        let watches = steward_agent::watches::AgentWatches::new(
            api.client(),
            node,
            steward_agent::selection::Selection::all(),
        );
        let task = tokio::spawn(publish(
            api.client(),
            node.to_owned(),
            steward_core::dra::Layout::PerSlot,
            watches.instances(),
            watches.slot_claims(),
            stop.clone(),
        ));
        Self { stop, task }
    }

    async fn stop(mut self) {
        self.stop.cancel();
        (&mut self.task).await.unwrap();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn spec(capacity: u32, nodes: &[&str]) -> InstanceSpec {
    InstanceSpec {
        configuration_name: "cams".into(),
        device_id: "d".into(),
        shared: nodes.len() > 1,
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        capacity,
        properties: BTreeMap::from([
            ("DEVNODE".into(), "/dev/video0".into()),
            ("FIRMWARE".into(), "1.4.2".into()),
            ("not.an.identifier".into(), "x".into()),
        ]),
        mounts: Vec::new(),
        device_specs: Vec::new(),
        cdi_name: String::new(),
    }
}

async fn put(api: &ApiServer, name: &str, s: InstanceSpec) {
    let instances = Api::<Instance>::namespaced(api.client(), NS);
    match instances.get_opt(name).await.unwrap() {
        Some(mut i) => {
            i.spec = s;
            instances
                .replace(name, &PostParams::default(), &i)
                .await
                .unwrap();
        }
        None => {
            instances
                .create(&PostParams::default(), &Instance::new(name, s))
                .await
                .unwrap();
        }
    }
}

/// pool → (generation, writer, devices) of every slice in the API.
async fn pools(api: &ApiServer) -> BTreeMap<String, (i64, String, Vec<String>)> {
    let all = Api::<ResourceSlice>::all(api.client())
        .list(&ListParams::default())
        .await
        .unwrap();
    let mut out: BTreeMap<String, (i64, String, Vec<String>)> = BTreeMap::new();
    for s in all.items {
        let writer = s
            .metadata
            .labels
            .unwrap_or_default()
            .get(WRITER_LABEL)
            .cloned()
            .unwrap_or_default();
        let e = out.entry(s.spec.pool.name.clone()).or_insert((
            s.spec.pool.generation,
            writer,
            Vec::new(),
        ));
        e.2.extend(
            s.spec
                .devices
                .unwrap_or_default()
                .into_iter()
                .map(|d| d.name),
        );
        e.2.sort();
    }
    out
}

/// The node names a shared pool's slice selects.
fn selected(slice: &ResourceSlice) -> Vec<String> {
    let term = &slice
        .spec
        .node_selector
        .as_ref()
        .unwrap()
        .node_selector_terms[0];
    term.match_fields.as_ref().unwrap()[0]
        .values
        .clone()
        .unwrap_or_default()
}

async fn until<T: std::fmt::Debug>(
    what: &str,
    mut get: impl AsyncFnMut() -> T,
    ok: impl Fn(&T) -> bool,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let v = get().await;
        if ok(&v) {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never {what}: {v:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn entry(generation: i64, writer: &str, devices: &[&str]) -> (i64, String, Vec<String>) {
    (
        generation,
        writer.to_owned(),
        devices.iter().map(|d| d.to_string()).collect(),
    )
}

#[tokio::test]
async fn each_device_is_published_once_and_written_only_on_change() {
    let api = ApiServer::start().await.unwrap();
    api.serve_dra();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    put(&api, "cam-a", spec(2, &["n1"])).await;
    put(&api, "cam-s", spec(2, &["n1", "n2", "n3"])).await;
    put(&api, "cam-c", spec(1, &["n2"])).await;
    let n1 = Agent::start(&api, "n1");
    let n2 = Agent::start(&api, "n2");

    let want = BTreeMap::from([
        ("n1".to_owned(), entry(1, "n1", &["cam-a-0", "cam-a-1"])),
        ("n2".to_owned(), entry(1, "n2", &["cam-c-0"])),
        (
            "shared/cam-s".to_owned(),
            entry(1, "n1", &["cam-s-0", "cam-s-1"]),
        ),
    ]);
    until("published", || pools(&api), |p| p == &want).await;
    let slices = Api::<ResourceSlice>::all(api.client());
    let all = slices.list(&ListParams::default()).await.unwrap().items;
    let shared = all
        .iter()
        .find(|s| s.spec.pool.name == "shared/cam-s")
        .unwrap();
    assert_eq!(shared.spec.node_name, None);
    assert_eq!(selected(shared), ["n1", "n2", "n3"]);
    let local = all.iter().find(|s| s.spec.pool.name == "n1").unwrap();
    assert_eq!(local.spec.node_name.as_deref(), Some("n1"));
    let attrs = local.spec.devices.as_ref().unwrap()[0]
        .attributes
        .clone()
        .unwrap();
    assert_eq!(attrs["FIRMWARE"].version.as_deref(), Some("1.4.2"));
    assert_eq!(attrs["slot"].int, Some(0));
    assert_eq!(attrs["instance"].string.as_deref(), Some("cam-a"));
    assert!(!attrs.contains_key("not.an.identifier"));
    let versions: BTreeMap<String, Option<String>> = all
        .iter()
        .map(|s| {
            (
                s.metadata.name.clone().unwrap(),
                s.metadata.resource_version.clone(),
            )
        })
        .collect();

    // cam-a grows: only n1's pool is rewritten, its generation moves.
    put(&api, "cam-a", spec(3, &["n1"])).await;
    let got = until(
        "cam-a grown",
        || pools(&api),
        |p| p["n1"] == entry(2, "n1", &["cam-a-0", "cam-a-1", "cam-a-2"]),
    )
    .await;
    assert_eq!(got["shared/cam-s"].0, 1);
    assert_eq!(got["n2"].0, 1);
    for s in slices.list(&ListParams::default()).await.unwrap().items {
        if s.spec.pool.name != "n1" {
            assert_eq!(
                versions[s.metadata.name.as_ref().unwrap()],
                s.metadata.resource_version,
                "{} rewritten without a change",
                s.spec.pool.name
            );
        }
    }

    // n1 no longer sees the shared camera: n2 takes its pool over.
    put(&api, "cam-s", spec(2, &["n2", "n3"])).await;
    until(
        "shared pool handed over",
        || pools(&api),
        |p| p.get("shared/cam-s").is_some_and(|e| e.1 == "n2"),
    )
    .await;
    // Whether n1 deleted it first (n2 then creates it at generation 1) or
    // n2 adopted it (generation 2), the pool is whole and selects n2, n3.
    let shared = slices
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|s| s.spec.pool.name == "shared/cam-s")
        .unwrap();
    assert_eq!(selected(&shared), ["n2", "n3"]);
    assert_eq!(shared.spec.pool.resource_slice_count, 1);

    // cam-c goes: n2's own pool goes with it.
    Api::<Instance>::namespaced(api.client(), NS)
        .delete("cam-c", &DeleteParams::default())
        .await
        .unwrap();
    until(
        "n2's pool removed",
        || pools(&api),
        |p| !p.contains_key("n2"),
    )
    .await;

    // n1's agent stops: its slices go; n2's stay.
    n1.stop().await;
    let left = pools(&api).await;
    assert_eq!(
        left.keys().collect::<Vec<_>>(),
        ["shared/cam-s"],
        "{left:?}"
    );
    n2.stop().await;
    assert!(pools(&api).await.is_empty());
}

/// A test-made slice of another driver on `node`: one device per NUMA node
/// given, carrying the standard attribute (what a DRA CPU driver publishes).
fn other_driver_slice(node: &str, numa: &[i64]) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(format!("cpus-{node}")),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: "cpu.example.com".into(),
            pool: ResourcePool {
                name: node.into(),
                generation: 1,
                resource_slice_count: 1,
            },
            node_name: Some(node.into()),
            devices: Some(
                numa.iter()
                    .map(|n| Device {
                        name: format!("cpus-numa{n}"),
                        attributes: Some(BTreeMap::from([(
                            "resource.kubernetes.io/numaNode".to_owned(),
                            DeviceAttribute {
                                int: Some(*n),
                                ..DeviceAttribute::default()
                            },
                        )])),
                        ..Device::default()
                    })
                    .collect(),
            ),
            ..ResourceSliceSpec::default()
        },
    }
}

fn class(name: &str, driver: &str) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!("device.driver == \"{driver}\""),
                }),
            }]),
            ..DeviceClassSpec::default()
        },
    }
}

fn exactly(name: &str, class: &str) -> DeviceRequest {
    DeviceRequest {
        name: name.into(),
        exactly: Some(ExactDeviceRequest {
            device_class_name: class.into(),
            ..ExactDeviceRequest::default()
        }),
        ..DeviceRequest::default()
    }
}

#[tokio::test]
async fn devices_carry_the_standard_topology_attributes_discovery_knows_and_align_by_them() {
    let api = ApiServer::start().await.unwrap();
    api.serve_dra();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let with = |numa: Option<&str>, devpath: &str| {
        let mut s = spec(1, &["n1"]);
        if let Some(n) = numa {
            s.properties.insert("NUMA_NODE".into(), n.into());
        }
        s.properties.insert("UDEV_DEVPATH".into(), devpath.into());
        s
    };
    let usb = "/devices/pci0000:00/0000:00:14.0/usb1/1-1";
    put(&api, "cam-far", with(Some("0"), usb)).await;
    put(
        &api,
        "cam-near",
        with(Some("1"), "/devices/pci0000:40/0000:40:01.0/usb3/3-1"),
    )
    .await;
    put(
        &api,
        "cam-spans",
        with(Some("0,1"), "/devices/virtual/video4linux/v0"),
    )
    .await;
    put(&api, "cam-unknown", with(None, usb)).await;
    let n1 = Agent::start(&api, "n1");
    let want = BTreeMap::from([(
        "n1".to_owned(),
        entry(
            1,
            "n1",
            &["cam-far-0", "cam-near-0", "cam-spans-0", "cam-unknown-0"],
        ),
    )]);
    until("published", || pools(&api), |p| p == &want).await;
    let slices = Api::<ResourceSlice>::all(api.client());
    let all = slices.list(&ListParams::default()).await.unwrap().items;
    let topology: BTreeMap<String, (Option<i64>, Option<String>)> = all[0]
        .spec
        .devices
        .clone()
        .unwrap()
        .into_iter()
        .map(|d| {
            let a = d.attributes.unwrap_or_default();
            let numa = a.get("resource.kubernetes.io/numaNode").and_then(|v| v.int);
            let root = a
                .get("resource.kubernetes.io/pcieRoot")
                .and_then(|v| v.string.clone());
            (d.name, (numa, root))
        })
        .collect();
    let root = |r: &str| Some(r.to_owned());
    assert_eq!(
        topology,
        BTreeMap::from([
            ("cam-far-0".to_owned(), (Some(0), root("pci0000:00"))),
            ("cam-near-0".to_owned(), (Some(1), root("pci0000:40"))),
            // Two NUMA nodes listed, a virtual device: neither is guessed.
            ("cam-spans-0".to_owned(), (None, None)),
            ("cam-unknown-0".to_owned(), (None, root("pci0000:00"))),
        ])
    );

    // Another driver has CPUs left on NUMA 1 only: one claim asks for a
    // camera and CPUs on one NUMA node and gets the camera of NUMA 1,
    // although cam-far-0 comes first.
    slices
        .create(&PostParams::default(), &other_driver_slice("n1", &[1]))
        .await
        .unwrap();
    let classes: Api<DeviceClass> = Api::all(api.client());
    for c in [
        class("cams", "steward.dev"),
        class("cpus", "cpu.example.com"),
    ] {
        classes.create(&PostParams::default(), &c).await.unwrap();
    }
    let claims: Api<ResourceClaim> = Api::namespaced(api.client(), NS);
    let claim = ResourceClaim {
        metadata: ObjectMeta {
            name: Some("aligned".into()),
            ..ObjectMeta::default()
        },
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![exactly("cam", "cams"), exactly("cpu", "cpus")]),
                constraints: Some(vec![DeviceConstraint {
                    match_attribute: Some("resource.kubernetes.io/numaNode".into()),
                    ..DeviceConstraint::default()
                }]),
                ..DeviceClaim::default()
            }),
        },
        status: None,
    };
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let got = allocate_claim(&api.client(), NS, "aligned", "pod", "uid-1", "n1")
        .await
        .unwrap();
    let results: Vec<(String, String)> = got
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap()
        .into_iter()
        .map(|r| (r.request, r.device))
        .collect();
    assert_eq!(
        results,
        [
            ("cam".to_owned(), "cam-near-0".to_owned()),
            ("cpu".to_owned(), "cpus-numa1".to_owned())
        ]
    );
    n1.stop().await;
}
