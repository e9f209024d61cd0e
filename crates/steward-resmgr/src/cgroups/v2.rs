//! The unified cgroup v2 hierarchy: `<root>/<cgroup>/<file>`.

use std::path::{Path, PathBuf};

use super::common::{parse_pids, read_trimmed, rel, write_file};
use super::{BlockIoClass, BlockIoOutcome, CgroupVersion, Cgroups, v2_io_weight};
use crate::error::ResmgrError;

/// Unified cgroup v2 hierarchy.
#[derive(Debug, Clone)]
pub struct CgroupV2 {
    root: PathBuf,
}

impl CgroupV2 {
    /// Hierarchy mounted at `root`.
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    fn file(&self, cgroup: &str, name: &str) -> PathBuf {
        self.root.join(rel(cgroup)).join(name)
    }

    /// The configured value, falling back to the effective one when the
    /// cgroup inherits (empty `cpuset.cpus`).
    fn read_cpuset(&self, cgroup: &str, name: &str) -> Result<String, ResmgrError> {
        let own = self.file(cgroup, name);
        let v = if own.is_file() {
            read_trimmed(&own)?
        } else {
            String::new()
        };
        if v.is_empty() {
            read_trimmed(&self.file(cgroup, &format!("{name}.effective")))
        } else {
            Ok(v)
        }
    }
}

impl Cgroups for CgroupV2 {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V2
    }

    fn exists(&self, cgroup: &str) -> bool {
        self.root.join(rel(cgroup)).is_dir()
    }

    fn read_cpus(&self, cgroup: &str) -> Result<String, ResmgrError> {
        self.read_cpuset(cgroup, "cpuset.cpus")
    }

    fn read_mems(&self, cgroup: &str) -> Result<String, ResmgrError> {
        self.read_cpuset(cgroup, "cpuset.mems")
    }

    fn read_memory_limit(&self, cgroup: &str) -> Result<Option<u64>, ResmgrError> {
        let path = self.file(cgroup, "memory.max");
        let raw = read_trimmed(&path)?;
        if raw == "max" {
            return Ok(None);
        }
        raw.parse().map(Some).map_err(|_| ResmgrError::Cgroup {
            path,
            reason: format!("not a number or \"max\": {raw:?}"),
            source: None,
        })
    }

    fn read_pids(&self, cgroup: &str) -> Result<Vec<u32>, ResmgrError> {
        parse_pids(&self.file(cgroup, "cgroup.procs"))
    }

    fn apply_blockio(
        &self,
        cgroup: &str,
        class: &BlockIoClass,
    ) -> Result<BlockIoOutcome, ResmgrError> {
        let dir = self.root.join(rel(cgroup));
        if !dir.is_dir() {
            return Err(ResmgrError::Cgroup {
                path: dir,
                reason: "cgroup does not exist".into(),
                source: None,
            });
        }
        let mut out = BlockIoOutcome::default();
        if let Some(w) = class.weight {
            // v1 weights are 10..1000 (default 500), v2 1..10000 (default 100).
            let path = dir.join("io.weight");
            let bfq = dir.join("io.bfq.weight");
            if path.is_file() {
                let v2 = v2_io_weight(w);
                let line = format!("default {v2}");
                write_file(&path, &line)?;
                out.written.push((path, line));
            } else if bfq.is_file() {
                let line = format!("default {w}");
                write_file(&bfq, &line)?;
                out.written.push((bfq, line));
            } else {
                out.skipped.push(
                    "weight: no io.weight or io.bfq.weight (io controller not enabled?)".into(),
                );
            }
        }
        let max = dir.join("io.max");
        for d in &class.devices {
            let mut parts = vec![d.device.clone()];
            for (key, value) in [
                ("rbps", d.read_bps),
                ("wbps", d.write_bps),
                ("riops", d.read_iops),
                ("wiops", d.write_iops),
            ] {
                if let Some(v) = value {
                    parts.push(format!("{key}={v}"));
                }
            }
            if parts.len() == 1 {
                continue;
            }
            if !max.is_file() {
                out.skipped
                    .push("io.max: not present (io controller not enabled?)".into());
                break;
            }
            let line = parts.join(" ");
            write_file(&max, &line)?;
            out.written.push((max.clone(), line));
        }
        Ok(out)
    }
}
