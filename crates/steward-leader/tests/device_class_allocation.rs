//! The DeviceClasses `steward controller --dra-device-classes` writes select
//! exactly their Configuration's devices when a ResourceClaim is allocated
//! against them: ResourceSlices as the agents publish them (attribute
//! `configuration` in the driver's domain) beside another driver's devices,
//! allocated by the API server stand-in's allocator, which evaluates the
//! classes' CEL as kube-scheduler does (a missing attribute is an error,
//! `false && <error>` is false).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use steward_api::{Configuration, ConfigurationSpec};
use steward_leader::{ControllerConfig, run};
use steward_testing_apiserver::ApiServer;
use steward_testing_apiserver::dra_alloc::allocate_claim;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

/// A device as the agent publishes slot `slot` of Instance `instance`.
fn device(name: &str, configuration: &str, instance: &str, slot: i64) -> Value {
    device_in("default", name, configuration, instance, slot)
}

fn device_in(namespace: &str, name: &str, configuration: &str, instance: &str, slot: i64) -> Value {
    json!({
        "name": name,
        "attributes": {
            "namespace": {"string": namespace},
            "configuration": {"string": configuration},
            "instance": {"string": instance},
            "shared": {"bool": false},
            "slot": {"int": slot},
        },
    })
}

async fn create<K>(api: Api<K>, v: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(v).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap()
}

/// The claim of the docs (docs/DRA.md): `count` devices (or all) of the
/// class of Configuration `configuration` in `default`, for a pod.
async fn claim_and_pod(api: &ApiServer, name: &str, configuration: &str, all: bool) -> Pod {
    let mode = if all {
        json!({"allocationMode": "All"})
    } else {
        json!({"count": 1})
    };
    let mut exactly = json!({"deviceClassName": format!("{configuration}.default.steward.dev")});
    exactly
        .as_object_mut()
        .unwrap()
        .extend(mode.as_object().unwrap().clone());
    create(
        Api::<ResourceClaim>::namespaced(api.client(), "default"),
        json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "camera", "exactly": exactly}]}},
        }),
    )
    .await;
    create(
        Api::<Pod>::namespaced(api.client(), "default"),
        json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "resourceClaims": [{"name": "camera", "resourceClaimName": name}],
                "containers": [{"name": "main", "image": "busybox",
                    "resources": {"claims": [{"name": "camera"}]}}],
            },
        }),
    )
    .await
}

fn allocated(claim: &ResourceClaim) -> BTreeSet<(String, String, String)> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .map(|a| {
            a.devices
                .as_ref()
                .and_then(|d| d.results.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|r| (r.driver, r.pool, r.device))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_a_configurations_class_gets_only_that_configurations_devices() {
    let api = ApiServer::start().await.unwrap();
    api.serve_dra();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    create(
        Api::<Namespace>::all(api.client()),
        json!({"metadata": {"name": "steward-system"}}),
    )
    .await;
    create(
        Api::<Node>::all(api.client()),
        json!({"metadata": {"name": "n1"}}),
    )
    .await;
    for name in ["cams", "mics"] {
        let c = Configuration::new(name, ConfigurationSpec::new("debug-echo", ""));
        Api::<Configuration>::namespaced(api.client(), "default")
            .create(&PostParams::default(), &c)
            .await
            .unwrap();
    }
    create(
        Api::<ResourceSlice>::all(api.client()),
        json!({
            "metadata": {"name": "steward-n1-0"},
            "spec": {
                "driver": "steward.dev",
                "nodeName": "n1",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    device("cam-a-0", "cams", "cam-a", 0),
                    device("cam-a-1", "cams", "cam-a", 1),
                    device("mic-0", "mics", "mic", 0),
                    // A Configuration of the same name in another
                    // namespace: not the class's.
                    device_in("other", "cam-o-0", "cams", "cam-o", 0),
                ],
            },
        }),
    )
    .await;
    // Another driver's device, without steward's attributes: the driver
    // test keeps the class's CEL from erring on it.
    create(
        Api::<ResourceSlice>::all(api.client()),
        json!({
            "metadata": {"name": "gpu-n1"},
            "spec": {
                "driver": "gpu.example.com",
                "nodeName": "n1",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "attributes": {"model": {"string": "x"}}}],
            },
        }),
    )
    .await;

    let mut cfg = ControllerConfig::new("steward-system", "replica-a");
    cfg.device_classes = true;
    cfg.lease.retry_period = Duration::from_millis(100);
    let stop = CancellationToken::new();
    let controller = tokio::spawn(run(api.client(), cfg, stop.clone()));
    let classes = Api::<DeviceClass>::all(api.client());
    let deadline = tokio::time::Instant::now() + WAIT;
    for name in ["cams.default.steward.dev", "mics.default.steward.dev"] {
        while classes.get_opt(name).await.unwrap().is_none() {
            assert!(tokio::time::Instant::now() < deadline, "no class {name}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let dev = |d: &str| ("steward.dev".to_owned(), "n1".to_owned(), d.to_owned());
    let pod = claim_and_pod(&api, "all-cams", "cams", true).await;
    let uid = pod.metadata.uid.clone().unwrap();
    let claim = allocate_claim(&api.client(), "default", "all-cams", "all-cams", &uid, "n1")
        .await
        .unwrap();
    assert_eq!(
        allocated(&claim),
        [dev("cam-a-0"), dev("cam-a-1")].into_iter().collect()
    );
    let pod = claim_and_pod(&api, "one-mic", "mics", false).await;
    let uid = pod.metadata.uid.clone().unwrap();
    let claim = allocate_claim(&api.client(), "default", "one-mic", "one-mic", &uid, "n1")
        .await
        .unwrap();
    assert_eq!(allocated(&claim), [dev("mic-0")].into_iter().collect());
    // Every camera is taken: a third claim on the class finds none.
    let pod = claim_and_pod(&api, "no-cam", "cams", false).await;
    let uid = pod.metadata.uid.clone().unwrap();
    let refused = allocate_claim(&api.client(), "default", "no-cam", "no-cam", &uid, "n1").await;
    assert!(refused.is_err(), "{refused:?}");

    stop.cancel();
    controller.await.unwrap().unwrap();
}
