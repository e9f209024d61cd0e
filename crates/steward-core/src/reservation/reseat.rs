//! Reservations kept true as the cluster changes under them: Instances
//! appearing, changing and going, and SlotClaims observed and released.
//! A claim is reality: a reservation whose pod's own claims hold what it
//! asked for is consumed (dropped: the claims carry on), and one whose
//! slot another pod's claim took, or whose Instance no longer backs it, is
//! reseated (kept on its node with other free slots) or canceled.

use std::collections::BTreeSet;

use super::ReservationDecider;
use super::model::{Change, InstanceCapacity, Reservation, SlotRequest, slot_id};

impl ReservationDecider {
    /// Whether pod `uid`'s reservation is used up: its own claims hold
    /// every slot asked for (the node may have granted other slots than the
    /// reserved ones) and, when CPUs were asked for, its node names the pod
    /// among those holding exclusive CPUs.
    fn consumed(&self, r: &Reservation) -> bool {
        let uid = r.pod.uid.as_str();
        r.holds()
            && r.request
                .iter()
                .all(|(instance, want)| self.claimed_by(instance, uid) >= *want as usize)
            && (r.cpus == 0
                || r.node
                    .as_deref()
                    .and_then(|n| self.node_cpus.get(n))
                    .is_some_and(|c| c.holders.contains(uid)))
    }

    /// Drops every reservation that is used up ([`Change::Consumed`]).
    pub fn settle(&mut self) -> Vec<Change> {
        let done: Vec<String> = self
            .reservations
            .values()
            .filter(|r| self.consumed(r))
            .map(|r| r.pod.uid.clone())
            .collect();
        done.into_iter()
            .map(|uid| {
                self.take(&uid);
                Change::Consumed { uid }
            })
            .collect()
    }

    /// [`Self::settle`] for pod `uid` alone: O(its claims), not
    /// O(reservations).
    pub fn settle_pod(&mut self, uid: &str) -> Vec<Change> {
        if self.reservations.get(uid).is_some_and(|r| self.consumed(r)) {
            self.take(uid);
            return vec![Change::Consumed {
                uid: uid.to_owned(),
            }];
        }
        Vec::new()
    }

    /// An Instance appeared or changed. Reservations it no longer backs
    /// (the slot beyond a shrunk capacity, the node no longer seeing the
    /// device) are moved to other free slots or canceled.
    pub fn set_instance(&mut self, name: &str, capacity: InstanceCapacity) -> Vec<Change> {
        self.instances.insert(name.to_owned(), capacity);
        self.revalidate(name)
    }

    /// An Instance is gone: reservations on it are canceled.
    pub fn remove_instance(&mut self, name: &str) -> Vec<Change> {
        self.instances.remove(name);
        self.revalidate(name)
    }

    /// A claim on `slot` by pod `uid` was seen. A reservation of `uid` whose
    /// slots are now all its own claims is consumed; another pod's
    /// reservation of that slot is moved or canceled (the claim is reality).
    pub fn claim_observed(&mut self, slot: &str, uid: &str) -> Vec<Change> {
        if self.claims.get(slot).is_some_and(|h| h == uid) {
            return Vec::new();
        }
        let before = self.claims.insert(slot.to_owned(), uid.to_owned());
        self.index.claim(slot, uid, before.as_deref());
        let mut changes = Vec::new();
        let taken_from: Vec<String> = self
            .index
            .holders(slot)
            .filter(|h| *h != uid)
            .map(str::to_owned)
            .collect();
        for other in taken_from {
            changes.extend(self.reseat(&other, &format!("slot {slot} was taken by pod {uid}")));
        }
        let consumed = self.reservations.get(uid).is_some_and(|r| self.consumed(r));
        if consumed {
            self.take(uid);
            changes.push(Change::Consumed {
                uid: uid.to_owned(),
            });
        }
        changes
    }

    /// How many slots of `instance` pod `uid`'s claims hold.
    fn claimed_by(&self, instance: &str, uid: &str) -> usize {
        self.index
            .claimed_by(uid)
            .filter(|slot| {
                slot.rsplit_once('-')
                    .is_some_and(|(i, n)| i == instance && n.parse::<u32>().is_ok())
            })
            .count()
    }

    /// The claim on `slot` is gone (its pod ended).
    pub fn claim_released(&mut self, slot: &str) {
        if let Some(uid) = self.claims.remove(slot) {
            self.index.unclaim(slot, &uid);
        }
    }

    /// Re-checks the reservations that use `instance` after it changed.
    fn revalidate(&mut self, instance: &str) -> Vec<Change> {
        let affected: Vec<String> = self
            .reservations
            .values()
            .filter(|r| r.holds() && r.request.contains_key(instance))
            .map(|r| r.pod.uid.clone())
            .collect();
        affected
            .iter()
            .flat_map(|uid| self.reseat(uid, &format!("instance {instance} changed")))
            .collect()
    }

    /// Keeps `uid`'s reservation on its node with slots that are still
    /// valid and free, choosing others where needed; cancels it when its
    /// node can no longer hold it.
    fn reseat(&mut self, uid: &str, why: &str) -> Vec<Change> {
        let Some(r) = self.reservations.get(uid) else {
            return Vec::new();
        };
        let Some(node) = r.node.clone() else {
            return Vec::new();
        };
        // Drop the held slots first so the fit sees them as this pod's.
        let request = r.request.clone();
        let old = r.slots.clone();
        self.edit(uid, |r| r.slots.clear());
        let valid: BTreeSet<String> = old
            .iter()
            .filter(|s| self.slot_usable(s, &node, uid))
            .cloned()
            .collect();
        match self.refit(&request, &node, uid, &valid) {
            Some(slots) => {
                self.edit(uid, |r| r.slots = slots);
                Vec::new()
            }
            None => self.cancel(uid, &format!("{why}; {node} can no longer hold the pod")),
        }
    }

    /// Whether `slot` exists, is seen by `node` and is free for `uid`.
    pub(super) fn slot_usable(&self, slot: &str, node: &str, uid: &str) -> bool {
        let Some((instance, n)) = slot.rsplit_once('-') else {
            return false;
        };
        let Ok(n) = n.parse::<u32>() else {
            return false;
        };
        self.instances
            .get(instance)
            .is_some_and(|c| n < c.capacity && c.nodes.contains(node))
            && self.slot_free_for(&slot_id(instance, n), uid)
    }

    /// The request's slots on `node`, keeping those in `keep`.
    fn refit(
        &self,
        request: &SlotRequest,
        node: &str,
        uid: &str,
        keep: &BTreeSet<String>,
    ) -> Option<BTreeSet<String>> {
        let mut slots = BTreeSet::new();
        for (instance, want) in request {
            let cap = self.instances.get(instance)?;
            if !cap.nodes.contains(node) {
                return None;
            }
            let prefix = format!("{instance}-");
            let mut mine: Vec<String> = keep
                .iter()
                .filter(|s| {
                    s.strip_prefix(&prefix)
                        .is_some_and(|n| n.parse::<u32>().is_ok())
                })
                .cloned()
                .collect();
            for n in self.free_slots(instance, uid) {
                if mine.len() >= *want as usize {
                    break;
                }
                let id = slot_id(instance, n);
                if !mine.contains(&id) {
                    mine.push(id);
                }
            }
            if mine.len() < *want as usize {
                return None;
            }
            slots.extend(mine.into_iter().take(*want as usize));
        }
        Some(slots)
    }
}
