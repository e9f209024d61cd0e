//! Exclusive CPUs in reservations: what a node's resource manager says it
//! can still hand out, per NUMA node, and which NUMA node of it can hold a
//! request once other pods' reservations are counted.
//!
//! The node publishes [`NodeCpus`]: exclusive CPUs free per NUMA node
//! (free of exclusive grants, not counting reservations) and the pods that
//! hold exclusive CPUs there. Both come in one document, so a reservation
//! is counted against a NUMA node exactly until its pod appears among the
//! holders — at that moment the node's free count already excludes the
//! pod's CPUs. Counting is by number per NUMA node: which CPUs of the node
//! a pod gets is the node's decision.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::ReservationDecider;
use super::model::{Change, Misfit};

/// The extended resource a pod asks for exclusive CPUs with (and that a
/// node's resource manager publishes as capacity): what the scheduler
/// extender reserves on one NUMA node.
pub const EXCLUSIVE_CPUS_RESOURCE: &str = "resmgr.steward.dev/exclusive-cpus";

/// The Node annotation a CRI resource manager publishes [`NodeCpus`] in
/// (JSON).
pub const NODE_CPUS_ANNOTATION: &str = "resmgr.steward.dev/exclusive-cpus-free";

/// What a node can still hand out exclusively.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCpus {
    /// NUMA node id → exclusive CPUs free there (not counting
    /// reservations).
    pub free: BTreeMap<u32, u32>,
    /// Uids of the pods that hold exclusive CPUs on the node.
    #[serde(default)]
    pub holders: BTreeSet<String>,
}

/// The NUMA node of `free` (after `held` is taken off each) that best fits
/// `want` CPUs: the one with the fewest left that still holds them (big
/// NUMA nodes stay whole for big requests), lowest id on ties. `Err` gives
/// the most any single NUMA node has left.
pub fn best_numa(
    free: &BTreeMap<u32, u32>,
    held: &BTreeMap<u32, u32>,
    want: u32,
) -> Result<u32, u32> {
    let left = |k: &u32, n: &u32| n.saturating_sub(held.get(k).copied().unwrap_or(0));
    free.iter()
        .map(|(k, n)| (left(k, n), *k))
        .filter(|(l, _)| *l >= want)
        .min()
        .map(|(_, k)| k)
        .ok_or_else(|| free.iter().map(|(k, n)| left(k, n)).max().unwrap_or(0))
}

impl ReservationDecider {
    /// Exclusive CPUs per NUMA node of `node` held by reservations of pods
    /// other than `uid` that do not hold their CPUs yet.
    fn cpus_held(&self, node: &str, uid: &str) -> BTreeMap<u32, u32> {
        let holders = self.node_cpus.get(node).map(|c| &c.holders);
        let mut held: BTreeMap<u32, u32> = BTreeMap::new();
        let on_node = self
            .index
            .on_node(node)
            .filter_map(|u| self.reservations.get(u));
        for r in on_node {
            if r.pod.uid == uid
                || !r.holds()
                || r.node.as_deref() != Some(node)
                || holders.is_some_and(|h| h.contains(&r.pod.uid))
            {
                continue;
            }
            if let Some(k) = r.numa {
                *held.entry(k).or_default() += r.cpus;
            }
        }
        held
    }

    /// The NUMA node of `node` that can hold `want` exclusive CPUs for pod
    /// `uid` (`None` when none are wanted), or why none can.
    pub fn fit_cpus(&self, node: &str, uid: &str, want: u32) -> Result<Option<u32>, Misfit> {
        if want == 0 {
            return Ok(None);
        }
        let cpus = self.node_cpus.get(node).ok_or_else(|| Misfit::NoCpus {
            node: node.to_owned(),
        })?;
        best_numa(&cpus.free, &self.cpus_held(node, uid), want)
            .map(Some)
            .map_err(|most| Misfit::NoNumaFit { want, most })
    }

    /// Whether `numa` of `node` still has `want` CPUs for `uid`.
    pub(super) fn numa_still_fits(&self, node: &str, uid: &str, numa: u32, want: u32) -> bool {
        let Some(cpus) = self.node_cpus.get(node) else {
            return false;
        };
        if cpus.holders.contains(uid) {
            return true;
        }
        let free = cpus.free.get(&numa).copied().unwrap_or(0);
        let held = self.cpus_held(node, uid).get(&numa).copied().unwrap_or(0);
        free.saturating_sub(held) >= want
    }

    /// What `node`'s resource manager published (`None`: nothing, or it
    /// stopped). Reservations holding CPUs there keep their NUMA node while
    /// it still fits, move to another that does, or are canceled; those
    /// whose pod now holds its CPUs (and slots) are consumed.
    pub fn set_node_cpus(&mut self, node: &str, cpus: Option<NodeCpus>) -> Vec<Change> {
        match cpus {
            Some(c) => self.node_cpus.insert(node.to_owned(), c),
            None => self.node_cpus.remove(node),
        };
        let holders = self.node_cpus.get(node).map(|c| c.holders.clone());
        let mut on_node: Vec<(Option<crate::Millis>, String, u32, Option<u32>)> = self
            .index
            .on_node(node)
            .filter_map(|u| self.reservations.get(u))
            .filter(|r| r.holds() && r.cpus > 0 && r.node.as_deref() == Some(node))
            .filter(|r| holders.as_ref().is_none_or(|h| !h.contains(&r.pod.uid)))
            .map(|r| (r.decided_at, r.pod.uid.clone(), r.cpus, r.numa))
            .collect();
        on_node.sort();
        // Seat them again in the order they were decided.
        for (_, uid, _, _) in &on_node {
            self.edit(uid, |r| r.numa = None);
        }
        let mut changes = Vec::new();
        for (_, uid, want, old) in on_node {
            let seat = match old.filter(|k| self.numa_still_fits(node, &uid, *k, want)) {
                Some(k) => Some(k),
                None => self.fit_cpus(node, &uid, want).ok().flatten(),
            };
            match seat {
                Some(k) => {
                    self.edit(&uid, |r| r.numa = Some(k));
                }
                None => changes.extend(self.cancel(
                    &uid,
                    &format!("{node} no longer has {want} exclusive CPUs free on one NUMA node"),
                )),
            }
        }
        changes.extend(self.settle());
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tightest_numa_node_that_fits_wins() {
        let free = BTreeMap::from([(0, 8), (1, 4), (2, 6)]);
        assert_eq!(best_numa(&free, &BTreeMap::new(), 4), Ok(1));
        assert_eq!(best_numa(&free, &BTreeMap::from([(1, 1)]), 4), Ok(2));
        assert_eq!(best_numa(&free, &BTreeMap::new(), 9), Err(8));
        assert_eq!(best_numa(&free, &BTreeMap::from([(0, 8)]), 7), Err(6));
        assert_eq!(best_numa(&BTreeMap::new(), &BTreeMap::new(), 1), Err(0));
    }

    #[test]
    fn the_annotation_is_json_with_numa_ids_as_keys() {
        let c = NodeCpus {
            free: BTreeMap::from([(0, 3), (1, 0)]),
            holders: BTreeSet::from(["u1".to_owned()]),
        };
        let s = serde_json::to_string(&c).unwrap();
        assert_eq!(s, r#"{"free":{"0":3,"1":0},"holders":["u1"]}"#);
        assert_eq!(serde_json::from_str::<NodeCpus>(&s).unwrap(), c);
    }
}
