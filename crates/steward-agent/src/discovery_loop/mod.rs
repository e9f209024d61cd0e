//! The agent's discovery loop: one task owning the handler registry, the
//! discovery streams, the latest reports and the Instance writes.
//!
//! Everything that changes state goes through this loop, one input at a
//! time, so the node never races itself; other nodes are handled by the
//! store's optimistic concurrency. Writes happen only in response to a
//! change (a report, a disconnect, a deleted Configuration or Node) or to
//! retry a write that failed: steady state writes nothing.

mod configurations;
mod handlers;
mod writes;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use steward_core::Millis;
use steward_core::discovery::registry::{Registry, RegistryEvent};
use steward_core::discovery::{ConfigKey, Device, Endpoint, HandlerKey};
use steward_discovery::DiscoveryHandler;
use steward_discovery::client::ClientOptions;
use steward_discovery::registration::Registration;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::config::AgentTimings;
use crate::discovery::TaskReport;
use crate::error::InvalidDetails;
use crate::metrics::AgentMetrics;
use crate::node_store::NodeStore;
use crate::source::{ConfigEvent, ConfigSnapshot};
use crate::status::{NodeContribution, StatusWriter};
use crate::store::{self, InstanceStore};

struct ConfigState {
    snap: ConfigSnapshot,
    /// Latest validated report of each handler connected (or lately connected) for it.
    reports: BTreeMap<HandlerKey, Vec<Device>>,
    details: Option<Result<(), InvalidDetails>>,
    /// Last invalid-details message an Event was recorded for.
    warned: Option<InvalidDetails>,
    /// Instances of the Configuration after the last reconcile.
    instances: Option<u32>,
}

pub(crate) struct Inputs {
    pub registrations: mpsc::Receiver<Registration>,
    pub configs: mpsc::Receiver<ConfigEvent>,
    pub nodes_gone: mpsc::Receiver<String>,
}

/// The readiness condition the discovery loop keeps.
pub(crate) const READY_CONFIGURATIONS: &str = "configurations";

pub(crate) struct DiscoveryLoop<S> {
    node: String,
    store: S,
    registry: Registry,
    state: NodeStore,
    metrics: AgentMetrics,
    embedded: BTreeMap<String, Arc<dyn DiscoveryHandler>>,
    client_opts: ClientOptions,
    timings: AgentTimings,
    status: Option<StatusWriter>,
    /// Standalone: where the read API finds the Configurations' status.
    local: Option<crate::local_api::LocalView>,
    readiness: steward_nodeio::Readiness,
    start: Instant,
    tasks: BTreeMap<(HandlerKey, ConfigKey), (u64, AbortHandle)>,
    next_task: u64,
    task_tx: mpsc::Sender<TaskReport>,
    task_rx: mpsc::Receiver<TaskReport>,
    configs: BTreeMap<ConfigKey, ConfigState>,
    deferred: Vec<RegistryEvent>,
    retry_reconcile: BTreeSet<ConfigKey>,
    retry_node_gone: BTreeSet<String>,
    published: BTreeMap<ConfigKey, NodeContribution>,
}

pub(crate) struct DiscoveryLoopParts<S> {
    pub node: String,
    pub store: S,
    pub registry: Registry,
    pub state: NodeStore,
    pub metrics: AgentMetrics,
    pub embedded: Vec<Arc<dyn DiscoveryHandler>>,
    pub client_opts: ClientOptions,
    pub timings: AgentTimings,
    pub status: Option<StatusWriter>,
    /// Standalone: the Configurations' status for the read API.
    pub local: Option<crate::local_api::LocalView>,
    /// `configurations` holds once the initial list has been applied.
    pub readiness: steward_nodeio::Readiness,
}

pub(super) fn endpoint_text(e: &Endpoint) -> String {
    match e {
        Endpoint::Embedded => "embedded".into(),
        Endpoint::Uds(p) => format!("unix://{p}"),
        Endpoint::Network(u) => u.clone(),
    }
}

impl<S> Drop for DiscoveryLoop<S> {
    fn drop(&mut self) {
        for (_, (_, handle)) in std::mem::take(&mut self.tasks) {
            handle.abort();
        }
    }
}

impl<S: InstanceStore> DiscoveryLoop<S> {
    pub(crate) fn new(p: DiscoveryLoopParts<S>) -> Self {
        let (task_tx, task_rx) = mpsc::channel(256);
        Self {
            node: p.node,
            store: p.store,
            registry: p.registry,
            state: p.state,
            metrics: p.metrics,
            embedded: p
                .embedded
                .into_iter()
                .map(|h| (h.name().to_string(), h))
                .collect(),
            client_opts: p.client_opts,
            timings: p.timings,
            status: p.status,
            local: p.local,
            readiness: p.readiness,
            start: Instant::now(),
            tasks: BTreeMap::new(),
            next_task: 0,
            task_tx,
            task_rx,
            configs: BTreeMap::new(),
            deferred: Vec::new(),
            retry_reconcile: BTreeSet::new(),
            retry_node_gone: BTreeSet::new(),
            published: BTreeMap::new(),
        }
    }

    fn now(&self) -> Millis {
        Millis(u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    /// Register embedded handlers and restore persisted registrations.
    pub(crate) async fn restore(&mut self) -> Result<(), crate::AgentError> {
        let embedded: Vec<(String, bool)> = self
            .embedded
            .values()
            .map(|h| (h.name().to_string(), h.shared()))
            .collect();
        for (name, shared) in embedded {
            let at = self.now();
            self.feed(RegistryEvent::Registered {
                key: HandlerKey {
                    name,
                    endpoint: Endpoint::Embedded,
                },
                shared,
                at,
            })
            .await;
        }
        for (key, shared) in self.state.registrations()? {
            tracing::info!(name = %key.name, endpoint = %endpoint_text(&key.endpoint), "restoring persisted discovery handler registration");
            let at = self.now();
            self.feed(RegistryEvent::Registered { key, shared, at })
                .await;
        }
        Ok(())
    }

    /// Run until `shutdown` resolves.
    pub(crate) async fn run(
        mut self,
        mut inputs: Inputs,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let mut ticker = tokio::time::interval(self.timings.tick_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(reg) = inputs.registrations.recv() => self.on_registration(reg).await,
                Some(ev) = inputs.configs.recv() => self.on_config(ev).await,
                Some(report) = self.task_rx.recv() => self.on_task(report).await,
                Some(node) = inputs.nodes_gone.recv() => self.on_node_gone(node).await,
                _ = ticker.tick() => self.on_tick().await,
            }
        }
        for (_, (_, handle)) in std::mem::take(&mut self.tasks) {
            handle.abort();
        }
        tracing::info!(node = %self.node, "discovery loop stopped");
    }

    async fn on_registration(&mut self, reg: Registration) {
        if self.registry.get(&reg.key).map(|h| h.shared) != Some(reg.shared)
            && let Err(e) = self.state.put_registration(&reg.key, reg.shared)
        {
            tracing::error!(error = %e, name = %reg.key.name, "could not persist registration; it will not survive a restart");
        }
        let at = self.now();
        self.feed(RegistryEvent::Registered {
            key: reg.key,
            shared: reg.shared,
            at,
        })
        .await;
    }

    async fn on_node_gone(&mut self, node: String) {
        if node == self.node {
            return;
        }
        tracing::info!(node = %node, "node deleted; removing it from every instance");
        match store::remove_node(
            &self.store,
            &node,
            self.timings.max_conflict_retries,
            &self.metrics,
        )
        .await
        {
            Ok(()) => {
                self.retry_node_gone.remove(&node);
                let keys: Vec<ConfigKey> = self.configs.keys().cloned().collect();
                for key in keys {
                    self.reconcile(&key).await;
                    self.publish(&key).await;
                }
            }
            Err(e) => {
                tracing::error!(node = %node, error = %e, "removing deleted node from instances failed; will retry");
                self.retry_node_gone.insert(node);
            }
        }
    }

    async fn on_tick(&mut self) {
        let now = self.now();
        self.feed(RegistryEvent::Tick { now }).await;
        for key in std::mem::take(&mut self.retry_reconcile) {
            self.reconcile(&key).await;
        }
        for node in std::mem::take(&mut self.retry_node_gone) {
            self.on_node_gone(node).await;
        }
        let keys: Vec<ConfigKey> = self.configs.keys().cloned().collect();
        for key in keys {
            self.publish(&key).await;
        }
    }
}
