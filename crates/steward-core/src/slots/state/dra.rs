//! DRA ResourceClaims as holders: kubelet's NodePrepareResources claims
//! slots for a claim, NodeUnprepareResources frees them. The same slots,
//! the same records and the same cluster claims as a device-plugin
//! Allocate, so a slot is never handed out on both paths.

use super::*;

impl SlotAllocator {
    /// NodePrepareResources for one ResourceClaim: each slot with the hold
    /// it is prepared under (the claim, the request and DRA device it was
    /// allocated as, its users).
    ///
    /// Idempotent: slots this claim already holds are prepared again
    /// without question (kubelet retries, a restart between prepare and
    /// unprepare), their hold rewritten. A slot held by anyone else on this
    /// node — a pod through the device plugin, an Allocate awaiting its pod,
    /// another claim — is refused, as are the device-plugin refusals
    /// (unknown slot, device gone, another node's claim or reservation,
    /// shared device with the API server unreachable).
    ///
    /// All or nothing, then the same protocol as
    /// [`SlotAllocator::allocate`]: make the plan's writes durable,
    /// [`SlotAllocator::commit`] (or [`SlotAllocator::claim_conflict`] /
    /// [`SlotAllocator::abort`]), and only then answer kubelet. The slots turn
    /// Unhealthy for the device plugins when the plan is made (and back on
    /// rollback): send the health of their Instances after either.
    pub fn prepare(
        &mut self,
        slots: &[(String, ClaimHold)],
        at: Millis,
    ) -> Result<AllocatePlan, AllocateError> {
        let mut wanted: Vec<&(String, ClaimHold)> = Vec::new();
        for entry in slots {
            if !wanted.iter().any(|(s, _)| *s == entry.0) {
                wanted.push(entry);
            }
        }
        if wanted.is_empty() {
            return Err(AllocateError::NoDevices);
        }
        for (slot, hold) in &wanted {
            self.check_preparable(slot, hold)?;
        }
        let (id, mut plan) = self.open_plan(at);
        let mut writes = Vec::new();
        for (slot, hold) in wanted {
            if !self.claims.contains_key(slot) {
                plan.created.insert(slot.clone());
            }
            plan.slots.push((slot.clone(), None));
            let claim = self.open_claim(slot, id, at);
            claim.dra = Some(Box::new(hold.clone()));
            writes.push(self.record(slot, &self.claims[slot.as_str()]));
        }
        let target = plan.target;
        self.plans.insert(id, plan);
        Ok(AllocatePlan { id, writes, target })
    }

    fn check_preparable(&self, id: &str, hold: &ClaimHold) -> Result<(), AllocateError> {
        if let Some(c) = self.claims.get(id) {
            if c.plan.is_some() {
                return Err(AllocateError::ClaimInFlight { id: id.to_owned() });
            }
            match (&c.dra, &c.holder) {
                (Some(h), _) if h.uid() == hold.uid() => return Ok(()),
                (Some(h), _) => {
                    return Err(AllocateError::HeldByClaim {
                        id: id.to_owned(),
                        claim: h.claim.to_string(),
                    });
                }
                (None, Some(holder)) => {
                    return Err(AllocateError::InUseByDevicePlugin {
                        id: id.to_owned(),
                        pod: format!("pod {}/{}", holder.pod.namespace, holder.pod.name),
                    });
                }
                (None, None) => {
                    return Err(AllocateError::InUseByDevicePlugin {
                        id: id.to_owned(),
                        pod: "allocated to a pod not identified yet".to_owned(),
                    });
                }
            }
        }
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
        if let Some(node) = self.reserved_elsewhere.get(id) {
            return Err(AllocateError::ReservedForOtherNode {
                id: id.to_owned(),
                node: node.clone(),
            });
        }
        if info.shared && !self.reachable {
            return Err(AllocateError::ClusterUnreachable {
                id: id.to_owned(),
                instance: info.name.clone(),
            });
        }
        Ok(())
    }

    /// NodeUnprepareResources for the claim with `uid`: frees exactly the
    /// slots it holds (none when it holds none: unprepare is idempotent)
    /// and reports the health that changed. A slot of the claim still
    /// being prepared is left to that plan.
    pub fn unprepare(&mut self, uid: &str) -> Vec<Effect> {
        let slots = self.prepared_for(uid);
        let before = self.health_all();
        let mut effects = Vec::new();
        for slot in slots {
            if self.claims.get(&slot).is_some_and(|c| c.plan.is_none()) {
                self.free(&slot, &mut effects);
            }
        }
        self.health_diff(&before, &mut effects);
        effects
    }

    /// The slots prepared (or being prepared) for the claim with `uid`, in
    /// slot order.
    pub fn prepared_for(&self, uid: &str) -> Vec<String> {
        self.claims
            .iter()
            .filter(|(_, c)| c.dra.as_ref().is_some_and(|h| h.uid() == uid))
            .map(|(slot, _)| slot.clone())
            .collect()
    }

    /// Whether `slots` is exactly what their claim already holds, prepared
    /// and durable, each under the same hold (request, device, users): a
    /// repeated NodePrepareResources (a kubelet retry) that needs no plan
    /// and no write. `false` for an empty list, slots of several claims, a
    /// slot the claim does not hold, a slot it holds that is not listed,
    /// or a hold that changed.
    pub fn is_prepared_as(&self, slots: &[(String, ClaimHold)]) -> bool {
        let Some((_, first)) = slots.first() else {
            return false;
        };
        let uid = first.uid();
        let listed: BTreeSet<&str> = slots.iter().map(|(s, _)| s.as_str()).collect();
        let held = self.prepared_for(uid);
        held.len() == listed.len()
            && held.iter().all(|s| listed.contains(s.as_str()))
            && slots.iter().all(|(slot, hold)| {
                hold.uid() == uid
                    && self.claims.get(slot).is_some_and(|c| {
                        c.plan.is_none() && c.dra.as_deref().is_some_and(|h| h == hold)
                    })
            })
    }

    /// The slots `hold`'s claim holds (prepared and durable) as its DRA
    /// device of its pool, under its share (one slot for a per-slot device,
    /// the consumed ones of a consumable device), whatever pool that device
    /// is published in now: a claim prepared before its Instance moved
    /// pool keeps its slots.
    pub fn held_as(&self, hold: &ClaimHold) -> Vec<String> {
        self.claims
            .iter()
            .filter_map(|(slot, c)| {
                let h = c.dra.as_deref()?;
                (c.plan.is_none()
                    && h.uid() == hold.uid()
                    && h.pool == hold.pool
                    && h.device == hold.device
                    && h.share_id == hold.share_id)
                    .then(|| slot.clone())
            })
            .collect()
    }

    /// The slots `hold` gets of the consumable device of `instance` (slots
    /// `0..capacity`): those its claim already holds as that device and
    /// share (a repeat), then free ones in slot order, none of `taken`
    /// (slots other devices of the same prepare got). A free slot is one
    /// with no record on this node that [`SlotAllocator::prepare`] would
    /// accept. `Err(n)`: only `n < want` can be had.
    pub fn consumable_pick(
        &self,
        instance: &str,
        capacity: u32,
        hold: &ClaimHold,
        want: u32,
        taken: &BTreeSet<String>,
    ) -> Result<Vec<String>, u32> {
        let want_len = usize::try_from(want).unwrap_or(usize::MAX);
        let mut picked: Vec<String> = self
            .claims
            .iter()
            .filter(|(slot, c)| {
                !taken.contains(*slot)
                    && c.dra.as_deref().is_some_and(|h| {
                        h.uid() == hold.uid()
                            && h.pool == hold.pool
                            && h.device == hold.device
                            && h.share_id == hold.share_id
                    })
            })
            .map(|(slot, _)| slot.clone())
            .take(want_len)
            .collect();
        for n in 0..capacity {
            if picked.len() >= want_len {
                break;
            }
            let slot = crate::reservation::slot_id(instance, n);
            if taken.contains(&slot) || self.claims.contains_key(&slot) {
                continue;
            }
            if self.check_preparable(&slot, hold).is_ok() {
                picked.push(slot);
            }
        }
        if picked.len() < want_len {
            return Err(u32::try_from(picked.len()).unwrap_or(u32::MAX));
        }
        Ok(picked)
    }

    /// Whether the claim with `uid` holds `slot`, prepared and durable (its
    /// plan committed).
    pub fn is_prepared(&self, slot: &str, uid: &str) -> bool {
        self.claims
            .get(slot)
            .is_some_and(|c| c.plan.is_none() && c.dra.as_ref().is_some_and(|h| h.uid() == uid))
    }
}
