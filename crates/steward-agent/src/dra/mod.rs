//! Dynamic Resource Allocation: the same discovered devices as a DRA
//! driver (`steward.dev`), beside the device plugins, from the one slot
//! ledger.
//!
//! * [`slices`]: this node's devices as `resource.k8s.io/v1`
//!   ResourceSlices (one device per slot).
//! * [`kubelet`]: the kubelet plugin — registration on kubelet's
//!   `plugins_registry` and the `v1.DRAPlugin` service
//!   (NodePrepareResources / NodeUnprepareResources).
//! * `health`: device health for kubelet's DRA resource health stream,
//!   typed; `health_wire`: its two wire versions, `v1.DRAResourceHealth`
//!   and `v1alpha1.DRAResourceHealth`, served on the same socket.
//! * `handover`: two agents on one node during a roll (the new one's
//!   plugin relays to the old one's until it holds the node's store).
//! * [`gc`]: the safety net under unprepare (holds of claims gone from the
//!   API are released).
//! * [`claims`]: reading an allocated ResourceClaim (its devices of this
//!   driver and the pods and containers using it).

pub mod claims;
pub mod gc;
pub(crate) mod handover;
mod health;
mod health_wire;
pub mod kubelet;
mod prepare;
pub mod slices;

pub use kubelet::{
    DraPluginConfig, PLUGIN_SOCKET, PLUGIN_TYPE, REGISTRATION_SOCKET, SERVICE_VERSION,
    SUPPORTED_SERVICES,
};
pub use prepare::{AllocatedDevice, PrepareError, PreparedDevice};
pub use slices::{OnStop, SlicePublisher, WRITER_LABEL, publish, publish_until, writer_label};
