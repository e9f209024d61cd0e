//! Reservations at scheduling time, the Kubernetes side of
//! `steward_core::reservation`.
//!
//! * [`controller`]: `steward controller`, the only writer of decisions —
//!   leader-elected on a Lease, level-triggered ([`world`]): it rebuilds the
//!   ledger from Instances, SlotClaims, Nodes, Pods and the Reservations'
//!   recorded statuses after each change and writes only what differs,
//!   each write conditional on the resourceVersion it decided from.
//! * [`extender`]: `steward extender`, kube-scheduler's Filter and
//!   Prioritize over HTTP; Filter creates the pod's Reservation and awaits
//!   the controller's decision within a bound.

pub mod controller;
pub mod extender;
pub mod world;

pub use controller::{ControllerConfig, ControllerError, run};
