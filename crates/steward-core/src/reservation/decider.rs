//! The cluster-wide decider of reservations: the slots held by claims and by
//! reservations, and the decisions they allow. How reservations follow the
//! Instances and claims as they change is in `reseat.rs`, the exclusive
//! CPUs in `cpus.rs`.

use std::collections::{BTreeMap, BTreeSet};

use super::cpus::NodeCpus;
use super::index::SlotIndex;
use super::model::{
    Change, InstanceCapacity, Misfit, Phase, PodRef, Reservation, ReservationError, SlotRequest,
    slot_id,
};
use crate::Millis;

/// Every Instance's slots, who holds them (SlotClaims, from the cluster)
/// and who has them reserved. Pure and deterministic.
#[derive(Debug, Clone, Default)]
pub struct ReservationDecider {
    pub(super) instances: BTreeMap<String, InstanceCapacity>,
    /// slot → uid of the pod whose claim holds it.
    pub(super) claims: BTreeMap<String, String>,
    /// pod uid → its reservation. Changed only through [`Self::put`],
    /// [`Self::take`] and [`Self::edit`], which keep `index` true.
    pub(super) reservations: BTreeMap<String, Reservation>,
    /// Who holds what, derived from `reservations` and `claims`.
    pub(super) index: SlotIndex,
    /// node → the exclusive CPUs its resource manager published.
    pub(super) node_cpus: BTreeMap<String, NodeCpus>,
    /// How long a `Reserved` reservation may wait to be consumed.
    ttl_ms: u64,
}

impl ReservationDecider {
    pub fn new(ttl_ms: u64) -> Self {
        Self {
            ttl_ms,
            ..Self::default()
        }
    }

    pub fn reservation(&self, uid: &str) -> Option<&Reservation> {
        self.reservations.get(uid)
    }

    /// Adds or replaces `r` (keyed by its pod's uid).
    fn put(&mut self, r: Reservation) {
        self.take(&r.pod.uid);
        self.index.hold(&r);
        self.reservations.insert(r.pod.uid.clone(), r);
    }

    /// Removes pod `uid`'s reservation.
    pub(super) fn take(&mut self, uid: &str) -> Option<Reservation> {
        let r = self.reservations.remove(uid)?;
        self.index.release(&r);
        Some(r)
    }

    /// Changes pod `uid`'s reservation in place with `f`, keeping the
    /// index true; `None` when it has none.
    pub(super) fn edit<T>(
        &mut self,
        uid: &str,
        f: impl FnOnce(&mut Reservation) -> T,
    ) -> Option<T> {
        let r = self.reservations.get_mut(uid)?;
        self.index.release(r);
        let out = f(r);
        self.index.hold(r);
        Some(out)
    }

    /// Whether the kept index equals one rebuilt from scratch.
    #[cfg(test)]
    pub(super) fn index_is_true(&self) -> bool {
        self.index == SlotIndex::of(self.reservations.values(), &self.claims)
    }

    pub fn reservations(&self) -> impl Iterator<Item = &Reservation> {
        self.reservations.values()
    }

    pub fn instance(&self, name: &str) -> Option<&InstanceCapacity> {
        self.instances.get(name)
    }

    /// Who holds `slot`: the pod of its claim, else the pod it is reserved for.
    pub fn holder(&self, slot: &str) -> Option<&str> {
        self.claims
            .get(slot)
            .map(String::as_str)
            .or_else(|| self.index.holders(slot).next())
    }

    /// The pods with `slot` reserved (held by a `Reserved` reservation).
    pub fn reserved_for(&self, slot: &str) -> Vec<String> {
        self.index.holders(slot).map(str::to_owned).collect()
    }

    /// The pods with a `Reserved` reservation on `node`.
    pub fn reserved_on(&self, node: &str) -> Vec<String> {
        self.index.on_node(node).map(str::to_owned).collect()
    }

    /// Slot numbers of `instance` free for pod `uid` (unclaimed or claimed
    /// by it, and reserved for no other pod).
    pub fn free_slots(&self, instance: &str, uid: &str) -> Vec<u32> {
        let Some(cap) = self.instances.get(instance) else {
            return Vec::new();
        };
        // O(capacity), whatever the number of reservations.
        (0..cap.capacity)
            .filter(|n| self.slot_free_for(&slot_id(instance, *n), uid))
            .collect()
    }

    /// Whether `slot` is unclaimed or claimed by `uid`, and reserved for no
    /// other pod (one slot of [`Self::free_slots`], without listing them all).
    pub(super) fn slot_free_for(&self, slot: &str, uid: &str) -> bool {
        self.claims.get(slot).is_none_or(|h| h == uid) && !self.index.held_by_other(slot, uid)
    }

    /// Whether `node` can hold `request` for pod `uid`: the slots it would
    /// get, or why not.
    pub fn fit(
        &self,
        request: &SlotRequest,
        node: &str,
        uid: &str,
    ) -> Result<BTreeSet<String>, Misfit> {
        let mut slots = BTreeSet::new();
        for (instance, want) in request {
            let Some(cap) = self.instances.get(instance) else {
                return Err(Misfit::NoInstance {
                    instance: instance.clone(),
                });
            };
            if !cap.nodes.contains(node) {
                return Err(Misfit::NotSeen {
                    instance: instance.clone(),
                    node: node.to_owned(),
                });
            }
            let free = self.free_slots(instance, uid);
            if (free.len() as u64) < u64::from(*want) {
                return Err(Misfit::TooFew {
                    instance: instance.clone(),
                    free: free.len(),
                    capacity: cap.capacity,
                    want: *want,
                });
            }
            slots.extend(
                free.into_iter()
                    .take(*want as usize)
                    .map(|n| slot_id(instance, n)),
            );
        }
        Ok(slots)
    }

    /// The scheduler asks for pod `pod`. Asking again with the same request
    /// changes nothing while it is `Requested` or `Reserved`; after
    /// `Rejected` or `Canceled` it asks anew (a retry may fit now).
    pub fn request(
        &mut self,
        pod: PodRef,
        request: SlotRequest,
        candidates: Vec<String>,
        now: Millis,
    ) -> Result<Vec<Change>, ReservationError> {
        self.request_with_cpus(pod, request, 0, candidates, now)
    }

    /// [`Self::request`] with `cpus` exclusive CPUs wanted on one NUMA node
    /// of the chosen node as well.
    pub fn request_with_cpus(
        &mut self,
        pod: PodRef,
        request: SlotRequest,
        cpus: u32,
        candidates: Vec<String>,
        now: Millis,
    ) -> Result<Vec<Change>, ReservationError> {
        let uid = pod.uid.clone();
        let request: SlotRequest = request.into_iter().filter(|(_, n)| *n > 0).collect();
        if request.is_empty() && cpus == 0 {
            return Err(ReservationError::EmptyRequest { uid });
        }
        if candidates.is_empty() {
            return Err(ReservationError::NoCandidates { uid });
        }
        if let Some(r) = self.reservations.get(&uid) {
            match r.phase {
                Phase::Requested | Phase::Reserved if r.request != request || r.cpus != cpus => {
                    return Err(ReservationError::Conflicting { uid });
                }
                Phase::Requested => {
                    self.edit(&uid, |r| r.candidates = candidates);
                    return Ok(Vec::new());
                }
                Phase::Reserved => return Ok(Vec::new()),
                Phase::Rejected | Phase::Canceled => {}
            }
        }
        self.put(Reservation {
            pod,
            request,
            candidates,
            phase: Phase::Requested,
            node: None,
            slots: BTreeSet::new(),
            cpus,
            numa: None,
            reason: None,
            requested_at: now,
            decided_at: None,
        });
        Ok(vec![Change::Phase {
            uid,
            phase: Phase::Requested,
        }])
    }

    /// A reservation as a previous writer recorded it (a controller that
    /// took over reads the Reservation objects back). A `Reserved` one is
    /// kept as it was if its node still sees every Instance and each of its
    /// slots is free for the pod and matches the request; otherwise it goes
    /// back to `Requested` to be decided again. Other phases are kept, with
    /// nothing held. Replaces what the ledger had for that pod.
    pub fn restore(&mut self, r: Reservation) -> Vec<Change> {
        let uid = r.pod.uid.clone();
        self.take(&uid);
        let mut r = r;
        r.request.retain(|_, n| *n > 0);
        if r.phase == Phase::Reserved && !self.still_holds(&r) {
            r.phase = Phase::Requested;
            r.node = None;
            r.slots.clear();
            r.numa = None;
            r.decided_at = None;
            r.reason = None;
            self.put(r);
            return vec![Change::Phase {
                uid,
                phase: Phase::Requested,
            }];
        }
        if r.phase != Phase::Reserved {
            r.node = None;
            r.slots.clear();
            r.numa = None;
        }
        self.put(r);
        Vec::new()
    }

    /// Whether a recorded `Reserved` reservation is still valid here.
    fn still_holds(&self, r: &Reservation) -> bool {
        let Some(node) = r.node.as_deref() else {
            return false;
        };
        let mut per: BTreeMap<&str, u32> = BTreeMap::new();
        for slot in &r.slots {
            let Some((instance, _)) = slot.rsplit_once('-') else {
                return false;
            };
            if !r.request.contains_key(instance) || !self.slot_usable(slot, node, &r.pod.uid) {
                return false;
            }
            *per.entry(instance).or_default() += 1;
        }
        let cpus_ok = match (r.cpus, r.numa) {
            (0, _) => true,
            (want, Some(k)) => self.numa_still_fits(node, &r.pod.uid, k, want),
            (_, None) => false,
        };
        cpus_ok
            && r.request
                .iter()
                .all(|(i, n)| per.get(i.as_str()).copied().unwrap_or(0) == *n)
    }

    /// The single writer's decision on a `Requested` reservation: the first
    /// candidate (in the scheduler's order) that can hold every request
    /// gets the slots (`Reserved`), or `Rejected` with each candidate's
    /// reason. Deciding anything else changes nothing.
    pub fn decide(&mut self, uid: &str, now: Millis) -> Result<Vec<Change>, ReservationError> {
        let r = self
            .reservations
            .get(uid)
            .ok_or_else(|| ReservationError::Unknown { uid: uid.into() })?;
        if r.phase != Phase::Requested {
            return Ok(Vec::new());
        }
        let mut why = Vec::new();
        let mut chosen = None;
        let mut seen = BTreeSet::new();
        for node in r.candidates.iter().filter(|n| seen.insert(n.as_str())) {
            let fits = self
                .fit(&r.request, node, uid)
                .and_then(|slots| Ok((slots, self.fit_cpus(node, uid, r.cpus)?)));
            match fits {
                Ok((slots, numa)) => {
                    chosen = Some((node.clone(), slots, numa));
                    break;
                }
                Err(e) => why.push(format!("{node}: {e}")),
            }
        }
        let phase = self.edit(uid, |r| {
            r.decided_at = Some(now);
            match chosen {
                Some((node, slots, numa)) => {
                    r.phase = Phase::Reserved;
                    r.node = Some(node);
                    r.slots = slots;
                    r.numa = numa;
                    r.reason = None;
                }
                None => {
                    r.phase = Phase::Rejected;
                    r.reason = Some(format!(
                        "no candidate node can hold the pod: {}",
                        why.join("; ")
                    ));
                }
            }
            r.phase
        });
        Ok(phase
            .map(|phase| {
                vec![Change::Phase {
                    uid: uid.to_owned(),
                    phase,
                }]
            })
            .unwrap_or_default())
    }

    /// Releases what `uid` has reserved (Unreserve, a failed binding, the
    /// pod gone). Idempotent; a pod with no reservation changes nothing.
    pub fn cancel(&mut self, uid: &str, reason: &str) -> Vec<Change> {
        let Some(r) = self.reservations.get(uid) else {
            return Vec::new();
        };
        if matches!(r.phase, Phase::Canceled | Phase::Rejected) {
            return Vec::new();
        }
        self.edit(uid, |r| {
            r.phase = Phase::Canceled;
            r.node = None;
            r.slots.clear();
            r.numa = None;
            r.reason = Some(reason.to_owned());
        });
        vec![Change::Phase {
            uid: uid.to_owned(),
            phase: Phase::Canceled,
        }]
    }

    /// The pod was bound to `node`: a reservation for another node is
    /// canceled (extenders never hear of a failed or diverted binding).
    pub fn bound(&mut self, uid: &str, node: &str) -> Vec<Change> {
        let elsewhere = self
            .reservations
            .get(uid)
            .is_some_and(|r| r.holds() && r.node.as_deref() != Some(node));
        if elsewhere {
            self.cancel(
                uid,
                &format!("the pod was bound to {node}, not the reserved node"),
            )
        } else {
            Vec::new()
        }
    }

    /// The pod is gone: its reservation is dropped (released first).
    pub fn forget(&mut self, uid: &str) -> Vec<Change> {
        let mut changes = self.cancel(uid, "the pod is gone");
        self.take(uid);
        changes.retain(|c| !matches!(c, Change::Phase { .. }));
        changes
    }

    /// `Reserved` reservations not consumed within the time to live are
    /// canceled (a pod never bound, or bound and never started).
    pub fn expire(&mut self, now: Millis) -> Vec<Change> {
        let ttl = self.ttl_ms;
        let due: Vec<String> = self
            .reservations
            .values()
            .filter(|r| r.holds() && r.decided_at.is_some_and(|t| now.since(t) >= ttl))
            .map(|r| r.pod.uid.clone())
            .collect();
        due.iter()
            .flat_map(|uid| {
                self.cancel(
                    uid,
                    &format!("not consumed within {} ms of being reserved", ttl),
                )
            })
            .collect()
    }
}
