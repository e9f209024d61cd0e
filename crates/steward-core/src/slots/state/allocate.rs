//! Allocate as a two-phase plan: [`SlotAllocator::allocate`] reserves the
//! slots and says what to write; the adapter makes the writes durable and
//! calls [`SlotAllocator::commit`], or rolls the plan back with
//! [`SlotAllocator::claim_conflict`] or [`SlotAllocator::abort`].

use super::*;

impl SlotAllocator {
    /// kubelet's Allocate for `device_ids` (all containers of one request).
    ///
    /// All or nothing: on error nothing changed. On success the slots are
    /// reserved for the returned plan; the adapter makes every write of the
    /// plan durable, then calls [`SlotAllocator::commit`] and only then answers
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
        let (id, mut plan) = self.open_plan(at);
        let mut writes = Vec::new();
        for slot in slots {
            let claim = self.open_claim(slot, id, at);
            plan.slots.push((slot.clone(), claim.awaiting));
            claim.awaiting = Some(at);
            let record = self.record(slot, &self.claims[slot.as_str()]);
            writes.push(record);
        }
        let target = plan.target;
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
        if let Some(hold) = claim.and_then(|c| c.dra.as_ref()) {
            return Err(AllocateError::HeldByClaim {
                id: id.to_owned(),
                claim: hold.claim.to_string(),
            });
        }
        if claim.is_none()
            && let Some(node) = self.reserved_elsewhere.get(id)
        {
            return Err(AllocateError::ReservedForOtherNode {
                id: id.to_owned(),
                node: node.clone(),
            });
        }
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

    pub(super) fn rollback(&mut self, plan: PlanId, effects: &mut Vec<Effect>) {
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
            let unheld = c.holder.is_none() && c.awaiting.is_none() && c.dra.is_none();
            if unheld || p.created.contains(&slot) {
                self.free(&slot, effects);
            } else {
                self.emit_write(&slot, effects);
            }
        }
    }
}
