//! Reservations: capacity held for a pod at scheduling time, so
//! the scheduler's belief and what the nodes grant agree.
//!
//! The sharpest case is a shared Instance: seen by three nodes with
//! capacity 2, each node's kubelet advertises 2 slots, so the scheduler
//! believes 6 exist. A [`ReservationDecider`] counts the slots of every
//! Instance once, cluster-wide: the slots held by SlotClaims (pods running
//! or admitted) and the slots reserved for pods not yet running.
//!
//! One controller is the only writer of decisions; this module is its pure
//! core: no I/O, no clock (time comes in as [`crate::Millis`]).
//!
//! Life of a reservation: `Requested` (the scheduler extender asked, with the
//! candidate nodes its Filter saw) → [`ReservationDecider::decide`] →
//! `Reserved` (one node chosen, slots held for the pod, and exclusive CPUs
//! counted against one NUMA node of it when asked for: [`NodeCpus`]) or
//! `Rejected` (no candidate can hold it, with the reason). A `Reserved`
//! reservation is consumed when the pod's own claims hold its slots and its
//! node names it among the holders of exclusive CPUs (the reservation is
//! then dropped: the claims and the pinning carry on), and `Canceled` when the scheduler
//! unreserves, the pod goes away or binds elsewhere, or its time to live
//! runs out. `Rejected` and `Canceled` hold nothing; nothing is ever stuck.

mod cpus;
mod decider;
mod index;
mod model;
#[cfg(test)]
mod proptests;
mod reseat;

pub use cpus::{EXCLUSIVE_CPUS_RESOURCE, NODE_CPUS_ANNOTATION, NodeCpus, best_numa};
pub use decider::ReservationDecider;
pub use model::{
    Change, InstanceCapacity, Misfit, Phase, PodRef, Reservation, ReservationError, SlotRequest,
    reservation_name, slot_id,
};
