//! The pure core of a shared watch: the one store of a kind and the
//! numbered steps its subscribers are sent.
//!
//! [`Hub::publish`] folds a [`Change`] into the store (a [`Mirror`] of
//! whole objects, behind `Arc`s so readers and subscribers share them) and
//! broadcasts it as a [`Step`] numbered one past the last. The caller holds
//! the hub's lock across both, so a step's number is the store's version
//! right after it: a subscriber that reads the store at version `n`
//! ([`Hub::snapshot`]) and skips every step up to `n` has seen every change
//! exactly once. No I/O, no clock: the watch task and the subscriptions
//! are the async shells around it.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::watcher;
use tokio::sync::broadcast;

use crate::mirror::{Mirror, ObjectKey};
use crate::watch::Change;

/// One change as sent to subscribers, numbered.
pub(crate) struct Step<K> {
    pub seq: u64,
    pub what: What<K>,
}

/// A [`Change`] with shared objects (cloned out per subscriber).
pub(crate) enum What<K> {
    Relisted(Arc<[Arc<K>]>),
    Applied(Arc<K>),
    Deleted(Arc<K>),
}

impl<K> Clone for Step<K> {
    fn clone(&self) -> Self {
        let what = match &self.what {
            What::Relisted(all) => What::Relisted(all.clone()),
            What::Applied(o) => What::Applied(o.clone()),
            What::Deleted(o) => What::Deleted(o.clone()),
        };
        Self {
            seq: self.seq,
            what,
        }
    }
}

impl<K: Clone> What<K> {
    /// The change as a subscriber receives it: objects of its own.
    pub fn to_change(&self) -> Change<K> {
        match self {
            What::Relisted(all) => Change::Relisted(all.iter().map(|o| K::clone(o)).collect()),
            What::Applied(o) => Change::Applied(K::clone(o)),
            What::Deleted(o) => Change::Deleted(K::clone(o)),
        }
    }
}

/// The store of one watched kind, and the sender of its steps.
pub(crate) struct Hub<K> {
    store: Mirror<Arc<K>, Arc<K>>,
    /// Steps published so far (the store's version).
    seq: u64,
    /// `None` once the watch ended: subscriptions then end too.
    tx: Option<broadcast::Sender<Step<K>>>,
    /// Times a subscriber fell behind and was relisted from the store.
    lags: u64,
}

impl<K: ResourceExt + 'static> Hub<K> {
    /// An empty, unlisted store; each subscriber may fall `capacity` steps
    /// behind before it is relisted.
    pub fn new(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity.max(1));
        Self {
            store: Mirror::keyed(|o: &Arc<K>| Some(ObjectKey::of(o.as_ref())), Some),
            seq: 0,
            tx: Some(tx),
            lags: 0,
        }
    }

    /// Folds `change` into the store and sends it to every subscriber; an
    /// interruption changes nothing, sends nothing and is returned (the
    /// watch resumes or relists by itself).
    pub fn publish(&mut self, change: Change<K>) -> Option<watcher::Error> {
        let (shared, what) = match change {
            Change::Relisted(all) => {
                let all: Arc<[Arc<K>]> = all.into_iter().map(Arc::new).collect();
                (Change::Relisted(all.to_vec()), What::Relisted(all))
            }
            Change::Applied(o) => {
                let o = Arc::new(o);
                (Change::Applied(o.clone()), What::Applied(o))
            }
            Change::Deleted(o) => {
                let o = Arc::new(o);
                (Change::Deleted(o.clone()), What::Deleted(o))
            }
            Change::Interrupted(e) => return Some(e),
        };
        if let Err(e) = self.store.apply(shared) {
            return Some(e);
        }
        self.seq += 1;
        if let Some(tx) = &self.tx {
            // No subscriber: nothing to send, the store has it.
            let _ = tx.send(Step {
                seq: self.seq,
                what,
            });
        }
        None
    }

    /// A receiver of every step after the current one, and the store as of
    /// it: `(version, listed, objects)`.
    pub fn subscribe(&self) -> (broadcast::Receiver<Step<K>>, Snapshot<K>) {
        let rx = match &self.tx {
            Some(tx) => tx.subscribe(),
            // Ended: a receiver that reports so at once.
            None => broadcast::channel(1).1,
        };
        (rx, self.snapshot())
    }

    /// The watch ended: subscriptions end once they have read every step.
    pub fn close(&mut self) {
        self.tx = None;
    }

    /// The store now, with its version.
    pub fn snapshot(&self) -> Snapshot<K> {
        Snapshot {
            seq: self.seq,
            listed: self.store.listed(),
            objects: self.store.values().cloned().collect(),
        }
    }

    pub fn store(&self) -> &Mirror<Arc<K>, Arc<K>> {
        &self.store
    }

    pub fn lagged(&mut self) {
        self.lags += 1;
    }

    pub fn lags(&self) -> u64 {
        self.lags
    }
}

/// The store at one version.
pub(crate) struct Snapshot<K> {
    pub seq: u64,
    pub listed: bool,
    /// In key order.
    pub objects: Vec<Arc<K>>,
}
