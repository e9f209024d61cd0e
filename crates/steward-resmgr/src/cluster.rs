//! The cluster interface: configuration pushed through ConfigMaps and the
//! Node object the resource manager publishes to (after CRI-RM's node
//! agent).
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
//!
//! **Publishing.** [`NodePublisher`] patches the Node's metadata with a
//! JSON merge patch that names only its own keys ([`TOPOLOGY_ANNOTATION`],
//! [`POLICY_ANNOTATION`], [`POLICY_LABEL`]) and the status subresource
//! with the extended resource [`EXCLUSIVE_CPUS_RESOURCE`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use serde::Serialize;
use steward_core::cpu::{Assignment, ContainerKey, CpuSet, PolicyConfig, PolicyKind, Topology};
use steward_core::reservation::{NODE_CPUS_ANNOTATION, NodeCpus};
use steward_kube::{Change, follow};
use tracing::{debug, info, warn};

use crate::config::FileConfig;
pub use crate::config::{ClusterConfig, DEFAULT_NAMESPACE};
use crate::error::ResmgrError;
use crate::metrics::Metrics;

/// Node label naming the node's configuration group.
pub const GROUP_LABEL: &str = "resmgr.steward.dev/group";
/// Node label with the active policy.
pub const POLICY_LABEL: &str = "resmgr.steward.dev/policy";
/// Node annotation with the active policy.
pub const POLICY_ANNOTATION: &str = "resmgr.steward.dev/policy";
/// Node annotation with the JSON topology summary ([`TopologySummary`]).
pub const TOPOLOGY_ANNOTATION: &str = "resmgr.steward.dev/topology";
/// Extended resource (node `status.capacity`/`allocatable`): CPUs that can
/// be handed out exclusively.
pub const EXCLUSIVE_CPUS_RESOURCE: &str = steward_core::reservation::EXCLUSIVE_CPUS_RESOURCE;
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
#[derive(Debug, Clone)]
pub struct ConfigSelector {
    node: String,
    group: Option<String>,
    maps: BTreeMap<String, Option<String>>,
    last: Option<Option<Selected>>,
}

impl ConfigSelector {
    /// Selection for `node`, no group, no ConfigMaps yet.
    pub fn new(node: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            group: None,
            maps: BTreeMap::new(),
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

    /// A ConfigMap was added or changed (`document` = its [`CONFIG_KEY`]).
    pub fn upsert(&mut self, name: impl Into<String>, document: Option<String>) {
        self.maps.insert(name.into(), document);
    }

    /// A ConfigMap was deleted.
    pub fn remove(&mut self, name: &str) {
        self.maps.remove(name);
    }

    /// Replace every known ConfigMap (a re-list).
    pub fn replace_all(&mut self, maps: BTreeMap<String, Option<String>>) {
        self.maps = maps;
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
    maps_ready: bool,
    node_ready: bool,
    metrics: Metrics,
}

impl WatchState {
    /// Fold one watcher event in; `true` when the selection may have changed.
    fn absorb(&mut self, input: Input) -> bool {
        match input {
            Input::Maps(Change::Interrupted(e)) => {
                warn!(namespace = %self.namespace, error = %e, "watching resource-manager ConfigMaps failed; retrying");
                false
            }
            Input::Node(Change::Interrupted(e)) => {
                warn!(node = %self.selector.node, error = %e, "watching the Node failed; retrying");
                false
            }
            Input::Maps(Change::Relisted(maps)) => {
                self.selector.replace_all(
                    maps.iter()
                        .filter_map(|cm| {
                            let name = cm.metadata.name.as_deref()?;
                            ours(name).then(|| (name.to_owned(), document(cm)))
                        })
                        .collect(),
                );
                self.maps_ready = true;
                true
            }
            Input::Maps(Change::Applied(cm)) => match cm.metadata.name.as_deref() {
                Some(name) if ours(name) => {
                    self.selector.upsert(name, document(&cm));
                    true
                }
                _ => false,
            },
            Input::Maps(Change::Deleted(cm)) => match cm.metadata.name.as_deref() {
                Some(name) if ours(name) => {
                    self.selector.remove(name);
                    true
                }
                _ => false,
            },
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
        if !(self.maps_ready && self.node_ready) {
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
    let maps = follow(maps, watcher::Config::default()).map(Input::Maps);
    let nodes = follow(
        nodes,
        watcher::Config::default().fields(&format!("metadata.name={}", cluster.node_name)),
    )
    .map(Input::Node);
    let inputs = futures::stream::select(maps, nodes).boxed();
    let state = WatchState {
        selector: ConfigSelector::new(cluster.node_name.clone()),
        namespace: cluster.namespace.clone(),
        maps_ready: false,
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

/// One NUMA node in the [`TopologySummary`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeSummary {
    /// Node id.
    pub id: u32,
    /// Its online CPUs (cpuset list syntax).
    pub cpus: String,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// Memory kind (`dram`, `pmem`, `hbm`).
    pub kind: String,
}

/// What [`TOPOLOGY_ANNOTATION`] carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopologySummary {
    /// Socket ids.
    pub sockets: Vec<u32>,
    /// NUMA nodes.
    pub numa_nodes: Vec<NodeSummary>,
    /// Online CPUs.
    pub online_cpus: String,
    /// CPUs isolated from the scheduler (isolcpus).
    pub isolated_cpus: String,
    /// CPUs the configuration reserves for the system.
    pub reserved_cpus: String,
    /// CPUs that can be handed out exclusively (online minus reserved
    /// minus isolated; none under the `none` policy).
    pub exclusive_cpus: usize,
}

impl TopologySummary {
    /// Summarize `topology` under `policy` with parameters `config`.
    pub fn new(topology: &Topology, policy: PolicyKind, config: &PolicyConfig) -> Self {
        let online = topology.online_cpus();
        let exclusive: CpuSet = online
            .iter()
            .filter(|c| {
                !config.reserved_cpus.contains(*c) && !topology.isolated_cpus().contains(*c)
            })
            .collect();
        Self {
            sockets: topology.sockets().collect(),
            numa_nodes: topology
                .nodes()
                .map(|n| NodeSummary {
                    id: n.id,
                    cpus: topology.node_cpus(n.id).to_string(),
                    memory_bytes: n.memory_bytes,
                    kind: n.kind.as_str().to_owned(),
                })
                .collect(),
            online_cpus: online.to_string(),
            isolated_cpus: topology.isolated_cpus().to_string(),
            reserved_cpus: config.reserved_cpus.to_string(),
            exclusive_cpus: if policy == PolicyKind::None {
                0
            } else {
                exclusive.len()
            },
        }
    }
}

/// What is published on the Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publication {
    /// Active policy.
    pub policy: PolicyKind,
    /// Topology summary.
    pub topology: TopologySummary,
    /// Exclusive CPUs still free per NUMA node and who holds some
    /// ([`crate::reservations::node_cpus`]).
    pub cpus: NodeCpus,
}

impl Publication {
    /// Summarize for `policy` with `config` on `topology`, with
    /// `assignments` the containers placed.
    pub fn new(
        topology: &Topology,
        policy: PolicyKind,
        config: &PolicyConfig,
        assignments: &BTreeMap<ContainerKey, Assignment>,
    ) -> Self {
        Self {
            policy,
            topology: TopologySummary::new(topology, policy, config),
            cpus: crate::reservations::node_cpus(topology, policy, config, assignments),
        }
    }

    /// The JSON merge patch for the Node's metadata (only our keys).
    pub fn metadata_patch(&self) -> Result<serde_json::Value, ResmgrError> {
        let topo = serde_json::to_string(&self.topology).map_err(|e| ResmgrError::Cluster {
            action: "encoding the topology summary".to_owned(),
            source: Box::new(e),
        })?;
        let cpus = serde_json::to_string(&self.cpus).map_err(|e| ResmgrError::Cluster {
            action: "encoding the free exclusive CPUs".to_owned(),
            source: Box::new(e),
        })?;
        Ok(serde_json::json!({
            "metadata": {
                "labels": { POLICY_LABEL: self.policy.as_str() },
                "annotations": {
                    TOPOLOGY_ANNOTATION: topo,
                    POLICY_ANNOTATION: self.policy.as_str(),
                    NODE_CPUS_ANNOTATION: cpus,
                },
            }
        }))
    }

    /// The JSON merge patch for the Node's status (only our resource).
    pub fn status_patch(&self) -> serde_json::Value {
        let n = self.topology.exclusive_cpus.to_string();
        serde_json::json!({
            "status": {
                "capacity": { EXCLUSIVE_CPUS_RESOURCE: n },
                "allocatable": { EXCLUSIVE_CPUS_RESOURCE: n },
            }
        })
    }
}

/// Patches our keys onto the Node.
#[derive(Clone)]
pub struct NodePublisher {
    api: Api<Node>,
    node: String,
}

impl std::fmt::Debug for NodePublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePublisher")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl NodePublisher {
    /// Publisher for the cluster's node.
    pub fn new(cluster: &ClusterConfig) -> Self {
        Self {
            api: Api::all(cluster.client.clone()),
            node: cluster.node_name.clone(),
        }
    }

    /// Patch the labels/annotations (metadata) and the extended resource
    /// (status subresource) with JSON merge patches.
    pub async fn publish(&self, p: &Publication) -> Result<(), ResmgrError> {
        let params = PatchParams::default();
        self.api
            .patch(&self.node, &params, &Patch::Merge(p.metadata_patch()?))
            .await
            .map_err(|e| ResmgrError::Cluster {
                action: format!("patching node {} metadata", self.node),
                source: Box::new(e),
            })?;
        self.api
            .patch_status(&self.node, &params, &Patch::Merge(p.status_patch()))
            .await
            .map_err(|e| ResmgrError::Cluster {
                action: format!("patching node {} status", self.node),
                source: Box::new(e),
            })?;
        debug!(node = %self.node, policy = p.policy.as_str(), "node labels, annotations and capacity published");
        Ok(())
    }

    /// Publish every new value of `rx` (the latest wins); failures are
    /// logged and retried after `retry`.
    pub async fn run(
        self,
        mut rx: tokio::sync::watch::Receiver<Option<Publication>>,
        retry: Duration,
        metrics: Metrics,
    ) {
        loop {
            let current = rx.borrow_and_update().clone();
            if let Some(p) = current {
                match self.publish(&p).await {
                    Ok(()) => {
                        info!(node = %self.node, policy = p.policy.as_str(), "published policy and topology on the node");
                    }
                    Err(e) => {
                        metrics.event("node-publish-failed");
                        warn!(error = %e, "publishing to the node failed; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(retry) => continue,
                            r = rx.changed() => if r.is_err() { return } else { continue },
                        }
                    }
                }
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configmap_names_follow_cri_rm() {
        assert_eq!(
            candidates("n1", Some("g")),
            vec![
                "steward-resmgr.node.n1".to_owned(),
                "steward-resmgr.group.g".to_owned(),
                "steward-resmgr.default".to_owned()
            ]
        );
        assert_eq!(candidates("n1", Some("")).len(), 2);
        assert!(ours("steward-resmgr.default"));
        assert!(!ours("steward-resmgrx.default"));
        assert!(!ours("coredns"));
    }

    #[test]
    fn cluster_overrides_the_file_and_falls_back_to_it() {
        let file = FileConfig::parse("policy: { active: balloons }", "f".as_ref()).unwrap();
        let cm = FileConfig::parse("policy: { active: topology-aware }", "c".as_ref()).unwrap();
        let mut s = ConfigSources::new(file.clone());
        assert_eq!(s.cluster_changed(ClusterUpdate::Fallback), None);
        let got = s.cluster_changed(ClusterUpdate::Config {
            configmap: "steward-resmgr.default".into(),
            config: Box::new(cm.clone()),
        });
        assert_eq!(got.as_ref(), Some(&cm));
        assert_eq!(
            s.file_changed(FileConfig::default()),
            None,
            "cluster overrides"
        );
        assert_eq!(s.effective(), &cm);
        assert_eq!(
            s.cluster_changed(ClusterUpdate::Fallback),
            Some(FileConfig::default())
        );
        assert_eq!(s.file_changed(file.clone()), Some(file));
    }

    #[test]
    fn missing_key_and_bad_documents_are_refused_with_the_configmap_name() {
        let e = parse_selected(
            "kube-system",
            Some(Selected {
                name: "steward-resmgr.default".into(),
                document: None,
            }),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("kube-system/steward-resmgr.default") && e.contains("config.yaml"),
            "{e}"
        );
        let e = parse_selected(
            "ns",
            Some(Selected {
                name: "steward-resmgr.node.a".into(),
                document: Some("policy: { active: fastest }".into()),
            }),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("ns/steward-resmgr.node.a") && e.contains("unknown variant"),
            "{e}"
        );
    }
}
