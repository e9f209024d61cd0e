//! The leader's watches: one [`SharedWatch`] per kind while it leads,
//! opened on first use and handed to every task of the lead.
//!
//! | kind | selector | consumers |
//! |---|---|---|
//! | Instance | none | the decision loop (ledger, node labels), DeviceClasses, deleted Nodes (reads the store) |
//! | SlotClaim | none | the decision loop (ledger, node labels) |
//! | Reservation | none | the decision loop (ledger, asks, node labels) |
//! | Pod | none | the decision loop |
//! | Node | none | the decision loop (published CPUs), deleted Nodes (names only) |
//! | Configuration | none | DeviceClasses |
//! | DeviceClass | steward's own | DeviceClasses |
//!
//! The deleted-Node task used to follow the Nodes' metadata on a watch of
//! its own; it now subscribes to the loop's Node watch (the same objects,
//! the same `list`/`watch nodes` RBAC; more bytes per Node event, one
//! watch fewer). Made when the replica starts leading and dropped when it
//! stops: every watch ends with the lead.

use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::Api;
use kube::runtime::watcher;
use steward_api::{Configuration, Instance, Reservation, SlotClaim};
use steward_kube::SharedWatch;

/// The leader's shared watches (cloning shares them).
#[derive(Clone)]
pub struct LeaderWatches {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    instances: OnceLock<SharedWatch<Instance>>,
    slot_claims: OnceLock<SharedWatch<SlotClaim>>,
    reservations: OnceLock<SharedWatch<Reservation>>,
    pods: OnceLock<SharedWatch<Pod>>,
    nodes: OnceLock<SharedWatch<Node>>,
    configurations: OnceLock<SharedWatch<Configuration>>,
    device_classes: OnceLock<SharedWatch<DeviceClass>>,
}

impl std::fmt::Debug for LeaderWatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderWatches").finish_non_exhaustive()
    }
}

/// Every object of a kind, one watch.
fn all<K>(client: &kube::Client, cell: &OnceLock<SharedWatch<K>>) -> SharedWatch<K>
where
    K: kube::Resource<DynamicType = ()>
        + kube::ResourceExt
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    cell.get_or_init(|| SharedWatch::start(Api::all(client.clone()), watcher::Config::default()))
        .clone()
}

impl LeaderWatches {
    /// Nothing is opened until a task asks for it.
    pub fn new(client: kube::Client) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                instances: OnceLock::new(),
                slot_claims: OnceLock::new(),
                reservations: OnceLock::new(),
                pods: OnceLock::new(),
                nodes: OnceLock::new(),
                configurations: OnceLock::new(),
                device_classes: OnceLock::new(),
            }),
        }
    }

    pub fn instances(&self) -> SharedWatch<Instance> {
        all(&self.inner.client, &self.inner.instances)
    }

    pub fn slot_claims(&self) -> SharedWatch<SlotClaim> {
        all(&self.inner.client, &self.inner.slot_claims)
    }

    pub fn reservations(&self) -> SharedWatch<Reservation> {
        all(&self.inner.client, &self.inner.reservations)
    }

    pub fn pods(&self) -> SharedWatch<Pod> {
        all(&self.inner.client, &self.inner.pods)
    }

    pub fn nodes(&self) -> SharedWatch<Node> {
        all(&self.inner.client, &self.inner.nodes)
    }

    pub fn configurations(&self) -> SharedWatch<Configuration> {
        all(&self.inner.client, &self.inner.configurations)
    }

    /// The DeviceClasses steward owns (`selector`: their label).
    pub fn device_classes(&self, selector: &str) -> SharedWatch<DeviceClass> {
        let i = &self.inner;
        i.device_classes
            .get_or_init(|| {
                SharedWatch::start(
                    Api::all(i.client.clone()),
                    watcher::Config::default().labels(selector),
                )
            })
            .clone()
    }
}
