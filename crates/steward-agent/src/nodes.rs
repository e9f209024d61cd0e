//! Kubernetes mode: watch Node objects; a deleted Node is removed from every
//! Instance by whichever agent sees the deletion (idempotent). Only their
//! metadata is followed: every agent sees every Node's changes, and a Node
//! whole is kilobytes of status nobody here reads.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::core::PartialObjectMeta;
use steward_kube::{Change, SharedWatch};
use tokio::sync::mpsc;

/// Send the name of every Node deleted while watching. Ends when `tx` closes.
///
/// Only observed deletions count: a Node that vanished while the watch was
/// down is not inferred from a re-list (a node whose Node object is merely
/// late must not be evicted from its own Instances). `nodes` is the
/// agent's shared watch of the Nodes' metadata.
pub async fn watch_nodes(nodes: SharedWatch<PartialObjectMeta<Node>>, tx: mpsc::Sender<String>) {
    let mut changes = nodes.subscribe();
    while let Some(change) = changes.next().await {
        if let Change::Deleted(node) = change
            && let Some(name) = node.metadata.name
            && tx.send(name).await.is_err()
        {
            return;
        }
    }
}
