//! Device health in the ResourceSlices, against the API server stand-in: a
//! device whose discovery reports a fault (the `STEWARD_HEALTH` property
//! of its Instance) is tainted `steward.dev/unhealthy` — `NoSchedule` when
//! fatal, `None` when transient — the allocator keeps a fatal one from new
//! claims but not a transient one, and the taint goes when the fault
//! clears, by the same running agent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClaim, DeviceClass, DeviceClassSpec, DeviceRequest, DeviceSelector,
    ExactDeviceRequest, ResourceClaim, ResourceClaimSpec, ResourceSlice,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use steward_agent::dra::publish;
use steward_api::{Instance, InstanceSpec};
use steward_core::dra::{HEALTH_PROPERTY, HELD_TAINT_KEY, UNHEALTHY_TAINT_KEY};
use steward_testing_apiserver::ApiServer;
use steward_testing_apiserver::dra_alloc::allocate_claim;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";

fn spec(capacity: u32, health: Option<&str>) -> InstanceSpec {
    let mut properties = BTreeMap::from([("DEVNODE".to_owned(), "/dev/video0".to_owned())]);
    if let Some(h) = health {
        properties.insert(HEALTH_PROPERTY.to_owned(), h.to_owned());
    }
    InstanceSpec {
        configuration_name: "cams".into(),
        device_id: "d".into(),
        shared: false,
        nodes: vec!["n1".into()],
        capacity,
        properties,
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

/// (key, value, effect) of one device's taints.
type Taints = Vec<(String, String, String)>;

/// Pool generation, and device → its taints, of node n1's pool.
async fn published(api: &ApiServer) -> (i64, BTreeMap<String, Taints>) {
    let all = Api::<ResourceSlice>::all(api.client())
        .list(&ListParams::default())
        .await
        .unwrap();
    let mut generation = 0;
    let mut out = BTreeMap::new();
    for s in all.items.into_iter().filter(|s| s.spec.pool.name == "n1") {
        generation = generation.max(s.spec.pool.generation);
        for d in s.spec.devices.unwrap_or_default() {
            let taints = d
                .taints
                .unwrap_or_default()
                .into_iter()
                .map(|t| (t.key, t.value.unwrap_or_default(), t.effect))
                .collect();
            out.insert(d.name, taints);
        }
    }
    (generation, out)
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

fn taint(key: &str, value: &str, effect: &str) -> (String, String, String) {
    (key.to_owned(), value.to_owned(), effect.to_owned())
}

/// A claim for one device of Instance `instance` (class `cams`: driver
/// steward.dev).
async fn claim_for(api: &ApiServer, name: &str, instance: &str) {
    let claim = ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "d".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: "cams".into(),
                        selectors: Some(vec![DeviceSelector {
                            cel: Some(CELDeviceSelector {
                                expression: format!(
                                    "device.attributes[\"steward.dev\"].instance == \"{instance}\""
                                ),
                            }),
                        }]),
                        ..ExactDeviceRequest::default()
                    }),
                    ..DeviceRequest::default()
                }]),
                ..DeviceClaim::default()
            }),
        },
        status: None,
    };
    Api::<ResourceClaim>::namespaced(api.client(), NS)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
}

/// The device `claim` was allocated, or the allocator's refusal.
async fn allocate(api: &ApiServer, claim: &str, uid: &str) -> Result<String, String> {
    match allocate_claim(&api.client(), NS, claim, claim, uid, "n1").await {
        Ok(c) => Ok(c
            .status
            .unwrap()
            .allocation
            .unwrap()
            .devices
            .unwrap()
            .results
            .unwrap()[0]
            .device
            .clone()),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test]
async fn a_faulty_device_is_tainted_by_kind_kept_from_new_claims_when_fatal_and_untainted_when_it_recovers()
 {
    let api = ApiServer::start().await.unwrap();
    api.serve_dra();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    Api::<DeviceClass>::all(api.client())
        .create(
            &PostParams::default(),
            &DeviceClass {
                metadata: ObjectMeta {
                    name: Some("cams".into()),
                    ..ObjectMeta::default()
                },
                spec: DeviceClassSpec {
                    selectors: Some(vec![DeviceSelector {
                        cel: Some(CELDeviceSelector {
                            expression: "device.driver == \"steward.dev\"".into(),
                        }),
                    }]),
                    ..DeviceClassSpec::default()
                },
            },
        )
        .await
        .unwrap();
    put(&api, "cam", spec(2, None)).await;
    put(&api, "link", spec(1, None)).await;
    let stop = CancellationToken::new();
    let watches = steward_agent::watches::AgentWatches::new(
        api.client(),
        "n1",
        steward_agent::selection::Selection::all(),
    );
    let task = tokio::spawn(publish(
        api.client(),
        "n1".to_owned(),
        steward_core::dra::Layout::PerSlot,
        watches.instances(),
        watches.slot_claims(),
        stop.clone(),
    ));
    let healthy: BTreeMap<String, Taints> = ["cam-0", "cam-1", "link-0"]
        .iter()
        .map(|d| (d.to_string(), Vec::new()))
        .collect();
    let (g1, _) = until("published", || published(&api), |(_, d)| d == &healthy).await;

    // cam reports a fatal fault, link a transient one: every device of
    // each is tainted, the effect by kind, the reason as the value.
    put(
        &api,
        "cam",
        spec(2, Some("fatal: ECC error (uncorrectable)")),
    )
    .await;
    put(&api, "link", spec(1, Some("transient: link flapping"))).await;
    let fatal = taint(UNHEALTHY_TAINT_KEY, "ECC-error-uncorrectable", "NoSchedule");
    let transient = taint(UNHEALTHY_TAINT_KEY, "link-flapping", "None");
    let faulty = BTreeMap::from([
        ("cam-0".to_owned(), vec![fatal.clone()]),
        ("cam-1".to_owned(), vec![fatal.clone()]),
        ("link-0".to_owned(), vec![transient.clone()]),
    ]);
    let (g2, _) = until("tainted by kind", || published(&api), |(_, d)| d == &faulty).await;
    assert!(g2 > g1, "the pool's generation moves with its taints");

    // A new claim does not get a fatally faulty device; a transient fault
    // does not keep one from it.
    claim_for(&api, "wants-cam", "cam").await;
    let refused = allocate(&api, "wants-cam", "uid-1").await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("tainted")),
        "{refused:?}"
    );
    claim_for(&api, "wants-link", "link").await;
    assert_eq!(
        allocate(&api, "wants-link", "uid-2").await.as_deref(),
        Ok("link-0")
    );

    // A second, different fatal reason replaces the value; healthy again
    // untaints, without restarting the agent.
    put(&api, "cam", spec(2, Some("FATAL overheated"))).await;
    until(
        "the new reason",
        || published(&api),
        |(_, d)| d["cam-0"] == [taint(UNHEALTHY_TAINT_KEY, "overheated", "NoSchedule")],
    )
    .await;
    put(&api, "cam", spec(2, Some("healthy"))).await;
    put(&api, "link", spec(1, None)).await;
    let (g3, _) = until("untainted", || published(&api), |(_, d)| d == &healthy).await;
    assert!(g3 > g2);
    assert_eq!(
        allocate(&api, "wants-cam", "uid-1").await.as_deref(),
        Ok("cam-0")
    );
    // Nothing more is written while nothing changes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(published(&api).await, (g3, healthy));
    assert_ne!(HELD_TAINT_KEY, UNHEALTHY_TAINT_KEY);
    stop.cancel();
    task.await.unwrap();
}
