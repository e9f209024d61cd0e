//! Node-membership labels: which nodes an object concerns, so that each
//! node's agent watches only those (a label selector) instead of every
//! object in the cluster.
//!
//! An Instance carries one label per node in `spec.nodes`; a SlotClaim and
//! a Reserved Reservation carry the labels of the nodes that see the
//! Instances they hold. The key names the node by a hash (a label key's
//! name part is at most 63 characters, a node name up to 253): a collision
//! only widens a node's watch, so nothing depends on the hash being unique.
//! The value is the node's name where it is a valid label value (else
//! empty), for whoever reads the object.

use std::collections::BTreeMap;
use std::hash::Hasher;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The prefix of every node-membership label key.
pub const NODE_LABEL_PREFIX: &str = "steward.dev/n-";

/// The label key naming `node`: [`NODE_LABEL_PREFIX`] and 10 hex digits of
/// the FNV-1a hash of the name.
pub fn node_label_key(node: &str) -> String {
    let mut h = fnv::FnvHasher::default();
    h.write(node.as_bytes());
    format!("{NODE_LABEL_PREFIX}{:010x}", h.finish() >> 24)
}

/// The label selector of the objects that concern `node`.
pub fn node_selector(node: &str) -> String {
    node_label_key(node)
}

/// `node` itself where it is a valid label value, else empty.
fn node_label_value(node: &str) -> String {
    let valid = node.len() <= 63
        && node
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && node
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && node
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if valid {
        node.to_owned()
    } else {
        String::new()
    }
}

/// The labels of `nodes`.
pub fn node_labels<'a>(nodes: impl IntoIterator<Item = &'a String>) -> BTreeMap<String, String> {
    nodes
        .into_iter()
        .map(|n| (node_label_key(n), node_label_value(n)))
        .collect()
}

/// Sets exactly the labels of `nodes` on `meta` (other node labels go,
/// every other label stays); whether anything changed.
pub fn set_node_labels<'a>(
    meta: &mut ObjectMeta,
    nodes: impl IntoIterator<Item = &'a String>,
) -> bool {
    let wanted = node_labels(nodes);
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    let before = labels.clone();
    labels.retain(|k, _| !k.starts_with(NODE_LABEL_PREFIX));
    labels.extend(wanted);
    let changed = *labels != before;
    if labels.is_empty() {
        meta.labels = None;
    }
    changed
}

/// Adds the labels of `nodes` to `meta` (node labels already there stay);
/// whether anything changed.
pub fn add_node_labels<'a>(
    meta: &mut ObjectMeta,
    nodes: impl IntoIterator<Item = &'a String>,
) -> bool {
    let missing = missing_node_labels(meta, nodes);
    if missing.is_empty() {
        return false;
    }
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .extend(missing);
    true
}

/// The labels of `nodes` that `meta` lacks.
pub fn missing_node_labels<'a>(
    meta: &ObjectMeta,
    nodes: impl IntoIterator<Item = &'a String>,
) -> BTreeMap<String, String> {
    let mut wanted = node_labels(nodes);
    if let Some(labels) = &meta.labels {
        wanted.retain(|k, _| !labels.contains_key(k));
    }
    wanted
}

/// The node labels `meta` carries that are not `nodes`'.
pub fn extra_node_labels<'a>(
    meta: &ObjectMeta,
    nodes: impl IntoIterator<Item = &'a String>,
) -> Vec<String> {
    let wanted = node_labels(nodes);
    meta.labels
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with(NODE_LABEL_PREFIX) && !wanted.contains_key(*k))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn keys_are_stable_valid_and_distinct() {
        let a = node_label_key("worker-1");
        // FNV-1a of the bytes: the same on every build and every peer.
        assert_eq!(a, node_label_key("worker-1"));
        assert_eq!(a.len(), NODE_LABEL_PREFIX.len() + 10);
        assert!(
            a[NODE_LABEL_PREFIX.len()..]
                .chars()
                .all(|c| c.is_ascii_hexdigit())
        );
        assert_ne!(a, node_label_key("worker-2"));
        let long = "n".repeat(253);
        assert_eq!(node_label_key(&long).len(), a.len());
    }

    #[test]
    fn values_name_the_node_when_they_can() {
        let l = node_labels(&s(&["worker-1", &"x".repeat(64), "a:b"]));
        let values: Vec<&str> = l.values().map(String::as_str).collect();
        assert!(values.contains(&"worker-1"));
        assert_eq!(values.iter().filter(|v| v.is_empty()).count(), 2);
    }

    #[test]
    fn set_is_exact_add_only_grows_and_other_labels_stay() {
        let mut meta = ObjectMeta {
            labels: Some(BTreeMap::from([("team".to_string(), "video".to_string())])),
            ..ObjectMeta::default()
        };
        assert!(set_node_labels(&mut meta, &s(&["a", "b"])));
        assert!(!set_node_labels(&mut meta, &s(&["a", "b"])));
        assert!(missing_node_labels(&meta, &s(&["a", "b"])).is_empty());
        assert!(set_node_labels(&mut meta, &s(&["b"])));
        let labels = meta.labels.clone().unwrap();
        assert!(labels.contains_key(&node_label_key("b")));
        assert!(!labels.contains_key(&node_label_key("a")));
        assert_eq!(labels.get("team").map(String::as_str), Some("video"));
        assert!(add_node_labels(&mut meta, &s(&["a"])));
        assert!(!add_node_labels(&mut meta, &s(&["a", "b"])));
        assert_eq!(extra_node_labels(&meta, &s(&["a"])), [node_label_key("b")]);
        assert_eq!(meta.labels.as_ref().unwrap().len(), 3);
        let mut bare = ObjectMeta::default();
        assert!(!set_node_labels(&mut bare, &s(&[])));
        assert_eq!(bare.labels, None);
    }
}
