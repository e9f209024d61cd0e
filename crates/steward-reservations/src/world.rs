//! What the controller knows of the cluster, and the decisions it implies.
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
use steward_kube::Change as Watch;

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

/// Every object the decisions depend on, as last seen.
#[derive(Debug, Default)]
pub struct World {
    instances: BTreeMap<String, InstanceCapacity>,
    /// slot id → uid of the pod whose claim holds it.
    claims: BTreeMap<String, String>,
    /// SlotClaim object name → its slot (to release on delete).
    claim_objects: BTreeMap<(String, String), String>,
    reservations: BTreeMap<(String, String), Reservation>,
    pods: BTreeMap<String, PodFacts>,
    nodes: BTreeSet<String>,
    /// node → the exclusive CPUs its resource manager publishes.
    node_cpus: BTreeMap<String, NodeCpus>,
    /// Which kinds have been listed at least once: nothing is decided
    /// before all have (a pod not yet seen is not a pod that is gone).
    listed: BTreeSet<&'static str>,
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

const KINDS: [&str; 5] = ["instances", "slotclaims", "reservations", "pods", "nodes"];

fn key<K: ResourceExt>(o: &K) -> (String, String) {
    (o.namespace().unwrap_or_default(), o.name_any())
}

impl World {
    /// Whether every kind has been listed.
    pub fn ready(&self) -> bool {
        KINDS.iter().all(|k| self.listed.contains(k))
    }

    pub fn instances(&mut self, change: Watch<Instance>) {
        let cap = |i: &Instance| InstanceCapacity {
            capacity: i.spec.capacity,
            nodes: i.spec.nodes.iter().cloned().collect(),
        };
        match change {
            Watch::Relisted(all) => {
                self.instances = all.iter().map(|i| (i.name_any(), cap(i))).collect();
                self.listed.insert("instances");
            }
            Watch::Applied(i) => {
                self.instances.insert(i.name_any(), cap(&i));
            }
            Watch::Deleted(i) => {
                self.instances.remove(&i.name_any());
            }
            Watch::Interrupted(_) => {}
        }
    }

    pub fn slot_claims(&mut self, change: Watch<SlotClaim>) {
        let holder = |c: &SlotClaim| c.spec.pod.as_ref().map(|p| p.uid.clone());
        match change {
            Watch::Relisted(all) => {
                self.claims.clear();
                self.claim_objects.clear();
                for c in &all {
                    self.claim_applied(c, holder(c));
                }
                self.listed.insert("slotclaims");
            }
            Watch::Applied(c) => {
                if let Some(slot) = self.claim_objects.remove(&key(&c)) {
                    self.claims.remove(&slot);
                }
                self.claim_applied(&c, holder(&c));
            }
            Watch::Deleted(c) => {
                if let Some(slot) = self.claim_objects.remove(&key(&c)) {
                    self.claims.remove(&slot);
                }
            }
            Watch::Interrupted(_) => {}
        }
    }

    fn claim_applied(&mut self, c: &SlotClaim, holder: Option<String>) {
        let slot = c.spec.slot_id();
        self.claim_objects.insert(key(c), slot.clone());
        // A claim not yet attributed to a pod holds the slot for nobody we
        // can name; it still holds it.
        self.claims.insert(
            slot,
            holder.unwrap_or_else(|| format!("unattributed/{}", c.spec.node)),
        );
    }

    pub fn reservations(&mut self, change: Watch<Reservation>) {
        match change {
            Watch::Relisted(all) => {
                self.reservations = all.into_iter().map(|r| (key(&r), r)).collect();
                self.listed.insert("reservations");
            }
            Watch::Applied(r) => {
                self.reservations.insert(key(&r), r);
            }
            Watch::Deleted(r) => {
                self.reservations.remove(&key(&r));
            }
            Watch::Interrupted(_) => {}
        }
    }

    pub fn pods(&mut self, change: Watch<Pod>) {
        match change {
            Watch::Relisted(all) => {
                self.pods = all
                    .iter()
                    .filter_map(|p| Some((p.metadata.uid.clone()?, PodFacts::of(p))))
                    .collect();
                self.listed.insert("pods");
            }
            Watch::Applied(p) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    self.pods.insert(uid, PodFacts::of(&p));
                }
            }
            Watch::Deleted(p) => {
                if let Some(uid) = &p.metadata.uid {
                    self.pods.remove(uid);
                }
            }
            Watch::Interrupted(_) => {}
        }
    }

    pub fn nodes(&mut self, change: Watch<Node>) {
        match change {
            Watch::Relisted(all) => {
                self.nodes.clear();
                self.node_cpus.clear();
                for n in &all {
                    self.node_applied(n);
                }
                self.listed.insert("nodes");
            }
            Watch::Applied(n) => self.node_applied(&n),
            Watch::Deleted(n) => {
                self.nodes.remove(&n.name_any());
                self.node_cpus.remove(&n.name_any());
            }
            Watch::Interrupted(_) => {}
        }
    }

    fn node_applied(&mut self, n: &Node) {
        let name = n.name_any();
        // A document that does not parse counts as none: CPUs are not
        // reserved on a node whose capacity cannot be read.
        match n
            .annotations()
            .get(NODE_CPUS_ANNOTATION)
            .map(|a| serde_json::from_str::<NodeCpus>(a))
        {
            Some(Ok(c)) => {
                self.node_cpus.insert(name.clone(), c);
            }
            Some(Err(e)) => {
                tracing::warn!(node = %name, error = %e, "unreadable {NODE_CPUS_ANNOTATION} annotation; no exclusive CPUs reserved there");
                self.node_cpus.remove(&name);
            }
            None => {
                self.node_cpus.remove(&name);
            }
        }
        self.nodes.insert(name);
    }

    /// The statuses to write at `now` (milliseconds of the wall clock),
    /// reservations held at most `ttl_ms` before their pod's claims
    /// consume them.
    pub fn reconcile(&self, ttl_ms: u64, now: Millis) -> Vec<Write> {
        if !self.ready() {
            return Vec::new();
        }
        let mut ledger = ReservationLedger::new(ttl_ms);
        for (name, cap) in &self.instances {
            let mut cap = cap.clone();
            cap.nodes.retain(|n| self.nodes.contains(n));
            ledger.set_instance(name, cap);
        }
        for (node, cpus) in &self.node_cpus {
            ledger.set_node_cpus(node, Some(cpus.clone()));
        }
        // What earlier decisions persisted.
        for r in self.reservations.values() {
            if let Some(s) = &r.status {
                let mut rec = recorded(r, s);
                if let Some(node) = rec.node.clone()
                    && rec.phase == Phase::Reserved
                    && !self.nodes.contains(&node)
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
        for (slot, uid) in &self.claims {
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
