//! Configuration from the cluster: ConfigMaps that carry the same document
//! as the configuration file (after CRI-RM's node agent).
//!
//! **Configuration.** ConfigMaps in [`ClusterConfig::namespace`] carry the
//! same document as the configuration file under the key
//! [`CONFIG_KEY`]. For node `N` the first that exists wins:
//! `steward-resmgr.node.N`, `steward-resmgr.group.G` where `G` is the
//! node's [`GROUP_LABEL`] label, `steward-resmgr.default`. The ConfigMaps
//! and the Node are watched; every change of the resolved document is
//! sent on ([`watch`]) into the same apply path as the file. A document
//! that does not parse is refused with a log line and the running
//! configuration stays. When no ConfigMap applies, [`ClusterUpdate::Fallback`]
//! hands control back to the file (or the defaults).

use std::path::PathBuf;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::Api;
use kube::runtime::watcher;
use steward_kube::{Change, Mirror, SharedWatch};
use tracing::{info, warn};

use crate::config::FileConfig;
pub use crate::config::{ClusterConfig, DEFAULT_NAMESPACE};
use crate::error::ResmgrError;
use crate::metrics::Metrics;

/// Node label naming the node's configuration group.
pub const GROUP_LABEL: &str = "resmgr.steward.dev/group";
/// ConfigMap key holding the configuration document.
pub const CONFIG_KEY: &str = "config.yaml";
/// Prefix of the ConfigMap names.
pub const CONFIGMAP_PREFIX: &str = "steward-resmgr";

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("node_name", &self.node_name)
            .field("namespace", &self.namespace)
            .field("initial_timeout", &self.initial_timeout)
            .field("publish_retry", &self.publish_retry)
            .finish_non_exhaustive()
    }
}

/// `steward-resmgr.node.<node>`.
pub fn node_configmap(node: &str) -> String {
    format!("{CONFIGMAP_PREFIX}.node.{node}")
}

/// `steward-resmgr.group.<group>`.
pub fn group_configmap(group: &str) -> String {
    format!("{CONFIGMAP_PREFIX}.group.{group}")
}

/// `steward-resmgr.default`.
pub fn default_configmap() -> String {
    format!("{CONFIGMAP_PREFIX}.default")
}

/// The ConfigMaps that can apply to a node, most specific first.
pub fn candidates(node: &str, group: Option<&str>) -> Vec<String> {
    let mut v = vec![node_configmap(node)];
    if let Some(g) = group.filter(|g| !g.is_empty()) {
        v.push(group_configmap(g));
    }
    v.push(default_configmap());
    v
}

/// The ConfigMap that applies and its document (`None`: the key is missing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// ConfigMap name.
    pub name: String,
    /// Content of [`CONFIG_KEY`].
    pub document: Option<String>,
}

/// What the cluster says, as it changes.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterUpdate {
    /// A ConfigMap applies and its document is valid.
    Config {
        /// ConfigMap name.
        configmap: String,
        /// The parsed document.
        config: Box<FileConfig>,
    },
    /// No ConfigMap applies: the file (or the defaults) rules.
    Fallback,
}

/// node > group > default selection over the ConfigMaps seen so far.
#[derive(Debug)]
pub struct ConfigSelector {
    node: String,
    group: Option<String>,
    /// Our ConfigMaps by name, with their document (`None`: no
    /// [`CONFIG_KEY`]); other ConfigMaps of the namespace are not kept.
    maps: Mirror<ConfigMap, Option<String>, String>,
    last: Option<Option<Selected>>,
}

impl ConfigSelector {
    /// Selection for `node`, no group, no ConfigMaps yet.
    pub fn new(node: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            group: None,
            maps: Mirror::keyed(
                |cm: &ConfigMap| cm.metadata.name.clone().filter(|n| ours(n)),
                |cm| Some(document(&cm)),
            ),
            last: None,
        }
    }

    /// The node's group label changed.
    pub fn set_group(&mut self, group: Option<String>) {
        self.group = group.filter(|g| !g.is_empty());
    }

    /// The node's group.
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// Folds in a change of the namespace's ConfigMaps; `Ok(true)` when one
    /// of ours changed or the list was replaced, the watch's error when it
    /// was interrupted (nothing changed).
    pub fn apply(&mut self, change: Change<ConfigMap>) -> Result<bool, watcher::Error> {
        self.maps.apply(change).map(|delta| !delta.is_empty())
    }

    /// Whether the ConfigMaps have been listed once.
    pub fn listed(&self) -> bool {
        self.maps.listed()
    }

    /// The ConfigMap that applies now.
    pub fn resolve(&self) -> Option<Selected> {
        candidates(&self.node, self.group.as_deref())
            .into_iter()
            .find_map(|name| {
                self.maps.get(&name).map(|doc| Selected {
                    name,
                    document: doc.clone(),
                })
            })
    }

    /// The resolution when it differs from the one last returned here.
    pub fn changed(&mut self) -> Option<Option<Selected>> {
        let now = self.resolve();
        if self.last.as_ref() == Some(&now) {
            return None;
        }
        self.last = Some(now.clone());
        Some(now)
    }
}

/// Parse a selected ConfigMap into an update. Errors name the ConfigMap.
pub fn parse_selected(
    namespace: &str,
    sel: Option<Selected>,
) -> Result<ClusterUpdate, ResmgrError> {
    let Some(sel) = sel else {
        return Ok(ClusterUpdate::Fallback);
    };
    let origin = PathBuf::from(format!("configmap {namespace}/{}", sel.name));
    let Some(doc) = sel.document else {
        return Err(ResmgrError::Config {
            path: origin,
            reason: format!("no {CONFIG_KEY:?} key"),
            source: None,
        });
    };
    let config = FileConfig::parse(&doc, &origin)?;
    Ok(ClusterUpdate::Config {
        configmap: sel.name,
        config: Box::new(config),
    })
}

// One watcher event; only ever moved through the merged stream, so the
// size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Input {
    Maps(Change<ConfigMap>),
    Node(Change<Node>),
}

fn document(cm: &ConfigMap) -> Option<String> {
    cm.data.as_ref().and_then(|d| d.get(CONFIG_KEY).cloned())
}

fn ours(name: &str) -> bool {
    name.starts_with(CONFIGMAP_PREFIX) && name[CONFIGMAP_PREFIX.len()..].starts_with('.')
}

fn node_group(node: &Node) -> Option<String> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(GROUP_LABEL).cloned())
}

struct WatchState {
    selector: ConfigSelector,
    namespace: String,
    node_ready: bool,
    metrics: Metrics,
}

impl WatchState {
    /// Fold one watcher event in; `true` when the selection may have changed.
    fn absorb(&mut self, input: Input) -> bool {
        match input {
            Input::Maps(change) => match self.selector.apply(change) {
                Ok(changed) => changed,
                Err(e) => {
                    warn!(namespace = %self.namespace, error = %e, "watching resource-manager ConfigMaps failed; retrying");
                    false
                }
            },
            Input::Node(Change::Interrupted(e)) => {
                warn!(node = %self.selector.node, error = %e, "watching the Node failed; retrying");
                false
            }
            // Watched by name: a relist holds the Node or nothing (deleted
            // while the watch was down).
            Input::Node(Change::Relisted(nodes)) => {
                self.set_node(nodes.first());
                self.node_ready = true;
                true
            }
            Input::Node(Change::Applied(node)) => {
                self.set_node(Some(&node));
                true
            }
            Input::Node(Change::Deleted(_)) => {
                self.set_node(None);
                true
            }
        }
    }

    /// The configuration group of this node (its label), `None` without
    /// the Node.
    fn set_node(&mut self, node: Option<&Node>) {
        let group = node.and_then(node_group);
        if group.as_deref() != self.selector.group() {
            info!(node = %self.selector.node, group = ?group, "node configuration group changed");
        }
        self.selector.set_group(group);
    }

    /// The next update to send, if the resolution changed and is valid.
    fn next_update(&mut self) -> Option<ClusterUpdate> {
        if !(self.selector.listed() && self.node_ready) {
            return None;
        }
        let sel = self.selector.changed()?;
        let name = sel.as_ref().map(|s| s.name.clone());
        match parse_selected(&self.namespace, sel) {
            Ok(u) => {
                match &u {
                    ClusterUpdate::Config { configmap, .. } => {
                        info!(namespace = %self.namespace, configmap = %configmap, "cluster configuration changed");
                    }
                    ClusterUpdate::Fallback => {
                        info!(namespace = %self.namespace, node = %self.selector.node, "no resource-manager ConfigMap applies to this node; falling back to the file");
                    }
                }
                self.metrics.event("cluster-config");
                Some(u)
            }
            Err(e) => {
                self.metrics.event("config-rejected");
                warn!(configmap = ?name, error = %e, "ignoring invalid cluster configuration; keeping the running one");
                None
            }
        }
    }
}

/// Watch the ConfigMaps and the Node; yield each change of the resolved,
/// valid cluster configuration. The first item comes once both the
/// ConfigMaps and the Node have been listed. Watch errors are logged and
/// retried with backoff; the stream does not end on its own.
pub fn watch(
    cluster: &ClusterConfig,
    metrics: Metrics,
) -> impl Stream<Item = ClusterUpdate> + Send + 'static {
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let maps = SharedWatch::start(maps, watcher::Config::default())
        .subscribe()
        .map(Input::Maps);
    let nodes = SharedWatch::start(
        nodes,
        watcher::Config::default().fields(&format!("metadata.name={}", cluster.node_name)),
    )
    .subscribe()
    .map(Input::Node);
    let inputs = futures::stream::select(maps, nodes).boxed();
    let state = WatchState {
        selector: ConfigSelector::new(cluster.node_name.clone()),
        namespace: cluster.namespace.clone(),
        node_ready: false,
        metrics,
    };
    futures::stream::unfold((inputs, state), |(mut inputs, mut state)| async move {
        while let Some(input) = inputs.next().await {
            if state.absorb(input)
                && let Some(u) = state.next_update()
            {
                return Some((u, (inputs, state)));
            }
        }
        None
    })
}

/// The file and the cluster as configuration sources: the cluster's
/// document, when one applies, overrides the file; the file (or the
/// defaults) is the fallback.
#[derive(Debug, Clone)]
pub struct ConfigSources {
    file: FileConfig,
    cluster: Option<FileConfig>,
}

impl ConfigSources {
    /// Start from the file's (or the default) configuration.
    pub fn new(file: FileConfig) -> Self {
        Self {
            file,
            cluster: None,
        }
    }

    /// The configuration in force.
    pub fn effective(&self) -> &FileConfig {
        self.cluster.as_ref().unwrap_or(&self.file)
    }

    /// A new valid file; returns what to apply (nothing while the cluster
    /// overrides it).
    pub fn file_changed(&mut self, cfg: FileConfig) -> Option<FileConfig> {
        self.file = cfg;
        self.cluster.is_none().then(|| self.file.clone())
    }

    /// A cluster update; returns what to apply.
    pub fn cluster_changed(&mut self, update: ClusterUpdate) -> Option<FileConfig> {
        match update {
            ClusterUpdate::Config { config, .. } => {
                self.cluster = Some(*config);
                self.cluster.clone()
            }
            ClusterUpdate::Fallback => self.cluster.take().map(|_| self.file.clone()),
        }
    }
}

#[cfg(test)]
mod tests;
