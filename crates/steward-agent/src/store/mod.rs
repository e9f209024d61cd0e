//! Where Instances live: the [`InstanceStore`] trait and its two adapters,
//! Kubernetes custom resources ([`KubeInstanceStore`]) and the node's embedded
//! store ([`LocalInstanceStore`]), plus [`reconcile`], which drives either
//! with the core planner.

mod kube;
mod local;

use std::collections::BTreeSet;
use std::future::Future;

pub use self::kube::KubeInstanceStore;
pub use self::local::LocalInstanceStore;

use steward_api::Configuration;
use steward_core::discovery::instances::{InstanceOp, InstanceView, plan, plan_node_gone};
use steward_core::discovery::{ConfigKey, Device};

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use crate::error::StoreError;
use crate::metrics::AgentMetrics;

/// What a store needs to carry out an op.
#[derive(Debug, Clone, Copy)]
pub struct OpContext<'a> {
    /// Namespace of the Instance (and of its Configuration).
    pub namespace: &'a str,
    /// The node the op was planned for: `AddNode`/`RemoveNode` name it, and
    /// `Delete` only deletes an Instance that lists no other node.
    pub node: &'a str,
    /// The owning Configuration: required by `Create` (ownerReference).
    pub owner: Option<&'a Configuration>,
}

/// A store of Instances.
///
/// Every op is applied against the *current* stored object, not the view it
/// was planned from; when the stored state moved in a way that invalidates the
/// op (the object appeared, vanished, or changed under an optimistic-
/// concurrency check), the store returns [`StoreError::Conflict`] and the
/// caller plans again from a fresh [`InstanceStore::list`]. Ops that would not
/// change anything write nothing. `apply` returns whether it wrote.
pub trait InstanceStore: Send + Sync + 'static {
    /// Instances of `config`, for every node.
    fn list(
        &self,
        config: &ConfigKey,
    ) -> impl Future<Output = Result<Vec<InstanceView>, StoreError>> + Send;

    /// Every Instance in the store (every Configuration and node).
    fn list_all(&self) -> impl Future<Output = Result<Vec<InstanceView>, StoreError>> + Send;

    /// Apply one op.
    fn apply(
        &self,
        cx: OpContext<'_>,
        op: &InstanceOp,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// Metric label of an op.
pub(crate) fn op_label(op: &InstanceOp) -> &'static str {
    match op {
        InstanceOp::Create { .. } => "create",
        InstanceOp::AddNode { .. } => "add_node",
        InstanceOp::RemoveNode { .. } => "remove_node",
        InstanceOp::UpdateDevice { .. } => "update_device",
        InstanceOp::SetCapacity { .. } => "set_capacity",
        InstanceOp::Delete { .. } => "delete",
    }
}

/// What one node discovers for one Configuration.
#[derive(Debug, Clone, Copy)]
pub struct Desired<'a> {
    pub node: &'a str,
    pub key: &'a ConfigKey,
    /// The owning Configuration; needed only when something must be created.
    pub owner: Option<&'a Configuration>,
    /// Whether the handlers' devices are shared between nodes.
    pub shared: bool,
    /// The Configuration's `capacity`: slots per Instance.
    pub capacity: u32,
    /// Validated devices, merged across the Configuration's handlers.
    pub devices: &'a [Device],
}

/// Bring the Instances of `want.key` in line with what `want.node`
/// discovers now, planning again on conflicts. Returns the Instances of the
/// Configuration after the last round.
pub async fn reconcile<S: InstanceStore>(
    store: &S,
    want: Desired<'_>,
    max_rounds: u32,
    metrics: &AgentMetrics,
) -> Result<Vec<InstanceView>, StoreError> {
    let Desired {
        node,
        key,
        owner,
        shared,
        capacity,
        devices,
    } = want;
    let cx = OpContext {
        namespace: &key.namespace,
        node,
        owner,
    };
    for _ in 0..max_rounds.max(1) {
        let existing = store.list(key).await?;
        let ops = plan(node, key, shared, capacity, devices, &existing);
        if ops.is_empty() {
            return Ok(existing);
        }
        match apply_all(store, cx, &ops, metrics).await {
            Ok(()) => {}
            Err(StoreError::Conflict { name, detail }) => {
                metrics.instance_conflicts.inc();
                tracing::debug!(configuration = %key, instance = %name, %detail, "instance write conflicted; planning again");
            }
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::TooManyConflicts {
        config: key.to_string(),
        attempts: max_rounds,
    })
}

/// Remove `node` from every Instance (any Configuration), deleting Instances
/// left without a node. Idempotent: any agent may do it.
pub async fn remove_node<S: InstanceStore>(
    store: &S,
    node: &str,
    max_rounds: u32,
    metrics: &AgentMetrics,
) -> Result<(), StoreError> {
    for _ in 0..max_rounds.max(1) {
        let existing = store.list_all().await?;
        let ops = plan_node_gone(node, &existing);
        if ops.is_empty() {
            return Ok(());
        }
        let mut conflicted = false;
        for op in &ops {
            let Some(view) = existing.iter().find(|v| v.name == op.name()) else {
                continue;
            };
            let cx = OpContext {
                namespace: &view.configuration.namespace,
                node,
                owner: None,
            };
            match apply_one(store, cx, op, metrics).await {
                Ok(()) => {}
                Err(StoreError::Conflict { .. }) => {
                    metrics.instance_conflicts.inc();
                    conflicted = true;
                }
                Err(e) => return Err(e),
            }
        }
        if !conflicted {
            return Ok(());
        }
    }
    Err(StoreError::TooManyConflicts {
        config: format!("node {node} removal"),
        attempts: max_rounds,
    })
}

/// Instance writes of one reconcile in flight at once (kube-apiserver's
/// default admits 200 mutating requests in flight).
const WRITES_IN_FLIGHT: usize = 16;

/// Writes `ops`, the Instances of up to [`WRITES_IN_FLIGHT`] at a time: the
/// ops of one Instance in their planned order, different Instances side by
/// side, so a node that finds a thousand devices at once waits for a few
/// round trips, not a thousand. An error other than a conflict wins over a
/// conflict (which only asks the caller to plan again).
async fn apply_all<S: InstanceStore>(
    store: &S,
    cx: OpContext<'_>,
    ops: &[InstanceOp],
    metrics: &AgentMetrics,
) -> Result<(), StoreError> {
    // `plan` sorts by name (stably), so one Instance's ops are adjacent.
    let mut groups = ops
        .chunk_by(|a, b| a.name() == b.name())
        .collect::<Vec<_>>()
        .into_iter();
    let mut running = FuturesUnordered::new();
    let mut conflict = None;
    loop {
        while running.len() < WRITES_IN_FLIGHT {
            let Some(same) = groups.next() else { break };
            running.push(apply_in_order(store, cx, same, metrics));
        }
        let Some(result) = running.next().await else {
            break;
        };
        match result {
            Ok(()) => {}
            Err(e @ StoreError::Conflict { .. }) => conflict = conflict.or(Some(e)),
            Err(e) => return Err(e),
        }
    }
    conflict.map_or(Ok(()), Err)
}

async fn apply_in_order<S: InstanceStore>(
    store: &S,
    cx: OpContext<'_>,
    ops: &[InstanceOp],
    metrics: &AgentMetrics,
) -> Result<(), StoreError> {
    for op in ops {
        apply_one(store, cx, op, metrics).await?;
    }
    Ok(())
}

async fn apply_one<S: InstanceStore>(
    store: &S,
    cx: OpContext<'_>,
    op: &InstanceOp,
    metrics: &AgentMetrics,
) -> Result<(), StoreError> {
    if store.apply(cx, op).await? {
        metrics.write(op_label(op));
        tracing::info!(namespace = cx.namespace, node = cx.node, op = ?op_summary(op), "instance written");
    }
    Ok(())
}

fn op_summary(op: &InstanceOp) -> (&'static str, &str) {
    (op_label(op), op.name())
}

/// The Instances among `views` that list `node`.
pub fn on_node<'a>(
    views: &'a [InstanceView],
    node: &'a str,
) -> impl Iterator<Item = &'a InstanceView> {
    views.iter().filter(move |v| v.nodes.contains(node))
}

/// Nodes of `view` after removing `node`.
pub(crate) fn without(nodes: &BTreeSet<String>, node: &str) -> BTreeSet<String> {
    nodes.iter().filter(|n| *n != node).cloned().collect()
}
