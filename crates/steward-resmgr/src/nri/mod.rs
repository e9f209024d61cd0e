//! The NRI transport: the resource manager as an NRI plugin of containerd
//! 2.x (or 1.7 with NRI on), driven by the runtime's events instead of
//! intercepted CRI calls. No kubelet reconfiguration and no extra hop on
//! CRI calls; the decisions are the manager's, as for the CRI proxy.

pub mod convert;
pub mod handler;
pub mod plugin;

pub use handler::ResmgrHandler;
pub use plugin::{NriConfig, NriPlugin};
