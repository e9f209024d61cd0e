//! The `Instance` custom resource: one discovered device (or one shared device
//! seen by several nodes), owned by its Configuration.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::NodeServing;

/// A discovered device exposed to the cluster.
///
/// Discovery writes the spec only. The status belongs to the agents' device
/// plugins (which nodes serve it, `Ready`); discovery never writes it, and
/// because status is a subresource, discovery's spec updates never overwrite
/// it.
// Several printer columns share a type: not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "steward.dev",
    version = "v1alpha1",
    kind = "Instance",
    namespaced,
    status = "InstanceStatus",
    shortname = "sinst",
    derive = "PartialEq",
    doc = "A device discovered for a Configuration, on one node or shared by several.",
    printcolumn(
        name = "Configuration",
        type_ = "string",
        json_path = ".spec.configurationName",
        description = "owning Configuration"
    ),
    printcolumn(
        name = "Shared",
        type_ = "boolean",
        json_path = ".spec.shared",
        description = "visible from several nodes"
    ),
    printcolumn(
        name = "Nodes",
        type_ = "string",
        json_path = ".spec.nodes",
        description = "nodes that can reach the device"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "served to kubelet on every node listed"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSpec {
    /// Name of the Configuration (same namespace) this Instance was discovered for.
    #[schemars(length(min = 1, max = 253))]
    pub configuration_name: String,
    /// The handler's identifier for the device.
    #[schemars(length(min = 1, max = 1024))]
    pub device_id: String,
    /// Whether several nodes can reach the device.
    #[serde(default)]
    pub shared: bool,
    /// Nodes that currently see the device; exact, no duplicates.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub nodes: Vec<String>,
    /// Slots (concurrent users), copied from the Configuration.
    #[schemars(range(min = 1, max = 1024))]
    pub capacity: u32,
    /// Device properties passed to workloads.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
    /// Host paths mounted into containers using the device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<InstanceMount>,
    /// Host device nodes exposed to containers using the device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_specs: Vec<InstanceDeviceSpec>,
    /// Fully-qualified CDI device name: `steward.dev/<configuration>=<instance>`.
    pub cdi_name: String,
}

/// A host path mounted into containers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct InstanceMount {
    pub container_path: String,
    pub host_path: String,
    #[serde(default)]
    pub read_only: bool,
}

/// A host device node exposed to containers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct InstanceDeviceSpec {
    pub container_path: String,
    pub host_path: String,
    /// Cgroup permissions, any of `r`, `w`, `m`.
    #[serde(default)]
    pub permissions: String,
}

/// Observed state of an Instance. Written by the agents' device plugins,
/// never by discovery.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// Standard conditions: `Ready` (every node listed serves the Instance to
    /// its kubelet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// One entry per node serving the Instance as a device plugin; each
    /// node's agent writes its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["node".into()]))]
    pub nodes: Vec<NodeServing>,
    /// Reserved for per-slot usage; steward records slot claims as
    /// `SlotClaim` objects instead (see ARCHITECTURE.md) and leaves it empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["id".into()]))]
    pub slots: Vec<Slot>,
}

/// A typed slot claim.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Slot {
    /// `<instance>-<n>`, `0 <= n < capacity`.
    pub id: String,
    /// Node holding the slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Pod holding the slot, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// Container within the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// When the slot was claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

/// Identity of a pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// The slot id for slot `n` of `instance`.
pub fn slot_id(instance: &str, n: u32) -> String {
    format!("{instance}-{n}")
}

/// The CDI name of an Instance of a Configuration.
pub fn cdi_name(configuration: &str, instance: &str) -> String {
    format!("{}/{configuration}={instance}", crate::GROUP)
}
