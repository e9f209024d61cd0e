//! The values of the reservation core.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::Millis;

/// The device-plugin id of slot `n` of `instance`: `<instance>-<n>`.
pub fn slot_id(instance: &str, n: u32) -> String {
    format!("{instance}-{n}")
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

/// A request the ledger refuses; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReservationError {
    #[error("reservation of pod {uid} asks for no slot")]
    EmptyRequest { uid: String },
    #[error("reservation of pod {uid} names no candidate node")]
    NoCandidates { uid: String },
    #[error("pod {uid} already has a reservation with a different request; cancel it first")]
    Conflicting { uid: String },
    #[error("no reservation for pod {uid}")]
    Unknown { uid: String },
}
