//! What the controller knows of the cluster — one [`Mirror`] per kind —
//! the reservation decider kept from it, and the decisions it implies.
//!
//! The decider is built once from every object ([`rebuild`]: Instances,
//! SlotClaims, Nodes, Pods and the Reservations with the statuses earlier
//! decisions wrote) and then kept: each watch change updates it where the
//! change lands, and only the pods it touched ("dirty") are looked at
//! again, each first re-read from what its Reservation object says. A
//! batch's work grows with what changed, not with the cluster. Only
//! differences from each Reservation's current status are written. A write
//! that loses (409) changes nothing: the pod is looked at again from what
//! was really persisted, so a decision exists only once it is in the API,
//! and a successor controller starts from exactly what its predecessor
//! persisted. A relist rebuilds; [`ClusterPicture::audit`] rebuilds aside
//! and reports where the kept decider would write otherwise.

mod asks;
mod echoes;
mod pod_facts;
#[cfg(test)]
mod proptests;
mod rebuild;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use steward_api::{Instance, Reservation, SlotClaim};
use steward_core::Millis;
use steward_core::reservation::{
    Change, InstanceCapacity, NODE_CPUS_ANNOTATION, NodeCpus, ReservationDecider,
};
use steward_kube::{Change as Watch, Mirror, ObjectKey};

pub use pod_facts::PodFacts;
use rebuild::{Rebuilt, write_for};

/// Every object the decisions depend on, as last seen: one
/// [`Mirror`] per kind, each keeping only what the decisions read.
#[derive(Debug)]
pub struct ClusterPicture {
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
    /// pod uid → the key of its Reservation.
    by_uid: BTreeMap<String, ObjectKey>,
    /// The decider as of the last reconcile, kept between batches.
    decider: ReservationDecider,
    /// Pods whose reservations their own claims consumed.
    consumed: BTreeSet<String>,
    /// Pods to look at again in the next reconcile.
    dirty: BTreeSet<String>,
    /// The decider must be rebuilt from every object before it is used
    /// (nothing built yet, a relist, the set of Nodes changed).
    stale: bool,
    /// The time to live `decider` was built with.
    ttl_ms: u64,
    /// Full rebuilds so far.
    rebuilds: u64,
    /// Reservations this controller wrote whose watch event has not come
    /// yet: key → the resourceVersion written. Until it comes, the watch
    /// can only bring older states of the object (it delivers one kind's
    /// events in resourceVersion order), which must not move the decider
    /// back; resourceVersions are only compared for equality.
    /// With the instant of the write, to give up on an echo that never
    /// comes ([`ClusterPicture::forget_expected`]).
    expected: HashMap<ObjectKey, (String, Millis)>,
    /// Reservation relists so far: an ask written before the last one has
    /// its result taken from the watch only.
    relists: u64,
    /// Uids of the Reservation objects deleted most recently (at most
    /// [`echoes::RECENTLY_DELETED`]), oldest first: an ask's result naming
    /// one is not brought back.
    deleted: VecDeque<String>,
    deleted_set: HashSet<String>,
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
    /// Whether the change is worth an Event: a rejection, or a
    /// cancellation its pod outlives (unreserved by the scheduler, expired,
    /// its node gone, the pod Failed at admission). A reservation made,
    /// consumed, or canceled with its pod (deleted, Succeeded) says so in
    /// its status only: at a hundred pods a second, an Event each would
    /// double the writes.
    pub announce: bool,
}

impl Default for ClusterPicture {
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
            by_uid: BTreeMap::new(),
            decider: ReservationDecider::default(),
            consumed: BTreeSet::new(),
            dirty: BTreeSet::new(),
            stale: true,
            ttl_ms: 0,
            rebuilds: 0,
            expected: HashMap::new(),
            relists: 0,
            deleted: VecDeque::new(),
            deleted_set: HashSet::new(),
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

impl ClusterPicture {
    /// Whether every kind has been listed: nothing is decided before all
    /// have (a pod not yet seen is not a pod that is gone).
    pub fn ready(&self) -> bool {
        self.instances.listed()
            && self.claims.listed()
            && self.reservations.listed()
            && self.pods.listed()
            && self.nodes.listed()
    }

    /// Whether the decider is built and kept: every kind listed and no
    /// rebuild pending.
    pub fn kept(&self) -> bool {
        self.ready() && !self.stale
    }

    /// How many times the decider was rebuilt from every object.
    pub fn rebuilds(&self) -> u64 {
        self.rebuilds
    }

    /// Reservation `namespace`/`name` as last seen.
    pub fn reservation(&self, namespace: &str, name: &str) -> Option<&Reservation> {
        self.reservations.get(&ObjectKey::new(namespace, name))
    }

    /// Pods waiting to be looked at again.
    pub fn dirty(&self) -> usize {
        self.dirty.len()
    }

    // An interrupted watch changes nothing here: it resumes or relists.
    // While the decider is stale, changes only update the mirrors: the
    // rebuild reads them all.

    pub fn instances(&mut self, change: Watch<Instance>) {
        let named = watched_name(&change);
        let before = named
            .as_deref()
            .and_then(|n| self.instances.get(n).cloned());
        let Ok(delta) = self.instances.apply(change) else {
            return;
        };
        if delta.relisted {
            self.stale = true;
        }
        if self.stale {
            return;
        }
        // Every reservation asking for it is looked at again (O(reservations),
        // but Instances change seldom); each is re-read from its object.
        for name in delta.applied {
            if let Some(cap) = self.instances.get(&name)
                && before.as_ref() != Some(cap)
            {
                let cap = self.seen_capacity(cap);
                let changes = self.decider.set_instance(&name, cap);
                self.note(changes);
                self.dirty.extend(self.asking_for(&name));
            }
        }
        for (name, _) in delta.removed {
            let changes = self.decider.remove_instance(&name);
            self.note(changes);
            self.dirty.extend(self.asking_for(&name));
        }
    }

    pub fn slot_claims(&mut self, change: Watch<SlotClaim>) {
        let key = match &change {
            Watch::Applied(c) | Watch::Deleted(c) => Some(ObjectKey::of(c)),
            _ => None,
        };
        let before = key.as_ref().and_then(|k| self.claims.get(k).cloned());
        let Ok(delta) = self.claims.apply(change) else {
            return;
        };
        if delta.relisted {
            self.stale = true;
        }
        if self.stale {
            return;
        }
        let after = key.as_ref().and_then(|k| self.claims.get(k).cloned());
        if before == after {
            return;
        }
        if let Some((slot, uid)) = before {
            self.decider.claim_released(&slot);
            self.dirty.insert(uid);
        }
        if let Some((slot, uid)) = after {
            // Other pods' reservations of the slot move: look at them again.
            self.dirty.extend(self.decider.reserved_for(&slot));
            let changes = self.decider.claim_observed(&slot, &uid);
            self.note(changes);
            self.dirty.insert(uid);
        }
    }

    pub fn pods(&mut self, change: Watch<Pod>) {
        let Ok(delta) = self.pods.apply(change) else {
            return;
        };
        if delta.relisted {
            self.stale = true;
            return;
        }
        // Only pods with a Reservation matter to the decisions.
        let touched = delta
            .applied
            .into_iter()
            .chain(delta.removed.into_iter().map(|(uid, _)| uid));
        for uid in touched {
            if self.by_uid.contains_key(&uid) {
                self.dirty.insert(uid);
            }
        }
    }

    pub fn nodes(&mut self, change: Watch<Node>) {
        let named = watched_name(&change);
        let before = named.as_deref().map(|n| self.nodes.get(n).cloned());
        let Ok(delta) = self.nodes.apply(change) else {
            return;
        };
        // A node appearing or going changes which nodes see each Instance
        // and which reservations stand: rebuild.
        if delta.relisted || !delta.removed.is_empty() || matches!(before, Some(None)) {
            self.stale = true;
        }
        if self.stale {
            return;
        }
        // Otherwise only the CPUs it publishes matter (not its heartbeats).
        for node in delta.applied {
            let now = self.nodes.get(&node).cloned().flatten();
            let was = before.as_ref().and_then(|b| b.as_ref());
            if was != Some(&now) {
                // Reservations there may move to another NUMA node, and a
                // pod that starts or stops holding its CPUs there is
                // consumed or no longer.
                self.dirty.extend(self.decider.reserved_on(&node));
                let holders = |c: Option<&Option<NodeCpus>>| {
                    c.and_then(Option::as_ref)
                        .map(|c| c.holders.clone())
                        .unwrap_or_default()
                };
                let (old, new) = (holders(was), holders(Some(&now)));
                self.dirty.extend(old.symmetric_difference(&new).cloned());
                let changes = self.decider.set_node_cpus(&node, now);
                self.note(changes);
            }
        }
    }

    /// A write of pod `uid`'s status did not land: look at it again.
    pub fn unwritten(&mut self, uid: &str) {
        self.dirty.insert(uid.to_owned());
    }

    /// The statuses to write at `now` (milliseconds of the wall clock),
    /// reservations held at most `ttl_ms` before their pod's claims
    /// consume them.
    pub fn reconcile(&mut self, ttl_ms: u64, now: Millis) -> Vec<Write> {
        if !self.ready() {
            return Vec::new();
        }
        if self.stale || self.ttl_ms != ttl_ms {
            let (Rebuilt { decider, consumed }, writes) = self.rebuild(ttl_ms, now);
            self.decider = decider;
            self.consumed = consumed;
            self.dirty.clear();
            self.stale = false;
            self.ttl_ms = ttl_ms;
            self.rebuilds += 1;
            return writes;
        }
        let mut touched = std::mem::take(&mut self.dirty);
        // Re-read each from its object first, as a rebuild restores every
        // persisted decision before deciding any.
        for uid in &touched {
            self.reread(uid);
        }
        for uid in &touched {
            let mut decider = std::mem::take(&mut self.decider);
            self.decide_into(&mut decider, &self.consumed, uid, now);
            self.decider = decider;
        }
        for c in self.decider.expire(now) {
            if let Change::Phase { uid, .. } = c {
                touched.insert(uid);
            }
        }
        touched
            .iter()
            .filter_map(|uid| self.reservation_of(uid))
            .filter_map(|r| {
                let lives = self.pod_lives(&r.spec.pod.uid);
                write_for(r, &self.decider, &self.consumed, now, lives)
            })
            .collect()
    }

    /// The writes a decider rebuilt from every object would make now, pods
    /// still waiting to be looked at aside: empty when the kept decider
    /// agrees with the objects. Changes nothing; O(everything).
    pub fn audit(&self, ttl_ms: u64, now: Millis) -> Vec<Write> {
        if !self.ready() {
            return Vec::new();
        }
        // A pod still dirty is looked at in the next batch anyway.
        let mut writes = self.rebuild(ttl_ms, now).1;
        writes.retain(|w| !self.dirty.contains(&w.object.spec.pod.uid));
        writes
    }

    /// The next reconcile rebuilds the decider from every object.
    pub fn invalidate(&mut self) {
        self.stale = true;
    }

    /// Pod `uid`'s reservation as its object records it, replacing what
    /// the decider had.
    fn reread(&mut self, uid: &str) {
        self.consumed.remove(uid);
        let recorded = self
            .reservation_of(uid)
            .and_then(|r| r.status.as_ref().map(|s| self.recorded(r, s)));
        match recorded {
            Some(rec) => {
                self.decider.restore(rec);
                // Looked at in this batch already: not marked dirty again.
                if !self.decider.settle_pod(uid).is_empty() {
                    self.consumed.insert(uid.to_owned());
                }
            }
            None => {
                self.decider.forget(uid);
            }
        }
    }

    /// Marks what decider `changes` touched.
    fn note(&mut self, changes: Vec<Change>) {
        for c in changes {
            match c {
                Change::Consumed { uid } => {
                    self.consumed.insert(uid.clone());
                    self.dirty.insert(uid);
                }
                Change::Phase { uid, .. } => {
                    self.dirty.insert(uid);
                }
            }
        }
    }

    /// The pods whose Reservations ask for slots of `instance`, consumed
    /// ones included.
    fn asking_for(&self, instance: &str) -> Vec<String> {
        self.reservations
            .values()
            .filter(|r| r.spec.slots.contains_key(instance))
            .map(|r| r.spec.pod.uid.clone())
            .collect()
    }

    /// Pod `uid`'s Reservation object.
    fn reservation_of(&self, uid: &str) -> Option<&Reservation> {
        self.by_uid.get(uid).and_then(|k| self.reservations.get(k))
    }

    /// An Instance's capacity counting only the nodes that exist.
    fn seen_capacity(&self, cap: &InstanceCapacity) -> InstanceCapacity {
        let mut cap = cap.clone();
        cap.nodes.retain(|n| self.nodes.contains(n.as_str()));
        cap
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
}

/// The name of the object an Applied or Deleted change carries.
fn watched_name<K: ResourceExt>(change: &Watch<K>) -> Option<String> {
    match change {
        Watch::Applied(o) | Watch::Deleted(o) => Some(o.name_any()),
        _ => None,
    }
}
