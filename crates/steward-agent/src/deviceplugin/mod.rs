//! Device plugins: one kubelet device plugin (v1beta1) per Instance this
//! node serves, backed by the slot ledger of `steward_core::slots`.
//!
//! * Each Instance listing this node is served as the extended resource
//!   `steward.dev/<instance>` with its slots `<instance>-<n>` as device IDs,
//!   on the socket `steward-<instance>.sock` in kubelet's plugin directory.
//!   Plugins start and stop as Instances of this node appear and disappear
//!   (an Instance watch); a change of capacity reaches kubelet as a new
//!   device list, the device becoming usable again registers the plugin
//!   again.
//! * `ListAndWatch` reports what this node may use now: a slot free or held
//!   here is Healthy; held by another node, or its device gone, Unhealthy.
//!   Every change is pushed at once; NUMA nodes come from the device
//!   property [`NUMA_PROPERTY`].
//! * `Allocate` claims the slots durably (local store, then the cluster)
//!   before it answers; then pod resources are read until kubelet shows
//!   which pod uses them. The pod watch (this node's pods) reclaims slots at
//!   once when a pod is deleted or reaches Succeeded/Failed.
//! * At start the ledger is rebuilt from the local store, the cluster's
//!   claims, kubelet's pod resources and this node's pods.
//! * kubelet restarts (socket directory wiped, `kubelet.sock` re-created)
//!   are noticed by one watcher of `kubelet.sock` polling every
//!   [`DevicePluginConfig::poll`], which wakes the plugins; a registered
//!   plugin checks its own socket by itself only every 50 polls.
//!
//! Known limits: a pod deleted before kubelet's pod resources attributed its
//! slot (within milliseconds of admission) leaves a pending claim that is
//! released by the ledger's pending timeout, not at once; this node still
//! reuses it (kubelet re-allocates it), other nodes see it Unhealthy until
//! then. Device plugins run in Kubernetes mode only.

mod allocate;
mod cdi;
mod kubelet_socket;
mod plugin;
mod podresources;
mod serving;
mod view;
mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use steward_core::slots::SlotConfig;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

pub use self::allocate::{INSTANCE_ANNOTATION, SLOTS_ANNOTATION};
pub use self::cdi::{
    CDI_VERSION, kind as cdi_kind, qualified_name as cdi_qualified_name, spec_path as cdi_spec_path,
};
pub use self::plugin::{MAX_MESSAGE_BYTES, OPTIONS};
pub use self::podresources::{KubeletError, PodResourcesClient};
pub use crate::slot_keeper::{
    ClaimOpLabels, DevicePluginMetrics, NUMA_PROPERTY, ResultLabels, ServedInstance,
    SlotHealthLabels, env_name, resource_name, socket_name,
};

use self::plugin::PluginSite;
pub(crate) use self::plugin::finish_task;
use self::watch::CatalogEvent;
use crate::claims::{ClaimEvent, ClaimStore, InstanceDirectory};
use crate::slot_keeper::SlotKeeper;

/// How the device plugins are set up.
#[derive(Debug, Clone)]
pub struct DevicePluginConfig {
    /// kubelet's device plugin directory (`.../device-plugins`), where
    /// `kubelet.sock` is and plugin sockets are created.
    pub plugin_dir: PathBuf,
    /// kubelet's pod resources socket (`.../pod-resources/kubelet.sock`).
    pub pod_resources_socket: PathBuf,
    /// Where CDI spec files are written; `None`: no CDI (Allocate names no
    /// CDI devices).
    pub cdi_dir: Option<PathBuf>,
    /// Slot ledger timing (pending timeout).
    pub slots: SlotConfig,
    /// How often the ledger ticks (expiries, queued cluster writes, API
    /// server probe while unreachable).
    pub tick_interval: Duration,
    /// How often kubelet restarts are checked for (≤ 200 ms keeps
    /// re-registration well within a second).
    pub poll: Duration,
    /// Upper bound on one claim store operation or kubelet call.
    pub op_timeout: Duration,
    /// The Instances and Reservations followed (all, or this node's by
    /// label).
    pub selection: crate::selection::Selection,
}

impl DevicePluginConfig {
    /// Defaults for a kubelet rooted at `kubelet_root` (`/var/lib/kubelet`
    /// on a real node).
    pub fn new(kubelet_root: impl Into<PathBuf>, cdi_dir: Option<PathBuf>) -> Self {
        let root: PathBuf = kubelet_root.into();
        Self {
            plugin_dir: root.join("device-plugins"),
            pod_resources_socket: root.join("pod-resources").join("kubelet.sock"),
            cdi_dir,
            slots: SlotConfig::default(),
            tick_interval: Duration::from_millis(500),
            poll: Duration::from_millis(100),
            op_timeout: Duration::from_secs(5),
            selection: crate::selection::Selection::all(),
        }
    }
}

/// Errors that stop the device plugins.
#[derive(Debug, thiserror::Error)]
pub enum DevicePluginError {
    #[error("creating {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What [`run`] needs.
pub struct DevicePluginParts<L, C> {
    pub node: String,
    pub client: kube::Client,
    /// The agent's shared watches: the plugins subscribe to its Instances,
    /// Configurations, pods and Reservations (the claims come in as
    /// `claim_events`).
    pub watches: crate::watches::AgentWatches,
    /// The node's durable claim ledger.
    pub local: L,
    /// The cluster's claims.
    pub cluster: C,
    pub config: DevicePluginConfig,
    pub metrics: DevicePluginMetrics,
    /// Kept current from the Instance watch (the cluster claim store
    /// resolves Instances with it).
    pub directory: Option<InstanceDirectory>,
    /// The node view the slots are published to (the agent's pod resources
    /// server), if it runs.
    pub view: Option<Arc<steward_podresources::Hub>>,
    /// `device-plugins` (ledger recovered, plugins started) and one
    /// `device-plugin/<instance>` per plugin (registered with kubelet).
    pub readiness: steward_nodeio::Readiness,
    /// Kubernetes Events on the Instances (slot released, claim conflict).
    pub events: Option<crate::events::EventSink>,
    /// Tasks that serve on the same slot ledger (the DRA kubelet plugin),
    /// started with it and stopped with the plugins.
    pub(crate) with_core: Vec<CoreTask<L, C>>,
    /// This node publishes its devices and prepares claims (DRA driver on):
    /// the Instances of Configurations with `draExtendedResources` are
    /// served through DRA here ([`steward_api::Configuration::served_through_dra`]),
    /// and their device plugins are not registered with kubelet (a node
    /// must not offer one extended resource both ways).
    pub(crate) extended_through_dra: bool,
    /// The node's host path policy: every mount and device node of an
    /// Allocate answer or a CDI spec is checked against it.
    pub host_paths: crate::host_paths::HostPathPolicy,
}

/// A task given the slot keeper (weakly: it answers Unavailable once the
/// plugins stop).
pub(crate) type CoreTask<L, C> = Box<
    dyn FnOnce(std::sync::Weak<SlotKeeper<L, C>>) -> futures::future::BoxFuture<'static, ()> + Send,
>;

struct Running {
    inst: ServedInstance,
    /// The Instance's device list (what ListAndWatch sends).
    devices: tokio::sync::watch::Receiver<Vec<steward_proto::deviceplugin::v1beta1::Device>>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio_util::task::AbortOnDropHandle<()>,
}

/// Serves the device plugins of `parts.node` until `shutdown` resolves.
/// Dropping the future (an aborted task: the in-process kill -9) stops every
/// task and server it started; nothing is cleaned up.
pub async fn run<L: ClaimStore, C: ClaimStore>(
    parts: DevicePluginParts<L, C>,
    claim_events: impl futures::Stream<Item = ClaimEvent> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), DevicePluginError> {
    let DevicePluginParts {
        node,
        client,
        watches,
        local,
        cluster,
        config,
        metrics,
        directory,
        view,
        readiness,
        events,
        with_core,
        extended_through_dra,
        host_paths,
    } = parts;
    readiness.not_ready("device-plugins", "recovering the slot ledger");
    for dir in [Some(&config.plugin_dir), config.cdi_dir.as_ref()]
        .into_iter()
        .flatten()
    {
        std::fs::create_dir_all(dir).map_err(|source| DevicePluginError::Dir {
            path: dir.clone(),
            source,
        })?;
    }
    let (core, followups) = SlotKeeper::new(
        node.clone(),
        local,
        cluster,
        config.slots,
        metrics.clone(),
        config.op_timeout,
        config.cdi_dir.is_some(),
        host_paths,
    );
    let core = Arc::new(core.with_events(events));
    let podres = PodResourcesClient::new(&config.pod_resources_socket, config.op_timeout);

    let selection = config.selection.clone();
    let initial = watch::recovery_input(
        &client,
        &node,
        &selection,
        &podres,
        &core,
        directory.as_ref(),
    )
    .await;
    let served = watch::ServedChanges::complete(initial.served.clone());
    core.recover(initial.input).await;
    for (key, props) in &initial.broker {
        core.set_broker(key.clone(), Some(props.clone())).await;
    }

    let mut tasks = JoinSet::new();
    let (cat_tx, mut cat_rx) = mpsc::channel::<CatalogEvent>(256);
    tasks.spawn(watch::watch_instances(
        watches.instances(),
        node.clone(),
        directory,
        cat_tx.clone(),
    ));
    tasks.spawn(watch::watch_configurations(
        watches.configurations(),
        cat_tx,
    ));
    tasks.spawn(watch::watch_pods(
        watches.pods(),
        core.clone(),
        podres.clone(),
    ));
    tasks.spawn(watch::follow_allocations(
        core.clone(),
        podres.clone(),
        followups,
        Duration::from_millis(config.slots.pending_timeout_ms),
    ));
    tasks.spawn(watch::feed_claims(core.clone(), claim_events));
    tasks.spawn(watch::watch_reservations(
        watches.reservations(),
        core.clone(),
    ));
    if let Some(hub) = view {
        tasks.spawn(view::publish(core.clone(), hub));
    }
    for task in with_core {
        tasks.spawn(task(Arc::downgrade(&core)));
    }

    let serving = serving::ServingBoard::default();
    tasks.spawn(serving::write_status(
        client.clone(),
        node.clone(),
        serving.clone(),
    ));
    let (kubelet, kubelet_watch) = kubelet_socket::follow(
        PluginSite::kubelet_socket_of(&config.plugin_dir),
        config.poll,
    );
    tasks.spawn(kubelet_watch);
    let site = PluginSite {
        kubelet,
        plugin_dir: config.plugin_dir.clone(),
        poll: config.poll,
        rpc_timeout: config.op_timeout,
        readiness: readiness.clone(),
        serving,
    };
    let mut manager = Manager {
        core: core.clone(),
        site,
        cdi_dir: config.cdi_dir.clone(),
        running: BTreeMap::new(),
        broker: initial.broker,
        through_dra: if extended_through_dra {
            initial.through_dra
        } else {
            BTreeSet::new()
        },
        extended_through_dra,
        metrics,
    };
    manager.apply_served(served).await;
    // Spec files of the format before (named after the Configuration alone,
    // whatever its namespace) are not rewritten any more: gone, so no
    // runtime resolves a device from one.
    if let Some(dir) = &config.cdi_dir {
        match cdi::remove_legacy(dir) {
            Ok(removed) => {
                for path in removed {
                    tracing::info!(path = %path.display(), "removed a CDI spec of the format before (not namespaced)");
                }
            }
            Err(e) => tracing::warn!(error = %e, "removing CDI specs of the format before failed"),
        }
    }
    readiness.ready("device-plugins");

    let mut ticker = tokio::time::interval(config.tick_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    tracing::info!(%node, "device plugins started");
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(ev) = cat_rx.recv() => {
                // Events already waiting are taken too: consecutive
                // changes of the served set are folded into one, so a
                // burst starts its plugins and rewrites each CDI spec
                // once, not once per Instance.
                let mut pending = Some(ev);
                while let Some(ev) = pending.take() {
                    match (ev, cat_rx.try_recv()) {
                        (CatalogEvent::Instances(mut changes), Ok(CatalogEvent::Instances(next))) => {
                            changes.merge(next);
                            pending = Some(CatalogEvent::Instances(changes));
                        }
                        (ev, Ok(next)) => {
                            manager.on_catalog(ev).await;
                            pending = Some(next);
                        }
                        (ev, Err(_)) => manager.on_catalog(ev).await,
                    }
                }
            }
            _ = ticker.tick() => core.tick().await,
        }
    }
    manager.stop_all().await;
    tasks.abort_all();
    tracing::info!(%node, "device plugins stopped");
    Ok(())
}

struct Manager<L, C> {
    core: Arc<SlotKeeper<L, C>>,
    site: PluginSite,
    cdi_dir: Option<PathBuf>,
    running: BTreeMap<String, Running>,
    broker: BTreeMap<(String, String), BTreeMap<String, String>>,
    /// Configurations whose Instances are served through DRA on this node
    /// (empty unless `extended_through_dra`).
    through_dra: BTreeSet<(String, String)>,
    extended_through_dra: bool,
    metrics: DevicePluginMetrics,
}

impl<L: ClaimStore, C: ClaimStore> Manager<L, C> {
    async fn on_catalog(&mut self, ev: CatalogEvent) {
        match ev {
            CatalogEvent::Instances(changes) => self.apply_served(changes).await,
            CatalogEvent::Broker {
                key,
                props,
                through_dra,
            } => {
                let switched = if through_dra && self.extended_through_dra {
                    self.through_dra.insert(key.clone())
                } else {
                    self.through_dra.remove(&key)
                };
                if switched {
                    self.switch_path(&key);
                }
                let changed = self.broker.get(&key) != props.as_ref();
                match &props {
                    Some(p) => {
                        self.broker.insert(key.clone(), p.clone());
                    }
                    None => {
                        self.broker.remove(&key);
                    }
                }
                self.core.set_broker(key.clone(), props).await;
                if changed {
                    self.write_cdi(&BTreeSet::from([key]));
                }
            }
        }
    }

    /// Brings the running plugins in line with what changed in the set of
    /// Instances this node serves.
    async fn apply_served(&mut self, changes: watch::ServedChanges) {
        let watch::ServedChanges { complete, entries } = changes;
        let mut touched = BTreeSet::new();
        let gone: Vec<String> = if complete {
            self.running
                .keys()
                .filter(|n| !matches!(entries.get(*n), Some(Some(_))))
                .cloned()
                .collect()
        } else {
            entries
                .iter()
                .filter(|(_, now)| now.is_none())
                .map(|(name, _)| name.clone())
                .collect()
        };
        for name in gone {
            if let Some(r) = self.running.remove(&name) {
                touched.insert(r.inst.config_key());
                self.core.instance_removed(&name).await;
                stop(r, self.site.clone()).await;
                tracing::info!(instance = %name, "instance gone from this node; device plugin stopped");
            }
        }
        for (name, inst) in entries {
            let Some(inst) = inst else { continue };
            match self.running.get(&name) {
                Some(r) if r.inst == inst => {}
                Some(r) => {
                    touched.insert(inst.config_key());
                    let restart = r.inst.needs_reregistration(&inst);
                    let devices = self.core.instance_upserted(inst.clone()).await;
                    if restart {
                        if let Some(old) = self.running.remove(&name) {
                            stop(old, self.site.clone()).await;
                        }
                        tracing::info!(instance = %name, capacity = inst.capacity, "instance changed; restarting its device plugin");
                        let r = self.start(inst, devices, None);
                        self.running.insert(name, r);
                    } else if let Some(r) = self.running.get_mut(&name) {
                        r.inst = inst;
                    }
                }
                None => {
                    touched.insert(inst.config_key());
                    let devices = self.core.instance_upserted(inst.clone()).await;
                    tracing::info!(instance = %name, resource = %inst.resource_name, capacity = inst.capacity, "starting device plugin");
                    let r = self.start(inst, devices, None);
                    self.running.insert(name, r);
                }
            }
        }
        self.metrics
            .plugins
            .set(i64::try_from(self.running.len()).unwrap_or(i64::MAX));
        self.write_cdi(&touched);
    }

    /// Restarts the plugins of Configuration `key`'s Instances on the path
    /// [`Manager::start`] now picks (a device plugin, or DRA alone).
    fn switch_path(&mut self, key: &(String, String)) {
        let names: Vec<String> = self
            .running
            .iter()
            .filter(|(_, r)| &r.inst.config_key() == key)
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            let Some(old) = self.running.remove(&name) else {
                continue;
            };
            let site = self.site.clone();
            let devices = old.devices.clone();
            let inst = old.inst.clone();
            // The old generation ends before the new one starts: the
            // socket and the readiness entry are the same names.
            let r = self.start(inst, devices, Some(stop(old, site)));
            tracing::info!(instance = %name, through_dra = self.through_dra.contains(key), "instance's serving path changed");
            self.running.insert(name, r);
        }
    }

    /// Starts serving `inst`: its device plugin, or, for an Instance served
    /// through DRA on this node, only its entry in the Instance status (the
    /// slot ledger serves DRA either way). `after` runs first.
    fn start(
        &self,
        inst: ServedInstance,
        devices: tokio::sync::watch::Receiver<Vec<steward_proto::deviceplugin::v1beta1::Device>>,
        after: Option<futures::future::BoxFuture<'static, ()>>,
    ) -> Running {
        let stop = tokio_util::sync::CancellationToken::new();
        let through_dra = self.through_dra.contains(&inst.config_key());
        let (core, site, token) = (Arc::downgrade(&self.core), self.site.clone(), stop.clone());
        let (namespace, name, resource) = (
            inst.namespace.clone(),
            inst.name.clone(),
            inst.resource_name.clone(),
        );
        let rx = devices.clone();
        let task = tokio::spawn(async move {
            if let Some(previous) = after {
                previous.await;
            }
            if through_dra {
                plugin::through_dra(namespace, name, site, token).await;
            } else {
                plugin::run(core, namespace, name, resource, site, rx, token).await;
            }
        });
        Running {
            inst,
            devices,
            stop,
            task: tokio_util::task::AbortOnDropHandle::new(task),
        }
    }

    fn write_cdi(&self, configs: &BTreeSet<(String, String)>) {
        let Some(dir) = &self.cdi_dir else {
            return;
        };
        let empty = BTreeMap::new();
        for key in configs {
            let insts: Vec<&ServedInstance> = self
                .running
                .values()
                .map(|r| &r.inst)
                .filter(|i| &i.config_key() == key)
                .collect();
            let broker = self.broker.get(key).unwrap_or(&empty);
            let policy = &self.core.host_paths;
            if let Err(e) = cdi::write(policy, dir, &key.0, &key.1, &insts, broker) {
                tracing::error!(namespace = %key.0, configuration = %key.1, error = %e, "writing CDI spec failed");
            }
        }
    }

    async fn stop_all(&mut self) {
        for (_, r) in std::mem::take(&mut self.running) {
            stop(r, self.site.clone()).await;
        }
    }
}

fn stop(r: Running, site: PluginSite) -> futures::future::BoxFuture<'static, ()> {
    Box::pin(async move {
        r.stop.cancel();
        finish_task(r.task, Duration::from_secs(2)).await;
        site.readiness.remove(&plugin::readiness_name(&r.inst.name));
        site.serving
            .report(&r.inst.namespace, &r.inst.name, serving::Serving::Stopped);
    })
}
