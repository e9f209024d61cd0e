//! kube-scheduler's extender wire types (`k8s.io/kube-scheduler/extender/v1`),
//! with the JSON names kube-scheduler sends and reads.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::{Deserialize, Serialize};

/// A `v1.NodeList` as kube-scheduler sends it (only `items` is read; the
/// rest is passed back as it came).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct NodeList {
    #[serde(
        default,
        rename = "apiVersion",
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    #[serde(default)]
    pub items: Vec<Node>,
}

/// What kube-scheduler POSTs to the filter and prioritize verbs: the pod and
/// the candidate nodes — whole Node objects, or only their names when the
/// extender is configured `nodeCacheCapable`.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ExtenderArgs {
    pub pod: Pod,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    #[serde(default, rename = "nodenames", skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
}

impl ExtenderArgs {
    /// The candidate node names, in the scheduler's order.
    pub fn candidates(&self) -> Vec<String> {
        match (&self.node_names, &self.nodes) {
            (Some(names), _) => names.clone(),
            (None, Some(list)) => list
                .items
                .iter()
                .filter_map(|n| n.metadata.name.clone())
                .collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// Node name → why the pod cannot go there.
pub type FailedNodesMap = BTreeMap<String, String>;

/// The filter verb's answer. The nodes that pass are returned in the form
/// they came in (names for a node-cache-capable extender, else objects).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct ExtenderFilterResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    #[serde(default, rename = "nodenames", skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
    /// Nodes that cannot take the pod now (preemption may help).
    #[serde(
        default,
        rename = "failedNodes",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub failed_nodes: FailedNodesMap,
    /// Nodes that cannot take the pod whatever is preempted.
    #[serde(
        default,
        rename = "failedAndUnresolvableNodes",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub failed_and_unresolvable_nodes: FailedNodesMap,
    /// A failure of the extender itself (the scheduler retries the pod).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// One node's score from the prioritize verb (0 to [`MAX_EXTENDER_PRIORITY`]).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct HostPriority {
    pub host: String,
    pub score: i64,
}

/// The highest score an extender may give.
pub const MAX_EXTENDER_PRIORITY: i64 = 10;
