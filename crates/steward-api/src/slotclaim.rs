//! The `SlotClaim` custom resource: one device-plugin slot of an Instance,
//! claimed by one node (and, once known, one pod).
//!
//! A claim object is named after its slot (`<instance>-<n>`) and lives in the
//! Instance's namespace, so two nodes racing for one slot collide on create
//! (409 AlreadyExists) and exactly one wins. Objects are small and written
//! only by the claiming node: no object is shared by all users of a device.
//!
//! Ownership (garbage collection) is chosen by the writer, see
//! `steward_agent::claims`: a claim whose pod is known, settled and in the
//! claim's namespace is owned by that Pod (deleting the pod frees the slot
//! even while the agent is down); every other claim is owned by its Instance
//! (deleting the Instance frees it).

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use steward_core::Millis;
use steward_core::ledger::{ClaimHold, ClaimRef, Holder, Holding};
use steward_core::slots::{Claim, parse_slot_id, slot_id};

use crate::PodRef;

/// Short name of the SlotClaim kind (`kubectl get sclaim`).
pub const SLOT_CLAIM_SHORT_NAME: &str = "sclaim";

/// One slot of an Instance claimed by one node.
// Several printer columns share a type: not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "steward.dev",
    version = "v1alpha1",
    kind = "SlotClaim",
    namespaced,
    shortname = "sclaim",
    derive = "PartialEq",
    doc = "A device-plugin slot of an Instance claimed by one node; named `<instance>-<n>`, in the Instance's namespace.",
    printcolumn(
        name = "Instance",
        type_ = "string",
        json_path = ".spec.instance",
        description = "Instance the slot belongs to"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".spec.node",
        description = "node holding the slot"
    ),
    printcolumn(
        name = "Pod",
        type_ = "string",
        json_path = ".spec.pod.name",
        description = "pod using the slot, once known"
    ),
    printcolumn(
        name = "Claim",
        type_ = "string",
        json_path = ".spec.resourceClaim.name",
        description = "DRA ResourceClaim holding the slot (prepared by kubelet)"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct SlotClaimSpec {
    /// Name of the Instance (same namespace).
    #[schemars(length(min = 1, max = 253))]
    pub instance: String,
    /// Slot index, `0 <= slot < capacity`.
    #[schemars(range(max = 1023))]
    pub slot: u32,
    /// Node holding the slot.
    #[schemars(length(min = 1, max = 253))]
    pub node: String,
    /// Write counter of the claiming node; a record with a higher epoch is
    /// newer and is never replaced by an older write.
    pub epoch: u64,
    /// Pod holding the slot, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// Container within the pod, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// When the holder was recorded (or the slot claimed), in milliseconds
    /// of the claiming node's clock.
    pub since: u64,
    /// Set (milliseconds) while an Allocate of the slot awaits attribution to
    /// a pod: the pod, if any, may be stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting: Option<u64>,
    /// Reservation the slot was handed out under, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// The DRA ResourceClaim the slot was prepared for (NodePrepareResources),
    /// instead of a pod's device-plugin Allocate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_claim: Option<ResourceClaimHold>,
}

/// A slot held by a DRA ResourceClaim: the claim and the device allocated.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaimHold {
    #[schemars(length(max = 253))]
    pub namespace: String,
    #[schemars(length(max = 253))]
    pub name: String,
    #[schemars(length(max = 128))]
    pub uid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 253))]
    pub request: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 253))]
    pub pool: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub device: String,
    /// The allocation's `shareID` (a device that allows multiple
    /// allocations).
    #[serde(default, rename = "shareID", skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub share_id: String,
}

/// Errors converting between [`SlotClaim`]s and the core's [`Claim`]s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotClaimError {
    /// The claim's resource is not a slot id `<instance>-<n>`.
    #[error("{0:?} is not a slot id (<instance>-<n>)")]
    NotASlot(String),
    /// The object's name is not the slot its spec describes.
    #[error("SlotClaim {name:?} describes slot {slot:?}: the name must be the slot id")]
    NameMismatch { name: String, slot: String },
}

impl SlotClaimSpec {
    /// The spec recording `claim`.
    pub fn from_claim(claim: &Claim) -> Result<Self, SlotClaimError> {
        let (instance, slot) = parse_slot_id(claim.slot())
            .ok_or_else(|| SlotClaimError::NotASlot(claim.slot().to_owned()))?;
        let holder = claim.holding.holder.as_ref();
        Ok(Self {
            instance: instance.to_owned(),
            slot,
            node: claim.node.clone(),
            epoch: claim.epoch,
            pod: holder.map(|h| PodRef {
                namespace: h.pod.namespace.clone(),
                name: h.pod.name.clone(),
                uid: h.pod.uid.clone(),
            }),
            container: holder.and_then(|h| h.container.clone()),
            since: claim.holding.since.0,
            awaiting: claim.awaiting.map(|m| m.0),
            reservation: claim.holding.reservation.clone(),
            resource_claim: claim.holding.claim.as_ref().map(|h| ResourceClaimHold {
                namespace: h.claim.namespace.clone(),
                name: h.claim.name.clone(),
                uid: h.claim.uid.clone(),
                request: h.request.clone(),
                pool: h.pool.clone(),
                device: h.device.clone(),
                share_id: h.share_id.clone(),
            }),
        })
    }

    /// The slot id `<instance>-<n>` (also the object's name).
    pub fn slot_id(&self) -> String {
        slot_id(&self.instance, self.slot)
    }

    /// The core's claim recorded by this spec.
    pub fn to_claim(&self) -> Claim {
        let holder = self.pod.as_ref().map(|p| {
            Holder::new(
                steward_core::ledger::PodRef::new(&p.uid, &p.namespace, &p.name),
                self.container.clone(),
            )
        });
        Claim {
            node: self.node.clone(),
            epoch: self.epoch,
            holding: Holding {
                resource: self.slot_id(),
                holder,
                since: Millis(self.since),
                reservation: self.reservation.clone(),
                claim: self.resource_claim.as_ref().map(|h| {
                    Box::new(ClaimHold {
                        claim: ClaimRef::new(&h.uid, &h.namespace, &h.name),
                        request: h.request.clone(),
                        pool: h.pool.clone(),
                        device: h.device.clone(),
                        share_id: h.share_id.clone(),
                        users: Vec::new(),
                    })
                }),
            },
            awaiting: self.awaiting.map(Millis),
        }
    }
}

impl SlotClaim {
    /// The core's claim recorded by this object; its name must be the slot id.
    pub fn to_claim(&self) -> Result<Claim, SlotClaimError> {
        let slot = self.spec.slot_id();
        match self.metadata.name.as_deref() {
            Some(name) if name == slot => Ok(self.spec.to_claim()),
            name => Err(SlotClaimError::NameMismatch {
                name: name.unwrap_or_default().to_owned(),
                slot,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(holder: Option<Holder>, awaiting: Option<Millis>) -> Claim {
        Claim {
            node: "node-a".into(),
            epoch: 42,
            holding: Holding {
                resource: "cam-3".into(),
                holder,
                since: Millis(1_700_000_000_123),
                reservation: Some("r1".into()),
                claim: None,
            },
            awaiting,
        }
    }

    #[test]
    fn claim_round_trips_through_the_spec() {
        let holder = Holder::new(
            steward_core::ledger::PodRef::new("uid-1", "apps", "web-0"),
            Some("main".into()),
        );
        for c in [claim(Some(holder), None), claim(None, Some(Millis(5)))] {
            let spec = SlotClaimSpec::from_claim(&c).unwrap();
            assert_eq!(spec.instance, "cam");
            assert_eq!(spec.slot, 3);
            assert_eq!(spec.to_claim(), c);
            let obj = SlotClaim::new("cam-3", spec.clone());
            assert_eq!(obj.to_claim().unwrap(), c);
            let wrong = SlotClaim::new("cam-4", spec);
            assert!(matches!(
                wrong.to_claim(),
                Err(SlotClaimError::NameMismatch { .. })
            ));
        }
    }

    #[test]
    fn a_slot_held_by_a_resource_claim_round_trips_without_its_users() {
        let mut hold = ClaimHold::of(ClaimRef::new("c-uid", "apps", "gpu-claim"));
        hold.request = "cam".into();
        hold.pool = "node-a".into();
        hold.device = "cam-3".into();
        let mut c = claim(None, None);
        c.holding.claim = Some(Box::new(hold.clone()));
        let spec = SlotClaimSpec::from_claim(&c).unwrap();
        assert_eq!(spec.resource_claim.as_ref().unwrap().name, "gpu-claim");
        assert_eq!(spec.to_claim(), c);
        // Users are for readers on the node; the cluster record names the
        // claim only.
        hold.users = vec![Holder::new(
            steward_core::ledger::PodRef::new("p", "apps", "web-0"),
            Some("main".into()),
        )];
        c.holding.claim = Some(Box::new(hold));
        let back = SlotClaimSpec::from_claim(&c).unwrap().to_claim();
        assert!(back.holding.claim.unwrap().users.is_empty());
    }

    #[test]
    fn non_slot_resources_are_rejected() {
        let mut c = claim(None, None);
        c.holding.resource = "cam-03".into();
        assert_eq!(
            SlotClaimSpec::from_claim(&c),
            Err(SlotClaimError::NotASlot("cam-03".into()))
        );
    }
}
