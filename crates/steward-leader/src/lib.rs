//! `steward controller`: replicas elect a leader on a Lease; the leader is
//! the only writer of Reservation decisions (the pure decisions are
//! `steward_core::reservation`; what it shares with the extender is
//! `steward_reservations`).
//!
//! * [`decision_loop`]: the leader's loop — level-triggered over
//!   [`cluster_picture`] (what the leader's watches show, and the
//!   `ReservationDecider` kept from them): each change updates the picture
//!   where it lands, the pods it touched are decided again, and only what
//!   differs is written, each write conditional on the resourceVersion it
//!   decided from.
//! * [`direct`]: the leader's side of the direct path: the `/v1/decide`
//!   endpoint every replica serves, its callers' authentication, the
//!   standby's probe of the leader.
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

pub mod cluster_picture;
pub mod decision_loop;
pub mod deviceclass;
pub mod direct;
pub mod leader_watches;
pub mod metrics;
pub mod node_gone;
pub mod node_labels;

pub use decision_loop::{ControllerConfig, ControllerError, DecideConfig, run};
pub use metrics::ControllerMetrics;
