//! Reads the CPU and memory topology of a machine from sysfs into
//! [`steward_core::cpu::Topology`].
//!
//! The sysfs root is configuration (normally `/sys`; tests use fixture
//! trees). Files read, relative to the root:
//!
//! - `devices/system/cpu/online`, `offline`, `isolated` (the last two may
//!   be absent);
//! - per online CPU `cpuN/topology/physical_package_id`, `die_id` (absent on
//!   older kernels: die 0), `core_id`, `thread_siblings_list` (checked
//!   against the core grouping);
//! - `devices/system/node/nodeN/cpulist`, `distance`, `meminfo`
//!   (`MemTotal`). Without a `node` directory (kernel without NUMA) one
//!   node 0 holds every CPU, with unknown (0) memory.
//!
//! # Memory kind heuristic
//!
//! sysfs does not say what memory a node holds. A node with online CPUs is
//! DRAM; a node with memory and no online CPUs is taken as
//! [`MemoryKind::Pmem`] (the usual case for Optane in memory mode), or
//! [`DiscoverOptions::cpu_less_kind`] when set. (A DRAM node whose CPUs are
//! all offline therefore reads as memory-only: override it.) CXL expanders and HBM-only nodes look the same to sysfs, so
//! [`DiscoverOptions::memory_kinds`] (or the policy config's
//! `memory_kinds`) overrides per node.

pub mod fixture;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use steward_core::cpu::{Cpu, CpuSet, MemoryKind, NumaNode, Topology};

/// Why discovery failed.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("malformed {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("inconsistent sysfs topology: {0}")]
    Inconsistent(String),
    #[error(transparent)]
    Model(#[from] steward_core::cpu::TopologyError),
}

/// Discovery knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoverOptions {
    /// Kind of a node with memory and no CPUs (default PMEM).
    pub cpu_less_kind: MemoryKind,
    /// Per-node kind overrides, applied last.
    pub memory_kinds: BTreeMap<u32, MemoryKind>,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        DiscoverOptions {
            cpu_less_kind: MemoryKind::Pmem,
            memory_kinds: BTreeMap::new(),
        }
    }
}

/// Reads the topology under `sysfs_root` with default options.
pub fn discover(sysfs_root: &Path) -> Result<Topology, TopologyError> {
    discover_with(sysfs_root, &DiscoverOptions::default())
}

fn read(path: &Path) -> Result<String, TopologyError> {
    fs::read_to_string(path).map_err(|source| TopologyError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn read_opt(path: &Path) -> Result<Option<String>, TopologyError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TopologyError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn cpuset(path: &Path, text: &str) -> Result<CpuSet, TopologyError> {
    CpuSet::parse(text).map_err(|e| TopologyError::Parse {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn read_cpuset(path: &Path) -> Result<CpuSet, TopologyError> {
    cpuset(path, &read(path)?)
}

fn read_opt_cpuset(path: &Path) -> Result<CpuSet, TopologyError> {
    match read_opt(path)? {
        Some(t) => cpuset(path, &t),
        None => Ok(CpuSet::new()),
    }
}

fn read_u32(path: &Path) -> Result<u32, TopologyError> {
    let t = read(path)?;
    // die_id / physical_package_id are -1 on some virtual machines
    let v: i64 = t.trim().parse().map_err(|_| TopologyError::Parse {
        path: path.to_path_buf(),
        reason: format!("expected an integer, found {:?}", t.trim()),
    })?;
    if v < 0 {
        return Ok(0);
    }
    u32::try_from(v).map_err(|_| TopologyError::Parse {
        path: path.to_path_buf(),
        reason: format!("{v} is out of range"),
    })
}

/// Node ids present under `node/`: `nodeN` directories.
fn node_dirs(node_root: &Path) -> Result<Vec<u32>, TopologyError> {
    let rd = match fs::read_dir(node_root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(TopologyError::Io {
                path: node_root.to_path_buf(),
                source,
            });
        }
    };
    let mut ids = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|source| TopologyError::Io {
            path: node_root.to_path_buf(),
            source,
        })?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = name.strip_prefix("node")
            && let Ok(id) = n.parse::<u32>()
        {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// `MemTotal` of a node `meminfo` file, in bytes.
fn mem_total(path: &Path, text: &str) -> Result<u64, TopologyError> {
    for line in text.lines() {
        // "Node 0 MemTotal:       20014880 kB"
        if let Some((_, rest)) = line.split_once("MemTotal:") {
            let mut parts = rest.split_whitespace();
            let num = parts.next().unwrap_or("");
            let unit = parts.next().unwrap_or("kB");
            let v: u64 = num.parse().map_err(|_| TopologyError::Parse {
                path: path.to_path_buf(),
                reason: format!("MemTotal value {num:?} is not a number"),
            })?;
            let mult = match unit {
                "kB" => 1024,
                "B" | "" => 1,
                other => {
                    return Err(TopologyError::Parse {
                        path: path.to_path_buf(),
                        reason: format!("unknown MemTotal unit {other:?}"),
                    });
                }
            };
            return v.checked_mul(mult).ok_or_else(|| TopologyError::Parse {
                path: path.to_path_buf(),
                reason: "MemTotal overflows".into(),
            });
        }
    }
    Err(TopologyError::Parse {
        path: path.to_path_buf(),
        reason: "no MemTotal line".into(),
    })
}

/// Reads the topology under `sysfs_root`.
pub fn discover_with(sysfs_root: &Path, opts: &DiscoverOptions) -> Result<Topology, TopologyError> {
    let cpu_root = sysfs_root.join("devices/system/cpu");
    let node_root = sysfs_root.join("devices/system/node");
    let online = read_cpuset(&cpu_root.join("online"))?;
    let offline = read_opt_cpuset(&cpu_root.join("offline"))?;
    let isolated = read_opt_cpuset(&cpu_root.join("isolated"))?;
    if online.is_empty() {
        return Err(TopologyError::Inconsistent(format!(
            "{} lists no CPU",
            cpu_root.join("online").display()
        )));
    }
    // node membership
    let mut node_of: BTreeMap<u32, u32> = BTreeMap::new();
    let mut nodes = Vec::new();
    let ids = node_dirs(&node_root)?;
    if ids.is_empty() {
        for c in online.iter() {
            node_of.insert(c, 0);
        }
        nodes.push(NumaNode {
            id: 0,
            memory_bytes: 0,
            kind: MemoryKind::Dram,
            distances: BTreeMap::from([(0, 10)]),
        });
    } else {
        for &id in &ids {
            let dir = node_root.join(format!("node{id}"));
            let cpus = read_opt_cpuset(&dir.join("cpulist"))?;
            for c in cpus.iter() {
                if let Some(prev) = node_of.insert(c, id) {
                    return Err(TopologyError::Inconsistent(format!(
                        "CPU {c} is listed by node{prev} and node{id}"
                    )));
                }
            }
            let mpath = dir.join("meminfo");
            let memory_bytes = match read_opt(&mpath)? {
                Some(t) => mem_total(&mpath, &t)?,
                None => 0,
            };
            let dpath = dir.join("distance");
            let mut distances = BTreeMap::new();
            if let Some(t) = read_opt(&dpath)? {
                let values: Vec<&str> = t.split_whitespace().collect();
                if values.len() != ids.len() {
                    return Err(TopologyError::Parse {
                        path: dpath.clone(),
                        reason: format!("{} distances for {} nodes", values.len(), ids.len()),
                    });
                }
                for (other, v) in ids.iter().zip(values) {
                    let d: u32 = v.parse().map_err(|_| TopologyError::Parse {
                        path: dpath.clone(),
                        reason: format!("distance {v:?} is not a number"),
                    })?;
                    distances.insert(*other, d);
                }
            }
            let kind = if cpus.is_empty() && memory_bytes > 0 {
                opts.cpu_less_kind
            } else {
                MemoryKind::Dram
            };
            nodes.push(NumaNode {
                id,
                memory_bytes,
                kind,
                distances,
            });
        }
    }
    let mut cpus = Vec::new();
    for id in online.iter() {
        let topo = cpu_root.join(format!("cpu{id}/topology"));
        let socket = read_u32(&topo.join("physical_package_id"))?;
        let die = match read_opt(&topo.join("die_id"))? {
            Some(_) => read_u32(&topo.join("die_id"))?,
            None => 0,
        };
        let core = read_u32(&topo.join("core_id"))?;
        let node = node_of.get(&id).copied().ok_or_else(|| {
            TopologyError::Inconsistent(format!("online CPU {id} is in no NUMA node's cpulist"))
        })?;
        cpus.push(Cpu {
            id,
            socket,
            die,
            core,
            node,
            isolated: isolated.contains(id),
        });
    }
    let topology = Topology::new(cpus, offline.difference(&online), nodes)?
        .with_memory_kinds(&opts.memory_kinds)?;
    // cross-check the kernel's sibling lists with our core grouping
    for c in topology.cpus() {
        let path = cpu_root.join(format!("cpu{}/topology/thread_siblings_list", c.id));
        if let Some(t) = read_opt(&path)? {
            let listed = cpuset(&path, &t)?.intersection(topology.online_cpus());
            let ours = topology.siblings(c.id);
            if listed != ours {
                return Err(TopologyError::Inconsistent(format!(
                    "CPU {}: thread_siblings_list says {listed}, package/die/core ids say {ours}",
                    c.id
                )));
            }
        }
    }
    Ok(topology)
}
