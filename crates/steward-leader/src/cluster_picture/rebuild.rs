//! The decider rebuilt from every object, and what each Reservation's
//! status should be: the controller's start, its answer to a relist, and
//! the audit that checks the incremental decider against it.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;
use steward_api::{Reservation, ReservationStatus};
use steward_core::Millis;
use steward_core::reservation::{self as core, Change, Phase, ReservationDecider};

use super::{ClusterPicture, Write};

/// A decider and the pods whose reservations it found consumed.
pub(super) struct Rebuilt {
    pub(super) decider: ReservationDecider,
    pub(super) consumed: BTreeSet<String>,
}

impl ClusterPicture {
    /// The decider from scratch: every Instance, Node, persisted decision
    /// and claim, then every Reservation decided as the incremental path
    /// would; and the writes that brings. O(everything): used when the
    /// decider cannot be kept (start, relist) and for the audit.
    pub(super) fn rebuild(&self, ttl_ms: u64, now: Millis) -> (Rebuilt, Vec<Write>) {
        let mut decider = ReservationDecider::new(ttl_ms);
        for (name, cap) in self.instances.iter() {
            decider.set_instance(name, self.seen_capacity(cap));
        }
        for (node, cpus) in self.nodes.iter() {
            if let Some(cpus) = cpus {
                decider.set_node_cpus(node, Some(cpus.clone()));
            }
        }
        // What earlier decisions persisted. A reservation its pod's claims
        // already cover is consumed, not restored: the kept decider let its
        // slots go when it was consumed, and when the pod's claims hold
        // other slots than the ones reserved, another pod may hold those now.
        let mut consumed = BTreeSet::new();
        let claimed = self.claimed_per_pod();
        for r in self.reservations.values() {
            if let Some(s) = &r.status {
                let rec = self.recorded(r, s);
                if self.covered(&rec, &claimed) {
                    consumed.insert(rec.pod.uid.clone());
                    continue;
                }
                decider.restore(rec);
            }
        }
        // Reality: claims win over reservations of other pods.
        let mut changes = Vec::new();
        // By slot, as the claims are observed.
        let held: BTreeMap<&str, &str> = self
            .claims
            .values()
            .map(|(slot, uid)| (slot.as_str(), uid.as_str()))
            .collect();
        for (slot, uid) in held {
            changes.extend(decider.claim_observed(slot, uid));
        }
        changes.extend(decider.settle());
        for c in changes {
            if let Change::Consumed { uid } = c {
                consumed.insert(uid);
            }
        }
        let uids: BTreeSet<&str> = self
            .reservations
            .values()
            .map(|r| r.spec.pod.uid.as_str())
            .collect();
        for uid in uids {
            self.decide_into(&mut decider, &consumed, uid, now);
        }
        decider.expire(now);
        let writes = self
            .reservations
            .values()
            .filter_map(|r| {
                let lives = self.pod_lives(&r.spec.pod.uid);
                write_for(r, &decider, &consumed, now, lives)
            })
            .collect();
        (Rebuilt { decider, consumed }, writes)
    }

    /// What the decider says of pod `uid`'s Reservation once it is looked
    /// at: canceled when its pod is gone or ended or the scheduler
    /// unreserved, requested and decided when its spec is not answered
    /// yet, and checked against the node its pod was bound to.
    pub(super) fn decide_into(
        &self,
        decider: &mut ReservationDecider,
        consumed: &BTreeSet<String>,
        uid: &str,
        now: Millis,
    ) {
        if consumed.contains(uid) {
            return;
        }
        let Some(r) = self.reservation_of(uid) else {
            return;
        };
        let generation = r.metadata.generation;
        let answered = r
            .status
            .as_ref()
            .is_some_and(|s| s.observed_generation == generation);
        let Some(pod) = self.pods.get(uid) else {
            // A pod not seen yet is not a pod that is gone: an ask arrives
            // directly or through another watch than its pod, so a fresh
            // ask (never decided: no status) waits for the pod's first
            // event, which looks at it again. Its owner reference removes it
            // if the pod never comes. Anything once decided was decided for
            // a pod seen then: that pod is gone, and what it held released.
            if r.status.is_some() {
                decider.cancel(uid, "the pod is gone");
            }
            return;
        };
        if let Some(why) = &pod.ended {
            decider.cancel(uid, why);
            return;
        }
        if let Some(reason) = &r.spec.cancel {
            decider.cancel(uid, &format!("unreserved: {reason}"));
            return;
        }
        if !answered {
            let asked = decider.request_with_cpus(
                r.spec.pod_ref(),
                r.spec.slots.clone(),
                r.spec.exclusive_cpus,
                r.spec.candidates.clone(),
                now,
            );
            if asked.is_err() && decider.reservation(uid).is_none() {
                return;
            }
        }
        let _ = decider.decide(uid, now);
        if let Some(node) = &pod.node {
            decider.bound(uid, node);
        }
    }

    /// Pod uid → Instance → how many of its slots the pod's claims hold.
    fn claimed_per_pod(&self) -> BTreeMap<&str, BTreeMap<&str, u32>> {
        let mut out: BTreeMap<&str, BTreeMap<&str, u32>> = BTreeMap::new();
        for (slot, uid) in self.claims.values() {
            if let Some((instance, n)) = slot.rsplit_once('-')
                && n.parse::<u32>().is_ok()
            {
                *out.entry(uid.as_str())
                    .or_default()
                    .entry(instance)
                    .or_default() += 1;
            }
        }
        out
    }

    /// Whether a recorded reservation is used up, as
    /// `ReservationDecider`'s consumption counts it: Reserved, every slot
    /// asked for held by the pod's own claims, and its exclusive CPUs (if
    /// any) held by the pod on its node.
    fn covered(
        &self,
        r: &core::Reservation,
        claimed: &BTreeMap<&str, BTreeMap<&str, u32>>,
    ) -> bool {
        let uid = r.pod.uid.as_str();
        let mine = claimed.get(uid);
        r.holds()
            && r.request.iter().all(|(instance, want)| {
                mine.and_then(|m| m.get(instance.as_str()))
                    .copied()
                    .unwrap_or(0)
                    >= *want
            })
            && (r.cpus == 0
                || r.node
                    .as_deref()
                    .and_then(|n| self.nodes.get(n))
                    .and_then(|c| c.as_ref())
                    .is_some_and(|c| c.holders.contains(uid)))
    }

    /// Whether pod `uid` is seen and neither being deleted nor Succeeded
    /// (an Event about its Reservation has a reader; a Failed pod's says
    /// why, e.g. its node's admission refused it).
    pub(super) fn pod_lives(&self, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|p| !p.gone)
    }

    /// The core's reservation as `r`'s status recorded it; a reservation
    /// on a node that is gone is recorded canceled.
    pub(super) fn recorded(&self, r: &Reservation, s: &ReservationStatus) -> core::Reservation {
        let mut rec = recorded(r, s);
        if let Some(node) = rec.node.clone()
            && rec.phase == Phase::Reserved
            && !self.nodes.contains(node.as_str())
        {
            rec.phase = Phase::Canceled;
            rec.node = None;
            rec.slots.clear();
            rec.numa = None;
            rec.reason = Some(format!("node {node} is gone"));
        }
        rec
    }
}

/// The status write `r` needs, if any, given what the decider says.
pub(super) fn write_for(
    r: &Reservation,
    decider: &ReservationDecider,
    consumed: &BTreeSet<String>,
    now: Millis,
    pod_lives: bool,
) -> Option<Write> {
    let uid = r.spec.pod.uid.as_str();
    let generation = r.metadata.generation;
    let is_consumed = consumed.contains(uid);
    let wanted = if is_consumed {
        r.status.clone().map(|mut s| {
            s.reason = Some("consumed: the pod holds what was reserved for it".into());
            s.observed_generation = generation;
            s
        })
    } else if let Some(l) = decider.reservation(uid) {
        Some(ReservationStatus::from_core(l, generation))
    } else {
        invalid(r, generation)
    };
    let mut wanted = wanted?;
    if wanted.conditions.is_empty() {
        wanted.conditions = r
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
    }
    wanted.set_reserved_condition(is_consumed, time(now));
    if r.status.as_ref() == Some(&wanted) {
        return None;
    }
    let mut object = r.clone();
    let from = r.status.as_ref().map(|s| s.phase.clone());
    let announce = from.as_deref() != Some(wanted.phase.as_str())
        && match wanted.phase.as_str() {
            "Rejected" => true,
            "Canceled" => pod_lives,
            _ => false,
        };
    object.status = Some(wanted);
    Some(Write {
        namespace: r.namespace().unwrap_or_default(),
        name: r.name_any(),
        object,
        from,
        announce,
    })
}

/// The status of a Reservation the decider refused (no slot asked, no
/// candidate): Rejected with the reason, so it is not left Requested.
fn invalid(r: &Reservation, generation: Option<i64>) -> Option<ReservationStatus> {
    let reason = if r.spec.slots.values().all(|n| *n == 0) && r.spec.exclusive_cpus == 0 {
        "the reservation asks for no slot and no exclusive CPU"
    } else if r.spec.candidates.is_empty() {
        "the reservation names no candidate node"
    } else {
        return None;
    };
    Some(ReservationStatus {
        phase: "Rejected".into(),
        reason: Some(reason.into()),
        observed_generation: generation,
        ..ReservationStatus::default()
    })
}

/// The core's reservation as a Reservation object's status recorded it.
fn recorded(r: &Reservation, s: &ReservationStatus) -> core::Reservation {
    let phase = match s.phase.as_str() {
        "Reserved" => Phase::Reserved,
        "Rejected" => Phase::Rejected,
        "Canceled" => Phase::Canceled,
        _ => Phase::Requested,
    };
    core::Reservation {
        pod: r.spec.pod_ref(),
        request: r.spec.slots.clone(),
        candidates: r.spec.candidates.clone(),
        phase,
        node: s.node.clone(),
        slots: s.slot_set(),
        cpus: r.spec.exclusive_cpus,
        numa: s.numa_node,
        reason: s.reason.clone(),
        requested_at: Millis(s.decided_at.unwrap_or(0)),
        decided_at: s.decided_at.map(Millis),
    }
}

/// `now` as an API timestamp.
fn time(now: Millis) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    let ms = i64::try_from(now.0).unwrap_or(i64::MAX);
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_millisecond(ms)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}
