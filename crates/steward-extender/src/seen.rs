//! The extender's one shared watch of every Reservation. A Filter waiting
//! for the controller's decision is woken by the watch event that carries
//! it, instead of reading its object in a loop: the wait costs no API call,
//! and the answer arrives as soon as the controller's write is seen.
//!
//! Objects are kept (a [`steward_kube::Mirror`] behind a lock) without
//! `spec.candidates`. The picture may lag the API
//! (a watch being re-established): callers use
//! it to wait, never as proof that an object is absent; a Filter still reads
//! the object now and then while it waits, so a stalled watch only slows it.

use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use kube::Api;
use kube::runtime::watcher;
use steward_api::Reservation;
use steward_kube::{Change, Mirror, ObjectKey, SharedWatch};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

/// Every Reservation as last seen, and a counter bumped on each change.
pub(crate) struct Seen {
    objects: Mutex<Mirror<Reservation>>,
    changed: watch::Sender<u64>,
}

impl Seen {
    /// A picture no watch feeds: always empty, never changes.
    pub(crate) fn empty() -> Self {
        // A Filter waiting on the picture reads the pod, the generation and
        // the status; the candidate list (one name per node, hundreds in a
        // large cluster) would only be copied on every wake-up.
        let slim = |mut r: Reservation| {
            r.spec.candidates = Vec::new();
            Some(r)
        };
        Self {
            objects: Mutex::new(Mirror::projected(slim)),
            changed: watch::Sender::new(0),
        }
    }

    /// Starts following every Reservation; the watch stops when the
    /// returned handle is dropped.
    pub(crate) fn start(client: kube::Client) -> (Arc<Self>, AbortOnDropHandle<()>) {
        let seen = Arc::new(Self::empty());
        let task = tokio::spawn(follow_all(
            Api::<Reservation>::all(client),
            Arc::clone(&seen),
        ));
        (seen, AbortOnDropHandle::new(task))
    }

    fn lock(&self) -> MutexGuard<'_, Mirror<Reservation>> {
        // Plain values: a panic elsewhere leaves the map usable.
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reservation `namespace/name` as last seen.
    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<Reservation> {
        self.lock().get(&ObjectKey::new(namespace, name)).cloned()
    }

    /// Whether the watch has listed every Reservation and shows none named
    /// `namespace/name` (it may lag a write elsewhere: a create on this
    /// belief can still meet 409).
    pub(crate) fn absent(&self, namespace: &str, name: &str) -> bool {
        let m = self.lock();
        m.listed() && !m.contains(&ObjectKey::new(namespace, name))
    }

    /// Woken on every change seen after this call.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub(crate) fn apply(&self, change: Change<Reservation>) {
        let applied = self.lock().apply(change);
        if let Err(e) = applied {
            tracing::debug!(error = %e, "Reservation watch interrupted; resuming");
            return;
        }
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }
}

async fn follow_all(api: Api<Reservation>, seen: Arc<Seen>) {
    // The extender's one Reservation watch (its only consumer keeps the
    // slim projection above).
    let mut changes = SharedWatch::start(api, watcher::Config::default()).subscribe();
    while let Some(change) = changes.next().await {
        seen.apply(change);
    }
}

#[cfg(test)]
mod tests {
    use steward_api::{PodRef, ReservationSpec};

    use super::*;

    fn reservation(ns: &str, name: &str) -> Reservation {
        let mut r = Reservation::new(
            name,
            ReservationSpec {
                pod: PodRef {
                    namespace: ns.into(),
                    name: name.into(),
                    uid: "u".into(),
                },
                slots: Default::default(),
                exclusive_cpus: 0,
                candidates: vec![],
                cancel: None,
            },
        );
        r.metadata.namespace = Some(ns.into());
        r
    }

    #[test]
    fn changes_update_the_picture_and_wake_waiters() {
        let seen = Seen::empty();
        let mut rx = seen.subscribe();
        seen.apply(Change::Relisted(vec![reservation("a", "x")]));
        assert!(rx.has_changed().unwrap_or(false));
        rx.mark_unchanged();
        assert!(seen.get("a", "x").is_some());
        seen.apply(Change::Applied(reservation("b", "y")));
        assert!(seen.get("b", "y").is_some());
        seen.apply(Change::Deleted(reservation("a", "x")));
        assert!(seen.get("a", "x").is_none());
        assert!(rx.has_changed().unwrap_or(false));
        // A relist replaces the picture: what it lacks is gone.
        seen.apply(Change::Relisted(vec![]));
        assert!(seen.get("b", "y").is_none());
    }
}
