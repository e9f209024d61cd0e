//! Which of the cluster's Instances, SlotClaims and Reservations this
//! node's agent follows: all of them, or (`--select-by-node-labels`, where
//! the controller keeps the labels) those labeled with this node
//! ([`steward_api::node_selector`]), so that each object's changes reach
//! only the nodes that see its Instance.

use kube::api::ListParams;
use kube::runtime::watcher;

/// A label selector for the agent's lists and watches, or none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection(Option<String>);

impl Selection {
    /// Every object.
    pub fn all() -> Self {
        Self(None)
    }

    /// The objects labeled with `node`.
    pub fn node(node: &str) -> Self {
        Self(Some(steward_api::node_selector(node)))
    }

    /// A watch of what is selected.
    pub fn watcher(&self) -> watcher::Config {
        match &self.0 {
            Some(s) => watcher::Config::default().labels(s),
            None => watcher::Config::default(),
        }
    }

    /// A list of what is selected.
    pub fn list(&self) -> ListParams {
        match &self.0 {
            Some(s) => ListParams::default().labels(s),
            None => ListParams::default(),
        }
    }
}
