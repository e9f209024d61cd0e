//! Out-of-band block I/O controller: cgroup v1 `blkio` or v2 `io` settings
//! per class, applied once a container's cgroup exists.

use std::collections::BTreeMap;
use std::sync::Arc;

use tracing::{info, warn};

use crate::cgroups::{BlockIoClass, BlockIoOutcome, Cgroups};
use crate::error::ResmgrError;

/// Applies block I/O classes through a cgroup interface.
#[derive(Debug, Clone)]
pub struct BlockIoController {
    cgroups: Arc<dyn Cgroups>,
    classes: BTreeMap<String, BlockIoClass>,
}

impl BlockIoController {
    /// A controller over `cgroups` with `classes`.
    pub fn new(cgroups: Arc<dyn Cgroups>, classes: BTreeMap<String, BlockIoClass>) -> Self {
        Self { cgroups, classes }
    }

    /// Replace the classes (configuration reload).
    pub fn set_classes(&mut self, classes: BTreeMap<String, BlockIoClass>) {
        self.classes = classes;
    }

    /// Whether `class` is configured.
    pub fn knows(&self, class: &str) -> bool {
        self.classes.contains_key(class)
    }

    /// Apply `class` to the container cgroup `cgroup`.
    pub fn apply(
        &self,
        container_id: &str,
        cgroup: &str,
        class: &str,
    ) -> Result<BlockIoOutcome, ResmgrError> {
        let c = self
            .classes
            .get(class)
            .ok_or_else(|| ResmgrError::Controller {
                controller: "blockio",
                reason: format!("class {class:?} is not configured"),
            })?;
        let out = self.cgroups.apply_blockio(cgroup, c)?;
        for s in &out.skipped {
            warn!(%container_id, %class, skipped = %s, "block I/O setting not available on this host");
        }
        info!(%container_id, %class, written = out.written.len(), "block I/O class applied");
        Ok(out)
    }
}
