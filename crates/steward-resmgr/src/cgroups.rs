//! Cgroup v1 and v2 behind one trait: reading back what a container really
//! got (cpuset, memory limit) and writing block I/O parameters.
//!
//! v1 paths are `<root>/<controller>/<cgroup>/<file>`, v2 paths are
//! `<root>/<cgroup>/<file>`. A hybrid host (v1 controllers plus a v2
//! `unified` mount without cpuset/memory/io) is driven as v1.

use std::fmt::Debug;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::ResmgrError;

/// Value v1 reports for "no memory limit" (page-aligned `i64::MAX`), and
/// anything at or above it.
pub const V1_UNLIMITED: u64 = 0x7FFF_FFFF_FFFF_F000;

/// Which cgroup interface a host speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CgroupVersion {
    /// Legacy per-controller hierarchies (also used on hybrid hosts).
    V1,
    /// Unified hierarchy.
    V2,
}

/// Throttles for one block device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockIoDevice {
    /// `major:minor` of the device.
    pub device: String,
    /// Read bytes per second.
    #[serde(default)]
    pub read_bps: Option<u64>,
    /// Write bytes per second.
    #[serde(default)]
    pub write_bps: Option<u64>,
    /// Read operations per second.
    #[serde(default)]
    pub read_iops: Option<u64>,
    /// Write operations per second.
    #[serde(default)]
    pub write_iops: Option<u64>,
}

/// A block I/O class: a proportional weight and per-device throttles.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockIoClass {
    /// Proportional weight on the cgroup v1 scale, 1..=1000 (v2 `io.weight`
    /// gets [`v2_io_weight`] of it).
    #[serde(default)]
    pub weight: Option<u32>,
    /// Per-device throttles.
    #[serde(default)]
    pub devices: Vec<BlockIoDevice>,
}

/// A block I/O class the configuration cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockIoClassError {
    /// A weight outside the cgroup v1 range.
    #[error("class {class}: weight {weight} outside 1..=1000")]
    Weight { class: String, weight: u32 },
    /// A device that is not `major:minor`.
    #[error("class {class}: device {device:?} is not major:minor")]
    Device { class: String, device: String },
}

impl BlockIoClass {
    /// Check ranges and device numbers.
    pub fn validate(&self, name: &str) -> Result<(), BlockIoClassError> {
        if let Some(w) = self.weight
            && !(1..=1000).contains(&w)
        {
            return Err(BlockIoClassError::Weight {
                class: name.to_owned(),
                weight: w,
            });
        }
        for d in &self.devices {
            parse_major_minor(&d.device).ok_or_else(|| BlockIoClassError::Device {
                class: name.to_owned(),
                device: d.device.clone(),
            })?;
        }
        Ok(())
    }
}

/// A cgroup v1 block I/O weight (10..=1000) on the v2 `io.weight` scale
/// (1..=10000), as runc and youki convert it: `1 + (w - 10) * 9999 / 990`,
/// so 10 → 1, 500 → 4950, 1000 → 10000. Weights below the v1 minimum of 10
/// map to 1.
pub fn v2_io_weight(v1: u32) -> u64 {
    let w = u64::from(v1.clamp(10, 1000));
    1 + (w - 10) * 9999 / 990
}

fn parse_major_minor(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// What a block I/O application did: files written and parts skipped
/// because this host lacks them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockIoOutcome {
    /// Files written, with the value.
    pub written: Vec<(PathBuf, String)>,
    /// Settings not applied and why.
    pub skipped: Vec<String>,
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

fn read_trimmed(path: &Path) -> Result<String, ResmgrError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| ResmgrError::Cgroup {
            path: path.to_path_buf(),
            reason: "reading failed".into(),
            source: Some(e),
        })
}

fn write_file(path: &Path, value: &str) -> Result<(), ResmgrError> {
    std::fs::write(path, value).map_err(|e| ResmgrError::Cgroup {
        path: path.to_path_buf(),
        reason: format!("writing {value:?} failed"),
        source: Some(e),
    })
}

fn parse_pids(path: &Path) -> Result<Vec<u32>, ResmgrError> {
    let raw = read_trimmed(path)?;
    raw.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.trim().parse().map_err(|_| ResmgrError::Cgroup {
                path: path.to_path_buf(),
                reason: format!("not a pid: {l:?}"),
                source: None,
            })
        })
        .collect()
}

fn rel(cgroup: &str) -> &str {
    cgroup.trim_start_matches('/')
}

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

/// Turn a runtime's cgroups path into a hierarchy-relative path. Accepts the
/// cgroupfs form (`/a/b/id`) and the systemd form (`slice:prefix:name`).
pub fn normalize_cgroups_path(spec_path: &str) -> String {
    let parts: Vec<&str> = spec_path.split(':').collect();
    if let [slice, prefix, name] = parts.as_slice()
        && !spec_path.starts_with('/')
    {
        let mut out = expand_slice(slice);
        let unit = if name.ends_with(".slice") {
            (*name).to_owned()
        } else if prefix.is_empty() {
            format!("{name}.scope")
        } else {
            format!("{prefix}-{name}.scope")
        };
        out.push('/');
        out.push_str(&unit);
        return out;
    }
    if spec_path.starts_with('/') {
        spec_path.to_owned()
    } else {
        format!("/{spec_path}")
    }
}

/// `a-b-c.slice` -> `/a.slice/a-b.slice/a-b-c.slice` (`-.slice` is the root).
fn expand_slice(slice: &str) -> String {
    let base = slice.strip_suffix(".slice").unwrap_or(slice);
    if base.is_empty() || base == "-" {
        return String::new();
    }
    let mut out = String::new();
    let mut acc = String::new();
    for (i, part) in base.split('-').enumerate() {
        if i > 0 {
            acc.push('-');
        }
        acc.push_str(part);
        out.push('/');
        out.push_str(&acc);
        out.push_str(".slice");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(path: &Path, content: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    #[test]
    fn v1_reads_cpuset_and_memory_and_treats_huge_limit_as_unlimited() {
        let t = tempfile::tempdir().unwrap();
        let cg = "/kubepods/pod1/c1";
        put(
            &t.path().join("cpuset/kubepods/pod1/c1/cpuset.cpus"),
            "0-1,4\n",
        );
        put(&t.path().join("cpuset/kubepods/pod1/c1/cpuset.mems"), "0\n");
        put(
            &t.path()
                .join("memory/kubepods/pod1/c1/memory.limit_in_bytes"),
            "67108864\n",
        );
        let v1 = CgroupV1::new(t.path());
        assert!(v1.exists(cg));
        assert!(!v1.exists("/nope"));
        assert_eq!(v1.read_cpus(cg).unwrap(), "0-1,4");
        assert_eq!(v1.read_mems(cg).unwrap(), "0");
        assert_eq!(v1.read_memory_limit(cg).unwrap(), Some(64 << 20));
        put(
            &t.path()
                .join("memory/kubepods/pod1/c1/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        assert_eq!(v1.read_memory_limit(cg).unwrap(), None);
        put(
            &t.path()
                .join("memory/kubepods/pod1/c1/memory.limit_in_bytes"),
            "junk",
        );
        assert!(v1.read_memory_limit(cg).is_err());
        assert!(matches!(detect(t.path()).version(), CgroupVersion::V1));
        put(
            &t.path().join("cpuset/kubepods/pod1/c1/cgroup.procs"),
            "12\n345\n",
        );
        assert_eq!(v1.read_pids(cg).unwrap(), vec![12, 345]);
    }

    #[test]
    fn v2_reads_configured_or_effective_cpuset_and_memory_max() {
        let t = tempfile::tempdir().unwrap();
        put(
            &t.path().join("cgroup.controllers"),
            "cpuset cpu io memory\n",
        );
        let dir = t.path().join("kubepods.slice/c1");
        put(&dir.join("cpuset.cpus"), "\n");
        put(&dir.join("cpuset.cpus.effective"), "0-3\n");
        put(&dir.join("cpuset.mems"), "1\n");
        put(&dir.join("memory.max"), "max\n");
        let cg = detect(t.path());
        assert_eq!(cg.version(), CgroupVersion::V2);
        assert!(cg.exists("/kubepods.slice/c1"));
        assert_eq!(cg.read_cpus("/kubepods.slice/c1").unwrap(), "0-3");
        assert_eq!(cg.read_mems("/kubepods.slice/c1").unwrap(), "1");
        assert_eq!(cg.read_memory_limit("/kubepods.slice/c1").unwrap(), None);
        put(&dir.join("cpuset.cpus"), "2\n");
        put(&dir.join("memory.max"), "1048576\n");
        assert_eq!(cg.read_cpus("/kubepods.slice/c1").unwrap(), "2");
        assert_eq!(
            cg.read_memory_limit("/kubepods.slice/c1").unwrap(),
            Some(1 << 20)
        );
    }

    #[test]
    fn v2_blockio_writes_weight_and_io_max_and_reports_missing_files() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("pod/c1");
        put(&dir.join("io.weight"), "default 100\n");
        put(&dir.join("io.max"), "");
        let v2 = CgroupV2::new(t.path());
        let class = BlockIoClass {
            weight: Some(200),
            devices: vec![BlockIoDevice {
                device: "254:0".into(),
                read_bps: Some(1 << 20),
                write_iops: Some(100),
                ..Default::default()
            }],
        };
        let out = v2.apply_blockio("/pod/c1", &class).unwrap();
        assert!(out.skipped.is_empty(), "{out:?}");
        assert_eq!(
            std::fs::read_to_string(dir.join("io.weight")).unwrap(),
            "default 1920"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("io.max")).unwrap(),
            "254:0 rbps=1048576 wiops=100"
        );
        // No io controller files: a clean report, nothing written.
        let bare = t.path().join("pod/c2");
        std::fs::create_dir_all(&bare).unwrap();
        let out = v2.apply_blockio("/pod/c2", &class).unwrap();
        assert!(out.written.is_empty());
        assert_eq!(out.skipped.len(), 2, "{out:?}");
        assert!(v2.apply_blockio("/pod/missing", &class).is_err());
    }

    #[test]
    fn v1_blockio_writes_throttles_and_skips_missing_weight() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("blkio/pod/c1");
        put(&dir.join("blkio.throttle.read_bps_device"), "");
        put(&dir.join("blkio.throttle.write_bps_device"), "");
        let v1 = CgroupV1::new(t.path());
        let class = BlockIoClass {
            weight: Some(300),
            devices: vec![BlockIoDevice {
                device: "8:0".into(),
                read_bps: Some(4096),
                write_bps: Some(8192),
                read_iops: Some(5),
                ..Default::default()
            }],
        };
        let out = v1.apply_blockio("/pod/c1", &class).unwrap();
        assert_eq!(out.written.len(), 2, "{out:?}");
        assert_eq!(
            std::fs::read_to_string(dir.join("blkio.throttle.write_bps_device")).unwrap(),
            "8:0 8192"
        );
        assert_eq!(out.skipped.len(), 2, "{out:?}"); // weight + read_iops file absent
        put(&dir.join("blkio.bfq.weight"), "100");
        v1.apply_blockio("/pod/c1", &class).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("blkio.bfq.weight")).unwrap(),
            "300"
        );
    }

    #[test]
    fn v1_weights_convert_to_v2_as_runc_does() {
        for (v1, v2) in [
            (10, 1),
            (1000, 10_000),
            (500, 4950),
            (100, 910),
            (200, 1920),
            (11, 11),
            (999, 9989),
            (1, 1),
            (9, 1),
        ] {
            assert_eq!(v2_io_weight(v1), v2, "v1 weight {v1}");
        }
        // Monotonic and inside the v2 range over the whole v1 range.
        let all: Vec<u64> = (10..=1000).map(v2_io_weight).collect();
        assert!(all.windows(2).all(|p| p[0] < p[1]));
        assert!(all.iter().all(|w| (1..=10_000).contains(w)));
    }

    #[test]
    fn class_validation() {
        let mut c = BlockIoClass {
            weight: Some(0),
            devices: vec![],
        };
        assert!(c.validate("x").is_err());
        c.weight = Some(500);
        assert!(c.validate("x").is_ok());
        c.devices.push(BlockIoDevice {
            device: "sda".into(),
            ..Default::default()
        });
        assert!(
            c.validate("x")
                .unwrap_err()
                .to_string()
                .contains("major:minor")
        );
    }

    #[test]
    fn cgroups_paths_normalize() {
        assert_eq!(normalize_cgroups_path("/a/b/c"), "/a/b/c");
        assert_eq!(normalize_cgroups_path("a/b"), "/a/b");
        assert_eq!(
            normalize_cgroups_path("kubepods-burstable-pod1.slice:cri-containerd:abc"),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope"
        );
        assert_eq!(normalize_cgroups_path("-.slice::x"), "/x.scope");
    }
}
