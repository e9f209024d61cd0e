//! Kubernetes mode: watch Node objects; a deleted Node is removed from every
//! Instance by whichever agent sees the deletion (idempotent). Only their
//! metadata is followed: every agent sees every Node's changes, and a Node
//! whole is kilobytes of status nobody here reads.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;

/// Send the name of every Node deleted while watching. Ends when `tx` closes.
///
/// Only observed deletions count: a Node that vanished while the watch was
/// down is not inferred from a re-list (a node whose Node object is merely
/// late must not be evicted from its own Instances).
pub async fn watch_nodes(client: kube::Client, tx: mpsc::Sender<String>) {
    let api = Api::<PartialObjectMeta<Node>>::all(client);
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .backoff(steward_kube::backoff())
        .boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Delete(node)) => {
                if let Some(name) = node.metadata.name
                    && tx.send(name).await.is_err()
                {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "Node watch failed; retrying"),
        }
    }
}
