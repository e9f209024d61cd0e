//! The reservation ledger's indexes: who holds a slot, which holding
//! reservations are on a node, which slots a pod's claims hold.
//!
//! Without them every question ("is this slot free for that pod?") scanned
//! every reservation or every claim, and a rebuild that asks it once per
//! reservation grew with the square of the cluster's managed pods. The
//! indexes are derived data only: [`SlotIndex::of`] recomputes them from
//! scratch, and the property tests compare the kept ones against it after
//! every operation.

use std::collections::{BTreeMap, BTreeSet};

use super::model::Reservation;

/// Derived lookups over a ledger's reservations and claims.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct SlotIndex {
    /// slot → uids of the holding (`Reserved`) reservations that hold it.
    /// More than one uid only transiently, while a claim moves another
    /// pod's reservation off the slot.
    held: BTreeMap<String, BTreeSet<String>>,
    /// node → uids of the holding reservations on it.
    on_node: BTreeMap<String, BTreeSet<String>>,
    /// pod uid → the slots its claims hold.
    claimed: BTreeMap<String, BTreeSet<String>>,
}

impl SlotIndex {
    /// The index of `reservations` and `claims` (slot → uid), built from
    /// scratch.
    #[cfg(test)]
    pub(super) fn of<'a>(
        reservations: impl IntoIterator<Item = &'a Reservation>,
        claims: &BTreeMap<String, String>,
    ) -> Self {
        let mut ix = Self::default();
        for r in reservations {
            ix.hold(r);
        }
        for (slot, uid) in claims {
            ix.claim(slot, uid, None);
        }
        ix
    }

    /// `r` as it is now: indexed when it holds.
    pub(super) fn hold(&mut self, r: &Reservation) {
        if !r.holds() {
            return;
        }
        let uid = &r.pod.uid;
        for s in &r.slots {
            self.held.entry(s.clone()).or_default().insert(uid.clone());
        }
        if let Some(node) = &r.node {
            self.on_node
                .entry(node.clone())
                .or_default()
                .insert(uid.clone());
        }
    }

    /// `r` as it was before a change: whatever [`Self::hold`] indexed of it
    /// is removed.
    pub(super) fn release(&mut self, r: &Reservation) {
        if !r.holds() {
            return;
        }
        let uid = r.pod.uid.as_str();
        for s in &r.slots {
            remove_from(&mut self.held, s, uid);
        }
        if let Some(node) = &r.node {
            remove_from(&mut self.on_node, node, uid);
        }
    }

    /// A claim on `slot` by `uid`, replacing the one by `before` if any.
    pub(super) fn claim(&mut self, slot: &str, uid: &str, before: Option<&str>) {
        if let Some(b) = before {
            remove_from(&mut self.claimed, b, slot);
        }
        self.claimed
            .entry(uid.to_owned())
            .or_default()
            .insert(slot.to_owned());
    }

    /// The claim on `slot` by `uid` is gone.
    pub(super) fn unclaim(&mut self, slot: &str, uid: &str) {
        remove_from(&mut self.claimed, uid, slot);
    }

    /// The pods whose holding reservations hold `slot`.
    pub(super) fn holders(&self, slot: &str) -> impl Iterator<Item = &str> {
        self.held
            .get(slot)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    /// Whether a pod other than `uid` has `slot` reserved.
    pub(super) fn held_by_other(&self, slot: &str, uid: &str) -> bool {
        self.holders(slot).any(|h| h != uid)
    }

    /// The pods with holding reservations on `node`.
    pub(super) fn on_node(&self, node: &str) -> impl Iterator<Item = &str> {
        self.on_node
            .get(node)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    /// The slots `uid`'s claims hold.
    pub(super) fn claimed_by(&self, uid: &str) -> impl Iterator<Item = &str> {
        self.claimed
            .get(uid)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }
}

fn remove_from(map: &mut BTreeMap<String, BTreeSet<String>>, key: &str, member: &str) {
    if let Some(set) = map.get_mut(key) {
        set.remove(member);
        if set.is_empty() {
            map.remove(key);
        }
    }
}
