//! What the resource manager publishes on its Node (after CRI-RM's node
//! agent).
//!
//! **Publishing.** [`NodePublisher`] patches the Node's metadata with a
//! JSON merge patch that names only its own keys ([`TOPOLOGY_ANNOTATION`],
//! [`POLICY_ANNOTATION`], [`POLICY_LABEL`]) and the status subresource
//! with the extended resource [`EXCLUSIVE_CPUS_RESOURCE`].

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use steward_core::cpu::{Assignment, ContainerKey, CpuSet, PolicyConfig, PolicyKind, Topology};
use steward_core::reservation::{NODE_CPUS_ANNOTATION, NodeCpus};
use tracing::{debug, info, warn};

use crate::config::ClusterConfig;
use crate::error::ResmgrError;
use crate::metrics::Metrics;

/// Node label with the active policy.
pub const POLICY_LABEL: &str = "resmgr.steward.dev/policy";
/// Node annotation with the active policy.
pub const POLICY_ANNOTATION: &str = "resmgr.steward.dev/policy";
/// Node annotation with the JSON topology summary ([`TopologySummary`]).
pub const TOPOLOGY_ANNOTATION: &str = "resmgr.steward.dev/topology";
/// Extended resource (node `status.capacity`/`allocatable`): CPUs that can
/// be handed out exclusively.
pub const EXCLUSIVE_CPUS_RESOURCE: &str = steward_core::reservation::EXCLUSIVE_CPUS_RESOURCE;

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
