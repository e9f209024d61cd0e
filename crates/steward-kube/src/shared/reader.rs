//! Reading a shared watch's store.

use std::sync::Arc;

use kube::ResourceExt;

use super::Shared;
use crate::mirror::ObjectKey;

/// Reads the one store of a [`super::SharedWatch`]: every reader of a kind
/// sees the same objects. Keeps the watch alive while held.
pub struct Reader<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for Reader<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K: ResourceExt + 'static> Reader<K> {
    pub(super) fn new(shared: Arc<Shared<K>>) -> Self {
        Self { shared }
    }

    /// Whether a full list has arrived: before it, a missing object is not
    /// an object that is gone.
    pub fn listed(&self) -> bool {
        self.shared.lock().store().listed()
    }

    /// The object of `key` (namespace, name; empty namespace for
    /// cluster-scoped kinds), as last seen.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<K>> {
        self.shared.lock().store().get(key).cloned()
    }

    /// Every object, in key order.
    pub fn snapshot(&self) -> Vec<Arc<K>> {
        self.shared.lock().store().values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.shared.lock().store().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
