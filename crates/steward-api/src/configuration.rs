//! The `Configuration` custom resource: what to discover and how to expose it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Default slots per device.
pub const DEFAULT_CAPACITY: u32 = 1;
/// Upper bound on slots per device.
pub const MAX_CAPACITY: u32 = 1024;
/// Default limit on the devices one Configuration may expose per handler report.
pub const DEFAULT_MAX_DEVICES: u32 = 512;
/// Hard upper bound on `maxDevices`.
pub const MAX_MAX_DEVICES: u32 = 65_536;
/// Default host path prefix allowed for mounts and device specs.
pub const DEFAULT_ALLOWED_HOST_PATH: &str = "/dev/";

/// Condition type: the discovery details were accepted by the handler.
pub const CONDITION_DETAILS_VALID: &str = "DetailsValid";
/// Condition type: at least one handler is actively discovering for this Configuration.
pub const CONDITION_DISCOVERING: &str = "Discovering";
/// Condition type, written by the controller for a Configuration with
/// `draExtendedResources`: `True` once its Instances' DeviceClasses carry
/// `extendedResourceName`, `False` when the API server drops that field
/// (DRAExtendedResource off, as on Kubernetes 1.35), in which case agents
/// serve the Instances through their device plugins.
pub const CONDITION_DRA_EXTENDED_RESOURCES: &str = "DRAExtendedResources";
/// Its reason when `True`.
pub const REASON_CLASSES_WRITTEN: &str = "ClassesWritten";
/// Its reason when `False`.
pub const REASON_FEATURE_OFF: &str = "FeatureGateOff";

/// A Configuration names a discovery handler, the free-form details it parses,
/// and the policy the agent applies to what it reports.
// Several printer columns share a type: not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "steward.dev",
    version = "v1alpha1",
    kind = "Configuration",
    namespaced,
    status = "ConfigurationStatus",
    shortname = "scfg",
    derive = "PartialEq",
    doc = "What a discovery handler should look for, and how found devices are exposed as Instances.",
    printcolumn(
        name = "Handler",
        type_ = "string",
        json_path = ".spec.discoveryHandler.name",
        description = "discovery handler name"
    ),
    printcolumn(
        name = "Capacity",
        type_ = "integer",
        json_path = ".spec.capacity",
        description = "slots per device"
    ),
    printcolumn(
        name = "Instances",
        type_ = "integer",
        json_path = ".status.instances",
        description = "Instances of this Configuration"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationSpec {
    /// Which discovery handler to use and what to ask it.
    pub discovery_handler: DiscoveryHandlerInfo,
    /// Slots per discovered device (how many containers may use it at once).
    #[serde(default = "default_capacity")]
    #[schemars(range(min = 1, max = 1024))]
    pub capacity: u32,
    /// Key/value pairs passed to workloads using an Instance of this Configuration.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub broker_properties: BTreeMap<String, String>,
    /// Devices beyond this count in one handler report are rejected.
    #[serde(default = "default_max_devices")]
    #[schemars(range(min = 1, max = 65536))]
    pub max_devices: u32,
    /// Host path prefixes a handler may name in mounts and device specs.
    #[serde(default = "default_allowed_host_paths")]
    #[x_kube(validation = kube::core::Rule::new("self.all(p, p.startsWith('/'))").message("allowedHostPaths must be absolute path prefixes"))]
    pub allowed_host_paths: Vec<String>,
    /// Serve this Configuration's Instances to unchanged pods through DRA
    /// (Kubernetes 1.36+, KEP-5004): the controller gives each Instance a
    /// DeviceClass with `extendedResourceName: steward.dev/<instance>`, and
    /// agents running with `--dra` register no device plugin for those
    /// Instances, so on their nodes the scheduler allocates a device for
    /// `steward.dev/<instance>: 1`. Nodes whose agent runs without `--dra`
    /// keep serving the device plugin. Set it before the Configuration's
    /// devices are served: a device plugin withdrawn from a node stays in
    /// its capacity at 0. Off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dra_extended_resources: bool,
}

/// Which discovery handler, and the details it parses.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryHandlerInfo {
    /// Name the handler registered under (e.g. `udev`, `debug-echo`).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Free text the handler parses (usually YAML); steward does not interpret it.
    #[serde(default)]
    pub details: String,
    /// Extra properties sent with the discovery request, inline or from Secrets/ConfigMaps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discovery_properties: Vec<DiscoveryProperty>,
}

/// One named discovery property.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.value) != has(self.valueFrom)").message("exactly one of value or valueFrom must be set"))]
pub struct DiscoveryProperty {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<DiscoveryPropertySource>,
}

/// Where a discovery property's value comes from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.secretKeyRef) != has(self.configMapKeyRef)").message("exactly one of secretKeyRef or configMapKeyRef must be set"))]
pub struct DiscoveryPropertySource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
}

/// A key in a Secret or ConfigMap.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    /// Object name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Object namespace: the Configuration's own (the default) is the only
    /// one accepted; a reference to another namespace is refused
    /// (`DetailsValid` False), so a Configuration's author can have the
    /// agent read only what their namespace holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Key within the object's data.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
    /// If true, a missing object or key leaves the property out instead of failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// Observed state of a Configuration, written by agents.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationStatus {
    /// Standard conditions: `DetailsValid`, `Discovering`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Number of Instances of this Configuration.
    #[serde(default)]
    pub instances: u32,
    /// Handlers connected for this Configuration, one entry per node and handler endpoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handlers: Vec<HandlerStatus>,
}

/// One handler serving a Configuration on one node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct HandlerStatus {
    pub node: String,
    pub name: String,
    /// `embedded`, `unix://<path>` or a network address.
    pub endpoint: String,
    /// `Waiting`, `Active` or `Offline`.
    pub state: String,
}

fn default_capacity() -> u32 {
    DEFAULT_CAPACITY
}

fn default_max_devices() -> u32 {
    DEFAULT_MAX_DEVICES
}

fn default_allowed_host_paths() -> Vec<String> {
    vec![DEFAULT_ALLOWED_HOST_PATH.to_string()]
}

impl Configuration {
    /// Whether agents running the DRA driver serve this Configuration's
    /// Instances through DRA only (no device plugin): it opted in with
    /// `draExtendedResources` and the controller has not found the cluster
    /// dropping `extendedResourceName`. Known before any Instance exists,
    /// so a node never registers a device plugin it would withdraw (kubelet
    /// keeps a withdrawn resource in the node's capacity at 0).
    pub fn served_through_dra(&self) -> bool {
        self.spec.dra_extended_resources
            && !self.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == CONDITION_DRA_EXTENDED_RESOURCES && c.status == "False")
            })
    }
}

impl ConfigurationSpec {
    /// A spec with the documented defaults for everything but the handler.
    pub fn new(handler: impl Into<String>, details: impl Into<String>) -> Self {
        Self {
            discovery_handler: DiscoveryHandlerInfo {
                name: handler.into(),
                details: details.into(),
                discovery_properties: Vec::new(),
            },
            capacity: DEFAULT_CAPACITY,
            broker_properties: BTreeMap::new(),
            max_devices: DEFAULT_MAX_DEVICES,
            allowed_host_paths: default_allowed_host_paths(),
            dra_extended_resources: false,
        }
    }
}
