//! One watch per kind per process, shared by every consumer.
//!
//! A [`SharedWatch`] is started once per (kind, selector) by the process's
//! assembly code — the agent's `run`, the controller's leading loop — and
//! handed (cloned) to every consumer of that kind. It is kube-runtime's
//! reflector idea on steward's own terms:
//!
//! * **One watch.** [`SharedWatch::start`] opens the watch ([`follow`]:
//!   list, watch, resume, relist, [`crate::backoff`]) in a task of its own.
//!   It is the only thing that talks to the API server for that kind;
//!   an interruption is logged there once (`warn`), not by each consumer.
//! * **One store.** Every change is folded into one [`Mirror`] of whole
//!   objects. A [`Reader`] ([`SharedWatch::reader`]) reads it: `get`,
//!   `snapshot`, `listed`. Every reader sees the same picture.
//! * **Subscribers.** [`SharedWatch::subscribe`] gives a stream of the same
//!   [`Change`]s a private [`follow`] would have given: first the store as
//!   a [`Change::Relisted`] (once it has listed), then each change in
//!   order. A consumer that keeps its own projection folds them into its
//!   own [`Mirror`], as before; filtering (a label, a node) is the
//!   subscriber's. [`Change::Interrupted`] is never sent (the watch task
//!   logs it; the watch goes on by itself).
//! * **A subscriber that lags is relisted, never silently short.** Each
//!   subscriber may fall [`SUBSCRIBER_QUEUE`] changes behind (the changes
//!   are kept once, shared, in a bounded ring; nothing waits on a slow
//!   subscriber). One that falls further behind is told so on its next
//!   read: its missed changes are dropped and it receives the whole store
//!   as a [`Change::Relisted`] instead, exactly as if its own watch had
//!   been relisted after a 410, and then every change after it. A deletion
//!   it missed shows as an object missing from that list (consumers
//!   already handle that). Each such relist is logged (`warn`) and counted
//!   ([`SharedWatch::lags`]).
//! * **Lifetime.** The watch lives as long as any handle, reader or
//!   subscription of it; the last one dropped stops the watch task (the
//!   leader's watches end when it stops leading).
//!
//! The store and the numbering of changes are the pure core
//! (`hub.rs`); the task and the subscriptions are thin async shells.

mod hub;
mod reader;
mod subscription;
#[cfg(test)]
mod tests;

use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio_util::task::AbortOnDropHandle;

pub use reader::Reader;
pub use subscription::Subscription;

use crate::watch::{Change, follow};
use hub::Hub;

/// How many changes a subscriber may fall behind before it is relisted
/// from the store.
pub const SUBSCRIBER_QUEUE: usize = 1024;

/// What the handles, readers and subscriptions of one watch share.
struct Shared<K> {
    kind: String,
    hub: Arc<Mutex<Hub<K>>>,
    _task: AbortOnDropHandle<()>,
}

impl<K> Shared<K> {
    fn lock(&self) -> MutexGuard<'_, Hub<K>> {
        lock(&self.hub)
    }
}

fn lock<K>(hub: &Mutex<Hub<K>>) -> MutexGuard<'_, Hub<K>> {
    // The hub stays consistent across a panic elsewhere: each publish
    // completes before the lock is released.
    hub.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One watch of a kind, shared: see the [module](self) documentation.
pub struct SharedWatch<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for SharedWatch<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K> Debug for SharedWatch<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWatch")
            .field("kind", &self.shared.kind)
            .finish_non_exhaustive()
    }
}

impl<K> SharedWatch<K>
where
    K: Resource + ResourceExt + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    /// Opens the watch of `api` with `config` (its label and field
    /// selectors are the watch's) and keeps it for every consumer. Must be
    /// called within a tokio runtime.
    pub fn start(api: Api<K>, config: watcher::Config) -> Self {
        Self::from_changes(follow(api, config), SUBSCRIBER_QUEUE)
    }

    /// A shared watch fed by `changes` (any [`Change`] stream: tests, or a
    /// watch made some other way), each subscriber `capacity` changes deep.
    pub fn from_changes(
        changes: impl Stream<Item = Change<K>> + Send + 'static,
        capacity: usize,
    ) -> Self {
        let kind = K::kind(&K::DynamicType::default()).into_owned();
        let hub = Arc::new(Mutex::new(Hub::new(capacity)));
        let task = tokio::spawn(feed(kind.clone(), hub.clone(), changes));
        tracing::debug!(kind = %kind, "shared watch started");
        Self {
            shared: Arc::new(Shared {
                kind,
                hub,
                _task: AbortOnDropHandle::new(task),
            }),
        }
    }
}

impl<K> SharedWatch<K>
where
    K: ResourceExt + Clone + Send + Sync + 'static,
{
    /// A reader of the store.
    pub fn reader(&self) -> Reader<K> {
        Reader::new(self.shared.clone())
    }

    /// The changes from now on, starting with the store as it is (once it
    /// has listed).
    pub fn subscribe(&self) -> Subscription<K> {
        Subscription::new(self.shared.clone())
    }

    /// How many times a subscriber fell behind and was relisted.
    pub fn lags(&self) -> u64 {
        self.shared.lock().lags()
    }

    /// The kind watched (`Instance`, `Pod`, …).
    pub fn kind(&self) -> &str {
        &self.shared.kind
    }
}

/// Folds the watch's changes into the hub, for as long as anyone holds it.
async fn feed<K: ResourceExt + 'static>(
    kind: String,
    hub: Arc<Mutex<Hub<K>>>,
    changes: impl Stream<Item = Change<K>> + Send,
) {
    let mut changes = std::pin::pin!(changes);
    while let Some(change) = changes.next().await {
        if let Some(e) = lock(&hub).publish(change) {
            tracing::warn!(kind = %kind, error = %e, "watch failed; retrying");
        }
    }
    lock(&hub).close();
}
