//! kube-scheduler's extender wire types (`k8s.io/kube-scheduler/extender/v1`).
//!
//! Those Go structs carry **no json tags**, so Go's `encoding/json` writes
//! the Go field names as they are — `{"Pod":{…},"Nodes":null,"NodeNames":
//! ["n1"]}` — and reads keys case-insensitively (`"nodenames"` fills
//! `NodeNames` too). These types read the same way ([`go_key_eq`]: Go's
//! folding, `null` for an absent pointer, unknown keys ignored, the last of
//! duplicate keys winning) and write the Go names. The `Pod` and `Node`s
//! inside are `k8s.io/api` objects, whose tags are lowerCamel.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

/// A `v1.NodeList` as kube-scheduler sends it (only `items` is read; the
/// rest is passed back as it came). Go writes `"items":null` for none.
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
    #[serde(default, deserialize_with = "null_as_empty")]
    pub items: Vec<Node>,
}

fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// Whether a JSON object key names a Go struct field the way
/// `encoding/json` decides it: equal under Unicode simple case folding
/// (ASCII letters either case; `ſ` U+017F is `s`, the Kelvin sign U+212A
/// is `k`). `field` is the Go field name (ASCII).
pub fn go_key_eq(key: &str, field: &str) -> bool {
    let fold = |c: char| match c {
        '\u{17F}' => 's',
        '\u{212A}' => 'k',
        c => c.to_ascii_lowercase(),
    };
    key.chars().map(fold).eq(field.chars().map(fold))
}

/// What kube-scheduler POSTs to the filter and prioritize verbs: the pod and
/// the candidate nodes — whole Node objects, or only their names when the
/// extender is configured `nodeCacheCapable`.
#[derive(Debug, Clone, Serialize)]
pub struct ExtenderArgs {
    #[serde(rename = "Pod")]
    pub pod: Pod,
    #[serde(rename = "Nodes")]
    pub nodes: Option<NodeList>,
    #[serde(rename = "NodeNames")]
    pub node_names: Option<Vec<String>>,
}

impl<'de> Deserialize<'de> for ExtenderArgs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Args;
        impl<'de> Visitor<'de> for Args {
            type Value = ExtenderArgs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("kube-scheduler's ExtenderArgs {Pod, Nodes, NodeNames}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ExtenderArgs, A::Error> {
                let mut pod: Option<Pod> = None;
                let mut nodes = None;
                let mut node_names = None;
                while let Some(key) = map.next_key::<String>()? {
                    // The last of duplicate keys wins, as in Go.
                    if go_key_eq(&key, "Pod") {
                        pod = map.next_value()?;
                    } else if go_key_eq(&key, "Nodes") {
                        nodes = map.next_value()?;
                    } else if go_key_eq(&key, "NodeNames") {
                        node_names = map.next_value()?;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(ExtenderArgs {
                    pod: pod.ok_or_else(|| de::Error::missing_field("Pod"))?,
                    nodes,
                    node_names,
                })
            }
        }
        d.deserialize_map(Args)
    }
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

/// The filter verb's answer, with the Go field names. The nodes that pass
/// are returned in the form they came in (names for a node-cache-capable
/// extender, else objects), and only nodes that came in.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct ExtenderFilterResult {
    #[serde(
        default,
        rename = "Nodes",
        alias = "nodes",
        skip_serializing_if = "Option::is_none"
    )]
    pub nodes: Option<NodeList>,
    #[serde(
        default,
        rename = "NodeNames",
        alias = "nodenames",
        skip_serializing_if = "Option::is_none"
    )]
    pub node_names: Option<Vec<String>>,
    /// Nodes that cannot take the pod now (preemption may help).
    #[serde(
        default,
        rename = "FailedNodes",
        alias = "failedNodes",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub failed_nodes: FailedNodesMap,
    /// Nodes that cannot take the pod whatever is preempted.
    #[serde(
        default,
        rename = "FailedAndUnresolvableNodes",
        alias = "failedAndUnresolvableNodes",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub failed_and_unresolvable_nodes: FailedNodesMap,
    /// A failure of the extender itself (the scheduler retries the pod).
    #[serde(
        default,
        rename = "Error",
        alias = "error",
        skip_serializing_if = "String::is_empty"
    )]
    pub error: String,
}

/// One node's score from the prioritize verb (0 to [`MAX_EXTENDER_PRIORITY`]).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct HostPriority {
    #[serde(rename = "Host", alias = "host")]
    pub host: String,
    #[serde(rename = "Score", alias = "score")]
    pub score: i64,
}

/// The highest score an extender may give.
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_as_go_folds_them() {
        for key in ["NodeNames", "nodenames", "NODENAMES", "nodeNames"] {
            assert!(go_key_eq(key, "NodeNames"), "{key}");
        }
        assert!(go_key_eq("Node\u{17F}", "Nodes"), "long s folds to s");
        assert!(!go_key_eq("Node", "Nodes"));
        assert!(!go_key_eq("NodeName", "NodeNames"));
        assert!(!go_key_eq("pöd", "Pod"));
    }

    #[test]
    fn null_pointers_are_absent_and_the_last_duplicate_wins() {
        let a: ExtenderArgs = serde_json::from_str(
            r#"{"Pod":{"metadata":{"name":"a"}},"Nodes":null,"NodeNames":null,"pod":{"metadata":{"name":"b"}},"Extra":[1]}"#,
        )
        .unwrap();
        assert_eq!(a.pod.metadata.name.as_deref(), Some("b"));
        assert!(a.nodes.is_none() && a.node_names.is_none());
        let l: NodeList = serde_json::from_str(r#"{"metadata":{},"items":null}"#).unwrap();
        assert!(l.items.is_empty());
        let e = serde_json::from_str::<ExtenderArgs>(r#"{"Pod":null,"NodeNames":[]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing field `Pod`"), "{e}");
    }
}
