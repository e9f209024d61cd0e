//! The state cache: pods, containers and their assignments, persisted as a
//! versioned JSON document with write-to-temp, fsync and atomic rename.
//!
//! The cache is not the truth: the runtime is. At start the cache is loaded
//! and then re-synced against `ListPodSandbox`/`ListContainers`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use steward_core::cpu::{Assignment, ContainerKey, ContainerRequest, CpuSet, Qos};
use steward_proto::cri::runtime::v1 as cri;
use tracing::{info, warn};

use crate::error::ResmgrError;

/// Current schema version of the cache file. Bump it when the document's
/// shape changes, add a fixture written by the release before
/// (tests/fixtures/cache) and teach [`Cache::open`] to read it: a cache of
/// an older version that is discarded makes the re-sync place running
/// containers again. A newer version is refused ([`ResmgrError::CacheNewer`]).
pub const SCHEMA_VERSION: u32 = 1;
/// File name of the cache inside the state directory.
pub const CACHE_FILE: &str = "resmgr-cache.json";

/// Lifecycle state of a pod sandbox as far as we know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PodState {
    /// Running.
    Ready,
    /// Stopped, not yet removed.
    NotReady,
}

/// A pod sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    /// Sandbox id.
    pub id: String,
    /// Pod UID.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Cgroup parent the kubelet asked for.
    pub cgroup_parent: String,
    /// Pod annotations.
    pub annotations: BTreeMap<String, String>,
    /// Pod labels.
    pub labels: BTreeMap<String, String>,
    /// State.
    pub state: PodState,
}

impl PodRecord {
    /// Build from a sandbox config.
    pub fn from_config(id: &str, cfg: &cri::PodSandboxConfig) -> Self {
        let meta = cfg.metadata.clone().unwrap_or_default();
        Self {
            id: id.to_owned(),
            uid: meta.uid,
            name: meta.name,
            namespace: meta.namespace,
            cgroup_parent: cfg
                .linux
                .as_ref()
                .map(|l| l.cgroup_parent.clone())
                .unwrap_or_default(),
            annotations: cfg
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            labels: cfg
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            state: PodState::Ready,
        }
    }
}

/// Lifecycle state of a container as far as we know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerState {
    /// Created, not started.
    Created,
    /// Started.
    Running,
    /// Exited or stopped; resources released.
    Exited,
}

/// The policy request of a container, schema-stable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// QoS class.
    pub qos: String,
    /// CPU request.
    pub cpu_request_milli: u64,
    /// CPU limit.
    pub cpu_limit_milli: Option<u64>,
    /// Memory request.
    pub memory_request_bytes: u64,
    /// Memory limit.
    pub memory_limit_bytes: Option<u64>,
    /// The DRA CPU claims the container runs on (absent before 0.3).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_claims: Vec<String>,
}

fn qos_str(q: &Qos) -> &'static str {
    match q {
        Qos::Guaranteed => "Guaranteed",
        Qos::Burstable => "Burstable",
        Qos::BestEffort => "BestEffort",
    }
}

impl RequestRecord {
    /// Record a request.
    pub fn from_request(r: &ContainerRequest) -> Self {
        Self {
            qos: qos_str(&r.qos).to_owned(),
            cpu_request_milli: r.cpu_request_milli,
            cpu_limit_milli: r.cpu_limit_milli,
            memory_request_bytes: r.memory_request_bytes,
            memory_limit_bytes: r.memory_limit_bytes,
            cpu_claims: r.cpu_claims.clone(),
        }
    }

    /// Rebuild the policy request for `container` of `pod`.
    pub fn to_request(&self, pod: &PodRecord, container: &str) -> ContainerRequest {
        ContainerRequest {
            key: ContainerKey {
                pod_uid: pod.uid.clone(),
                container: container.to_owned(),
            },
            pod_namespace: pod.namespace.clone(),
            pod_name: pod.name.clone(),
            qos: match self.qos.as_str() {
                "Guaranteed" => Qos::Guaranteed,
                "BestEffort" => Qos::BestEffort,
                _ => Qos::Burstable,
            },
            cpu_request_milli: self.cpu_request_milli,
            cpu_limit_milli: self.cpu_limit_milli,
            memory_request_bytes: self.memory_request_bytes,
            memory_limit_bytes: self.memory_limit_bytes,
            annotations: pod.annotations.clone(),
            cpu_claims: self.cpu_claims.clone(),
        }
    }
}

/// An assignment in canonical string form, schema-stable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignmentRecord {
    /// CPUs.
    pub cpus: String,
    /// NUMA memory nodes.
    pub mems: String,
    /// Exclusive CPUs.
    pub exclusive: bool,
    /// Pool name.
    pub pool: String,
}

impl AssignmentRecord {
    /// Record an assignment.
    pub fn from_assignment(a: &Assignment) -> Self {
        Self {
            cpus: a.cpus.to_string(),
            mems: a.mems.to_string(),
            exclusive: a.exclusive,
            pool: a.pool.clone(),
        }
    }

    /// Back to the policy type.
    pub fn to_assignment(&self) -> Result<Assignment, RecordError> {
        let parse = |field: &'static str, value: &str| {
            CpuSet::parse(value).map_err(|source| RecordError {
                field,
                value: value.to_owned(),
                source,
            })
        };
        Ok(Assignment {
            cpus: parse("cpus", &self.cpus)?,
            mems: parse("mems", &self.mems)?,
            exclusive: self.exclusive,
            pool: self.pool.clone(),
        })
    }
}

/// A cached assignment whose CPU or memory-node list does not parse.
#[derive(Debug, thiserror::Error)]
#[error("cached {field} {value:?} is not a CPU list")]
pub struct RecordError {
    /// `cpus` or `mems`.
    pub field: &'static str,
    /// What the record holds.
    pub value: String,
    /// Why it does not parse.
    #[source]
    pub source: steward_core::cpu::CpuSetError,
}

/// The Linux resources the runtime was last told for a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourcesRecord {
    /// CFS period (µs).
    pub cpu_period: i64,
    /// CFS quota (µs).
    pub cpu_quota: i64,
    /// CPU shares.
    pub cpu_shares: i64,
    /// Memory limit.
    pub memory_limit_in_bytes: i64,
    /// OOM score adjustment.
    pub oom_score_adj: i64,
    /// CPUs.
    pub cpuset_cpus: String,
    /// Memory nodes.
    pub cpuset_mems: String,
    /// Hugepage limits: page size -> bytes.
    pub hugepage_limits: BTreeMap<String, u64>,
    /// Raw cgroup v2 settings.
    pub unified: BTreeMap<String, String>,
    /// Memory + swap limit.
    pub memory_swap_limit_in_bytes: i64,
}

impl ResourcesRecord {
    /// Record CRI resources.
    pub fn from_cri(r: &cri::LinuxContainerResources) -> Self {
        Self {
            cpu_period: r.cpu_period,
            cpu_quota: r.cpu_quota,
            cpu_shares: r.cpu_shares,
            memory_limit_in_bytes: r.memory_limit_in_bytes,
            oom_score_adj: r.oom_score_adj,
            cpuset_cpus: r.cpuset_cpus.clone(),
            cpuset_mems: r.cpuset_mems.clone(),
            hugepage_limits: r
                .hugepage_limits
                .iter()
                .map(|h| (h.page_size.clone(), h.limit))
                .collect(),
            unified: r
                .unified
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            memory_swap_limit_in_bytes: r.memory_swap_limit_in_bytes,
        }
    }

    /// Back to CRI resources.
    pub fn to_cri(&self) -> cri::LinuxContainerResources {
        cri::LinuxContainerResources {
            cpu_period: self.cpu_period,
            cpu_quota: self.cpu_quota,
            cpu_shares: self.cpu_shares,
            memory_limit_in_bytes: self.memory_limit_in_bytes,
            oom_score_adj: self.oom_score_adj,
            cpuset_cpus: self.cpuset_cpus.clone(),
            cpuset_mems: self.cpuset_mems.clone(),
            hugepage_limits: self
                .hugepage_limits
                .iter()
                .map(|(page_size, limit)| cri::HugepageLimit {
                    page_size: page_size.clone(),
                    limit: *limit,
                })
                .collect(),
            unified: self
                .unified
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            memory_swap_limit_in_bytes: self.memory_swap_limit_in_bytes,
        }
    }
}

/// A container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRecord {
    /// Container id.
    pub id: String,
    /// Sandbox id.
    pub pod_id: String,
    /// Container name within the pod.
    pub name: String,
    /// Policy request.
    pub request: RequestRecord,
    /// Current assignment (None once released).
    pub assignment: Option<AssignmentRecord>,
    /// What the kubelet asked for (before the policy's edits).
    pub kubelet_resources: ResourcesRecord,
    /// What the runtime was last told.
    pub resources: ResourcesRecord,
    /// State.
    pub state: ContainerState,
    /// Cgroup path, hierarchy-relative, once known.
    pub cgroups_path: Option<String>,
    /// Block I/O class.
    pub blockio_class: Option<String>,
    /// RDT class.
    pub rdt_class: Option<String>,
    /// Creation order, for deterministic replays.
    pub seq: u64,
}

/// The persisted document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheData {
    /// Schema version.
    pub version: u32,
    /// Name of the policy that made the assignments.
    pub policy: String,
    /// Next creation sequence number.
    pub next_seq: u64,
    /// Pods by sandbox id.
    pub pods: BTreeMap<String, PodRecord>,
    /// Containers by container id.
    pub containers: BTreeMap<String, ContainerRecord>,
    /// DRA claims (driver `cpu.steward.dev`) prepared here, by claim UID
    /// (absent before 0.3).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cpu_claims: BTreeMap<String, CpuClaim>,
}

/// One DRA claim of CPUs prepared on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuClaim {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The CPUs allocated to it (the devices of this driver it names).
    pub cpus: CpuSet,
    /// UIDs of the pods it is reserved for (`status.reservedFor`).
    pub pods: BTreeSet<String>,
}

impl Default for CacheData {
    fn default() -> Self {
        Self {
            version: SCHEMA_VERSION,
            policy: String::new(),
            next_seq: 0,
            pods: BTreeMap::new(),
            containers: BTreeMap::new(),
            cpu_claims: BTreeMap::new(),
        }
    }
}

/// How the cache came up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// No cache file: empty.
    Fresh,
    /// Loaded.
    Restored,
    /// A file was there but unusable; it was moved aside and the cache
    /// starts empty (the re-sync rebuilds it from the runtime).
    Discarded {
        /// Why.
        reason: String,
        /// Where the old file went.
        moved_to: PathBuf,
    },
}

/// The cache and its file.
#[derive(Debug)]
pub struct Cache {
    path: PathBuf,
    data: CacheData,
}

#[derive(Deserialize)]
struct VersionProbe {
    version: u32,
}

impl Cache {
    /// Load from `dir` (created if missing).
    pub fn open(dir: &Path) -> Result<(Self, LoadOutcome), ResmgrError> {
        let path = dir.join(CACHE_FILE);
        let err = |action: &'static str, e: std::io::Error| ResmgrError::Cache {
            path: path.clone(),
            action,
            source: Box::new(e),
        };
        std::fs::create_dir_all(dir).map_err(|e| err("creating the directory", e))?;
        let raw = match std::fs::read(&path) {
            Ok(raw) => raw,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((
                    Self {
                        path,
                        data: CacheData::default(),
                    },
                    LoadOutcome::Fresh,
                ));
            }
            Err(e) => return Err(err("reading", e)),
        };
        let problem = match serde_json::from_slice::<VersionProbe>(&raw) {
            Err(e) => format!("not a cache document: {e}"),
            // A newer release's cache: rebuilding from the runtime would
            // place its containers again. Refused; the file stays.
            Ok(p) if p.version > SCHEMA_VERSION => {
                return Err(ResmgrError::CacheNewer {
                    path,
                    found: p.version,
                    supported: SCHEMA_VERSION,
                });
            }
            Ok(p) if p.version != SCHEMA_VERSION => {
                format!(
                    "schema version {} (this build reads {SCHEMA_VERSION})",
                    p.version
                )
            }
            Ok(_) => match serde_json::from_slice::<CacheData>(&raw) {
                Ok(data) => {
                    info!(
                        path = %path.display(),
                        pods = data.pods.len(),
                        containers = data.containers.len(),
                        "cache restored"
                    );
                    return Ok((Self { path, data }, LoadOutcome::Restored));
                }
                Err(e) => format!("malformed: {e}"),
            },
        };
        let moved_to = path.with_extension(format!(
            "json.unusable-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default()
        ));
        std::fs::rename(&path, &moved_to).map_err(|e| err("moving it aside", e))?;
        warn!(path = %path.display(), %problem, moved_to = %moved_to.display(),
            "cache unusable; starting empty and rebuilding from the runtime");
        Ok((
            Self {
                path,
                data: CacheData::default(),
            },
            LoadOutcome::Discarded {
                reason: problem,
                moved_to,
            },
        ))
    }

    /// File path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read access.
    pub fn data(&self) -> &CacheData {
        &self.data
    }

    /// Write access; call [`Cache::save`] afterwards.
    pub fn data_mut(&mut self) -> &mut CacheData {
        &mut self.data
    }

    /// Persist: write a temporary file, fsync it, rename it over the cache
    /// file and fsync the directory, so a crash leaves the old or the new
    /// document, never a torn one.
    pub fn save(&self) -> Result<(), ResmgrError> {
        let err = |action: &'static str, source: crate::error::Cause| ResmgrError::Cache {
            path: self.path.clone(),
            action,
            source,
        };
        let bytes =
            serde_json::to_vec_pretty(&self.data).map_err(|e| err("encoding", Box::new(e)))?;
        steward_nodeio::durable::write_file(&self.path, &bytes)
            .map_err(|e| err("writing", Box::new(e)))
    }

    /// Next creation sequence number.
    pub fn next_seq(&mut self) -> u64 {
        let s = self.data.next_seq;
        self.data.next_seq += 1;
        s
    }

    /// The container ids carrying a key (normally at most one live).
    pub fn ids_for_key(&self, key: &ContainerKey) -> Vec<String> {
        self.data
            .containers
            .values()
            .filter(|c| c.name == key.container)
            .filter(|c| {
                self.data
                    .pods
                    .get(&c.pod_id)
                    .is_some_and(|p| p.uid == key.pod_uid)
            })
            .map(|c| c.id.clone())
            .collect()
    }

    /// The key of a container.
    pub fn key_of(&self, container_id: &str) -> Option<ContainerKey> {
        let c = self.data.containers.get(container_id)?;
        let p = self.data.pods.get(&c.pod_id)?;
        Some(ContainerKey {
            pod_uid: p.uid.clone(),
            container: c.name.clone(),
        })
    }

    /// Requests and assignments of every container holding resources, in
    /// creation order.
    pub fn allocated(&self) -> Vec<(String, ContainerRequest, Assignment)> {
        let mut v: Vec<_> = self
            .data
            .containers
            .values()
            .filter_map(|c| {
                let a = c.assignment.as_ref()?.to_assignment().ok()?;
                let p = self.data.pods.get(&c.pod_id)?;
                Some((c.seq, c.id.clone(), c.request.to_request(p, &c.name), a))
            })
            .collect();
        v.sort_by_key(|(seq, ..)| *seq);
        v.into_iter().map(|(_, id, r, a)| (id, r, a)).collect()
    }
}

#[cfg(test)]
mod tests;
