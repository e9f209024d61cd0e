//! The slot ledger state machine. Rules are in the module documentation of
//! [`crate::slots`].

use std::collections::{BTreeMap, BTreeSet};

use crate::Millis;
use crate::ledger::{Holder, Holding, Holdings, PodRef};

use super::model::{
    AllocateError, AllocatePlan, Claim, Effect, Health, InstanceInfo, PlanError, PlanId, PodInfo,
    PodResources, SlotConfig, Target, parse_slot_id,
};

/// This node's claim on one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LocalClaim {
    pub(super) epoch: u64,
    pub(super) holder: Option<Holder>,
    pub(super) since: Millis,
    pub(super) awaiting: Option<Millis>,
    /// When the latest Allocate of this slot was answered (its plan
    /// committed), or the recovery time for a claim recovered awaiting.
    /// Not stored: kubelet has certainly recorded the slot's pod
    /// `settle_ms` after this (see [`SlotConfig::settle_ms`]).
    pub(super) answered: Option<Millis>,
    /// The outstanding allocate plan writing this claim.
    pub(super) plan: Option<PlanId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PodRecord {
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) live: bool,
}

/// Pod-resources uses naming a pod the pod watch has not delivered yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unresolved {
    pub(super) at: Millis,
    /// (container, slot)
    pub(super) uses: BTreeSet<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Plan {
    pub(super) at: Millis,
    pub(super) target: Target,
    /// Each slot with its `awaiting` before the plan.
    pub(super) slots: Vec<(String, Option<Millis>)>,
}

/// The device-plugin slot ledger of one node. See [`crate::slots`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLedger {
    pub(super) node: String,
    pub(super) config: SlotConfig,
    pub(super) instances: BTreeMap<String, InstanceInfo>,
    /// This node's claims, by slot.
    pub(super) claims: BTreeMap<String, LocalClaim>,
    /// Slots claimed by other nodes, as observed in the cluster.
    pub(super) others: BTreeMap<String, String>,
    /// Pods of this node by UID (live, or terminal and not yet deleted).
    pub(super) pods: BTreeMap<String, PodRecord>,
    /// By (namespace, name).
    pub(super) unresolved: BTreeMap<(String, String), Unresolved>,
    pub(super) plans: BTreeMap<PlanId, Plan>,
    /// Slots whose cluster record may lag this node's state.
    pub(super) unsynced: BTreeSet<String>,
    /// Slots the cluster is known to hold a claim of this node for.
    pub(super) in_cluster: BTreeSet<String>,
    pub(super) reachable: bool,
    pub(super) next_epoch: u64,
    pub(super) next_plan: u64,
}

impl SlotLedger {
    /// An empty ledger for `node`. The API server counts as unreachable
    /// until [`SlotLedger::cluster_reachability`] says otherwise (shared
    /// devices fail closed). After a start or restart use
    /// [`SlotLedger::recover`] instead.
    pub fn new(node: impl Into<String>, config: SlotConfig) -> Self {
        Self {
            node: node.into(),
            config,
            instances: BTreeMap::new(),
            claims: BTreeMap::new(),
            others: BTreeMap::new(),
            pods: BTreeMap::new(),
            unresolved: BTreeMap::new(),
            plans: BTreeMap::new(),
            unsynced: BTreeSet::new(),
            in_cluster: BTreeSet::new(),
            reachable: false,
            next_epoch: 1,
            next_plan: 1,
        }
    }

    // ----- queries -------------------------------------------------------

    /// The node this ledger decides for.
    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn config(&self) -> SlotConfig {
        self.config
    }

    /// Whether the API server is considered reachable.
    pub fn cluster_reachable(&self) -> bool {
        self.reachable
    }

    /// The known Instance called `name`.
    pub fn instance(&self, name: &str) -> Option<&InstanceInfo> {
        self.instances.get(name)
    }

    /// ListAndWatch content of an Instance: every slot `0..capacity` in index
    /// order. Empty for an unknown Instance.
    pub fn health(&self, instance: &str) -> Vec<(String, Health)> {
        let Some(info) = self.instances.get(instance) else {
            return Vec::new();
        };
        (0..info.capacity)
            .map(|n| {
                let slot = info.slot(n);
                let health = self.slot_health(info, &slot);
                (slot, health)
            })
            .collect()
    }

    /// Health of slot `slot` of `info`: Unhealthy iff the device is not
    /// available to this node or another node holds the slot.
    pub fn slot_health(&self, info: &InstanceInfo, slot: &str) -> Health {
        if !info.available() || self.others.contains_key(slot) {
            Health::Unhealthy
        } else {
            Health::Healthy
        }
    }

    /// Health of a device ID, `None` when it names no slot.
    pub fn health_of(&self, slot: &str) -> Option<Health> {
        let (info, _) = self.slot_of(slot)?;
        Some(self.slot_health(info, slot))
    }

    /// This node's claim on `slot`, as it is (or is being) stored.
    pub fn claim(&self, slot: &str) -> Option<Claim> {
        self.claims.get(slot).map(|c| self.record(slot, c))
    }

    /// All of this node's claims, in slot order.
    pub fn claims(&self) -> Vec<Claim> {
        self.claims
            .iter()
            .map(|(slot, c)| self.record(slot, c))
            .collect()
    }

    /// Whether any claim awaits its pod's attribution (answered by Allocate,
    /// or recovered so, and not attributed, released or timed out since).
    /// Same answer as scanning [`SlotLedger::claims`], without copying them.
    pub fn any_awaiting(&self) -> bool {
        self.claims.values().any(|c| c.awaiting.is_some())
    }

    /// The slot↔pod map: every slot this node holds or has claimed for a
    /// pod not identified yet, in slot order.
    pub fn holders(&self) -> Vec<Holding> {
        self.claims
            .iter()
            .map(|(slot, c)| holding(slot, c))
            .collect()
    }

    /// Slots held by the pod with `uid`, in slot order.
    pub fn slots_of(&self, uid: &str) -> Vec<String> {
        self.claims
            .iter()
            .filter(|(_, c)| c.holder.as_ref().is_some_and(|h| h.uid() == uid))
            .map(|(slot, _)| slot.clone())
            .collect()
    }

    /// The node another node's claim on `slot` belongs to, as observed.
    pub fn held_elsewhere(&self, slot: &str) -> Option<&str> {
        self.others.get(slot).map(String::as_str)
    }

    /// Slots whose cluster record still has to be written or removed.
    pub fn unsynced(&self) -> Vec<String> {
        self.unsynced.iter().cloned().collect()
    }

    /// Outstanding allocate plans.
    pub fn outstanding_plans(&self) -> Vec<PlanId> {
        self.plans.keys().copied().collect()
    }

    /// GetPreferredAllocation: `size` IDs from `available`, starting with
    /// `must_include` (kept as given, duplicates removed).
    ///
    /// The rest is chosen greedily and deterministically: slots this node
    /// does not hold before slots it holds (kubelet offers those only for
    /// reuse), slots of an Instance already chosen before others, then by
    /// Instance name and slot index; IDs that are no slot of a known
    /// Instance come last, in their given order.
    pub fn preferred_allocation(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Vec<String> {
        let mut chosen: Vec<String> = Vec::new();
        for id in must_include {
            if !chosen.contains(id) {
                chosen.push(id.clone());
            }
        }
        let mut candidates: Vec<(usize, &String)> = Vec::new();
        for (i, id) in available.iter().enumerate() {
            if !chosen.contains(id) && !candidates.iter().any(|(_, c)| *c == id) {
                candidates.push((i, id));
            }
        }
        while chosen.len() < size && !candidates.is_empty() {
            let chosen_instances: BTreeSet<&str> = chosen
                .iter()
                .filter_map(|id| parse_slot_id(id).map(|(inst, _)| inst))
                .collect();
            let rank = |(i, id): &(usize, &String)| match self.slot_of(id) {
                Some((info, n)) => (
                    false,
                    self.claims.contains_key(id.as_str()),
                    !chosen_instances.contains(info.name.as_str()),
                    info.name.clone(),
                    n,
                    *i,
                ),
                None => (true, false, false, String::new(), 0, *i),
            };
            let Some(best) = candidates
                .iter()
                .enumerate()
                .min_by_key(|(_, c)| rank(c))
                .map(|(pos, _)| pos)
            else {
                break;
            };
            let (_, id) = candidates.remove(best);
            chosen.push(id.clone());
        }
        chosen
    }

    // ----- instances -----------------------------------------------------

    /// An Instance appeared or changed (capacity, presence, right to use).
    /// Claims are kept whatever changed: a slot held by a pod stays held
    /// until the pod ends, even if the device went away or the capacity
    /// shrank below it.
    pub fn instance_upserted(&mut self, info: InstanceInfo) -> Vec<Effect> {
        let name = info.name.clone();
        let before = self.health(&name);
        self.instances.insert(name.clone(), info);
        let mut effects = Vec::new();
        if self.health(&name) != before {
            effects.push(Effect::HealthChanged { instance: name });
        }
        effects
    }

    /// An Instance is gone (its device plugin is stopped). Claims stay
    /// until their pods end, in case the device comes back.
    pub fn instance_removed(&mut self, name: &str) -> Vec<Effect> {
        match self.instances.remove(name) {
            Some(_) => vec![Effect::HealthChanged {
                instance: name.to_owned(),
            }],
            None => Vec::new(),
        }
    }

    // ----- allocate ------------------------------------------------------

    /// kubelet's Allocate for `device_ids` (all containers of one request).
    ///
    /// All or nothing: on error nothing changed. On success the slots are
    /// reserved for the returned plan; the adapter makes every write of the
    /// plan durable, then calls [`SlotLedger::commit`] and only then answers
    /// kubelet. See the module documentation for the rules.
    pub fn allocate(
        &mut self,
        device_ids: &[String],
        at: Millis,
    ) -> Result<AllocatePlan, AllocateError> {
        let mut slots: Vec<&String> = Vec::new();
        for id in device_ids {
            if !slots.contains(&id) {
                slots.push(id);
            }
        }
        if slots.is_empty() {
            return Err(AllocateError::NoDevices);
        }
        for id in &slots {
            self.check_allocatable(id)?;
        }
        let id = PlanId(self.next_plan);
        self.next_plan += 1;
        let target = if self.reachable {
            Target::Both
        } else {
            Target::Local
        };
        let mut plan = Plan {
            at,
            target,
            slots: Vec::new(),
        };
        let mut writes = Vec::new();
        for slot in slots {
            let epoch = self.bump();
            let claim = self
                .claims
                .entry(slot.clone())
                .or_insert_with(|| LocalClaim {
                    epoch,
                    holder: None,
                    since: at,
                    awaiting: None,
                    answered: None,
                    plan: None,
                });
            plan.slots.push((slot.clone(), claim.awaiting));
            claim.epoch = epoch;
            claim.awaiting = Some(at);
            claim.plan = Some(id);
            let record = self.record(slot, &self.claims[slot.as_str()]);
            writes.push(record);
        }
        self.plans.insert(id, plan);
        Ok(AllocatePlan { id, writes, target })
    }

    fn check_allocatable(&self, id: &str) -> Result<(), AllocateError> {
        let Some((info, _)) = self.slot_of(id) else {
            return Err(AllocateError::UnknownDevice { id: id.to_owned() });
        };
        if !info.available() {
            return Err(AllocateError::DeviceGone {
                id: id.to_owned(),
                instance: info.name.clone(),
            });
        }
        if let Some(node) = self.others.get(id) {
            return Err(AllocateError::HeldByOtherNode {
                id: id.to_owned(),
                node: node.clone(),
            });
        }
        let claim = self.claims.get(id);
        if claim.is_some_and(|c| c.plan.is_some()) {
            return Err(AllocateError::ClaimInFlight { id: id.to_owned() });
        }
        // Offline, a shared slot may only be handed out again if this node
        // already holds it in the cluster: no other node can take it then.
        let held_in_cluster = claim.is_some() && self.in_cluster.contains(id);
        if info.shared && !self.reachable && !held_in_cluster {
            return Err(AllocateError::ClusterUnreachable {
                id: id.to_owned(),
                instance: info.name.clone(),
            });
        }
        Ok(())
    }

    /// Every write of the plan is durable: the adapter may answer Allocate,
    /// and does so right after this (`at` is the time of the answer; the
    /// settle window of [`SlotConfig::settle_ms`] starts there). Writes of a
    /// [`Target::Local`] plan are queued for the cluster.
    pub fn commit(&mut self, plan: PlanId, at: Millis) -> Result<(), PlanError> {
        let p = self
            .plans
            .remove(&plan)
            .ok_or(PlanError::UnknownPlan(plan))?;
        for (slot, _) in p.slots {
            if let Some(c) = self.claims.get_mut(&slot)
                && c.plan == Some(plan)
            {
                c.plan = None;
                c.answered = Some(at.max(p.at));
                if p.target.cluster() {
                    self.in_cluster.insert(slot);
                } else {
                    self.unsynced.insert(slot);
                }
            }
        }
        Ok(())
    }

    /// The cluster refused a claim of the plan because `holder_node` holds
    /// `slot` (create lost the race). The plan is rolled back (effects undo
    /// whatever of it was written) and Allocate must be answered with an
    /// error.
    pub fn claim_conflict(
        &mut self,
        plan: PlanId,
        slot: &str,
        holder_node: &str,
    ) -> Result<Vec<Effect>, PlanError> {
        if !self.plans.contains_key(&plan) {
            return Err(PlanError::UnknownPlan(plan));
        }
        let before = self.health_all();
        if holder_node != self.node {
            self.others.insert(slot.to_owned(), holder_node.to_owned());
            self.in_cluster.remove(slot);
        }
        let mut effects = Vec::new();
        self.rollback(plan, &mut effects);
        self.health_diff(&before, &mut effects);
        Ok(effects)
    }

    /// The plan could not be made durable (store error, API server gone
    /// while a shared claim was being written…): roll it back and answer
    /// Allocate with an error.
    pub fn abort(&mut self, plan: PlanId) -> Result<Vec<Effect>, PlanError> {
        if !self.plans.contains_key(&plan) {
            return Err(PlanError::UnknownPlan(plan));
        }
        let mut effects = Vec::new();
        self.rollback(plan, &mut effects);
        Ok(effects)
    }

    fn rollback(&mut self, plan: PlanId, effects: &mut Vec<Effect>) {
        let Some(p) = self.plans.remove(&plan) else {
            return;
        };
        for (slot, prev) in p.slots {
            let Some(c) = self.claims.get_mut(&slot) else {
                continue;
            };
            if c.plan != Some(plan) {
                continue;
            }
            c.plan = None;
            c.awaiting = prev;
            if c.holder.is_none() && c.awaiting.is_none() {
                self.free(&slot, effects);
            } else {
                self.emit_write(&slot, effects);
            }
        }
    }

    // ----- pods ----------------------------------------------------------

    /// A pod watch event (Added, Modified, or Deleted with `pod.deleted`).
    ///
    /// A live pod is recorded (and pod-resources entries waiting for it are
    /// applied). A pod that is deleted or in a terminal phase releases its
    /// slots at once: each slot it holds is freed, unless an Allocate
    /// handed the slot out again since the pod was bound (kubelet gave it
    /// to the next pod): then only the pod is dropped from the claim, which
    /// stays claimed until the next pod is seen or the claim expires.
    pub fn pod_observed(&mut self, pod: &PodInfo) -> Vec<Effect> {
        let mut effects = Vec::new();
        if pod.node != self.node {
            return effects;
        }
        if pod.is_live() {
            self.pods.insert(
                pod.uid.clone(),
                PodRecord {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    live: true,
                },
            );
            let key = (pod.namespace.clone(), pod.name.clone());
            if let Some(waiting) = self.unresolved.remove(&key) {
                let pod_ref = PodRef::new(&pod.uid, &pod.namespace, &pod.name);
                for (container, slot) in waiting.uses {
                    self.bind(&slot, &pod_ref, &container, waiting.at, &mut effects);
                }
            }
        } else {
            if pod.deleted {
                self.pods.remove(&pod.uid);
            } else {
                self.pods.insert(
                    pod.uid.clone(),
                    PodRecord {
                        namespace: pod.namespace.clone(),
                        name: pod.name.clone(),
                        live: false,
                    },
                );
            }
            self.release(&pod.uid, &mut effects);
        }
        effects
    }

    /// A full pod list of this node (watch start or re-list): pods known but
    /// missing are treated as deleted, then every listed pod as observed.
    pub fn pods_listed(&mut self, pods: &[PodInfo]) -> Vec<Effect> {
        let listed: BTreeSet<&str> = pods
            .iter()
            .filter(|p| p.node == self.node)
            .map(|p| p.uid.as_str())
            .collect();
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !listed.contains(uid.as_str()))
            .cloned()
            .collect();
        let mut effects = Vec::new();
        for uid in gone {
            self.pods.remove(&uid);
            self.release(&uid, &mut effects);
        }
        for pod in pods {
            effects.extend(self.pod_observed(pod));
        }
        effects
    }

    fn release(&mut self, uid: &str, effects: &mut Vec<Effect>) {
        for slot in self.slots_of(uid) {
            let Some(c) = self.claims.get_mut(&slot) else {
                continue;
            };
            match c.awaiting {
                Some(allocated) => {
                    c.holder = None;
                    c.since = allocated;
                    self.emit_write(&slot, effects);
                }
                None => self.free(&slot, effects),
            }
        }
    }

    // ----- pod resources -------------------------------------------------

    /// A full kubelet pod-resources `List`, taken at `at` (read the clock
    /// before sending the request). Replaces every entry still waiting for
    /// its pod.
    ///
    /// Also releases, at once, every pending claim (awaiting, no holder, its
    /// Allocate answered) whose slot the list does not mention at all when
    /// the list was taken at least `settle_ms` after the Allocate was
    /// answered: kubelet records a pod's devices when it receives the
    /// Allocate response and keeps them until the pod is removed, so the pod
    /// the slot was handed to is gone. Any mention of the slot keeps the
    /// claim, whatever the pod's state or resource name: an entry naming a
    /// pod the watch has not delivered, or has seen terminate, may be a new
    /// pod of that name; such claims go the usual way (bound when the pod
    /// is seen, released by its events or the pending timeout).
    pub fn podresources_listed(&mut self, pods: &[PodResources], at: Millis) -> Vec<Effect> {
        self.unresolved.clear();
        let mut effects = Vec::new();
        self.apply_podresources(pods, at, &mut effects);
        self.release_settled(pods, at, &mut effects);
        effects
    }

    /// Whether `c` is a pending claim a full list taken at `at` may release
    /// when it does not mention the slot.
    fn settled(&self, c: &LocalClaim, at: Millis) -> bool {
        c.plan.is_none()
            && c.holder.is_none()
            && c.awaiting.is_some()
            && c.answered
                .is_some_and(|t| at >= t && at.since(t) >= self.config.settle_ms)
    }

    fn release_settled(&mut self, pods: &[PodResources], at: Millis, effects: &mut Vec<Effect>) {
        let listed: BTreeSet<&str> = pods
            .iter()
            .flat_map(|p| &p.containers)
            .flat_map(|c| &c.devices)
            .flat_map(|d| &d.device_ids)
            .map(String::as_str)
            .collect();
        let gone: Vec<String> = self
            .claims
            .iter()
            .filter(|(slot, c)| !listed.contains(slot.as_str()) && self.settled(c, at))
            .map(|(slot, _)| slot.clone())
            .collect();
        for slot in gone {
            self.free(&slot, effects);
        }
    }

    /// The earliest time after `after` at which a full pod-resources list
    /// could release a pending claim by the settle rule (see
    /// [`SlotLedger::podresources_listed`]); `None` when no pending claim
    /// is waiting for its settle time. The adapter lists then.
    pub fn next_settle(&self, after: Millis) -> Option<Millis> {
        self.claims
            .values()
            .filter(|c| c.plan.is_none() && c.holder.is_none() && c.awaiting.is_some())
            .filter_map(|c| c.answered)
            .map(|t| Millis(t.0.saturating_add(self.config.settle_ms)))
            .filter(|due| *due > after)
            .min()
    }

    /// A kubelet pod-resources `Get` for one pod, taken at `at`.
    pub fn podresources_got(&mut self, pod: &PodResources, at: Millis) -> Vec<Effect> {
        self.unresolved
            .remove(&(pod.namespace.clone(), pod.name.clone()));
        let mut effects = Vec::new();
        self.apply_podresources(std::slice::from_ref(pod), at, &mut effects);
        effects
    }

    pub(super) fn apply_podresources(
        &mut self,
        pods: &[PodResources],
        at: Millis,
        effects: &mut Vec<Effect>,
    ) {
        let mut uses: BTreeMap<(String, String), BTreeSet<(String, String)>> = BTreeMap::new();
        for pod in pods {
            for container in &pod.containers {
                for devices in &container.devices {
                    for id in &devices.device_ids {
                        let Some((instance, _)) = parse_slot_id(id) else {
                            continue;
                        };
                        let ours = self
                            .instances
                            .get(instance)
                            .is_some_and(|i| i.resource_name == devices.resource_name);
                        if ours {
                            uses.entry((pod.namespace.clone(), pod.name.clone()))
                                .or_default()
                                .insert((container.name.clone(), id.clone()));
                        }
                    }
                }
            }
        }
        for ((namespace, name), uses) in uses {
            match self.live_uid(&namespace, &name) {
                Some(uid) => {
                    let pod_ref = PodRef::new(uid, &namespace, &name);
                    for (container, slot) in uses {
                        self.bind(&slot, &pod_ref, &container, at, effects);
                    }
                }
                None => {
                    self.unresolved
                        .insert((namespace, name), Unresolved { at, uses });
                }
            }
        }
    }

    fn live_uid(&self, namespace: &str, name: &str) -> Option<String> {
        self.pods
            .iter()
            .find(|(_, p)| p.live && p.namespace == namespace && p.name == name)
            .map(|(uid, _)| uid.clone())
    }

    /// kubelet (snapshot taken `at`) says `pod`'s `container` uses `slot`.
    fn bind(
        &mut self,
        slot: &str,
        pod: &PodRef,
        container: &str,
        at: Millis,
        effects: &mut Vec<Effect>,
    ) {
        let holder = Holder::new(pod.clone(), Some(container.to_owned()));
        let Some(c) = self.claims.get_mut(slot) else {
            // kubelet has the slot in use by a live pod but this node has no
            // claim (lost record, or expired too early): adopt it, unless
            // another node holds it.
            if self.others.contains_key(slot) {
                return;
            }
            let epoch = self.bump();
            self.claims.insert(
                slot.to_owned(),
                LocalClaim {
                    epoch,
                    holder: Some(holder),
                    since: at,
                    awaiting: None,
                    answered: None,
                    plan: None,
                },
            );
            self.emit_write(slot, effects);
            return;
        };
        let mut changed = false;
        let same = c.holder.as_ref().is_some_and(|h| h.uid() == pod.uid);
        if !same && (c.holder.is_none() || at >= c.since) {
            c.holder = Some(holder);
            c.since = at;
            changed = true;
        }
        let now_ours = c.holder.as_ref().is_some_and(|h| h.uid() == pod.uid);
        if now_ours && c.awaiting.is_some_and(|a| at >= a) && c.plan.is_none() {
            c.awaiting = None;
            changed = true;
        }
        if changed {
            self.emit_write(slot, effects);
        }
    }

    // ----- time ----------------------------------------------------------

    /// Time passed. Plans outstanding for `pending_timeout_ms` are rolled
    /// back; claims unattributed for `pending_timeout_ms` stop awaiting:
    /// with no holder they are freed, with one they stay with it; waiting
    /// pod-resources entries that old are dropped; queued cluster writes are
    /// retried when the API server is reachable.
    pub fn tick(&mut self, now: Millis) -> Vec<Effect> {
        let timeout = self.config.pending_timeout_ms;
        let mut effects = Vec::new();
        let expired: Vec<PlanId> = self
            .plans
            .iter()
            .filter(|(_, p)| now.since(p.at) >= timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.rollback(id, &mut effects);
        }
        let stale: Vec<String> = self
            .claims
            .iter()
            .filter(|(_, c)| {
                c.plan.is_none() && c.awaiting.is_some_and(|a| now.since(a) >= timeout)
            })
            .map(|(slot, _)| slot.clone())
            .collect();
        for slot in stale {
            let Some(c) = self.claims.get_mut(&slot) else {
                continue;
            };
            c.awaiting = None;
            if c.holder.is_none() {
                self.free(&slot, &mut effects);
            } else {
                self.emit_write(&slot, &mut effects);
            }
        }
        self.unresolved.retain(|_, u| now.since(u.at) < timeout);
        self.flush(&mut effects);
        effects
    }

    // ----- cluster -------------------------------------------------------

    /// A claim seen in the cluster (watch Added/Modified). Only other nodes'
    /// claims matter; this node's own records echo its writes and are
    /// compared on lists only.
    pub fn cluster_claim_observed(&mut self, claim: &Claim) -> Vec<Effect> {
        let mut effects = Vec::new();
        if claim.node == self.node {
            self.next_epoch = self.next_epoch.max(claim.epoch.saturating_add(1));
            return effects;
        }
        let slot = claim.slot();
        let was_others = self
            .others
            .insert(slot.to_owned(), claim.node.clone())
            .is_some();
        if !was_others {
            self.slot_health_flipped(slot, &mut effects);
        }
        effects
    }

    /// A claim disappeared from the cluster (watch Deleted).
    pub fn cluster_claim_removed(&mut self, slot: &str, node: &str) -> Vec<Effect> {
        let mut effects = Vec::new();
        if node == self.node || self.others.get(slot).is_none_or(|n| n != node) {
            return effects;
        }
        self.others.remove(slot);
        if self.claims.contains_key(slot) {
            // Ours was shadowed by the other node's claim: write it now.
            self.unsynced.insert(slot.to_owned());
            self.flush(&mut effects);
        }
        self.slot_health_flipped(slot, &mut effects);
        effects
    }

    /// A full list of the cluster's claims (all nodes). Replaces the view of
    /// other nodes' claims; this node's records that differ from its state
    /// (missing, extra, other holder) are queued and, if the API server is
    /// reachable, written at once.
    pub fn cluster_claims_listed(&mut self, claims: &[Claim]) -> Vec<Effect> {
        let before = self.health_all();
        self.others = claims
            .iter()
            .filter(|c| c.node != self.node)
            .map(|c| (c.slot().to_owned(), c.node.clone()))
            .collect();
        let own: BTreeMap<&str, &Claim> = claims
            .iter()
            .filter(|c| c.node == self.node)
            .map(|c| (c.slot(), c))
            .collect();
        self.in_cluster = own.keys().map(|s| (*s).to_owned()).collect();
        // Records written before a restart may carry epochs the local
        // ledger never saw: continue above them.
        if let Some(max) = own.values().map(|c| c.epoch).max() {
            self.next_epoch = self.next_epoch.max(max.saturating_add(1));
        }
        let slots: BTreeSet<String> = own
            .keys()
            .map(|s| (*s).to_owned())
            .chain(self.claims.keys().cloned())
            .collect();
        for slot in slots {
            let stored = own.get(slot.as_str()).map(|c| &c.holding.holder);
            let mine = self.claims.get(&slot).map(|c| &c.holder);
            if stored != mine {
                self.unsynced.insert(slot);
            }
        }
        let mut effects = Vec::new();
        self.flush(&mut effects);
        self.health_diff(&before, &mut effects);
        effects
    }

    /// The API server became reachable or unreachable. When reachable,
    /// queued claim writes are emitted as [`Target::Cluster`] effects.
    pub fn cluster_reachability(&mut self, reachable: bool) -> Vec<Effect> {
        self.reachable = reachable;
        let mut effects = Vec::new();
        self.flush(&mut effects);
        effects
    }

    /// The cluster part of a write or delete for `slot` failed: queue it
    /// again (it is retried on the next tick or reconnect).
    pub fn cluster_write_failed(&mut self, slot: &str) {
        self.unsynced.insert(slot.to_owned());
        self.in_cluster.remove(slot);
    }

    pub(super) fn flush(&mut self, effects: &mut Vec<Effect>) {
        if !self.reachable {
            return;
        }
        let ready: Vec<String> = self
            .unsynced
            .iter()
            .filter(|s| !self.others.contains_key(s.as_str()))
            .filter(|s| self.claims.get(s.as_str()).is_none_or(|c| c.plan.is_none()))
            .cloned()
            .collect();
        for slot in ready {
            self.unsynced.remove(&slot);
            let epoch = self.bump();
            match self.claims.get_mut(&slot) {
                Some(c) => {
                    c.epoch = epoch;
                    effects.push(Effect::WriteClaim {
                        claim: self.record(&slot, &self.claims[slot.as_str()]),
                        target: Target::Cluster,
                    });
                    self.in_cluster.insert(slot);
                }
                None => {
                    self.in_cluster.remove(&slot);
                    effects.push(Effect::DeleteClaim {
                        slot,
                        epoch,
                        target: Target::Cluster,
                    });
                }
            }
        }
    }

    // ----- helpers -------------------------------------------------------

    pub(super) fn bump(&mut self) -> u64 {
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        epoch
    }

    /// The Instance and index of a slot ID within the current capacity.
    pub(super) fn slot_of(&self, id: &str) -> Option<(&InstanceInfo, u32)> {
        let (instance, n) = parse_slot_id(id)?;
        let info = self.instances.get(instance)?;
        (n < info.capacity).then_some((info, n))
    }

    pub(super) fn record(&self, slot: &str, c: &LocalClaim) -> Claim {
        Claim {
            node: self.node.clone(),
            epoch: c.epoch,
            holding: holding(slot, c),
            awaiting: c.awaiting,
        }
    }

    /// Where a non-plan write for `slot` goes now; queues the cluster part
    /// when it cannot be written.
    fn target_for(&mut self, slot: &str) -> Target {
        if self.reachable && !self.others.contains_key(slot) {
            self.unsynced.remove(slot);
            Target::Both
        } else {
            self.unsynced.insert(slot.to_owned());
            Target::Local
        }
    }

    /// Stores the current claim on `slot` under a new epoch.
    pub(super) fn emit_write(&mut self, slot: &str, effects: &mut Vec<Effect>) {
        let epoch = self.bump();
        let Some(c) = self.claims.get_mut(slot) else {
            return;
        };
        c.epoch = epoch;
        let claim = self.record(slot, &self.claims[slot]);
        let target = self.target_for(slot);
        if target.cluster() {
            self.in_cluster.insert(slot.to_owned());
        }
        effects.push(Effect::WriteClaim { claim, target });
    }

    /// Frees `slot` and removes its records.
    pub(super) fn free(&mut self, slot: &str, effects: &mut Vec<Effect>) {
        if let Some(c) = self.claims.remove(slot) {
            // One record per slot: with another node's claim there, the
            // cluster holds nothing of ours to remove.
            let target = if self.others.contains_key(slot) {
                self.unsynced.remove(slot);
                self.in_cluster.remove(slot);
                Target::Local
            } else {
                self.target_for(slot)
            };
            if target.cluster() {
                self.in_cluster.remove(slot);
            }
            effects.push(Effect::DeleteClaim {
                slot: slot.to_owned(),
                epoch: c.epoch,
                target,
            });
        }
    }

    pub(super) fn health_all(&self) -> BTreeMap<String, Vec<(String, Health)>> {
        self.instances
            .keys()
            .map(|name| (name.clone(), self.health(name)))
            .collect()
    }

    /// `slot` entered or left the other nodes' claims. Health is Unhealthy
    /// iff the device is unavailable here or another node holds the slot, so
    /// only the slot's own Instance can change, and only when its device is
    /// available: the same answer as [`SlotLedger::health_diff`] over every
    /// Instance, without rebuilding each Instance's health per cluster event.
    fn slot_health_flipped(&self, slot: &str, effects: &mut Vec<Effect>) {
        if let Some((info, n)) = self.slot_of(slot)
            && info.available()
            && info.slot(n) == slot
        {
            effects.push(Effect::HealthChanged {
                instance: info.name.clone(),
            });
        }
    }

    pub(super) fn health_diff(
        &self,
        before: &BTreeMap<String, Vec<(String, Health)>>,
        effects: &mut Vec<Effect>,
    ) {
        for name in self.instances.keys() {
            if before.get(name) != Some(&self.health(name)) {
                effects.push(Effect::HealthChanged {
                    instance: name.clone(),
                });
            }
        }
    }
}

fn holding(slot: &str, c: &LocalClaim) -> Holding {
    Holding {
        resource: slot.to_owned(),
        holder: c.holder.clone(),
        since: c.since,
        reservation: None,
    }
}

impl Holdings for SlotLedger {
    fn holdings(&self) -> Vec<Holding> {
        self.holders()
    }
}
