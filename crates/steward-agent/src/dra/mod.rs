//! Dynamic Resource Allocation: the same discovered devices as a DRA
//! driver (`steward.dev`), beside the device plugins, from the one slot
//! ledger.
//!
//! * [`slices`]: this node's devices as `resource.k8s.io/v1`
//!   ResourceSlices (one device per slot).
//! * [`kubelet`]: the kubelet plugin — registration on kubelet's
//!   `plugins_registry` and the `v1.DRAPlugin` service
//!   (NodePrepareResources / NodeUnprepareResources).
//! * [`claims`]: reading an allocated ResourceClaim (its devices of this
//!   driver and the pods and containers using it).

pub mod claims;
pub mod kubelet;
pub mod slices;

pub use kubelet::{
    DraPluginConfig, PLUGIN_SOCKET, PLUGIN_TYPE, REGISTRATION_SOCKET, SERVICE_VERSION,
};
pub use slices::{SlicePublisher, WRITER_LABEL, publish, writer_label};
