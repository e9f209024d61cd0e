//! This node's part of each Instance's status: whether its device plugin is
//! registered with kubelet here (`status.nodes[node]`), and the `Ready`
//! condition recomputed with it (see [`steward_api::InstanceStatus::set_serving`]).
//!
//! Plugins report into a [`ServingBoard`] (latest state per Instance wins,
//! so a flapping registration costs one write, not one per flap); one task
//! writes the board out, read-modify-write guarded by `resourceVersion`,
//! up to 16 Instances at a time, skipping writes that change nothing. It
//! is off the Allocate path: a slow or unreachable API server delays the
//! status, never a pod.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use steward_api::Instance;
use steward_nodeio::backoff::Backoff;
use tokio::sync::Notify;

/// Conflicting writers (other nodes' agents) retried before the write is
/// queued again.
const CONFLICT_ATTEMPTS: usize = 5;
/// Status writes in flight at once (kube-apiserver admits 200 mutating
/// requests in flight by default).
const WRITES_IN_FLIGHT: usize = 16;
/// Wait after a failed write, doubling up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// What a plugin reports about its registration with kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Serving {
    /// Registered with kubelet.
    Registered,
    /// Not registered (yet), because of the message.
    NotRegistered(String),
    /// The plugin stopped: this node no longer serves the Instance.
    Stopped,
    /// Served through DRA on this node, no device plugin registered.
    ThroughDra,
}

/// Latest registration state per Instance (namespace, name), waiting to be
/// written.
#[derive(Clone, Debug, Default)]
pub(crate) struct ServingBoard {
    pending: Arc<Mutex<BTreeMap<(String, String), Serving>>>,
    wake: Arc<Notify>,
}

impl ServingBoard {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<(String, String), Serving>> {
        // Plain values, always consistent: a panic elsewhere leaves it usable.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the latest state of the plugin of `namespace/instance`; the
    /// writer picks it up.
    pub(crate) fn report(&self, namespace: &str, instance: &str, serving: Serving) {
        self.lock()
            .insert((namespace.to_owned(), instance.to_owned()), serving);
        self.wake.notify_one();
    }

    /// Takes every pending state.
    fn take(&self) -> Vec<((String, String), Serving)> {
        std::mem::take(&mut *self.lock()).into_iter().collect()
    }

    /// Puts back a state whose write failed, unless a newer one came in.
    fn retry(&self, key: (String, String), serving: Serving) {
        self.lock().entry(key).or_insert(serving);
    }
}

/// Writes the board out until the task is aborted.
pub(crate) async fn write_status(client: kube::Client, node: String, board: ServingBoard) {
    let mut backoff = Backoff::doubling(RETRY_MIN, RETRY_MAX);
    loop {
        let batch = board.take();
        if batch.is_empty() {
            board.wake.notified().await;
            continue;
        }
        // Different Instances side by side, a bounded number at a time: a
        // thousand plugins reporting at once wait for a few round trips,
        // not a thousand. Each Instance appears once per batch.
        let mut writes = futures::stream::iter(batch)
            .map(|((ns, name), serving)| {
                let api: Api<Instance> = Api::namespaced(client.clone(), &ns);
                let node = node.as_str();
                async move {
                    let result = write_one(&api, node, &name, &serving).await;
                    ((ns, name), serving, result)
                }
            })
            .buffer_unordered(WRITES_IN_FLIGHT);
        let mut failed = false;
        while let Some(((ns, name), serving, result)) = writes.next().await {
            if let Err(e) = result {
                tracing::warn!(instance = %name, error = %e, "writing Instance status failed; will retry");
                board.retry((ns, name), serving);
                failed = true;
            }
        }
        if failed {
            tokio::time::sleep(backoff.next_delay()).await;
        } else {
            backoff.reset();
        }
    }
}

/// Sets this node's entry of Instance `name` and writes it if that changed
/// anything. A missing Instance is not an error: its status went with it.
async fn write_one(
    api: &Api<Instance>,
    node: &str,
    name: &str,
    serving: &Serving,
) -> Result<(), kube::Error> {
    let entry = match serving {
        Serving::Registered => Some((true, None)),
        Serving::NotRegistered(why) => Some((false, Some(why.clone()))),
        Serving::Stopped | Serving::ThroughDra => None,
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(mut inst) = api.get_opt(name).await? else {
            return Ok(());
        };
        let mut status = inst.status.take().unwrap_or_default();
        let now = Time(Timestamp::now());
        let (spec_nodes, generation) = (&inst.spec.nodes, inst.metadata.generation);
        let changed = if *serving == Serving::ThroughDra {
            status.set_served_through_dra(node, spec_nodes, generation, now)
        } else {
            status.set_serving(node, entry.clone(), spec_nodes, generation, now)
        };
        if !changed {
            return Ok(());
        }
        inst.status = Some(status);
        match api
            .replace_status(name, &PostParams::default(), &inst)
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < CONFLICT_ATTEMPTS => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> (String, String) {
        ("ns".to_owned(), name.to_owned())
    }

    #[test]
    fn the_latest_state_wins() {
        let b = ServingBoard::default();
        b.report(
            "ns",
            "cam",
            Serving::NotRegistered("dialling kubelet".into()),
        );
        b.report("ns", "cam", Serving::Stopped);
        b.report("ns", "cam", Serving::Registered);
        b.report("ns", "mic", Serving::Stopped);
        assert_eq!(
            b.take(),
            vec![
                (key("cam"), Serving::Registered),
                (key("mic"), Serving::Stopped)
            ]
        );
        assert!(b.take().is_empty());
    }

    #[test]
    fn a_failed_write_is_retried_unless_a_newer_state_came_in() {
        let b = ServingBoard::default();
        b.report("ns", "cam", Serving::Registered);
        b.report("ns", "mic", Serving::Registered);
        let mut taken = b.take().into_iter();
        b.report("ns", "cam", Serving::NotRegistered("kubelet gone".into()));
        for (k, s) in taken.by_ref() {
            b.retry(k, s);
        }
        assert_eq!(
            b.take(),
            vec![
                (key("cam"), Serving::NotRegistered("kubelet gone".into())),
                (key("mic"), Serving::Registered),
            ]
        );
    }
}
