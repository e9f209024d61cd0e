//! The slot ledger state machine. Rules are in the module documentation of
//! [`crate::slots`].

mod allocate;
mod dra;
mod pods;
mod sync;

use std::collections::{BTreeMap, BTreeSet};

use crate::Millis;
use crate::ledger::{ClaimHold, Holder, Holding, Holdings, PodRef};

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
    /// Held by a DRA ResourceClaim (prepared), not by a pod: `holder` and
    /// `awaiting` stay `None` and pod rules never touch it.
    pub(super) dra: Option<Box<ClaimHold>>,
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
    /// Slots a prepare plan claims anew (freed again on rollback).
    pub(super) created: BTreeSet<String>,
}

/// The device-plugin slot ledger of one node. See [`crate::slots`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotAllocator {
    pub(super) node: String,
    pub(super) config: SlotConfig,
    pub(super) instances: BTreeMap<String, InstanceInfo>,
    /// This node's claims, by slot.
    pub(super) claims: BTreeMap<String, LocalClaim>,
    /// Slots claimed by other nodes, as observed in the cluster.
    pub(super) others: BTreeMap<String, String>,
    /// Slots reserved at scheduling time for pods bound for another node
    /// (slot → that node): not to be granted here.
    pub(super) reserved_elsewhere: BTreeMap<String, String>,
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

impl SlotAllocator {
    /// An empty ledger for `node`. The API server counts as unreachable
    /// until [`SlotAllocator::cluster_reachability`] says otherwise (shared
    /// devices fail closed). After a start or restart use
    /// [`SlotAllocator::recover`] instead.
    pub fn new(node: impl Into<String>, config: SlotConfig) -> Self {
        Self {
            node: node.into(),
            config,
            instances: BTreeMap::new(),
            claims: BTreeMap::new(),
            others: BTreeMap::new(),
            reserved_elsewhere: BTreeMap::new(),
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
    /// available to this node, another node holds the slot, a DRA
    /// ResourceClaim holds it (kubelet's device manager must not pick it),
    /// or it is reserved for a pod bound for another node (and this node
    /// does not hold it: a claim wins over a reservation).
    pub fn slot_health(&self, info: &InstanceInfo, slot: &str) -> Health {
        let claim = self.claims.get(slot);
        let reserved_away = self.reserved_elsewhere.contains_key(slot) && claim.is_none();
        let by_dra = claim.is_some_and(|c| c.dra.is_some());
        if !info.available() || self.others.contains_key(slot) || reserved_away || by_dra {
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
    /// Same answer as scanning [`SlotAllocator::claims`], without copying them.
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

    // ----- helpers -------------------------------------------------------

    /// A new, empty plan made at `at`: to both stores when the API server
    /// is reachable, else the local one (the cluster part queued).
    pub(super) fn open_plan(&mut self, at: Millis) -> (PlanId, Plan) {
        let id = PlanId(self.next_plan);
        self.next_plan += 1;
        let target = if self.reachable {
            Target::Both
        } else {
            Target::Local
        };
        let plan = Plan {
            at,
            target,
            slots: Vec::new(),
            created: BTreeSet::new(),
        };
        (id, plan)
    }

    /// This node's claim on `slot`, opened for plan `plan` at a new epoch:
    /// created held by nobody since `at` when there was none. What the plan
    /// holds it for (an awaited pod, a DRA claim) is the caller's.
    pub(super) fn open_claim(&mut self, slot: &str, plan: PlanId, at: Millis) -> &mut LocalClaim {
        let epoch = self.bump();
        let claim = self
            .claims
            .entry(slot.to_owned())
            .or_insert_with(|| LocalClaim {
                epoch,
                holder: None,
                since: at,
                awaiting: None,
                answered: None,
                plan: None,
                dra: None,
            });
        claim.epoch = epoch;
        claim.plan = Some(plan);
        claim
    }

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
            // One record per slot. With another node's claim seen there, ours
            // is in the cluster only if we wrote it before that node's claim
            // was seen: a stale event (the watch lags; the other node had
            // released the slot before our write). Then ours is deleted
            // there too; the delete removes only this node's record, so a
            // claim the other node really holds is never touched.
            let target = if self.others.contains_key(slot) {
                self.unsynced.remove(slot);
                if self.in_cluster.remove(slot) && self.reachable {
                    Target::Both
                } else {
                    Target::Local
                }
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
    /// iff the device is unavailable here, a DRA claim holds the slot here
    /// (it stays Unhealthy either way) or another node holds the slot, so
    /// only the slot's own Instance can change, and only when its device is
    /// available: the same answer as [`SlotAllocator::health_diff`] over every
    /// Instance, without rebuilding each Instance's health per cluster event.
    fn slot_health_flipped(&self, slot: &str, effects: &mut Vec<Effect>) {
        let by_dra = self.claims.get(slot).is_some_and(|c| c.dra.is_some());
        if let Some((info, n)) = self.slot_of(slot)
            && info.available()
            && !by_dra
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
        claim: c.dra.clone(),
    }
}

impl Holdings for SlotAllocator {
    fn holdings(&self) -> Vec<Holding> {
        self.holders()
    }
}
