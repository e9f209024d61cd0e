//! Cgroup v1 and v2 behind one trait: reading back what a container really
//! got (cpuset, memory limit) and writing block I/O parameters.
//!
//! v1 paths are `<root>/<controller>/<cgroup>/<file>`, v2 paths are
//! `<root>/<cgroup>/<file>`. A hybrid host (v1 controllers plus a v2
//! `unified` mount without cpuset/memory/io) is driven as v1.
//!
//! The shape follows youki's libcgroups: the trait and detection here,
//! `v1` and `v2` with one implementation each, file helpers and path
//! normalization in `common`, the block I/O class both write in `blockio`.

mod blockio;
mod common;
mod v1;
mod v2;

#[cfg(test)]
mod tests;

use std::fmt::Debug;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::ResmgrError;

pub use blockio::{BlockIoClass, BlockIoClassError, BlockIoDevice, BlockIoOutcome, v2_io_weight};
pub use common::normalize_cgroups_path;
pub use v1::{CgroupV1, V1_UNLIMITED};
pub use v2::CgroupV2;

/// Which cgroup interface a host speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CgroupVersion {
    /// Legacy per-controller hierarchies (also used on hybrid hosts).
    V1,
    /// Unified hierarchy.
    V2,
}

/// One cgroup interface. Cgroup names are paths relative to the hierarchy
/// root, e.g. `/kubepods/burstable/pod1/0123abcd`.
pub trait Cgroups: Send + Sync + Debug {
    /// The interface version.
    fn version(&self) -> CgroupVersion;
    /// Whether the container's cgroup exists (for the cpuset controller).
    fn exists(&self, cgroup: &str) -> bool;
    /// Effective configured CPU list (`cpuset.cpus`), as written by the kernel.
    fn read_cpus(&self, cgroup: &str) -> Result<String, ResmgrError>;
    /// Memory nodes (`cpuset.mems`).
    fn read_mems(&self, cgroup: &str) -> Result<String, ResmgrError>;
    /// Memory limit in bytes, `None` when unlimited.
    fn read_memory_limit(&self, cgroup: &str) -> Result<Option<u64>, ResmgrError>;
    /// Processes in the container's cgroup.
    fn read_pids(&self, cgroup: &str) -> Result<Vec<u32>, ResmgrError>;
    /// Apply a block I/O class.
    fn apply_blockio(
        &self,
        cgroup: &str,
        class: &BlockIoClass,
    ) -> Result<BlockIoOutcome, ResmgrError>;
}

/// Pick the interface by looking at `root`: a `cgroup.controllers` file at
/// the root means unified v2, anything else is treated as v1.
pub fn detect(root: &Path) -> Box<dyn Cgroups> {
    if root.join("cgroup.controllers").is_file() {
        Box::new(CgroupV2::new(root))
    } else {
        Box::new(CgroupV1::new(root))
    }
}
