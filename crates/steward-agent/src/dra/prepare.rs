//! DRA claims on the slot keeper: kubelet's NodePrepareResources and
//! NodeUnprepareResources (served by `super::kubelet`) land here, on the
//! same ledger, lock and stores as the device plugins' Allocate.

use std::collections::BTreeSet;
use std::time::Instant;

use steward_core::dra::{DRIVER, instance_for_device, slot_for_device};
use steward_core::ledger::{ClaimHold, ClaimRef, Holder};

use crate::claims::ClaimStore;
use crate::slot_keeper::{ClaimRefused, SlotKeeper, now};

/// Why nothing of a claim was prepared: the per-claim error kubelet gets
/// (as text, at the kubelet edge), and the `result` label of
/// `steward_dra_prepares_total` it is counted under ([`PrepareError::label`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// The claim names no device of this driver.
    #[error("ResourceClaim {0} has no device of driver {DRIVER} allocated")]
    NoDevices(ClaimRef),
    /// A device is not one this node publishes (nor one the claim holds).
    #[error(
        "device {pool}/{device} of ResourceClaim {claim} is not a device of node {node}; nothing was prepared"
    )]
    NotHere {
        claim: ClaimRef,
        pool: String,
        device: String,
        node: String,
    },
    /// The device's Instance has no CDI device, or CDI is off.
    #[error(
        "device {0} cannot be handed to a container: CDI is off on this node (the agent needs --cdi-dir for DRA)"
    )]
    NoCdi(String),
    /// A consumable device has fewer free slots on this node than the
    /// allocation consumed (a device plugin took them meanwhile).
    #[error(
        "device {device}: the allocation consumed {want} slot(s), {free} free on this node; nothing was prepared"
    )]
    Full {
        device: String,
        want: u32,
        free: u32,
    },
    /// The allocation's consumed capacity is not a whole number of slots
    /// between 1 and the device's.
    #[error(
        "device {device}: consumedCapacity slots {consumed:?} is not a whole number between 1 and {capacity}; nothing was prepared"
    )]
    BadCapacity {
        device: String,
        consumed: String,
        capacity: u32,
    },
    /// The slot keeper refused the claim or could not make it durable.
    #[error(transparent)]
    Refused(#[from] ClaimRefused),
}

impl PrepareError {
    /// The `result` label: `no_devices`, `unknown_device`, `no_cdi`,
    /// `device_full`, `bad_capacity`, or
    /// the slot keeper's label ([`ClaimRefused::label`]).
    pub fn label(&self) -> &'static str {
        match self {
            Self::NoDevices(_) => "no_devices",
            Self::NotHere { .. } => "unknown_device",
            Self::NoCdi(_) => "no_cdi",
            Self::Full { .. } => "device_full",
            Self::BadCapacity { .. } => "bad_capacity",
            Self::Refused(e) => e.label(),
        }
    }
}

/// One device the scheduler allocated to a claim, as its status names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    /// `shareID`: set when the device allows multiple allocations.
    pub share_id: String,
    /// `consumedCapacity["slots"]` as written (a quantity), if any.
    pub slots: Option<String>,
}

/// How many slots an allocation of a consumable device of `capacity`
/// slots consumed: `consumedCapacity["slots"]`, 1 when the scheduler
/// wrote none; `None` when it is not a whole number in `1..=capacity`.
fn consumed_slots(d: &AllocatedDevice, capacity: u32) -> Option<u32> {
    let Some(q) = &d.slots else { return Some(1) };
    steward_core::quantity::parse_count(q)
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| (1..=capacity).contains(n))
}

/// The Instance of slot `<instance>-<n>`.
fn instance_of(slot: &str) -> &str {
    slot.rsplit_once('-').map(|(i, _)| i).unwrap_or_default()
}

/// An allocated device prepared on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    /// The slots it is (`<instance>-<n>`): one for a per-slot device, as
    /// many as the allocation consumed of a consumable one.
    pub slots: Vec<String>,
    /// The allocation's `shareID` (empty for a device not shared).
    pub share_id: String,
    /// What the container gets: the Instance's CDI device.
    pub cdi_ids: Vec<String>,
}

impl<L: ClaimStore, C: ClaimStore> SlotKeeper<L, C> {
    /// Prepares `devices` for `claim` (used by `users`): resolves each
    /// device to the slot it was published as (a consumable device: to as
    /// many free slots of its Instance as the allocation consumed, the
    /// same ones again for a share already prepared), claims them all durably or
    /// none, and answers their CDI devices. Idempotent for a claim already
    /// prepared: a repeat with the same devices and users writes nothing
    /// and answers the same. A device the claim already holds is prepared
    /// again under the pool it was allocated from, even after its Instance
    /// moved pool (`steward_core::dra::pool_of`); a new claim only from
    /// the pool the device is published in now. The error says why
    /// nothing was prepared.
    pub async fn prepare_claim(
        &self,
        claim: &ClaimRef,
        users: &[Holder],
        devices: &[AllocatedDevice],
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let started = Instant::now();
        let result = self.prepare_inner(claim, users, devices).await;
        self.metrics
            .prepare_seconds
            .observe(started.elapsed().as_secs_f64());
        self.metrics.preparation(match &result {
            Ok(_) => "ok",
            Err(e) => e.label(),
        });
        result
    }

    async fn prepare_inner(
        &self,
        claim: &ClaimRef,
        users: &[Holder],
        devices: &[AllocatedDevice],
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        if devices.is_empty() {
            return Err(PrepareError::NoDevices(claim.clone()));
        }
        let mut st = self.lock().await;
        let mut prepared = Vec::new();
        let mut holds: Vec<(String, ClaimHold)> = Vec::new();
        for d in devices {
            let hold = ClaimHold {
                claim: claim.clone(),
                request: d.request.clone(),
                pool: d.pool.clone(),
                device: d.device.clone(),
                share_id: d.share_id.clone(),
                users: users.to_vec(),
            };
            let instances = || {
                st.instances
                    .values()
                    .map(|i| (i.name.as_str(), i.capacity, &i.nodes))
            };
            // The device as published now (a slot, or a whole Instance with
            // consumable capacity), or as this claim already holds it
            // (prepared before its Instance moved pool).
            let (instance, slots) =
                if let Some(slot) = slot_for_device(&self.node, &d.pool, &d.device, instances()) {
                    (instance_of(&slot).to_owned(), vec![slot])
                } else if let Some((instance, capacity)) =
                    instance_for_device(&self.node, &d.pool, &d.device, instances())
                {
                    let want =
                        consumed_slots(d, capacity).ok_or_else(|| PrepareError::BadCapacity {
                            device: d.device.clone(),
                            consumed: d.slots.clone().unwrap_or_default(),
                            capacity,
                        })?;
                    let taken = holds.iter().map(|(s, _)| s.clone()).collect();
                    let slots = st
                        .ledger
                        .consumable_pick(instance, capacity, &hold, want, &taken)
                        .map_err(|free| PrepareError::Full {
                            device: d.device.clone(),
                            want,
                            free,
                        })?;
                    (instance.to_owned(), slots)
                } else {
                    let held = st.ledger.held_as(&hold);
                    let Some(first) = held.first() else {
                        return Err(PrepareError::NotHere {
                            claim: claim.clone(),
                            pool: d.pool.clone(),
                            device: d.device.clone(),
                            node: self.node.clone(),
                        });
                    };
                    (instance_of(first).to_owned(), held)
                };
            let cdi = st
                .instances
                .get(&instance)
                .map(|i| i.cdi_name.clone())
                .unwrap_or_default();
            if !self.cdi || cdi.is_empty() {
                return Err(PrepareError::NoCdi(d.device.clone()));
            }
            holds.extend(slots.iter().map(|s| (s.clone(), hold.clone())));
            prepared.push(PreparedDevice {
                request: d.request.clone(),
                pool: d.pool.clone(),
                device: d.device.clone(),
                slots,
                share_id: d.share_id.clone(),
                cdi_ids: vec![cdi],
            });
        }
        if st.ledger.is_prepared_as(&holds) {
            // A repeat (kubelet retries): the claim holds exactly this,
            // durably; nothing to write.
            drop(st);
            tracing::debug!(%claim, "DRA claim already prepared");
            return Ok(prepared);
        }
        let result = self
            .claim_durably(
                &mut st,
                || format!("ResourceClaim {claim}"),
                |ledger| ledger.prepare(&holds, now()),
            )
            .await;
        // The slots turned Unhealthy for the device plugins when the plan
        // was made, and back if it was rolled back.
        let touched: BTreeSet<&str> = holds
            .iter()
            .filter_map(|(s, _)| s.rsplit_once('-').map(|(i, _)| i))
            .collect();
        for instance in touched {
            st.push_health(instance);
        }
        drop(st);
        match result {
            Ok(()) => {
                tracing::info!(%claim, slots = ?prepared.iter().map(|p| &p.slots).collect::<Vec<_>>(), "DRA claim prepared");
                Ok(prepared)
            }
            Err(refused) => Err(refused.into()),
        }
    }

    /// Unprepares the claim with `uid`: frees exactly the slots it holds
    /// (none if it holds none) and returns them. `collected`: released by
    /// the safety net (`crate::dra::gc`), not by kubelet.
    pub async fn unprepare_claim(&self, uid: &str, collected: bool) -> Vec<String> {
        let mut st = self.lock().await;
        let slots = st.ledger.prepared_for(uid);
        let effects = st.ledger.unprepare(uid);
        self.apply(&mut st, effects).await;
        drop(st);
        self.metrics
            .unprepared(match (collected, slots.is_empty()) {
                (_, true) => "none",
                (true, false) => "collected",
                (false, false) => "ok",
            });
        if !slots.is_empty() {
            tracing::info!(claim_uid = %uid, ?slots, "DRA claim unprepared");
        }
        slots
    }
}
