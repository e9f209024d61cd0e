//! The values of the reservation core.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::Millis;

/// The device-plugin id of slot `n` of `instance`: `<instance>-<n>`.
pub fn slot_id(instance: &str, n: u32) -> String {
    format!("{instance}-{n}")
}

/// Longest pod name used as it is for its Reservation's name.
const NAME_AS_IS: usize = 230;

/// The name of pod `namespace/name`'s Reservation (in the pod's namespace):
/// the pod's name when short enough, else its first 230 characters and a
/// hash of namespace and name, so long names that share a prefix do not
/// collide and the result stays a valid object name (at most 253).
pub fn reservation_name(namespace: &str, name: &str) -> String {
    if name.len() <= NAME_AS_IS {
        return name.to_owned();
    }
    let hash = crate::discovery::instances::fnv1a64(&[
        &(namespace.len() as u64).to_le_bytes(),
        namespace.as_bytes(),
        &(name.len() as u64).to_le_bytes(),
        name.as_bytes(),
    ]);
    let head: String = name.chars().take(NAME_AS_IS).collect();
    format!("{}-{hash:016x}", head.trim_end_matches(['-', '.']))
}

/// The pod a reservation is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// What one Instance offers, cluster-wide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceCapacity {
    /// Slots `0..capacity`, shared by every node in `nodes`.
    pub capacity: u32,
    /// The nodes that see the device (more than one: a shared Instance).
    pub nodes: BTreeSet<String>,
}

/// Slots wanted per Instance (the pod's `steward.dev/<instance>` requests,
/// every container combined).
pub type SlotRequest = BTreeMap<String, u32>;

/// Where a reservation is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    Requested,
    Reserved,
    Rejected,
    Canceled,
}

/// One pod's reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub pod: PodRef,
    pub request: SlotRequest,
    /// The nodes the scheduler's Filter passed, in its order.
    pub candidates: Vec<String>,
    pub phase: Phase,
    /// The node chosen (`Reserved`).
    pub node: Option<String>,
    /// The slots held for the pod (`Reserved`), in id order.
    pub slots: BTreeSet<String>,
    /// Exclusive CPUs wanted on one NUMA node (0: none).
    #[serde(default)]
    pub cpus: u32,
    /// The NUMA node of `node` they are held on (`Reserved` with `cpus`).
    #[serde(default)]
    pub numa: Option<u32>,
    /// Why it was rejected or canceled.
    pub reason: Option<String>,
    /// When it was requested, and when it was decided.
    pub requested_at: Millis,
    pub decided_at: Option<Millis>,
}

impl Reservation {
    /// Whether it holds capacity now.
    pub fn holds(&self) -> bool {
        self.phase == Phase::Reserved
    }
}

/// What a call changed, for the adapter to write (status) and announce
/// (Events). Only real changes are reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The reservation of `uid` is now in `phase` (its whole state is in
    /// the ledger).
    Phase { uid: String, phase: Phase },
    /// The reservation of `uid` was consumed by the pod's own claims and
    /// dropped from the ledger.
    Consumed { uid: String },
}

/// Why a node cannot hold a request (the scheduler logs it per node).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Misfit {
    #[error("instance {instance} does not exist")]
    NoInstance { instance: String },
    #[error("{instance} is not seen by {node}")]
    NotSeen { instance: String, node: String },
    #[error("{instance}: {free} of {capacity} slots free, {want} wanted")]
    TooFew {
        instance: String,
        free: usize,
        capacity: u32,
        want: u32,
    },
    #[error("no CRI resource manager publishes exclusive CPUs on {node}")]
    NoCpus { node: String },
    #[error("{want} exclusive CPUs wanted on one NUMA node, at most {most} free on any")]
    NoNumaFit { want: u32, most: u32 },
}

/// A request the ledger refuses; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReservationError {
    #[error("reservation of pod {uid} asks for no slot and no exclusive CPU")]
    EmptyRequest { uid: String },
    #[error("reservation of pod {uid} names no candidate node")]
    NoCandidates { uid: String },
    #[error("pod {uid} already has a reservation with a different request; cancel it first")]
    Conflicting { uid: String },
    #[error("no reservation for pod {uid}")]
    Unknown { uid: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_names_are_the_pod_name_or_a_hashed_prefix() {
        assert_eq!(reservation_name("ns", "web-0"), "web-0");
        let long_a = format!("{}a", "x".repeat(240));
        let long_b = format!("{}b", "x".repeat(240));
        let a = reservation_name("ns", &long_a);
        let b = reservation_name("ns", &long_b);
        assert_ne!(a, b, "long names sharing a prefix do not collide");
        assert!(a.len() <= 253 && b.len() <= 253);
        assert_ne!(
            a,
            reservation_name("other", &long_a),
            "namespace is part of the hash"
        );
        assert_eq!(a, reservation_name("ns", &long_a), "stable");
    }
}
