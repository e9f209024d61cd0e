//! One mirror of watched objects: the picture a consumer keeps of a
//! followed watch, so no component folds [`Change`]s into its own map.
//!
//! A [`Mirror`] is fed the [`Change`]s of [`crate::follow`] with
//! [`Mirror::apply`] and holds, per object identity, what the consumer
//! chose to keep of it:
//!
//! * **Key.** [`Mirror::new`] and [`Mirror::projected`] key objects by
//!   [`ObjectKey`] (namespace and name; cluster-scoped objects have an
//!   empty namespace). [`Mirror::keyed`] takes any key function — e.g. the
//!   UID, for consumers that must tell a recreated object from the one it
//!   replaced. An object without a key (`None`) is not kept.
//! * **Projection.** What is stored per object: the object itself
//!   ([`Mirror::new`]) or what a function makes of it, so a consumer keeps
//!   only the fields it reads. A projection that returns `None` means "not
//!   mine": the object is not kept, and an earlier version of it is
//!   removed (a label taken off, a pod that no longer qualifies).
//! * **Relists.** [`Change::Relisted`] replaces the picture at once; the
//!   objects it lacks were deleted while the watch was down and are
//!   reported removed, as if each had been deleted.
//! * **What changed.** [`Mirror::apply`] returns a [`Delta`]: the keys
//!   stored or replaced, and the entries removed with their last kept
//!   value, so a consumer that reacts to deletions (slots to free when a
//!   pod or a Reservation disappears) still can. An interrupted watch is
//!   the `Err`: nothing changed, the consumer logs it as it sees fit.
//! * **Listed.** [`Mirror::listed`] says whether a full list has arrived:
//!   before it, a missing object is not an object that is gone.
//!
//! It is a plain value: a consumer shared between tasks wraps it in its
//! own lock. kube-runtime's `reflector::Store` was the other candidate; it
//! keeps whole objects (no projection), consumes the raw watcher events
//! rather than [`Change`]s, and derives no deletions on a relist.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt;

use kube::ResourceExt;
use kube::runtime::watcher;

use crate::watch::Change;

/// An object's identity within one kind: namespace (empty for
/// cluster-scoped kinds) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of `object`.
    pub fn of<K: ResourceExt>(object: &K) -> Self {
        Self::new(object.namespace().unwrap_or_default(), object.name_any())
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// What one [`Mirror::apply`] changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta<Key, V> {
    /// The change was a full list: the picture was replaced.
    pub relisted: bool,
    /// Keys stored or replaced (for a relist: every key it holds), in key
    /// order; read their values with [`Mirror::get`].
    pub applied: Vec<Key>,
    /// Entries removed — deleted, missing from a relist, or projected to
    /// nothing — with their last kept value, in key order.
    pub removed: Vec<(Key, V)>,
}

impl<Key, V> Delta<Key, V> {
    /// Nothing stored and nothing removed (and not a relist).
    pub fn is_empty(&self) -> bool {
        !self.relisted && self.applied.is_empty() && self.removed.is_empty()
    }
}

type KeyFn<K, Key> = Box<dyn Fn(&K) -> Option<Key> + Send + Sync>;
type ProjectFn<K, V> = Box<dyn Fn(K) -> Option<V> + Send + Sync>;

/// The objects of one followed watch as last seen, as `V`s by `Key` (see
/// the [module](self) documentation).
pub struct Mirror<K, V = K, Key = ObjectKey> {
    objects: BTreeMap<Key, V>,
    key: KeyFn<K, Key>,
    project: ProjectFn<K, V>,
    listed: bool,
}

impl<K: ResourceExt + 'static> Mirror<K> {
    /// Whole objects by namespace and name.
    pub fn new() -> Self {
        Self::projected(Some)
    }
}

impl<K: ResourceExt + 'static> Default for Mirror<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: ResourceExt + 'static, V> Mirror<K, V> {
    /// `project(object)` by namespace and name; objects it maps to `None`
    /// are not kept.
    pub fn projected(project: impl Fn(K) -> Option<V> + Send + Sync + 'static) -> Self {
        Self::keyed(|o: &K| Some(ObjectKey::of(o)), project)
    }
}

impl<K, V, Key: Ord + Clone> Mirror<K, V, Key> {
    /// `project(object)` by `key(object)`; objects either maps to `None`
    /// are not kept.
    pub fn keyed(
        key: impl Fn(&K) -> Option<Key> + Send + Sync + 'static,
        project: impl Fn(K) -> Option<V> + Send + Sync + 'static,
    ) -> Self {
        Self {
            objects: BTreeMap::new(),
            key: Box::new(key),
            project: Box::new(project),
            listed: false,
        }
    }

    /// Folds one change into the picture and says what it changed; an
    /// interrupted watch changes nothing and is returned as the error.
    pub fn apply(&mut self, change: Change<K>) -> Result<Delta<Key, V>, watcher::Error> {
        let mut delta = Delta {
            relisted: false,
            applied: Vec::new(),
            removed: Vec::new(),
        };
        match change {
            Change::Relisted(all) => {
                let mut fresh = BTreeMap::new();
                for object in all {
                    let Some(key) = (self.key)(&object) else {
                        continue;
                    };
                    // A list holds each object once; were it not, the
                    // last version wins, as it would applied in order.
                    match (self.project)(object) {
                        Some(v) => fresh.insert(key, v),
                        None => fresh.remove(&key),
                    };
                }
                let old = std::mem::replace(&mut self.objects, fresh);
                delta.removed = old
                    .into_iter()
                    .filter(|(k, _)| !self.objects.contains_key(k))
                    .collect();
                delta.applied = self.objects.keys().cloned().collect();
                delta.relisted = true;
                self.listed = true;
            }
            Change::Applied(object) => {
                let Some(key) = (self.key)(&object) else {
                    return Ok(delta);
                };
                match (self.project)(object) {
                    Some(v) => {
                        self.objects.insert(key.clone(), v);
                        delta.applied.push(key);
                    }
                    None => {
                        if let Some(v) = self.objects.remove(&key) {
                            delta.removed.push((key, v));
                        }
                    }
                }
            }
            Change::Deleted(object) => {
                if let Some(key) = (self.key)(&object)
                    && let Some(v) = self.objects.remove(&key)
                {
                    delta.removed.push((key, v));
                }
            }
            Change::Interrupted(e) => return Err(e),
        }
        Ok(delta)
    }

    /// Whether a full list has arrived (a [`Change::Relisted`]).
    pub fn listed(&self) -> bool {
        self.listed
    }

    /// The value kept for `key` (or anything it borrows as: a `&str` for
    /// a `String` key).
    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        Key: Borrow<Q>,
    {
        self.objects.get(key)
    }

    pub fn contains<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        Key: Borrow<Q>,
    {
        self.objects.contains_key(key)
    }

    /// Forgets one entry (e.g. an object the consumer itself deleted,
    /// before the watch echoes it).
    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        Key: Borrow<Q>,
    {
        self.objects.remove(key)
    }

    /// Everything kept, as the map it is (for code that takes one).
    pub fn as_map(&self) -> &BTreeMap<Key, V> {
        &self.objects
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Key, &V)> {
        self.objects.iter()
    }

    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.objects.keys()
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.objects.values()
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

impl<K, V: fmt::Debug, Key: fmt::Debug> fmt::Debug for Mirror<K, V, Key> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mirror")
            .field("listed", &self.listed)
            .field("objects", &self.objects)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
