//! Controllers that put policy decisions into effect.
//!
//! - [`cri`]: in-band. Edits the intercepted `CreateContainer` and builds
//!   `UpdateContainerResources` calls for other containers whose assignment
//!   changed.
//! - [`blockio`] and [`rdt`]: out-of-band. Write cgroup block I/O settings
//!   and resctrl groups after a container started; a host without the
//!   facility gets a clean, reported no-op.

pub mod blockio;
pub mod cri;
pub mod rdt;
