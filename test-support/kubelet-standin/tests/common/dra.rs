//! A DRA setup for the stand-in's tests: an API server stand-in serving
//! `resource.k8s.io/v1`, a kubelet mirroring into it, a ResourceSlice of
//! devices on the node, a DeviceClass, and the test DRA plugin registered
//! through `plugins_registry`.

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, Device, DeviceClaim, DeviceClass, DeviceClassSpec, DeviceRequest,
    DeviceSelector, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec, ResourcePool,
    ResourceSlice, ResourceSliceSpec,
};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use steward_testing_apiserver::ApiServer;
use steward_testing_apiserver::dra_alloc::allocate_claim;
use steward_testing_kubelet::testing::dra::{TestDraPlugin, TestDraPluginConfig};
use steward_testing_kubelet::{Kubelet, KubeletConfig, PodSpec};

use super::WAIT;

pub const DRIVER: &str = "steward.dev";
pub const NODE: &str = "node-1";
pub const CLASS: &str = "steward-devices";

pub struct DraEnv {
    pub dir: tempfile::TempDir,
    pub api: ApiServer,
    pub client: kube::Client,
    pub kubelet: Kubelet,
    pub plugin: TestDraPlugin,
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        ..Default::default()
    }
}

/// Everything up and the driver registered; `devices` are published for the node.
pub async fn dra_env(devices: &[&str]) -> DraEnv {
    let api = ApiServer::start().await.unwrap();
    api.serve_dra();
    let client = api.client();
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(KubeletConfig {
        root_dir: dir.path().to_path_buf(),
        node_name: NODE.to_string(),
        api: Some(client.clone()),
    })
    .await
    .unwrap();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let slice = ResourceSlice {
        metadata: meta("node-1-steward"),
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(NODE.into()),
            pool: ResourcePool {
                name: NODE.into(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(
                devices
                    .iter()
                    .map(|d| Device {
                        name: d.to_string(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        },
    };
    slices.create(&PostParams::default(), &slice).await.unwrap();
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let class = DeviceClass {
        metadata: meta(CLASS),
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!("device.driver == {DRIVER:?}"),
                }),
            }]),
            ..Default::default()
        },
    };
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let plugin = TestDraPlugin::serve(
        kubelet.plugins_registry_dir(),
        kubelet.plugins_dir(),
        TestDraPluginConfig::new(DRIVER).api(client.clone()),
    )
    .await
    .unwrap();
    kubelet.wait_for_dra_driver(DRIVER, WAIT).await.unwrap();
    DraEnv {
        dir,
        api,
        client,
        kubelet,
        plugin,
    }
}

impl DraEnv {
    /// Creates a ResourceClaim asking for `count` devices of the class.
    pub async fn claim(&self, name: &str, count: i64) -> ResourceClaim {
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), "default");
        let claim = ResourceClaim {
            metadata: meta(name),
            spec: ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: "devs".into(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: CLASS.into(),
                            count: Some(count),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            },
            status: None,
        };
        claims.create(&PostParams::default(), &claim).await.unwrap()
    }

    /// What the user and kube-scheduler do: the Pod object exists, bound to
    /// the node, and its claims are allocated and reserved for it. Returns
    /// the spec with the Pod's UID, ready for `add_pod`.
    pub async fn schedule(&self, spec: PodSpec) -> PodSpec {
        let uid = self.kubelet.create_pod_object(&spec).await.unwrap();
        for c in &spec.resource_claims {
            allocate_claim(
                &self.client,
                &spec.namespace,
                &c.resource_claim_name,
                &spec.name,
                &uid,
                NODE,
            )
            .await
            .unwrap();
        }
        spec.uid(uid)
    }

    /// The UID of a ResourceClaim.
    pub async fn claim_uid(&self, name: &str) -> String {
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), "default");
        claims.get(name).await.unwrap().metadata.uid.unwrap()
    }
}
