//! Proxy settings (from the command line) and the configuration file
//! (reloaded when it changes).

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

/// Where and how the proxy runs.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Socket the proxy serves CRI on (the kubelet's `--container-runtime-endpoint`).
    pub listen: PathBuf,
    /// The runtime's CRI socket.
    pub runtime: PathBuf,
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
    /// Deadline of calls the proxy makes to the runtime on its own behalf.
    pub runtime_timeout: Duration,
    /// How often the configuration file is checked for changes.
    pub config_poll: Duration,
    /// How often the runtime is probed (and re-synced after it comes back).
    pub runtime_probe: Duration,
    /// How often applied resources are read back from cgroupfs (0 = never).
    pub verify_interval: Duration,
    /// Metrics sink.
    pub metrics: Metrics,
    /// Cluster interface: configuration from ConfigMaps (overriding the
    /// file while one applies) and publishing to the Node. `None` = off.
    pub cluster: Option<crate::cluster::ClusterConfig>,
}

impl ProxyConfig {
    /// Defaults for a host: listens on `listen`, relays to `runtime`.
    pub fn new(
        listen: impl Into<PathBuf>,
        runtime: impl Into<PathBuf>,
        state_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            listen: listen.into(),
            runtime: runtime.into(),
            state_dir: state_dir.into(),
            config_file: None,
            allow_policy_switch: false,
            sysfs_root: PathBuf::from("/sys"),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            resctrl_root: PathBuf::from("/sys/fs/resctrl"),
            runtime_timeout: Duration::from_secs(10),
            config_poll: Duration::from_secs(2),
            runtime_probe: Duration::from_secs(1),
            verify_interval: Duration::from_secs(30),
            metrics: Metrics::default(),
            cluster: None,
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
    /// Parse YAML (JSON is YAML) and check it.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ResmgrError> {
        let err = |reason: String| ResmgrError::Config {
            path: path.to_path_buf(),
            reason,
        };
        let cfg: FileConfig = if text.trim().is_empty() {
            FileConfig::default()
        } else {
            serde_yaml::from_str(text).map_err(|e| err(e.to_string()))?
        };
        for (name, class) in &cfg.blockio.classes {
            class.validate(name).map_err(err)?;
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

    /// Read and parse a file.
    pub fn load(path: &Path) -> Result<Self, ResmgrError> {
        let text = std::fs::read_to_string(path).map_err(|e| ResmgrError::Config {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Self::parse(&text, path)
    }
}

/// Watch `path` and send each changed, valid configuration. Invalid files
/// are logged and skipped (the running configuration stays).
pub(crate) async fn watch(
    path: PathBuf,
    mut last: Option<String>,
    every: Duration,
    tx: mpsc::Sender<FileConfig>,
    metrics: Metrics,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let text = match tokio::fs::read_to_string(&path).await {
            Ok(t) => t,
            Err(e) => {
                debug!(path = %path.display(), error = %e, "configuration file unreadable");
                continue;
            }
        };
        if last.as_deref() == Some(text.as_str()) {
            continue;
        }
        last = Some(text.clone());
        match FileConfig::parse(&text, &path) {
            Ok(cfg) => {
                info!(path = %path.display(), "configuration changed");
                metrics.event("config-reload");
                if tx.send(cfg).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                metrics.event("config-rejected");
                warn!(error = %e, "ignoring invalid configuration; keeping the running one");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_file() {
        let text = r#"
policy:
  active: topology-aware
  config:
    reserved_cpus: "0"
    reserved_namespaces: [kube-system]
cri:
  disable_quota_for_exclusive: true
blockio:
  classes:
    slow:
      weight: 100
      devices:
        - { device: "254:0", read_bps: 1048576 }
rdt:
  classes:
    gold: { schemata: ["L3:0=ff"] }
"#;
        let cfg = FileConfig::parse(text, Path::new("c.yaml")).unwrap();
        assert_eq!(cfg.policy.active, PolicyKind::TopologyAware);
        assert_eq!(cfg.policy.config.reserved_cpus.to_string(), "0");
        assert!(cfg.cri.disable_quota_for_exclusive);
        assert_eq!(
            cfg.blockio.classes["slow"].devices[0].read_bps,
            Some(1 << 20)
        );
        assert_eq!(cfg.rdt.classes["gold"].schemata, vec!["L3:0=ff".to_owned()]);
        assert_eq!(
            FileConfig::parse("", Path::new("e")).unwrap(),
            FileConfig::default()
        );
    }

    #[test]
    fn rejects_bad_files_with_the_reason() {
        for (text, needle) in [
            ("policy: { active: fastest }", "unknown variant"),
            ("polcy: {}", "unknown field"),
            (
                "policy: { config: { reserved_cpus: \"0-\" } }",
                "invalid cpuset",
            ),
            ("blockio: { classes: { x: { weight: 5000 } } }", "weight"),
            ("rdt: { classes: { info: {} } }", "resctrl"),
            ("cri: { exclusive_oom_score_adj: 9999 }", "oom"),
        ] {
            let e = FileConfig::parse(text, Path::new("c.yaml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[tokio::test]
    async fn watcher_sends_changes_and_skips_invalid_files() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("c.yaml");
        std::fs::write(&path, "policy: { active: static }").unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let task = tokio::spawn(watch(
            path.clone(),
            Some("policy: { active: static }".into()),
            Duration::from_millis(20),
            tx,
            Metrics::default(),
        ));
        std::fs::write(&path, "policy: { active: bogus }").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(rx.try_recv().is_err(), "an invalid file must not be sent");
        std::fs::write(&path, "policy: { active: balloons }").unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.policy.active, PolicyKind::Balloons);
        task.abort();
    }
}
