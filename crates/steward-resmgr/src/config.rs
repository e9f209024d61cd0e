//! Settings of the resource manager and of its two transports (from the
//! command line), and the configuration file (reloaded when it changes).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use steward_core::cpu::{PolicyConfig, PolicyKind};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::cgroups::BlockIoClass;
use crate::error::ResmgrError;
use crate::metrics::Metrics;

/// The resource manager itself, whatever its transport: state, policy
/// configuration (file and cluster), cgroupfs, read-back, pod resources.
/// The CRI proxy ([`ProxyConfig`]) and the NRI plugin
/// ([`crate::nri::NriConfig`]) each add where they attach.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Directory of the state cache.
    pub state_dir: PathBuf,
    /// Configuration file (YAML or JSON); `None` runs with defaults.
    pub config_file: Option<PathBuf>,
    /// Allow a changed `policy.active` in the file to switch the running
    /// policy. Without it a change of policy is refused and logged.
    pub allow_policy_switch: bool,
    /// sysfs root for topology discovery (normally `/sys`).
    pub sysfs_root: PathBuf,
    /// cgroupfs root (normally `/sys/fs/cgroup`).
    pub cgroup_root: PathBuf,
    /// resctrl mount (normally `/sys/fs/resctrl`).
    pub resctrl_root: PathBuf,
    /// How often the configuration file is checked for changes.
    pub config_poll: Duration,
    /// How often applied resources are read back from cgroupfs (0 = never).
    pub verify_interval: Duration,
    /// Metrics sink.
    pub metrics: Metrics,
    /// Cluster interface: configuration from ConfigMaps (overriding the
    /// file while one applies) and publishing to the Node. `None` = off.
    pub cluster: Option<ClusterConfig>,
    /// Serve the pod resources API (podresources v1 + watch) over this
    /// manager's assignments on this socket; the agent follows it so its
    /// own pod resources socket shows the whole node. `None` = off.
    pub pod_resources_socket: Option<PathBuf>,
    /// Metrics of that server.
    pub pod_resources_metrics: steward_podresources::PodResourcesMetrics,
}

impl ManagerConfig {
    /// Defaults for a host, the cache in `state_dir`.
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            config_file: None,
            allow_policy_switch: false,
            sysfs_root: PathBuf::from("/sys"),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            resctrl_root: PathBuf::from("/sys/fs/resctrl"),
            config_poll: Duration::from_secs(2),
            verify_interval: Duration::from_secs(30),
            metrics: Metrics::default(),
            cluster: None,
            pod_resources_socket: None,
            pod_resources_metrics: Default::default(),
        }
    }
}

/// Where and how the CRI proxy runs: the resource manager plus the CRI
/// sockets it serves and relays to.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Socket the proxy serves CRI on (the kubelet's `--container-runtime-endpoint`).
    pub listen: PathBuf,
    /// The runtime's CRI socket.
    pub runtime: PathBuf,
    /// Deadline of calls the proxy makes to the runtime on its own behalf.
    pub runtime_timeout: Duration,
    /// How often the runtime is probed (and re-synced after it comes back).
    pub runtime_probe: Duration,
    /// Serve the CRI socket through the `:authority` fix, for CRI clients
    /// built on gRPC C-core (Python grpcio, C++), which h2 otherwise resets.
    /// kubelet, crictl and containerd's tools (grpc-go) do not need it.
    pub authority_fix: bool,
    /// The resource manager.
    pub manager: ManagerConfig,
}

/// Deadline of calls the resource manager makes to the runtime on its own
/// behalf unless configured otherwise.
pub const RUNTIME_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// Whether the CRI socket is served through the `:authority` fix unless
/// configured otherwise (BENCHMARKS.md, "`:authority` fix").
pub const AUTHORITY_FIX_DEFAULT: bool = false;

/// Namespace of the ConfigMaps unless configured otherwise.
pub const DEFAULT_NAMESPACE: &str = "kube-system";

/// Where the cluster configuration comes from and which Node is ours.
#[derive(Clone)]
pub struct ClusterConfig {
    /// API server client.
    pub client: kube::Client,
    /// This node's name (the Node object and `steward-resmgr.node.<name>`).
    pub node_name: String,
    /// Namespace of the ConfigMaps.
    pub namespace: String,
    /// How long [`crate::Proxy::start`] waits for the first resolved cluster
    /// configuration before starting with the file (or the defaults).
    pub initial_timeout: Duration,
    /// Delay before a failed Node patch is retried.
    pub publish_retry: Duration,
}

impl ClusterConfig {
    /// ConfigMaps in `kube-system`, 5 s initial wait, 5 s publish retry.
    pub fn new(client: kube::Client, node_name: impl Into<String>) -> Self {
        Self {
            client,
            node_name: node_name.into(),
            namespace: DEFAULT_NAMESPACE.to_owned(),
            initial_timeout: Duration::from_secs(5),
            publish_retry: Duration::from_secs(5),
        }
    }
}

impl ProxyConfig {
    /// Defaults for a host: listens on `listen`, relays to `runtime`, the
    /// cache in `state_dir`.
    pub fn new(
        listen: impl Into<PathBuf>,
        runtime: impl Into<PathBuf>,
        state_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            listen: listen.into(),
            runtime: runtime.into(),
            runtime_timeout: RUNTIME_TIMEOUT_DEFAULT,
            runtime_probe: Duration::from_secs(1),
            authority_fix: AUTHORITY_FIX_DEFAULT,
            manager: ManagerConfig::new(state_dir),
        }
    }
}

/// Which policy runs and its parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySection {
    /// Active policy.
    #[serde(default = "default_policy")]
    pub active: PolicyKind,
    /// Parameters, live-reconfigurable.
    #[serde(default)]
    pub config: PolicyConfig,
}

fn default_policy() -> PolicyKind {
    PolicyKind::Static
}

impl Default for PolicySection {
    fn default() -> Self {
        Self {
            active: default_policy(),
            config: PolicyConfig::default(),
        }
    }
}

/// Settings of the in-band CRI controller.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CriControlConfig {
    /// Drop the CFS quota of containers on exclusive CPUs (they cannot be
    /// throttled onto anybody else's CPUs anyway).
    #[serde(default)]
    pub disable_quota_for_exclusive: bool,
    /// Leave `cpuset.mems` alone (do not pin memory to the assigned nodes).
    #[serde(default)]
    pub skip_memory_pinning: bool,
    /// OOM score adjustment for containers on exclusive CPUs (overrides the
    /// kubelet's value; `None` keeps it).
    #[serde(default)]
    pub exclusive_oom_score_adj: Option<i64>,
}

/// Block I/O classes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockIoSection {
    /// Classes by name.
    #[serde(default)]
    pub classes: BTreeMap<String, BlockIoClass>,
}

/// One RDT class: a resctrl group and its schemata.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RdtClass {
    /// Lines for the group's `schemata` file (e.g. `L3:0=ff`, `MB:0=50`).
    #[serde(default)]
    pub schemata: Vec<String>,
}

/// RDT classes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RdtSection {
    /// Classes by name.
    #[serde(default)]
    pub classes: BTreeMap<String, RdtClass>,
}

/// The configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Policy selection and parameters.
    #[serde(default)]
    pub policy: PolicySection,
    /// CRI controller.
    #[serde(default)]
    pub cri: CriControlConfig,
    /// Block I/O controller.
    #[serde(default)]
    pub blockio: BlockIoSection,
    /// RDT controller.
    #[serde(default)]
    pub rdt: RdtSection,
}

impl FileConfig {
    /// Parse YAML (JSON is YAML) and check it. An empty document is
    /// refused: it is what a reader sees while an editor rewrites the file,
    /// and taking it for "all defaults" would drop the running settings (a
    /// configuration of all defaults is written `{}`).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ResmgrError> {
        if text.trim().is_empty() {
            return Err(ResmgrError::Config {
                path: path.to_path_buf(),
                reason: "the document is empty (write `{}` for all defaults)".into(),
                source: None,
            });
        }
        Self::parse_document(text, path)
    }

    /// Like [`FileConfig::parse`], but an empty document means the defaults:
    /// for the file read at start, when there is no running configuration an
    /// empty read could replace.
    pub fn parse_initial(text: &str, path: &Path) -> Result<Self, ResmgrError> {
        if text.trim().is_empty() {
            info!(path = %path.display(), "configuration file is empty; starting with the defaults");
            return Ok(FileConfig::default());
        }
        Self::parse_document(text, path)
    }

    fn parse_document(text: &str, path: &Path) -> Result<Self, ResmgrError> {
        let err = |reason: String| ResmgrError::Config {
            path: path.to_path_buf(),
            reason,
            source: None,
        };
        // One-line errors (no source snippet): the reason goes into a log line.
        let plain = serde_saphyr::options! { with_snippet: false };
        let cfg: FileConfig =
            serde_saphyr::from_str_with_options(text, plain).map_err(|e| ResmgrError::Config {
                path: path.to_path_buf(),
                reason: e.to_string(),
                source: Some(Box::new(e)),
            })?;
        for (name, class) in &cfg.blockio.classes {
            class.validate(name).map_err(|e| ResmgrError::Config {
                path: path.to_path_buf(),
                reason: e.to_string(),
                source: Some(Box::new(e)),
            })?;
        }
        for (name, class) in &cfg.rdt.classes {
            if name.is_empty()
                || name.contains('/')
                || name == "."
                || name == ".."
                || name == "info"
            {
                return Err(err(format!(
                    "rdt class name {name:?} cannot be a resctrl group"
                )));
            }
            if class.schemata.iter().any(|l| l.contains('\n')) {
                return Err(err(format!(
                    "rdt class {name}: one schemata line per entry"
                )));
            }
        }
        if let Some(adj) = cfg.cri.exclusive_oom_score_adj
            && !(-1000..=1000).contains(&adj)
        {
            return Err(err(format!(
                "cri.exclusive_oom_score_adj {adj} outside -1000..=1000"
            )));
        }
        Ok(cfg)
    }

    /// Read and parse a file (refusing an empty one).
    pub fn load(path: &Path) -> Result<Self, ResmgrError> {
        let text = std::fs::read_to_string(path).map_err(|e| ResmgrError::Config {
            path: path.to_path_buf(),
            reason: "reading failed".into(),
            source: Some(Box::new(e)),
        })?;
        Self::parse(&text, path)
    }
}

/// How long a read must stay unchanged before it is believed: twice the
/// same text, length and modification time this far apart.
fn settle_time(poll: Duration) -> Duration {
    poll.clamp(Duration::from_millis(10), Duration::from_millis(250))
}

/// Reads before a file that keeps changing is left for the next poll.
const SETTLE_ROUNDS: usize = 20;

#[derive(PartialEq, Eq)]
struct Snapshot {
    text: String,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

async fn snapshot(path: &Path) -> std::io::Result<Snapshot> {
    let before = tokio::fs::metadata(path).await?;
    let text = tokio::fs::read_to_string(path).await?;
    Ok(Snapshot {
        text,
        len: before.len(),
        modified: before.modified().ok(),
    })
}

/// The file's text once it has stopped changing: two reads `settle` apart
/// that agree on text, length and modification time. `Ok(None)` when it
/// was still changing after [`SETTLE_ROUNDS`] reads (an editor mid-write).
pub(crate) async fn read_settled(path: &Path, settle: Duration) -> std::io::Result<Option<String>> {
    let mut prev = snapshot(path).await?;
    for _ in 0..SETTLE_ROUNDS {
        tokio::time::sleep(settle).await;
        let next = snapshot(path).await?;
        if next == prev {
            return Ok(Some(next.text));
        }
        prev = next;
    }
    Ok(None)
}

/// The file at start: read until it settles, an empty file means the
/// defaults. Returns the configuration and the text it came from.
pub(crate) async fn load_initial(
    path: &Path,
    poll: Duration,
) -> Result<(FileConfig, String), ResmgrError> {
    let io_err = |e: std::io::Error| ResmgrError::Config {
        path: path.to_path_buf(),
        reason: "reading failed".into(),
        source: Some(Box::new(e)),
    };
    let text = match read_settled(path, settle_time(poll))
        .await
        .map_err(io_err)?
    {
        Some(t) => t,
        None => {
            return Err(ResmgrError::Config {
                path: path.to_path_buf(),
                reason: "the file kept changing while it was read".into(),
                source: None,
            });
        }
    };
    Ok((FileConfig::parse_initial(&text, path)?, text))
}

/// Watch `path` and send each changed, valid configuration. A changed file
/// is only read once it has settled (see [`read_settled`]); an empty,
/// unparsable or invalid document never replaces the running configuration:
/// it is logged once, counted as `config-rejected`, and the file is read
/// again on its next change. `applied` is the text of the configuration in
/// force (the file read at start); a refused text followed by the applied
/// one again (an editor that truncated, then rewrote the same document)
/// sends nothing.
pub(crate) async fn watch(
    path: PathBuf,
    mut applied: Option<String>,
    every: Duration,
    tx: mpsc::Sender<FileConfig>,
    metrics: Metrics,
) {
    let settle = settle_time(every);
    let mut refused: Option<String> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let text = match read_settled(&path, settle).await {
            Ok(Some(t)) => t,
            Ok(None) => {
                debug!(path = %path.display(), "configuration file still changing; reading it again later");
                continue;
            }
            Err(e) => {
                debug!(path = %path.display(), error = %e, "configuration file unreadable");
                continue;
            }
        };
        if applied.as_deref() == Some(text.as_str()) {
            refused = None;
            continue;
        }
        if refused.as_deref() == Some(text.as_str()) {
            continue;
        }
        match FileConfig::parse(&text, &path) {
            Ok(cfg) => {
                info!(path = %path.display(), "configuration changed");
                metrics.event("config-reload");
                applied = Some(text);
                refused = None;
                if tx.send(cfg).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                metrics.event("config-rejected");
                warn!(error = %e, "ignoring invalid configuration; keeping the running one");
                refused = Some(text);
            }
        }
    }
}

#[cfg(test)]
mod tests;
