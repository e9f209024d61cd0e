//! An Instance's status: which of its nodes serve it to their kubelet, and
//! the `Ready` condition derived from that.
//!
//! Each node's agent owns its own `nodes` entry. `Ready` and the pruning of
//! entries of nodes the spec no longer lists are computed from the whole
//! object, the same way by every writer, so concurrent writers (guarded by
//! `resourceVersion`) converge.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::{InstanceStatus, set_condition};

/// Condition type: every node that sees the device serves it to its kubelet.
pub const CONDITION_READY: &str = "Ready";
/// `Ready` reason: served on every node listed.
pub const REASON_SERVED: &str = "Served";
/// `Ready` reason: some listed node does not serve it (yet).
pub const REASON_NOT_SERVED: &str = "NotServed";

/// Nodes named one by one in a `Ready` message before "and N more".
const MESSAGE_NODES: usize = 3;

/// One node's device plugin for the Instance.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeServing {
    /// The node.
    pub node: String,
    /// Registered with the node's kubelet as `steward.dev/<instance>`.
    pub registered: bool,
    /// Why it is not registered, while it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When `registered` last changed.
    pub since: Time,
    /// Served through DRA on this node instead of a device plugin: its
    /// Configuration has `draExtendedResources` and the node's agent runs
    /// with `--dra`, so kube-scheduler allocates the Instance's devices
    /// for `steward.dev/<instance>` here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub through_dra: bool,
}

impl InstanceStatus {
    /// Sets `node`'s entry (`None` removes it: the node no longer serves the
    /// Instance), drops entries of nodes not in `spec_nodes`, and recomputes
    /// `Ready`. `since` and the condition's transition time move only when
    /// their state changes. Returns whether the status changed.
    pub fn set_serving(
        &mut self,
        node: &str,
        serving: Option<(bool, Option<String>)>,
        spec_nodes: &[String],
        generation: Option<i64>,
        now: Time,
    ) -> bool {
        let entry = serving.map(|(registered, message)| (registered, message, false));
        self.set_entry(node, entry, spec_nodes, generation, now)
    }

    /// Marks `node` as serving the Instance through DRA (no device plugin
    /// there), which counts as served for `Ready`; otherwise as
    /// [`InstanceStatus::set_serving`].
    pub fn set_served_through_dra(
        &mut self,
        node: &str,
        spec_nodes: &[String],
        generation: Option<i64>,
        now: Time,
    ) -> bool {
        self.set_entry(node, Some((false, None, true)), spec_nodes, generation, now)
    }

    fn set_entry(
        &mut self,
        node: &str,
        serving: Option<(bool, Option<String>, bool)>,
        spec_nodes: &[String],
        generation: Option<i64>,
        now: Time,
    ) -> bool {
        let before = self.clone();
        match serving {
            None => self.nodes.retain(|n| n.node != node),
            Some((registered, message, through_dra)) => {
                let message = if registered || through_dra {
                    None
                } else {
                    message
                };
                match self.nodes.iter_mut().find(|n| n.node == node) {
                    Some(e) => {
                        if e.registered != registered || e.through_dra != through_dra {
                            e.since = now.clone();
                        }
                        e.registered = registered;
                        e.message = message;
                        e.through_dra = through_dra;
                    }
                    None => self.nodes.push(NodeServing {
                        node: node.to_owned(),
                        registered,
                        message,
                        since: now.clone(),
                        through_dra,
                    }),
                }
            }
        }
        self.nodes.retain(|n| spec_nodes.contains(&n.node));
        self.nodes.sort_by(|a, b| a.node.cmp(&b.node));
        let (status, reason, message) = self.readiness(spec_nodes);
        set_condition(
            &mut self.conditions,
            CONDITION_READY,
            status,
            reason,
            &message,
            generation,
            now,
        );
        *self != before
    }

    /// `Ready`'s status, reason and message for the nodes the spec lists.
    fn readiness(&self, spec_nodes: &[String]) -> (&'static str, &'static str, String) {
        let mut sorted: Vec<&String> = spec_nodes.iter().collect();
        sorted.sort();
        sorted.dedup();
        if sorted.is_empty() {
            return ("False", REASON_NOT_SERVED, "no node sees the device".into());
        }
        let problems: Vec<String> = sorted
            .iter()
            .filter_map(|n| match self.nodes.iter().find(|e| &&e.node == n) {
                None => Some(format!("node {n}: no device plugin yet")),
                Some(e) if !e.registered && !e.through_dra => Some(format!(
                    "node {n}: {}",
                    e.message
                        .as_deref()
                        .unwrap_or("not registered with kubelet")
                )),
                Some(_) => None,
            })
            .collect();
        if problems.is_empty() {
            let (dra, plugin): (Vec<&str>, Vec<&str>) = sorted
                .iter()
                .map(|s| s.as_str())
                .partition(|n| self.nodes.iter().any(|e| e.node == *n && e.through_dra));
            let message = match (plugin.is_empty(), dra.is_empty()) {
                (_, true) => format!("registered with kubelet on {}", some_of(&plugin, "node")),
                (true, false) => format!("served through DRA on {}", some_of(&dra, "node")),
                (false, false) => format!(
                    "registered with kubelet on {}; served through DRA on {}",
                    some_of(&plugin, "node"),
                    some_of(&dra, "node")
                ),
            };
            ("True", REASON_SERVED, message)
        } else {
            let refs: Vec<&str> = problems.iter().map(String::as_str).collect();
            ("False", REASON_NOT_SERVED, some_of_sep(&refs, "; "))
        }
    }
}

/// `a, b, c and 2 more nodes`.
fn some_of(items: &[&str], noun: &str) -> String {
    let shown = items[..items.len().min(MESSAGE_NODES)].join(", ");
    match items.len().saturating_sub(MESSAGE_NODES) {
        0 => shown,
        rest => format!("{shown} and {rest} more {noun}s"),
    }
}

/// The first few items joined by `sep`, then how many were left out.
fn some_of_sep(items: &[&str], sep: &str) -> String {
    let shown = items[..items.len().min(MESSAGE_NODES)].join(sep);
    match items.len().saturating_sub(MESSAGE_NODES) {
        0 => shown,
        rest => format!("{shown}{sep}and {rest} more"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    fn nodes(ns: &[&str]) -> Vec<String> {
        ns.iter().map(|s| (*s).to_owned()).collect()
    }

    fn ready(s: &InstanceStatus) -> (&str, &str, &str) {
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_READY)
            .expect("Ready is always set");
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn ready_once_every_listed_node_serves_it() {
        let spec = nodes(&["a", "b"]);
        let mut s = InstanceStatus::default();
        assert!(s.set_serving("a", Some((true, None)), &spec, Some(1), at(1)));
        assert_eq!(
            ready(&s),
            ("False", REASON_NOT_SERVED, "node b: no device plugin yet")
        );
        let failed = Some("registration with kubelet failed: dialling kubelet".to_owned());
        assert!(s.set_serving("b", Some((false, failed)), &spec, Some(1), at(2)));
        assert_eq!(
            ready(&s),
            (
                "False",
                REASON_NOT_SERVED,
                "node b: registration with kubelet failed: dialling kubelet"
            )
        );
        assert!(s.set_serving("b", Some((true, None)), &spec, Some(1), at(3)));
        assert_eq!(
            ready(&s),
            ("True", REASON_SERVED, "registered with kubelet on a, b")
        );
        let c = &s.conditions[0];
        assert_eq!(c.last_transition_time, at(3));
        assert_eq!(s.nodes[1].since, at(3));
        assert_eq!(s.nodes[1].message, None);
    }

    #[test]
    fn a_node_serving_through_dra_counts_as_served() {
        let spec = nodes(&["a", "b"]);
        let mut s = InstanceStatus::default();
        assert!(s.set_serving("a", Some((true, None)), &spec, Some(1), at(1)));
        assert!(s.set_served_through_dra("b", &spec, Some(1), at(2)));
        assert_eq!(
            ready(&s),
            (
                "True",
                REASON_SERVED,
                "registered with kubelet on a; served through DRA on b"
            )
        );
        assert!(!s.set_served_through_dra("b", &spec, Some(1), at(3)));
        assert!(s.set_served_through_dra("a", &spec, Some(1), at(4)));
        assert_eq!(
            ready(&s),
            ("True", REASON_SERVED, "served through DRA on a, b")
        );
        // Back to a device plugin that is not registered yet.
        assert!(s.set_serving("b", Some((false, None)), &spec, Some(1), at(5)));
        assert_eq!(s.nodes[1].since, at(5));
        assert!(!s.nodes[1].through_dra);
        assert_eq!(ready(&s).0, "False");
    }

    #[test]
    fn writing_the_same_state_again_changes_nothing() {
        let spec = nodes(&["a"]);
        let mut s = InstanceStatus::default();
        assert!(s.set_serving("a", Some((true, None)), &spec, Some(1), at(1)));
        let before = s.clone();
        assert!(!s.set_serving("a", Some((true, None)), &spec, Some(1), at(9)));
        assert_eq!(s, before);
        assert_eq!(s.nodes[0].since, at(1));
    }

    #[test]
    fn entries_of_nodes_no_longer_listed_are_dropped_by_any_writer() {
        let mut s = InstanceStatus::default();
        s.set_serving("a", Some((true, None)), &nodes(&["a", "b"]), None, at(1));
        s.set_serving("b", Some((true, None)), &nodes(&["a", "b"]), None, at(1));
        // b's agent is gone; the spec no longer lists b; a writes again.
        assert!(s.set_serving("a", Some((true, None)), &nodes(&["a"]), None, at(2)));
        assert_eq!(s.nodes.len(), 1);
        assert_eq!(ready(&s).0, "True");
        // a stops serving it: no entry, not Ready.
        assert!(s.set_serving("a", None, &nodes(&["a"]), None, at(3)));
        assert!(s.nodes.is_empty());
        assert_eq!(
            ready(&s),
            ("False", REASON_NOT_SERVED, "node a: no device plugin yet")
        );
    }

    #[test]
    fn long_node_lists_are_cut_short() {
        let spec = nodes(&["a", "b", "c", "d", "e"]);
        let mut s = InstanceStatus::default();
        for n in &spec {
            s.set_serving(n, Some((true, None)), &spec, None, at(1));
        }
        assert_eq!(
            ready(&s).2,
            "registered with kubelet on a, b, c and 2 more nodes"
        );
        let mut s = InstanceStatus::default();
        s.set_serving("a", Some((true, None)), &spec, None, at(1));
        assert_eq!(
            ready(&s).2,
            "node b: no device plugin yet; node c: no device plugin yet; node d: no device plugin yet; and 1 more"
        );
        assert_eq!(
            InstanceStatus::default().readiness(&[]).2,
            "no node sees the device"
        );
    }
}
