//! The agent's watches: one [`SharedWatch`] per kind for the whole
//! process, opened on first use and handed to every consumer.
//!
//! | kind | selector | consumers |
//! |---|---|---|
//! | Instance | the agent's [`Selection`] | device plugins (served set, Instance directory), ResourceSlices |
//! | SlotClaim | the agent's [`Selection`] | the slot ledger's cluster claims, ResourceSlices (held taints) |
//! | Pod | `spec.nodeName=<node>` | device plugins (reclaim), the pod resources view (UIDs, deletions) |
//! | Configuration | none | the discovery loop's source, the device plugins' broker properties |
//! | Reservation | the agent's [`Selection`] | device plugins (slots reserved elsewhere) |
//! | Node (metadata) | none | deletions, when the agent follows them |
//!
//! Each consumer subscribes (and keeps its own projection) or reads the
//! store; none opens a watch. Two consumers of one kind use the same
//! selector here, so no subscriber-side filtering is needed.

use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use steward_api::{Configuration, Instance, Reservation, SlotClaim};
use steward_kube::SharedWatch;

use crate::selection::Selection;

/// The agent's shared watches (cloning shares them).
#[derive(Clone)]
pub struct AgentWatches {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    node: String,
    selection: Selection,
    instances: OnceLock<SharedWatch<Instance>>,
    slot_claims: OnceLock<SharedWatch<SlotClaim>>,
    pods: OnceLock<SharedWatch<Pod>>,
    configurations: OnceLock<SharedWatch<Configuration>>,
    reservations: OnceLock<SharedWatch<Reservation>>,
    nodes: OnceLock<SharedWatch<PartialObjectMeta<Node>>>,
}

impl std::fmt::Debug for AgentWatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentWatches")
            .field("node", &self.inner.node)
            .field("selection", &self.inner.selection)
            .finish_non_exhaustive()
    }
}

impl AgentWatches {
    /// Nothing is opened until a consumer asks for it.
    pub fn new(client: kube::Client, node: &str, selection: Selection) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                node: node.to_owned(),
                selection,
                instances: OnceLock::new(),
                slot_claims: OnceLock::new(),
                pods: OnceLock::new(),
                configurations: OnceLock::new(),
                reservations: OnceLock::new(),
                nodes: OnceLock::new(),
            }),
        }
    }

    pub fn client(&self) -> &kube::Client {
        &self.inner.client
    }

    pub fn node(&self) -> &str {
        &self.inner.node
    }

    pub fn selection(&self) -> &Selection {
        &self.inner.selection
    }

    /// The Instances the agent follows.
    pub fn instances(&self) -> SharedWatch<Instance> {
        let i = &self.inner;
        i.instances
            .get_or_init(|| SharedWatch::start(Api::all(i.client.clone()), i.selection.watcher()))
            .clone()
    }

    /// The SlotClaims the agent follows.
    pub fn slot_claims(&self) -> SharedWatch<SlotClaim> {
        let i = &self.inner;
        i.slot_claims
            .get_or_init(|| SharedWatch::start(Api::all(i.client.clone()), i.selection.watcher()))
            .clone()
    }

    /// This node's pods.
    pub fn pods(&self) -> SharedWatch<Pod> {
        let i = &self.inner;
        i.pods
            .get_or_init(|| {
                let config =
                    watcher::Config::default().fields(&format!("spec.nodeName={}", i.node));
                SharedWatch::start(Api::all(i.client.clone()), config)
            })
            .clone()
    }

    /// Every Configuration.
    pub fn configurations(&self) -> SharedWatch<Configuration> {
        let i = &self.inner;
        i.configurations
            .get_or_init(|| {
                SharedWatch::start(Api::all(i.client.clone()), watcher::Config::default())
            })
            .clone()
    }

    /// The Reservations the agent follows.
    pub fn reservations(&self) -> SharedWatch<Reservation> {
        let i = &self.inner;
        i.reservations
            .get_or_init(|| SharedWatch::start(Api::all(i.client.clone()), i.selection.watcher()))
            .clone()
    }

    /// Every Node's metadata.
    pub fn nodes(&self) -> SharedWatch<PartialObjectMeta<Node>> {
        let i = &self.inner;
        i.nodes
            .get_or_init(|| {
                SharedWatch::start(Api::all(i.client.clone()), watcher::Config::default())
            })
            .clone()
    }
}
