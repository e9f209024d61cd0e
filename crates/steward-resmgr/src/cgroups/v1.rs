//! Cgroup v1 (and hybrid) hierarchies: `<root>/<controller>/<cgroup>/<file>`.

use std::path::{Path, PathBuf};

use super::common::{parse_pids, read_trimmed, rel, write_file};
use super::{BlockIoClass, BlockIoOutcome, CgroupVersion, Cgroups};
use crate::error::ResmgrError;

/// Value v1 reports for "no memory limit" (page-aligned `i64::MAX`), and
/// anything at or above it.
pub const V1_UNLIMITED: u64 = 0x7FFF_FFFF_FFFF_F000;

/// Cgroup v1 (and hybrid) hierarchies.
#[derive(Debug, Clone)]
pub struct CgroupV1 {
    root: PathBuf,
}

impl CgroupV1 {
    /// Hierarchies mounted under `root` (normally `/sys/fs/cgroup`).
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    fn file(&self, controller: &str, cgroup: &str, name: &str) -> PathBuf {
        self.root.join(controller).join(rel(cgroup)).join(name)
    }
}

impl Cgroups for CgroupV1 {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V1
    }

    fn exists(&self, cgroup: &str) -> bool {
        self.root.join("cpuset").join(rel(cgroup)).is_dir()
    }

    fn read_cpus(&self, cgroup: &str) -> Result<String, ResmgrError> {
        read_trimmed(&self.file("cpuset", cgroup, "cpuset.cpus"))
    }

    fn read_mems(&self, cgroup: &str) -> Result<String, ResmgrError> {
        read_trimmed(&self.file("cpuset", cgroup, "cpuset.mems"))
    }

    fn read_memory_limit(&self, cgroup: &str) -> Result<Option<u64>, ResmgrError> {
        let path = self.file("memory", cgroup, "memory.limit_in_bytes");
        let raw = read_trimmed(&path)?;
        let v: u64 = raw.parse().map_err(|_| ResmgrError::Cgroup {
            path: path.clone(),
            reason: format!("not a number: {raw:?}"),
            source: None,
        })?;
        Ok((v < V1_UNLIMITED).then_some(v))
    }

    fn read_pids(&self, cgroup: &str) -> Result<Vec<u32>, ResmgrError> {
        parse_pids(&self.file("cpuset", cgroup, "cgroup.procs"))
    }

    fn apply_blockio(
        &self,
        cgroup: &str,
        class: &BlockIoClass,
    ) -> Result<BlockIoOutcome, ResmgrError> {
        let dir = self.root.join("blkio").join(rel(cgroup));
        if !dir.is_dir() {
            return Err(ResmgrError::Cgroup {
                path: dir,
                reason: "blkio cgroup does not exist".into(),
                source: None,
            });
        }
        let mut out = BlockIoOutcome::default();
        if let Some(w) = class.weight {
            // CFQ's blkio.weight is gone from current kernels; BFQ exposes
            // blkio.bfq.weight only while BFQ schedules some device.
            let candidates = ["blkio.weight", "blkio.bfq.weight"];
            match candidates.iter().map(|f| dir.join(f)).find(|p| p.is_file()) {
                Some(path) => {
                    write_file(&path, &w.to_string())?;
                    out.written.push((path, w.to_string()));
                }
                None => out
                    .skipped
                    .push("weight: no blkio.weight or blkio.bfq.weight on this host".into()),
            }
        }
        for d in &class.devices {
            for (file, value) in [
                ("blkio.throttle.read_bps_device", d.read_bps),
                ("blkio.throttle.write_bps_device", d.write_bps),
                ("blkio.throttle.read_iops_device", d.read_iops),
                ("blkio.throttle.write_iops_device", d.write_iops),
            ] {
                let Some(value) = value else { continue };
                let path = dir.join(file);
                if !path.is_file() {
                    out.skipped
                        .push(format!("{file}: not present on this host"));
                    continue;
                }
                let line = format!("{} {value}", d.device);
                write_file(&path, &line)?;
                out.written.push((path, line));
            }
        }
        Ok(out)
    }
}
