//! The leader removes a deleted Node from every Instance that names it,
//! deleting Instances no node sees any more.
//!
//! The leader's Node watch (shared with its decision loop: one watch of
//! the Nodes per leader), read for the names only: were every agent to
//! follow the Nodes, each would receive every Node's every change (its
//! heartbeats included) — N² events at rest. The Instances are read from
//! the leader's Instance store, not listed. A deletion observed on the
//! watch is applied at once. A deletion missed (a watch gap, a takeover)
//! is found after each full list: a node that Instances name but that has
//! stayed absent from the Nodes for [`NodeGoneConfig::grace`] is removed
//! (the grace keeps a node whose Node object is merely late on its
//! Instances).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use steward_api::{API_VERSION, Instance, instance_view};
use steward_core::discovery::instances::{InstanceOp, plan_node_gone};
use steward_kube::{Change, EventSink, Reader};

use crate::leader_watches::LeaderWatches;
use tokio::time::Instant;

/// How deleted nodes are found.
#[derive(Debug, Clone)]
pub struct NodeGoneConfig {
    /// How long a node named by Instances must stay absent from the Nodes
    /// (after a full list) before it is removed as deleted.
    pub grace: Duration,
    /// Read-modify-write rounds per node before trying again later.
    pub rounds: u32,
    /// Between two tries of a removal that failed.
    pub retry: Duration,
}

impl Default for NodeGoneConfig {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(60),
            rounds: 5,
            retry: Duration::from_secs(5),
        }
    }
}

/// Follows the Nodes and removes the deleted ones from the Instances;
/// never returns (run while leading, dropped on losing the lead). With
/// watches of its own: [`maintain_with`] shares the leader's.
pub async fn maintain(client: kube::Client, cfg: NodeGoneConfig, events: EventSink) {
    let watches = LeaderWatches::new(client.clone());
    maintain_with(client, cfg, events, &watches).await;
}

/// [`maintain`] on the leader's shared Node and Instance watches.
pub async fn maintain_with(
    client: kube::Client,
    cfg: NodeGoneConfig,
    events: EventSink,
    watches: &LeaderWatches,
) {
    let mut changes = watches.nodes().subscribe();
    let instances = watches.instances().reader();
    // Nodes present, as of the watch.
    let mut present = BTreeSet::new();
    // Nodes to remove, and when the next try is due.
    let mut gone: BTreeMap<String, Instant> = BTreeMap::new();
    // When the next sweep for missed deletions is due.
    let mut sweep: Option<Instant> = None;
    loop {
        let due = gone.values().copied().chain(sweep).min();
        let wake = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            change = changes.next() => match change {
                Some(Change::Deleted(node)) => {
                    if let Some(name) = node.metadata.name {
                        present.remove(&name);
                        gone.insert(name, Instant::now());
                    }
                }
                Some(Change::Applied(node)) => {
                    if let Some(name) = node.metadata.name {
                        gone.remove(&name);
                        present.insert(name);
                    }
                }
                // A full list: what it lacks is found by the sweep, after
                // the grace.
                Some(Change::Relisted(all)) => {
                    present = all.into_iter().filter_map(|n| n.metadata.name).collect();
                    for name in &present {
                        gone.remove(name);
                    }
                    sweep = Some(Instant::now() + cfg.grace);
                }
                Some(Change::Interrupted(_)) => {}
                None => std::future::pending::<()>().await,
            },
            () = wake => {
                let now = Instant::now();
                if sweep.is_some_and(|at| at <= now) {
                    sweep = None;
                    match missing(&instances, &present) {
                        Ok(missing) => {
                            for node in missing {
                                tracing::info!(node = %node, "Instances name a node that has no Node object; removing it from them");
                                gone.entry(node).or_insert(now);
                            }
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "looking for deleted nodes in the Instances; will retry");
                            sweep = Some(now + cfg.retry);
                        }
                    }
                }
                let ready: Vec<String> = gone
                    .iter()
                    .filter(|(_, at)| **at <= now)
                    .map(|(n, _)| n.clone())
                    .collect();
                for node in ready {
                    match remove(&client, &node, cfg.rounds, &events).await {
                        Ok(()) => {
                            gone.remove(&node);
                        }
                        Err(e) => {
                            tracing::error!(node = %node, error = %e, "removing a deleted node from the Instances failed; will retry");
                            gone.insert(node, now + cfg.retry);
                        }
                    }
                }
            }
        }
    }
}

/// Nodes the Instances (the leader's store of them) name that are not in
/// `present`; an error until the Instances have been listed.
fn missing(
    instances: &Reader<Instance>,
    present: &BTreeSet<String>,
) -> Result<BTreeSet<String>, NotListed> {
    if !instances.listed() {
        return Err(NotListed);
    }
    Ok(instances
        .snapshot()
        .iter()
        .flat_map(|i| i.spec.nodes.iter())
        .filter(|n| !present.contains(*n))
        .cloned()
        .collect())
}

/// The Instances have not been listed yet.
#[derive(Debug, thiserror::Error)]
#[error("the Instances have not been listed yet")]
struct NotListed;

/// Why a removal did not complete.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    #[error("the API server: {0}")]
    Api(#[from] kube::Error),
    #[error("the Instances kept changing under {rounds} read-modify-write rounds")]
    Conflicts { rounds: u32 },
}

/// Removes `node` from every Instance (deleting those left without a
/// node); each write conditional on the resourceVersion read. Idempotent.
pub async fn remove(
    client: &kube::Client,
    node: &str,
    rounds: u32,
    events: &EventSink,
) -> Result<(), RemoveError> {
    for _ in 0..rounds.max(1) {
        let list = Api::<Instance>::all(client.clone())
            .list(&ListParams::default())
            .await?;
        let mut views = Vec::new();
        for instance in &list.items {
            match instance_view(instance) {
                Ok(v) => views.push((v, instance)),
                Err(e) => {
                    tracing::debug!(error = %e, "an Instance steward cannot read is left alone")
                }
            }
        }
        let plain: Vec<_> = views.iter().map(|(v, _)| v.clone()).collect();
        let mut conflicted = false;
        for op in plan_node_gone(node, &plain) {
            let Some((view, instance)) = views.iter().find(|(v, _)| v.name == op.name()) else {
                continue;
            };
            let ns = view.configuration.namespace.as_str();
            match write(client, ns, instance, &op).await {
                Ok(None) => {}
                Ok(Some(note)) => events.emit(
                    instance_ref(ns, &view.name),
                    EventType::Warning,
                    "DeviceLost",
                    "DeviceLost",
                    format!("node {node} was deleted; {note}"),
                ),
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => conflicted = true,
                Err(e) => return Err(e.into()),
            }
        }
        if !conflicted {
            return Ok(());
        }
    }
    Err(RemoveError::Conflicts { rounds })
}

/// One planned write, conditional on `instance`'s resourceVersion; what
/// became of the Instance (`None`: nothing written).
async fn write(
    client: &kube::Client,
    ns: &str,
    instance: &Instance,
    op: &InstanceOp,
) -> Result<Option<String>, kube::Error> {
    let api: Api<Instance> = Api::namespaced(client.clone(), ns);
    let name = op.name();
    match op {
        InstanceOp::Delete { .. } => {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: instance.metadata.uid.clone(),
                    resource_version: instance.metadata.resource_version.clone(),
                }),
                ..DeleteParams::default()
            };
            api.delete(name, &dp).await?;
            Ok(Some(
                "no node sees the device any more; the Instance is removed".into(),
            ))
        }
        InstanceOp::RemoveNode { node, .. } => {
            let mut next = instance.clone();
            next.spec.nodes.retain(|n| n != node);
            steward_api::set_node_labels(&mut next.metadata, &next.spec.nodes.clone());
            api.replace(name, &PostParams::default(), &next).await?;
            Ok(Some(format!(
                "still seen by {}",
                next.spec.nodes.join(", ")
            )))
        }
        // plan_node_gone plans nothing else.
        _ => Ok(None),
    }
}

fn instance_ref(namespace: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(API_VERSION.into()),
        kind: Some("Instance".into()),
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        ..ObjectReference::default()
    }
}
