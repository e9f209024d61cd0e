//! The one record of *who holds what on a node*.
//!
//! Everything steward hands out — device-plugin slots, DRA claims,
//! exclusive and shared CPUs, memory per NUMA node — is recorded here. A
//! device slot is a [`Holding`]: ⟨resource, holder pod UID / namespace /
//! name / container, since, reservation⟩; the state machines that decide
//! (for instance [`crate::slots::SlotAllocator`]) keep their own richer state
//! and expose it through [`Holdings`]. What a pod holds of every kind —
//! slots, CPUs (from the CRI resource manager's policy), memory nodes, DRA
//! claims — is one [`PodAssignments`] in the [`NodeView`], so readers (a pod
//! resources server, the reservation controller, the operator CLI) see one
//! vocabulary.
//!
//! Resource keys are plain strings chosen by the owning state machine: a
//! device slot is its device-plugin ID (`<instance>-<n>`).

use serde::{Deserialize, Serialize};

use crate::Millis;

pub mod allocatable;
pub mod assignment;
pub mod view;
#[cfg(test)]
mod view_proptests;

pub use allocatable::{Allocatable, AllocatableEvent, AllocatableView};
pub use assignment::{
    ClaimDevice, ContainerAssignments, DeviceAssignment, DynamicAssignment, MemoryAssignment,
    PodAssignments, Source,
};
pub use view::{Action, NodeView, PodEvent};

/// Identity of a pod. The UID is what tells two incarnations of one
/// namespace/name (a recreated StatefulSet pod) apart.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

impl PodRef {
    pub fn new(
        uid: impl Into<String>,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            uid: uid.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// The pod (and, when known, the container) holding a resource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub pod: PodRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

impl Holder {
    pub fn new(pod: PodRef, container: Option<String>) -> Self {
        Self { pod, container }
    }

    /// The holder's pod UID.
    pub fn uid(&self) -> &str {
        &self.pod.uid
    }
}

/// Identity of a DRA ResourceClaim, as kubelet names it in
/// NodePrepareResources.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

impl ClaimRef {
    pub fn new(
        uid: impl Into<String>,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            uid: uid.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A resource held by a DRA ResourceClaim: the claim, and the pods (with
/// the containers naming the claim, when known) it was prepared for. The
/// users are what the claim said at prepare time, for readers; the hold
/// itself lasts from prepare to unprepare.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimHold {
    pub claim: ClaimRef,
    /// The request of the claim this device was allocated for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request: String,
    /// The DRA pool and device name the scheduler allocated.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pool: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub device: String,
    /// The allocation's `shareID` when the device allows multiple
    /// allocations (one consumable device, several slots).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub share_id: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<Holder>,
}

impl ClaimHold {
    /// The hold of `claim` with nothing else known.
    pub fn of(claim: ClaimRef) -> Self {
        Self {
            claim,
            request: String::new(),
            pool: String::new(),
            device: String::new(),
            share_id: String::new(),
            users: Vec::new(),
        }
    }

    /// The claim's UID.
    pub fn uid(&self) -> &str {
        &self.claim.uid
    }
}

/// One resource held on this node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holding {
    /// The resource key (a device slot is `<instance>-<n>`).
    pub resource: String,
    /// Who holds it; `None` while the resource is claimed for a pod that is
    /// not identified yet (a device slot between Allocate and the pod being
    /// seen in kubelet's pod resources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// When the current holder was recorded (or, with no holder, when the
    /// resource was claimed).
    pub since: Millis,
    /// The reservation the resource was handed out under, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// The DRA ResourceClaim holding the resource, when it was handed out
    /// by NodePrepareResources rather than a device-plugin Allocate. Such
    /// a resource has no `holder`: it is held until the claim is
    /// unprepared, whatever its pods do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Box<ClaimHold>>,
}

impl Holding {
    /// A resource claimed for a pod not identified yet.
    pub fn pending(resource: impl Into<String>, since: Millis) -> Self {
        Self {
            resource: resource.into(),
            holder: None,
            since,
            reservation: None,
            claim: None,
        }
    }

    /// A resource held by `holder`.
    pub fn held(resource: impl Into<String>, holder: Holder, since: Millis) -> Self {
        Self {
            resource: resource.into(),
            holder: Some(holder),
            since,
            reservation: None,
            claim: None,
        }
    }

    /// A resource held by the DRA ResourceClaim `claim`.
    pub fn claimed(resource: impl Into<String>, claim: ClaimHold, since: Millis) -> Self {
        Self {
            resource: resource.into(),
            holder: None,
            since,
            reservation: None,
            claim: Some(Box::new(claim)),
        }
    }

    /// Whether the pod with `uid` holds the resource.
    pub fn is_held_by(&self, uid: &str) -> bool {
        self.holder.as_ref().is_some_and(|h| h.uid() == uid)
    }
}

/// Read access to a state machine's holdings, in resource order.
pub trait Holdings {
    /// Every resource currently held or claimed on this node.
    fn holdings(&self) -> Vec<Holding>;

    /// The resources held by the pod with `uid`.
    fn held_by(&self, uid: &str) -> Vec<Holding> {
        self.holdings()
            .into_iter()
            .filter(|h| h.is_held_by(uid))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<Holding>);

    impl Holdings for Fixed {
        fn holdings(&self) -> Vec<Holding> {
            self.0.clone()
        }
    }

    #[test]
    fn held_by_filters_on_pod_uid_not_name() {
        let a = Holder::new(PodRef::new("uid-a", "ns", "web-0"), Some("main".into()));
        let b = Holder::new(PodRef::new("uid-b", "ns", "web-0"), None);
        let ledger = Fixed(vec![
            Holding::held("cam-0", a, Millis(1)),
            Holding::held("cam-1", b, Millis(2)),
            Holding::pending("cam-2", Millis(3)),
        ]);
        let held = ledger.held_by("uid-b");
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].resource, "cam-1");
        assert!(ledger.held_by("uid-c").is_empty());
        assert!(!ledger.holdings()[2].is_held_by("uid-a"));
    }

    #[test]
    fn constructors_set_holder_and_since() {
        let pending = Holding::pending("dev-3", Millis(7));
        assert_eq!(pending.holder, None);
        assert_eq!(pending.since, Millis(7));
        let held = Holding::held(
            "dev-3",
            Holder::new(PodRef::new("u", "ns", "p"), None),
            Millis(9),
        );
        assert!(held.is_held_by("u"));
        assert_eq!(held.since, Millis(9));
        assert_eq!(held.reservation, None);
    }
}
