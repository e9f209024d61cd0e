//! Reservations at scheduling time, the Kubernetes side of
//! `steward_core::reservation`.
//!
//! * [`decision_loop`]: `steward controller`, the only writer of
//!   decisions — leader-elected on a Lease, level-triggered
//!   ([`ledger_picture`]): it rebuilds the ledger from Instances,
//!   SlotClaims, Nodes, Pods and the Reservations' recorded statuses after
//!   each change and writes only what differs, each write conditional on
//!   the resourceVersion it decided from.
//! * [`deviceclass`]: with `--dra-device-classes`, the leader also keeps
//!   one `resource.k8s.io/v1` DeviceClass per Configuration, selecting
//!   that Configuration's devices by CEL.
//! * [`node_gone`]: the leader removes deleted Nodes from the Instances
//!   (deleting Instances no node sees any more).
//! * [`leader_watches`]: the leader's one watch per kind, shared by the
//!   tasks of its lead.
//! * [`node_labels`]: the leader keeps the node-membership labels the
//!   agents' selected watches follow.
//! * [`metrics`]: the controller's leadership and the Reservations by
//!   phase, for Prometheus.
//! * [`bounds`]: what one ask may be, applied on every way in.
//! * [`extender`]: `steward extender`, kube-scheduler's Filter and
//!   Prioritize over HTTP; Filter creates the pod's Reservation and awaits
//!   the controller's decision within a bound.

mod ask;
pub mod bounds;
pub mod decision_loop;
pub mod deviceclass;
pub mod direct;
pub mod extender;
mod http;
pub mod leader_watches;
pub mod ledger_picture;
pub mod metrics;
pub mod node_gone;
pub mod node_labels;

pub use decision_loop::{ControllerConfig, ControllerError, DecideConfig, run};
pub use metrics::ControllerMetrics;
