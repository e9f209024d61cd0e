//! The picture the reservation ledger is rebuilt from — what the
//! controller knows of the cluster, one [`Mirror`] per kind — and the
//! decisions it implies.
//!
//! Level-triggered: after every batch of watch changes the whole ledger is
//! rebuilt from what the objects say — Instances, SlotClaims, Nodes, Pods
//! and the Reservations with the statuses earlier decisions wrote — and
//! each Reservation's wanted status is compared with its current one. Only
//! differences are written. A write that loses (409) changes nothing: the
//! next rebuild decides again from what was really persisted, so a decision
//! exists only once it is in the API, and a successor controller starts from
//! exactly what its predecessor persisted.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use steward_api::{Instance, Reservation, ReservationStatus, SlotClaim};
use steward_core::Millis;
use steward_core::reservation::{
    self as core, Change, InstanceCapacity, NODE_CPUS_ANNOTATION, NodeCpus, Phase,
    ReservationLedger,
};
use steward_kube::{Change as Watch, Mirror};

/// A pod as the controller needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    /// `spec.nodeName`, once bound.
    pub node: Option<String>,
    /// Why it will never use a reservation (ended, refused by its node,
    /// being deleted); `None` while it may.
    pub ended: Option<String>,
}

impl PodFacts {
    fn of(p: &Pod) -> Self {
        let status = p.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref());
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let ended = if p.metadata.deletion_timestamp.is_some() {
            Some("the pod is gone (being deleted)".to_owned())
        } else if matches!(phase, Some("Succeeded" | "Failed")) {
            // kubelet's admission failures (a device plugin's Allocate or
            // the resource manager refusing) end the pod Failed with the
            // reason, e.g. UnexpectedAdmissionError.
            let reason = status.and_then(|s| s.reason.as_deref()).unwrap_or("");
            let message = status.and_then(|s| s.message.as_deref()).unwrap_or("");
            Some(match (phase, reason) {
                (Some("Failed"), r) if !r.is_empty() => format!(
                    "allocation failed on {}: {r}: {message}",
                    node.as_deref().unwrap_or("its node")
                ),
                (Some(ph), _) => format!("the pod ended ({ph})"),
                (None, _) => "the pod ended".to_owned(),
            })
        } else {
            None
        };
        PodFacts { node, ended }
    }
}

/// Every object the decisions depend on, as last seen: one
/// [`Mirror`] per kind, each keeping only what the decisions read.
#[derive(Debug)]
pub struct LedgerPicture {
    /// Instance name → its capacity.
    instances: Mirror<Instance, InstanceCapacity, String>,
    /// SlotClaim object → (its slot, the uid of the pod it holds it for).
    claims: Mirror<SlotClaim, (String, String)>,
    reservations: Mirror<Reservation>,
    /// pod uid → what the decisions need of the pod.
    pods: Mirror<Pod, PodFacts, String>,
    /// node name → the exclusive CPUs its resource manager publishes, if
    /// any.
    nodes: Mirror<Node, Option<NodeCpus>, String>,
}

/// A status to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub namespace: String,
    pub name: String,
    /// The object as read, with the new status (its resourceVersion makes
    /// the write conditional).
    pub object: Reservation,
    /// The phase it moves from (`None`: no status yet).
    pub from: Option<String>,
}

impl Default for LedgerPicture {
    fn default() -> Self {
        Self {
            instances: Mirror::keyed(name, |i: Instance| {
                Some(InstanceCapacity {
                    capacity: i.spec.capacity,
                    nodes: i.spec.nodes.iter().cloned().collect(),
                })
            }),
            claims: Mirror::projected(|c: SlotClaim| {
                // A claim not yet attributed to a pod holds the slot for
                // nobody we can name; it still holds it.
                let holder = match c.spec.pod.as_ref() {
                    Some(p) => p.uid.clone(),
                    None => format!("unattributed/{}", c.spec.node),
                };
                Some((c.spec.slot_id(), holder))
            }),
            reservations: Mirror::new(),
            pods: Mirror::keyed(|p: &Pod| p.metadata.uid.clone(), |p| Some(PodFacts::of(&p))),
            nodes: Mirror::keyed(name, |n: Node| Some(node_cpus(&n))),
        }
    }
}

/// An object's name: the key of cluster-wide names (Instances are
/// referred to by name alone, as slot ids do).
fn name<K: ResourceExt>(o: &K) -> Option<String> {
    Some(o.name_any())
}

/// The exclusive CPUs node `n` publishes. A document that does not parse
/// counts as none: CPUs are not reserved on a node whose capacity cannot
/// be read.
fn node_cpus(n: &Node) -> Option<NodeCpus> {
    match serde_json::from_str::<NodeCpus>(n.annotations().get(NODE_CPUS_ANNOTATION)?) {
        Ok(c) => Some(c),
        Err(e) => {
            let name = n.name_any();
            tracing::warn!(node = %name, error = %e, "unreadable {NODE_CPUS_ANNOTATION} annotation; no exclusive CPUs reserved there");
            None
        }
    }
}

impl LedgerPicture {
    /// Whether every kind has been listed: nothing is decided before all
    /// have (a pod not yet seen is not a pod that is gone).
    pub fn ready(&self) -> bool {
        self.instances.listed()
            && self.claims.listed()
            && self.reservations.listed()
            && self.pods.listed()
            && self.nodes.listed()
    }

    // An interrupted watch changes nothing here: it resumes or relists.

    pub fn instances(&mut self, change: Watch<Instance>) {
        let _ = self.instances.apply(change);
    }

    pub fn slot_claims(&mut self, change: Watch<SlotClaim>) {
        let _ = self.claims.apply(change);
    }

    pub fn reservations(&mut self, change: Watch<Reservation>) {
        let _ = self.reservations.apply(change);
    }

    pub fn pods(&mut self, change: Watch<Pod>) {
        let _ = self.pods.apply(change);
    }

    pub fn nodes(&mut self, change: Watch<Node>) {
        let _ = self.nodes.apply(change);
    }

    /// The statuses to write at `now` (milliseconds of the wall clock),
    /// reservations held at most `ttl_ms` before their pod's claims
    /// consume them.
    pub fn reconcile(&self, ttl_ms: u64, now: Millis) -> Vec<Write> {
        if !self.ready() {
            return Vec::new();
        }
        let mut ledger = ReservationLedger::new(ttl_ms);
        for (name, cap) in self.instances.iter() {
            let mut cap = cap.clone();
            cap.nodes.retain(|n| self.nodes.contains(n.as_str()));
            ledger.set_instance(name, cap);
        }
        for (node, cpus) in self.nodes.iter() {
            if let Some(cpus) = cpus {
                ledger.set_node_cpus(node, Some(cpus.clone()));
            }
        }
        // What earlier decisions persisted.
        for r in self.reservations.values() {
            if let Some(s) = &r.status {
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
                ledger.restore(rec);
            }
        }
        // Reality: claims win over reservations of other pods.
        let mut consumed = BTreeSet::new();
        let mut changes = Vec::new();
        // By slot, as the claims are observed.
        let held: BTreeMap<&str, &str> = self
            .claims
            .values()
            .map(|(slot, uid)| (slot.as_str(), uid.as_str()))
            .collect();
        for (slot, uid) in held {
            changes.extend(ledger.claim_observed(slot, uid));
        }
        changes.extend(ledger.settle());
        for c in changes {
            if let Change::Consumed { uid } = c {
                consumed.insert(uid);
            }
        }
        let by_uid: BTreeMap<&str, &Reservation> = self
            .reservations
            .values()
            .map(|r| (r.spec.pod.uid.as_str(), r))
            .collect();
        for (uid, r) in &by_uid {
            if consumed.contains(*uid) {
                continue;
            }
            let generation = r.metadata.generation;
            let answered = r
                .status
                .as_ref()
                .is_some_and(|s| s.observed_generation == generation);
            let Some(pod) = self.pods.get(*uid) else {
                ledger.cancel(uid, "the pod is gone");
                continue;
            };
            if let Some(why) = &pod.ended {
                ledger.cancel(uid, why);
                continue;
            }
            if let Some(reason) = &r.spec.cancel {
                ledger.cancel(uid, &format!("unreserved: {reason}"));
                continue;
            }
            if !answered {
                let candidates: Vec<String> = r.spec.candidates.clone();
                let asked = ledger.request_with_cpus(
                    r.spec.pod_ref(),
                    r.spec.slots.clone(),
                    r.spec.exclusive_cpus,
                    candidates,
                    now,
                );
                if asked.is_err() && ledger.reservation(uid).is_none() {
                    continue;
                }
            }
            let _ = ledger.decide(uid, now);
            if let Some(node) = &pod.node {
                ledger.bound(uid, node);
            }
        }
        ledger.expire(now);

        let mut writes = Vec::new();
        for r in self.reservations.values() {
            let uid = r.spec.pod.uid.as_str();
            let generation = r.metadata.generation;
            let wanted = if consumed.contains(uid) {
                r.status.clone().map(|mut s| {
                    s.reason = Some("consumed: the pod holds what was reserved for it".into());
                    s.observed_generation = generation;
                    s
                })
            } else if let Some(l) = ledger.reservation(uid) {
                Some(ReservationStatus::from_core(l, generation))
            } else {
                self.invalid(r, generation)
            };
            let Some(mut wanted) = wanted else { continue };
            if wanted.conditions.is_empty() {
                wanted.conditions = r
                    .status
                    .as_ref()
                    .map(|s| s.conditions.clone())
                    .unwrap_or_default();
            }
            wanted.set_reserved_condition(consumed.contains(uid), time(now));
            if r.status.as_ref() != Some(&wanted) {
                let mut object = r.clone();
                let from = r.status.as_ref().map(|s| s.phase.clone());
                object.status = Some(wanted);
                writes.push(Write {
                    namespace: r.namespace().unwrap_or_default(),
                    name: r.name_any(),
                    object,
                    from,
                });
            }
        }
        writes
    }

    /// Reservations by phase (no status, or a phase not known, counts as
    /// `Requested`) and the age at `now` of the oldest `Requested` one, in
    /// milliseconds from its creation; for the controller's metrics.
    pub fn phases(&self, now: Millis) -> (Vec<(&'static str, usize)>, Option<u64>) {
        let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
        let mut oldest: Option<u64> = None;
        for r in self.reservations.values() {
            let phase = match r.status.as_ref().map(|s| s.phase.as_str()) {
                Some("Reserved") => "Reserved",
                Some("Rejected") => "Rejected",
                Some("Canceled") => "Canceled",
                _ => "Requested",
            };
            *counts.entry(phase).or_default() += 1;
            if phase == "Requested"
                && let Some(created) = r.metadata.creation_timestamp.as_ref()
            {
                let created = u64::try_from(created.0.as_millisecond()).unwrap_or(0);
                let age = now.0.saturating_sub(created);
                oldest = Some(oldest.map_or(age, |o| o.max(age)));
            }
        }
        (counts.into_iter().collect(), oldest)
    }

    /// The status of a Reservation the ledger refused (no slot asked, no
    /// candidate): Rejected with the reason, so it is not left Requested.
    fn invalid(&self, r: &Reservation, generation: Option<i64>) -> Option<ReservationStatus> {
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
