//! Pod sandboxes the runtime said it removed (NRI `RemovePodSandbox`),
//! remembered so a later Synchronize that still lists one does not bring
//! it back. containerd (2.1.9 read) sends `RemovePodSandbox` before it
//! drops the sandbox from its stores, so a listing taken in between (a
//! plugin synchronised in that window, or containerd stopped in it and
//! recovering the sandbox) has a pod that is being removed and whose
//! removal is never announced again. Sandbox ids are never reused: a
//! remembered id is gone for good. In memory, the newest
//! [`RemovedPods::KEEP`].

use std::collections::{BTreeSet, VecDeque};

/// The ids of the pods most recently removed, oldest first.
#[derive(Debug, Default)]
pub(crate) struct RemovedPods {
    order: VecDeque<String>,
    ids: BTreeSet<String>,
}

impl RemovedPods {
    /// How many ids are kept.
    pub(crate) const KEEP: usize = 4096;

    /// Remember `id` (forgetting the oldest beyond [`Self::KEEP`]).
    pub(crate) fn insert(&mut self, id: &str) {
        if !self.ids.insert(id.to_owned()) {
            return;
        }
        self.order.push_back(id.to_owned());
        while self.order.len() > Self::KEEP {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
    }

    /// Whether `id` was removed.
    pub(crate) fn contains(&self, id: &str) -> bool {
        self.ids.contains(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_ids() {
        let mut r = RemovedPods::default();
        for i in 0..=RemovedPods::KEEP {
            r.insert(&format!("pod-{i}"));
        }
        r.insert("pod-1");
        assert!(!r.contains("pod-0"));
        assert!(r.contains("pod-1"));
        assert!(r.contains(&format!("pod-{}", RemovedPods::KEEP)));
        assert_eq!(r.order.len(), RemovedPods::KEEP);
        assert_eq!(r.ids.len(), RemovedPods::KEEP);
    }
}
