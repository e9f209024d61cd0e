//! Reservations as the watch brings them and as this controller's own
//! writes return them. A write's result is applied at once, and the watch
//! events of its key older than it are ignored until the watch brings the
//! write itself (its "echo"): the watch delivers one kind's events in
//! resourceVersion order, so until then it can only move the picture back.
//! An ask's result is not applied when the picture may be newer (the watch
//! brought the object first, a relist came after the write was sent, or
//! the watch showed the object deleted). Each applied change links the
//! Reservation to its pod and marks the pod to be looked at again.

use steward_api::Reservation;
use steward_core::Millis;
use steward_kube::{Change as Watch, ObjectKey};

use super::ClusterPicture;

/// How many deleted Reservation uids are remembered.
const RECENTLY_DELETED: usize = 4096;

impl ClusterPicture {
    /// A Reservation as this controller's own write returned it, at `now`:
    /// applied, and its key's older watch events ignored until the watch
    /// brings this one. Only for a write whose watch event cannot have come
    /// yet (a status written from the object as last seen, its result taken
    /// before the next watch event); otherwise [`ClusterPicture::written_ask`].
    pub fn written(&mut self, r: Reservation, now: Millis) {
        if let Some(rv) = r.metadata.resource_version.clone() {
            self.expected.insert(ObjectKey::of(&r), (rv, now));
        }
        self.apply_reservation(Watch::Applied(r));
    }

    /// An ask's Reservation as its write (create or renew, made off the
    /// decision loop) returned it: as [`ClusterPicture::written`], unless the
    /// picture already shows that object at that spec or later (the watch
    /// brought it first: the same object and a generation as high; the
    /// generation grows with every spec write). Whether it was applied.
    ///
    /// Nor is it applied when it may be older than the picture in another
    /// way: written before the last relist (`relists`, as
    /// [`ClusterPicture::relists`] said when the write was sent), or naming
    /// an object the watch showed deleted. The watch brings it then.
    pub fn written_ask(&mut self, r: Reservation, relists: u64, now: Millis) -> bool {
        let shown = self
            .reservations
            .get(&ObjectKey::of(&r))
            .is_some_and(|seen| {
                seen.metadata.uid == r.metadata.uid
                    && seen.metadata.generation >= r.metadata.generation
            });
        let deleted = r
            .metadata
            .uid
            .as_ref()
            .is_some_and(|u| self.deleted_set.contains(u));
        let apply = !shown && !deleted && relists == self.relists;
        if apply {
            self.written(r, now);
        }
        apply
    }

    /// Reservation relists so far.
    pub fn relists(&self) -> u64 {
        self.relists
    }

    /// How many of this controller's writes the watch has not brought yet.
    pub fn expected(&self) -> usize {
        self.expected.len()
    }

    /// Gives up waiting for echoes written before `before` (the object was
    /// deleted before its write's result was taken, so its event passed):
    /// the watch is followed again for those keys. How many.
    pub fn forget_expected(&mut self, before: Millis) -> usize {
        let n = self.expected.len();
        self.expected.retain(|_, (_, at)| *at >= before);
        n - self.expected.len()
    }

    /// Reservation `namespace`/`name` is gone (a write found it missing).
    pub fn reservation_gone(&mut self, namespace: &str, name: &str) {
        let key = ObjectKey::new(namespace, name);
        self.expected.remove(&key);
        if let Some(r) = self.reservations.get(&key).cloned() {
            self.apply_reservation(Watch::Deleted(r));
        }
    }

    /// A Reservation watch change.
    pub fn reservations(&mut self, change: Watch<Reservation>) {
        match &change {
            Watch::Applied(r) | Watch::Deleted(r) => {
                let key = ObjectKey::of(r);
                if let Some((rv, _)) = self.expected.get(&key) {
                    if r.metadata.resource_version.as_ref() != Some(rv) {
                        // Older than what this controller wrote.
                        return;
                    }
                    self.expected.remove(&key);
                }
            }
            Watch::Relisted(_) => {
                self.expected.clear();
                self.relists += 1;
            }
            Watch::Interrupted(_) => {}
        }
        if let Watch::Deleted(r) = &change
            && let Some(uid) = r.metadata.uid.clone()
            && self.deleted_set.insert(uid.clone())
        {
            self.deleted.push_back(uid);
            if self.deleted.len() > RECENTLY_DELETED
                && let Some(old) = self.deleted.pop_front()
            {
                self.deleted_set.remove(&old);
            }
        }
        self.apply_reservation(change);
    }

    pub(super) fn apply_reservation(&mut self, change: Watch<Reservation>) {
        let key = match &change {
            Watch::Applied(r) | Watch::Deleted(r) => Some(ObjectKey::of(r)),
            _ => None,
        };
        let before = key
            .as_ref()
            .and_then(|k| self.reservations.get(k))
            .map(|r| r.spec.pod.uid.clone());
        let Ok(delta) = self.reservations.apply(change) else {
            return;
        };
        if delta.relisted {
            self.stale = true;
            self.by_uid = self
                .reservations
                .iter()
                .map(|(k, r)| (r.spec.pod.uid.clone(), k.clone()))
                .collect();
            return;
        }
        // The pod a key named before, if the object now names another.
        if let (Some(k), Some(uid)) = (&key, before) {
            self.unlink(&uid, k);
        }
        for k in delta.applied {
            if let Some(r) = self.reservations.get(&k) {
                let uid = r.spec.pod.uid.clone();
                self.by_uid.insert(uid.clone(), k);
                self.dirty.insert(uid);
            }
        }
        for (k, r) in delta.removed {
            self.unlink(&r.spec.pod.uid, &k);
        }
    }

    /// Drops the link from pod `uid` to Reservation `key` (the object is
    /// gone or names another pod now); the pod is looked at again.
    fn unlink(&mut self, uid: &str, key: &ObjectKey) {
        if self.by_uid.get(uid) == Some(key) {
            self.by_uid.remove(uid);
        }
        self.dirty.insert(uid.to_owned());
    }
}
