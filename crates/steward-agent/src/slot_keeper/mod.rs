//! The node's slot keeper: the slot ledger of `steward_core::slots` behind
//! one lock, with the claim stores it makes its decisions durable in, the
//! Instances it serves and their ListAndWatch channels, and the wall clock
//! of its claims.
//!
//! Every input (Allocate, a DRA prepare, pod events, pod resources, cluster
//! claims, Reservations, ticks, Instances) takes the lock, feeds the ledger
//! and carries out the returned effects before releasing it: effects come
//! out in order, per slot, and an Allocate racing a delete waits for it
//! (ordering 2 of the three in `steward_core::slots`).
//!
//! Two adapters share it and keep their wire answers to themselves: the
//! device plugins (`crate::deviceplugin`: Allocate's v1beta1 response) and
//! the DRA kubelet plugin (`crate::dra`: NodePrepareResources). This module
//! imports neither.

mod clock;
mod durable;
mod effects;
mod inputs;
mod instance;
mod instances;
mod metrics;
mod names;
mod state;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use steward_core::slots::{SlotAllocator, SlotConfig};
use tokio::sync::{Mutex, MutexGuard, mpsc, watch};

pub use self::clock::now;
pub use self::durable::ClaimRefused;
pub use self::instance::{NUMA_PROPERTY, ServedInstance};
pub use self::metrics::{ClaimOpLabels, DevicePluginMetrics, ResultLabels, SlotHealthLabels};
pub use self::names::{env_name, resource_name, socket_name};
pub use self::state::State;
use crate::claims::{ClaimError, ClaimStore};
use crate::host_paths::HostPathPolicy;

/// The node's slot keeper, shared by the device plugins and the DRA
/// kubelet plugin.
pub struct SlotKeeper<L, C> {
    pub node: String,
    local: L,
    cluster: C,
    pub metrics: DevicePluginMetrics,
    op_timeout: Duration,
    pub(crate) cdi: bool,
    /// The node's host path policy, checked by Allocate (and the device
    /// plugins' CDI specs) before a mount or device node is handed out.
    pub(crate) host_paths: HostPathPolicy,
    state: Mutex<State>,
    /// Poked after every successful Allocate, after a pod ended while
    /// claims await attribution, and after recovery with such claims: the
    /// follower lists pod resources until the slots are attributed or
    /// released.
    followup: mpsc::UnboundedSender<()>,
    /// Poked whenever the state is locked (a possible change), for the
    /// node view's publisher (`view.rs`); permits coalesce.
    changed: Arc<tokio::sync::Notify>,
    /// Bumped whenever the state is locked, for any number of followers
    /// (the DRA health streams); they compare what they derive.
    generation: watch::Sender<u64>,
    /// Events on the Instances (slot released, claim conflict), if any.
    events: Option<crate::events::EventSink>,
}

impl<L: ClaimStore, C: ClaimStore> SlotKeeper<L, C> {
    /// A core for `node` with an empty ledger (see [`SlotKeeper::recover`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node: String,
        local: L,
        cluster: C,
        slots: SlotConfig,
        metrics: DevicePluginMetrics,
        op_timeout: Duration,
        cdi: bool,
        host_paths: HostPathPolicy,
    ) -> (Self, mpsc::UnboundedReceiver<()>) {
        let (followup, rx) = mpsc::unbounded_channel();
        let core = Self {
            state: Mutex::new(State {
                ledger: SlotAllocator::new(node.clone(), slots),
                instances: BTreeMap::new(),
                broker: BTreeMap::new(),
                channels: BTreeMap::new(),
                slot_health: metrics.slots.clone(),
            }),
            node,
            local,
            cluster,
            metrics,
            op_timeout,
            cdi,
            host_paths,
            followup,
            changed: Arc::new(tokio::sync::Notify::new()),
            generation: watch::channel(0).0,
            events: None,
        };
        (core, rx)
    }

    /// Emit Kubernetes Events on the Instances through `events`.
    pub fn with_events(mut self, events: Option<crate::events::EventSink>) -> Self {
        self.events = events;
        self
    }

    /// The namespace and name of the Instance `slot` belongs to, if served.
    fn instance_of(st: &State, slot: &str) -> Option<(String, String)> {
        let (name, _) = slot.rsplit_once('-')?;
        st.instances
            .get(name)
            .map(|i| (i.namespace.clone(), i.name.clone()))
    }

    pub(crate) async fn lock(&self) -> MutexGuard<'_, State> {
        // The publisher's lock queues behind this one (the mutex is fair),
        // so it sees whatever this holder changes.
        self.changed.notify_one();
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
        self.state.lock().await
    }

    /// Changes whenever the state may have changed (see [`SlotKeeper::lock`]).
    pub(crate) fn generations(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The state, without telling the node view's publisher (it is the one
    /// asking).
    pub(crate) async fn lock_quiet(&self) -> MutexGuard<'_, State> {
        self.state.lock().await
    }

    /// Woken after the state may have changed.
    pub(crate) fn changes(&self) -> Arc<tokio::sync::Notify> {
        self.changed.clone()
    }

    async fn timed<T>(
        &self,
        fut: impl Future<Output = Result<T, ClaimError>>,
    ) -> Result<T, ClaimError> {
        match tokio::time::timeout(self.op_timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(ClaimError::Unreachable(format!(
                "no answer within {:?}",
                self.op_timeout
            ))),
        }
    }

    fn note<T>(&self, store: &str, op: &str, r: &Result<T, ClaimError>) {
        let result = match r {
            Ok(_) => "ok",
            Err(ClaimError::Unreachable(_)) => "unreachable",
            Err(ClaimError::NoInstance(_)) => "no_instance",
            Err(ClaimError::Failed(_)) => "failed",
        };
        self.metrics.claim_op(store, op, result);
    }

    /// Pokes the follower: it lists pod resources until the slots awaiting
    /// attribution are attributed or released.
    pub(crate) fn follow_up(&self) {
        let _ = self.followup.send(());
    }
}
