//! The agent's discovery loop: one task owning the handler registry, the
//! discovery streams, the latest reports and the Instance writes.
//!
//! Everything that changes state goes through this loop, one input at a
//! time, so the node never races itself; other nodes are handled by the
//! store's optimistic concurrency. Writes happen only in response to a
//! change (a report, a disconnect, a deleted Configuration or Node) or to
//! retry a write that failed: steady state writes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use steward_api::{ConfigurationSpec, HandlerStatus};
use steward_core::Millis;
use steward_core::discovery::instances::merge;
use steward_core::discovery::registry::{Effect, HandlerState, Registry, RegistryEvent};
use steward_core::discovery::validate::{RejectReason, validate};
use steward_core::discovery::{ConfigKey, Device, Endpoint, HandlerKey};
use steward_discovery::DiscoveryHandler;
use steward_discovery::client::ClientOptions;
use steward_discovery::registration::Registration;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::config::AgentTimings;
use crate::discovery::{self, DiscoveryMsg, Target, TaskReport};
use crate::metrics::AgentMetrics;
use crate::node_store::NodeStore;
use crate::source::{ConfigEvent, ConfigSnapshot};
use crate::status::{NodeContribution, REASON_INVALID_DETAILS, StatusWriter};
use crate::store::{self, Desired, InstanceStore, on_node};

struct ConfigState {
    snap: ConfigSnapshot,
    /// Latest validated report of each handler connected (or lately connected) for it.
    reports: BTreeMap<HandlerKey, Vec<Device>>,
    details: Option<Result<(), String>>,
    /// Last invalid-details message an Event was recorded for.
    warned: Option<String>,
    /// Instances of the Configuration after the last reconcile.
    instances: Option<u32>,
}

pub(crate) struct Inputs {
    pub registrations: mpsc::Receiver<Registration>,
    pub configs: mpsc::Receiver<ConfigEvent>,
    pub nodes_gone: mpsc::Receiver<String>,
}

/// The readiness condition the controller keeps.
pub(crate) const READY_CONFIGURATIONS: &str = "configurations";

pub(crate) struct Controller<S> {
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

pub(crate) struct ControllerParts<S> {
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

fn endpoint_text(e: &Endpoint) -> String {
    match e {
        Endpoint::Embedded => "embedded".into(),
        Endpoint::Uds(p) => format!("unix://{p}"),
        Endpoint::Network(u) => u.clone(),
    }
}

fn reason_label(r: &RejectReason) -> &'static str {
    match r {
        RejectReason::EmptyId => "empty_id",
        RejectReason::DuplicateId => "duplicate_id",
        RejectReason::InvalidPropertyName(_) => "invalid_property_name",
        RejectReason::HostPathNotAllowed(_) => "host_path_not_allowed",
        RejectReason::OverLimit { .. } => "over_limit",
    }
}

impl<S> Drop for Controller<S> {
    fn drop(&mut self) {
        for (_, (_, handle)) in std::mem::take(&mut self.tasks) {
            handle.abort();
        }
    }
}

impl<S: InstanceStore> Controller<S> {
    pub(crate) fn new(p: ControllerParts<S>) -> Self {
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

    async fn on_config(&mut self, ev: ConfigEvent) {
        match ev {
            ConfigEvent::Applied(snap) => {
                let key = snap.key.clone();
                let handler_name = snap.configuration.spec.discovery_handler.name.clone();
                tracing::info!(configuration = %key, handler = %handler_name, "configuration applied");
                let details = snap.request.as_ref().err().map(|m| Err(m.clone()));
                // A capacity edit changes no discovery request: discovery is
                // not restarted, and the Instances are resized from the
                // reports already in hand, once this node has reconciled them
                // at least once (before that, an empty report would read as
                // "no devices"). Any other change, including a new value of
                // a referenced Secret or ConfigMap, restarts discovery.
                let mut resize = None;
                let mut rediscover = true;
                match self.configs.get_mut(&key) {
                    Some(cs) => {
                        let (old, new) = (&cs.snap, &*snap);
                        rediscover = old.request != new.request
                            || !same_but_capacity(&old.configuration.spec, &new.configuration.spec);
                        let capacity = new.configuration.spec.capacity;
                        resize = (cs.instances.is_some()
                            && old.configuration.spec.capacity != capacity)
                            .then_some(capacity);
                        cs.snap = *snap;
                        cs.details = details;
                        cs.warned = None;
                    }
                    None => {
                        self.configs.insert(
                            key.clone(),
                            ConfigState {
                                snap: *snap,
                                reports: BTreeMap::new(),
                                details,
                                warned: None,
                                instances: None,
                            },
                        );
                    }
                }
                if rediscover {
                    let at = self.now();
                    self.feed(RegistryEvent::ConfigurationApplied {
                        config: key.clone(),
                        handler_name,
                        at,
                    })
                    .await;
                }
                self.warn_invalid(&key).await;
                if let Some(capacity) = resize {
                    tracing::info!(configuration = %key, capacity, "capacity changed; resizing instances");
                    self.reconcile(&key).await;
                }
                self.publish(&key).await;
            }
            ConfigEvent::Synced(live) => {
                self.sweep_orphans(&live).await;
                self.readiness.ready(READY_CONFIGURATIONS);
            }
            ConfigEvent::Deleted(key) => {
                tracing::info!(configuration = %key, "configuration deleted");
                let at = self.now();
                self.feed(RegistryEvent::ConfigurationDeleted {
                    config: key.clone(),
                    at,
                })
                .await;
                if let Some(cs) = self.configs.get_mut(&key) {
                    cs.reports.clear();
                }
                self.reconcile(&key).await;
                self.configs.remove(&key);
                self.published.remove(&key);
                if let Some(view) = &self.local {
                    view.remove(&key.namespace, &key.name);
                }
                self.retry_reconcile.remove(&key);
                self.metrics.set_instances(&key.to_string(), 0);
            }
        }
    }

    /// Remove this node from Instances of Configurations that no longer
    /// exist (deleted while the agent was down).
    async fn sweep_orphans(&mut self, live: &BTreeSet<ConfigKey>) {
        let all = match self.store.list_all().await {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!(error = %e, "listing instances for the orphan sweep failed");
                return;
            }
        };
        let orphans: BTreeSet<ConfigKey> = on_node(&all, &self.node)
            .map(|v| v.configuration.clone())
            .filter(|k| !live.contains(k) && !self.configs.contains_key(k))
            .collect();
        for key in orphans {
            tracing::info!(configuration = %key, "removing this node from instances of a vanished configuration");
            if let Err(e) = store::reconcile(
                &self.store,
                Desired {
                    node: &self.node,
                    key: &key,
                    owner: None,
                    shared: false,
                    // Nothing is wanted: no Instance is created or resized.
                    capacity: 0,
                    devices: &[],
                },
                self.timings.max_conflict_retries,
                &self.metrics,
            )
            .await
            {
                tracing::warn!(configuration = %key, error = %e, "orphan sweep failed");
            }
            self.metrics.set_instances(&key.to_string(), 0);
        }
    }

    async fn on_task(&mut self, report: TaskReport) {
        let TaskReport {
            task,
            key,
            config,
            msg,
        } = report;
        let pair = (key.clone(), config.clone());
        if self.tasks.get(&pair).map(|t| t.0) != Some(task) {
            return; // a stream that was already closed or replaced
        }
        match msg {
            DiscoveryMsg::Connected => {
                if let Some(cs) = self.configs.get_mut(&config) {
                    cs.details = Some(Ok(()));
                    cs.warned = None;
                }
                let at = self.now();
                self.feed(RegistryEvent::Connected { key, config, at })
                    .await;
            }
            DiscoveryMsg::Devices(devices) => {
                self.on_devices(&key, &config, devices).await;
                self.publish(&config).await;
            }
            DiscoveryMsg::InvalidDetails(message) => {
                self.tasks.remove(&pair);
                tracing::error!(configuration = %config, handler = %key.name, error = %message, "discovery handler refused the discovery details");
                if let Some(cs) = self.configs.get_mut(&config) {
                    cs.details = Some(Err(message));
                }
                self.warn_invalid(&config).await;
                self.publish(&config).await;
            }
            DiscoveryMsg::Lost(message) => {
                self.tasks.remove(&pair);
                self.metrics.lost(&key.name);
                tracing::warn!(configuration = %config, handler = %key.name, endpoint = %endpoint_text(&key.endpoint), error = %message, "discovery stream lost");
                let at = self.now();
                self.feed(RegistryEvent::ConnectionLost { key, config, at })
                    .await;
            }
        }
    }

    async fn on_devices(&mut self, key: &HandlerKey, config: &ConfigKey, devices: Vec<Device>) {
        let Some(cs) = self.configs.get_mut(config) else {
            return;
        };
        let policy = cs.snap.configuration.spec.device_policy();
        let (accepted, rejected) = validate(devices, &policy);
        for r in &rejected {
            tracing::warn!(configuration = %config, handler = %key.name, device = %r.device_id, reason = %r.reason, "rejected device reported by discovery handler");
            self.metrics
                .rejected(&config.to_string(), reason_label(&r.reason));
        }
        if cs.reports.get(key) == Some(&accepted) {
            return;
        }
        cs.reports.insert(key.clone(), accepted);
        self.reconcile(config).await;
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

    /// Apply a registry event and everything it leads to.
    async fn feed(&mut self, ev: RegistryEvent) {
        self.deferred.push(ev);
        let mut dirty = BTreeSet::new();
        while !self.deferred.is_empty() {
            for ev in std::mem::take(&mut self.deferred) {
                let fx = self.registry.apply(ev);
                dirty.extend(self.carry_out(fx));
            }
        }
        self.update_handler_metrics();
        for key in dirty {
            self.reconcile(&key).await;
        }
        let keys: Vec<ConfigKey> = self.configs.keys().cloned().collect();
        for key in keys {
            self.publish(&key).await;
        }
    }

    /// Carry out effects; returns the Configurations whose reports changed.
    fn carry_out(&mut self, fx: Vec<Effect>) -> BTreeSet<ConfigKey> {
        let reconnecting: BTreeSet<(HandlerKey, ConfigKey)> = fx
            .iter()
            .filter_map(|e| match e {
                Effect::Connect { key, config } => Some((key.clone(), config.clone())),
                _ => None,
            })
            .collect();
        let mut dirty = BTreeSet::new();
        for e in fx {
            match e {
                Effect::Connect { key, config } => self.spawn(key, config),
                Effect::Disconnect { key, config } => {
                    tracing::info!(configuration = %config, handler = %key.name, endpoint = %endpoint_text(&key.endpoint), "closing discovery stream");
                    let pair = (key, config);
                    if let Some((_, handle)) = self.tasks.remove(&pair) {
                        handle.abort();
                    }
                    // A stream re-opened in the same breath keeps the old
                    // report until the new one arrives: no churn.
                    if !reconnecting.contains(&pair)
                        && let Some(cs) = self.configs.get_mut(&pair.1)
                        && cs.reports.remove(&pair.0).is_some()
                    {
                        dirty.insert(pair.1);
                    }
                }
                Effect::Removed { key } => {
                    tracing::warn!(handler = %key.name, endpoint = %endpoint_text(&key.endpoint), "discovery handler removed after staying offline too long");
                    if key.endpoint == Endpoint::Embedded {
                        // Compiled in: it "registers" again at once and
                        // is retried like a freshly registered handler.
                        if let Some(h) = self.embedded.get(&key.name) {
                            self.deferred.push(RegistryEvent::Registered {
                                key: key.clone(),
                                shared: h.shared(),
                                at: self.now(),
                            });
                        }
                    } else if let Err(e) = self.state.remove_registration(&key) {
                        tracing::error!(error = %e, "could not forget persisted registration");
                    }
                    for (ckey, cs) in &mut self.configs {
                        let had = cs.reports.remove(&key).is_some();
                        if had || cs.snap.configuration.spec.discovery_handler.name == key.name {
                            dirty.insert(ckey.clone());
                        }
                    }
                }
            }
        }
        dirty
    }

    fn spawn(&mut self, key: HandlerKey, config: ConfigKey) {
        let pair = (key.clone(), config.clone());
        if let Some((_, handle)) = self.tasks.remove(&pair) {
            handle.abort();
        }
        let Some(cs) = self.configs.get(&config) else {
            return;
        };
        let req = match &cs.snap.request {
            Ok(r) => r.clone(),
            Err(message) => {
                tracing::error!(configuration = %config, error = %message, "not starting discovery: discovery properties unresolved");
                return;
            }
        };
        let target = match &key.endpoint {
            Endpoint::Embedded => match self.embedded.get(&key.name) {
                Some(h) => Target::Embedded(h.clone()),
                None => {
                    self.deferred.push(RegistryEvent::ConnectionLost {
                        key,
                        config,
                        at: self.now(),
                    });
                    return;
                }
            },
            other => Target::Remote(other.clone()),
        };
        tracing::info!(configuration = %config, handler = %key.name, endpoint = %endpoint_text(&key.endpoint), "opening discovery stream");
        let task = self.next_task;
        self.next_task += 1;
        let handle = tokio::spawn(discovery::run(
            task,
            key,
            config,
            target,
            req,
            self.client_opts.clone(),
            self.task_tx.clone(),
        ));
        self.tasks.insert(pair, (task, handle.abort_handle()));
    }

    /// Plan and write the Instances of `key` from the current reports.
    async fn reconcile(&mut self, key: &ConfigKey) {
        let Some(cs) = self.configs.get(key) else {
            return;
        };
        let reports: Vec<Vec<Device>> = cs.reports.values().cloned().collect();
        let devices = merge(&reports);
        let shared = cs
            .reports
            .keys()
            .any(|k| self.registry.get(k).is_some_and(|h| h.shared));
        let configuration = cs.snap.configuration.clone();
        let result = store::reconcile(
            &self.store,
            Desired {
                node: &self.node,
                key,
                owner: Some(&configuration),
                shared,
                capacity: configuration.spec.capacity,
                devices: &devices,
            },
            self.timings.max_conflict_retries,
            &self.metrics,
        )
        .await;
        match result {
            Ok(views) => {
                self.retry_reconcile.remove(key);
                let mine = on_node(&views, &self.node).count();
                self.metrics.set_instances(&key.to_string(), mine);
                if let Some(cs) = self.configs.get_mut(key) {
                    cs.instances = Some(u32::try_from(views.len()).unwrap_or(u32::MAX));
                }
            }
            Err(e) => {
                tracing::error!(configuration = %key, error = %e, "writing instances failed; will retry");
                self.retry_reconcile.insert(key.clone());
            }
        }
    }

    fn contribution(&self, key: &ConfigKey) -> Option<NodeContribution> {
        let cs = self.configs.get(key)?;
        let wanted = &cs.snap.configuration.spec.discovery_handler.name;
        let handlers = self
            .registry
            .handlers()
            .filter(|h| &h.key.name == wanted)
            .map(|h| HandlerStatus {
                node: self.node.clone(),
                name: h.key.name.clone(),
                endpoint: endpoint_text(&h.key.endpoint),
                state: if h.configurations.contains(key) {
                    "Active".into()
                } else if matches!(h.state, HandlerState::Offline { .. }) {
                    "Offline".into()
                } else {
                    "Waiting".into()
                },
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        Some(NodeContribution {
            handlers,
            details: cs.details.clone(),
            instances: cs.instances,
        })
    }

    /// Write this node's contribution to the Configuration's status if it changed.
    async fn publish(&mut self, key: &ConfigKey) {
        let Some(mine) = self.contribution(key) else {
            return;
        };
        if let (Some(view), Some(cs)) = (&self.local, self.configs.get(key)) {
            let mut c = cs.snap.configuration.clone();
            let generation = c.metadata.generation;
            c.status = Some(crate::status::merged(
                &Default::default(),
                &self.node,
                generation,
                &mine,
            ));
            view.set(c);
        }
        let Some(writer) = self.status.clone() else {
            return;
        };
        if self.published.get(key) == Some(&mine) {
            return;
        }
        match writer.write(key, &mine).await {
            Ok(_) => {
                self.published.insert(key.clone(), mine);
            }
            Err(e) => {
                tracing::warn!(configuration = %key, error = %e, "writing Configuration status failed; will retry");
            }
        }
    }

    /// Record an Event for newly invalid details (once per message).
    async fn warn_invalid(&mut self, key: &ConfigKey) {
        let Some(writer) = self.status.clone() else {
            return;
        };
        let Some(cs) = self.configs.get(key) else {
            return;
        };
        let Some(Err(message)) = &cs.details else {
            return;
        };
        if cs.warned.as_ref() == Some(message) {
            return;
        }
        let message = message.clone();
        let configuration = cs.snap.configuration.clone();
        match writer
            .warn(&configuration, REASON_INVALID_DETAILS, &message)
            .await
        {
            Ok(()) => {
                if let Some(cs) = self.configs.get_mut(key) {
                    cs.warned = Some(message);
                }
            }
            Err(e) => tracing::warn!(configuration = %key, error = %e, "recording Event failed"),
        }
    }

    fn update_handler_metrics(&self) {
        let (mut w, mut a, mut o) = (0, 0, 0);
        for h in self.registry.handlers() {
            match h.state {
                HandlerState::Waiting => w += 1,
                HandlerState::Active => a += 1,
                HandlerState::Offline { .. } => o += 1,
            }
        }
        self.metrics.set_handlers(w, a, o);
    }
}

/// Whether two specs differ in nothing but `capacity`.
fn same_but_capacity(a: &ConfigurationSpec, b: &ConfigurationSpec) -> bool {
    let mut b = b.clone();
    b.capacity = a.capacity;
    *a == b
}
