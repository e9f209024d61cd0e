//! How the agent is configured by its caller (the `steward agent` subcommand or a test).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use steward_core::discovery::registry::RegistryConfig;
use steward_discovery::DiscoveryHandler;
use steward_discovery::client::ClientOptions;
use steward_discovery::handlers::HandlerOptions;
use steward_discovery::policy::Cidr;

use crate::AgentError;
use crate::host_paths::HostPathPolicy;
use crate::metrics::AgentMetrics;

/// Where Configurations come from and where Instances go.
#[derive(Clone)]
pub enum Mode {
    /// Configurations watched in every namespace, Instances written as custom resources.
    Kubernetes(kube::Client),
    /// Configurations read from a multi-document YAML file (reloaded when it
    /// changes); Instances kept in the node's embedded store.
    Standalone { configurations_file: PathBuf },
}

impl std::fmt::Debug for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mode::Kubernetes(_) => f.write_str("Kubernetes"),
            Mode::Standalone {
                configurations_file,
            } => f
                .debug_struct("Standalone")
                .field("configurations_file", configurations_file)
                .finish(),
        }
    }
}

/// Timings of the agent's loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentTimings {
    /// Upper bound between two registry ticks (retries and Offline expiry
    /// happen on ticks).
    pub tick_interval: Duration,
    /// How often the standalone configurations file is checked for changes.
    pub file_poll_interval: Duration,
    /// Most plan/apply rounds for one Configuration when writes conflict.
    pub max_conflict_retries: u32,
}

impl Default for AgentTimings {
    fn default() -> Self {
        Self {
            tick_interval: Duration::from_secs(1),
            file_poll_interval: Duration::from_secs(2),
            max_conflict_retries: 8,
        }
    }
}

/// Everything [`crate::run`] needs.
#[derive(Clone)]
pub struct AgentConfig {
    /// This node's name (the Kubernetes Node name).
    pub node_name: String,
    /// Directory of the node's embedded store (`steward.redb`).
    pub state_dir: PathBuf,
    /// Unix socket the Registration service listens on.
    pub registration_socket: PathBuf,
    /// Offline grace and retry interval of the handler registry.
    pub registry: RegistryConfig,
    /// Time limits for talking to external discovery handlers.
    pub client: ClientOptions,
    pub mode: Mode,
    /// Metrics, registered by the caller into its own registry; `None`
    /// keeps them unregistered.
    pub metrics: Option<AgentMetrics>,
    /// Handlers run inside the agent (registered with the embedded endpoint).
    pub embedded_handlers: Vec<Arc<dyn DiscoveryHandler>>,
    /// Where NETWORK discovery handler endpoints may point (empty: external
    /// handlers must use unix sockets). See `steward_discovery::policy`.
    pub network_handler_cidrs: Vec<Cidr>,
    pub timings: AgentTimings,
    /// Serve the Instances of this node as kubelet device plugins
    /// (Kubernetes mode only); `None`: discovery only.
    pub device_plugins: Option<crate::deviceplugin::DevicePluginConfig>,
    /// Serve the node view as kubelet's pod resources API plus the watch;
    /// `None`: off.
    pub pod_resources: Option<crate::pod_resources::PodResourcesConfig>,
    /// What `/readyz` reports: the Configurations read and applied, the
    /// slot ledger recovered, every device plugin registered with kubelet.
    pub readiness: steward_nodeio::Readiness,
    /// How long to wait at start for the node store while another agent
    /// (a previous one still stopping) holds it.
    pub store_wait: Duration,
    /// Publish the node's devices as `resource.k8s.io/v1` ResourceSlices
    /// (Kubernetes mode only; [`crate::dra`]).
    pub dra_slices: bool,
    /// Follow the Nodes and remove a deleted one from the Instances
    /// (Kubernetes mode). Off where `steward controller` runs: its leader
    /// does this with one watch, where every agent's own would receive
    /// every Node's every change.
    pub follow_node_deletions: bool,
    /// Follow only the Instances, SlotClaims and Reservations labeled with
    /// this node ([`crate::selection`]) instead of every one in the
    /// cluster. Needs the controller, which keeps the labels.
    pub select_by_node_labels: bool,
    /// How the slices publish Instances of several slots: one device per
    /// slot, or one device with consumable capacity
    /// ([`steward_core::dra::Layout`]).
    pub dra_layout: steward_core::dra::Layout,
    /// Serve the DRA kubelet plugin on the device plugins' slot ledger
    /// (needs `device_plugins`; [`crate::dra::kubelet`]).
    pub dra_plugin: Option<crate::dra::DraPluginConfig>,
    /// The node operator's rule for the host paths of Allocate answers and
    /// CDI specs ([`crate::host_paths`]); this agent's own, whatever other
    /// agents in the process hold. Default: [`HostPathPolicy::default`]
    /// (devices under `/dev/`, no mounts, no block devices).
    pub host_paths: HostPathPolicy,
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig")
            .field("node_name", &self.node_name)
            .field("state_dir", &self.state_dir)
            .field("registration_socket", &self.registration_socket)
            .field("registry", &self.registry)
            .field("client", &self.client)
            .field("mode", &self.mode)
            .field(
                "embedded_handlers",
                &self
                    .embedded_handlers
                    .iter()
                    .map(|h| h.name().to_string())
                    .collect::<Vec<_>>(),
            )
            .field("network_handler_cidrs", &self.network_handler_cidrs)
            .field("timings", &self.timings)
            .field("device_plugins", &self.device_plugins)
            .field("dra_slices", &self.dra_slices)
            .field("follow_node_deletions", &self.follow_node_deletions)
            .field("select_by_node_labels", &self.select_by_node_labels)
            .field("dra_layout", &self.dra_layout)
            .field("dra_plugin", &self.dra_plugin)
            .field("host_paths", &self.host_paths)
            .finish()
    }
}

impl AgentConfig {
    /// A configuration with default timings, no embedded handlers and no metrics.
    pub fn new(
        node_name: impl Into<String>,
        state_dir: impl Into<PathBuf>,
        registration_socket: impl Into<PathBuf>,
        mode: Mode,
    ) -> Self {
        Self {
            node_name: node_name.into(),
            state_dir: state_dir.into(),
            registration_socket: registration_socket.into(),
            registry: RegistryConfig::default(),
            client: ClientOptions::default(),
            mode,
            metrics: None,
            embedded_handlers: Vec::new(),
            network_handler_cidrs: Vec::new(),
            timings: AgentTimings::default(),
            device_plugins: None,
            pod_resources: None,
            readiness: steward_nodeio::Readiness::new(),
            store_wait: Duration::from_secs(60),
            dra_slices: false,
            follow_node_deletions: true,
            select_by_node_labels: false,
            dra_layout: steward_core::dra::Layout::PerSlot,
            dra_plugin: None,
            host_paths: HostPathPolicy::default(),
        }
    }

    pub(crate) fn check(&self) -> Result<(), AgentError> {
        if self.node_name.is_empty() {
            return Err(AgentError::Config("node name is empty".into()));
        }
        if self.timings.tick_interval.is_zero() || self.timings.file_poll_interval.is_zero() {
            return Err(AgentError::Config("timings must be non-zero".into()));
        }
        Ok(())
    }
}

/// The built-in handlers called `names`, set up with the node operator's
/// `options`, for [`AgentConfig::embedded_handlers`].
pub fn embedded_handlers(
    names: &[&str],
    options: &HandlerOptions,
) -> Result<Vec<Arc<dyn DiscoveryHandler>>, AgentError> {
    names
        .iter()
        .map(|name| {
            steward_discovery::handlers::by_name(name, options).ok_or_else(|| {
                AgentError::Config(format!(
                    "unknown embedded discovery handler {name:?} (known: {})",
                    steward_discovery::handlers::NAMES.join(", ")
                ))
            })
        })
        .collect()
}
