//! CPU and memory topology model and allocation policies.
//!
//! Pure and deterministic: a [`Topology`] (built by the `steward-topology`
//! crate from sysfs, or synthetically) and a [`PolicyConfig`] go into
//! [`new_policy`]; the CRI resource manager then calls
//! [`Policy::allocate`] / [`Policy::release`] for each container and
//! applies every [`Assignment`] in the returned [`Decision`] (which lists
//! *all* containers whose CPUs or memory nodes changed, not only the one
//! asked about — e.g. when an exclusive allocation shrinks the shared pool;
//! a change of a whole pool is stated once, with the pool's members).
//!
//! Policies (see each module for details):
//! - `none`: every container gets every allocatable CPU and memory node.
//! - `static`: kubelet CPU manager static policy parity — Guaranteed pods'
//!   containers with an integer CPU request get exclusive CPUs (whole cores
//!   first, fewest NUMA nodes/sockets), everyone else shares the rest;
//!   reserved CPUs are never handed out.
//! - `topology-aware`: a pool tree (machine → socket → die → NUMA node); a
//!   container goes to the smallest pool that holds it and its memory is
//!   pinned to the pool's nodes (and the memory tiers it asks for).
//! - `balloons`: named pools of CPUs that grow and shrink with the CPU
//!   requests of the containers in them.
//!
//! Annotations (pod-wide, or `<key>.container.<name>` for one container):
//! [`ANN_PREFER_ISOLATED`], [`ANN_PREFER_SHARED`], [`ANN_MEMORY_TIER`],
//! [`ANN_BALLOON`]. Any other `*.steward.dev` key is an error.

mod alloc;
mod balloons;
mod cpuset;
mod engine;
mod none;
mod request;
mod static_policy;
mod topology;
mod topology_aware;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub use alloc::Picker;
pub use cpuset::{CpuSet, CpuSetError, MAX_ID};
pub use request::{
    ANN_BALLOON, ANN_MEMORY_TIER, ANN_PREFER_ISOLATED, ANN_PREFER_SHARED, CONTAINER_SUFFIX,
    ContainerKey, ContainerRequest, ContainerResources, CriResources, DerivedResources, Hints,
    KNOWN_ANNOTATIONS, Qos, cpu_limit_from_quota, cpu_request_from_shares, derive_from_cri,
    is_policy_annotation, qos_from_cgroup_parent, qos_of,
};
pub use topology::{Core, Cpu, MemoryKind, NumaNode, SyntheticSpec, Topology, TopologyError};

/// The CPUs and memory nodes a container runs on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Assignment {
    /// `cpuset.cpus`.
    pub cpus: CpuSet,
    /// `cpuset.mems`: NUMA node ids.
    pub mems: CpuSet,
    /// True when no other container may run on `cpus`.
    pub exclusive: bool,
    /// Name of the pool the container is in (`shared`, `reserved`,
    /// `exclusive`, a pool-tree name like `socket0/node1`, or a balloon
    /// name like `default[0]`).
    pub pool: String,
}

/// The members of a pool at the time of a decision: a shared,
/// copy-on-write snapshot of the policy's own member set, so a decision
/// naming a pool of hundreds of containers copies no key.
pub type Members = Arc<BTreeSet<ContainerKey>>;

/// A pool whose assignment changed: every one of `members` now runs on
/// `assignment`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolChange {
    pub assignment: Assignment,
    pub members: Members,
}

/// The outcome of a policy operation: every container whose assignment
/// changed, with its new assignment. A released container is not listed.
///
/// A change shared by a whole pool (e.g. the `static` shared pool shrank
/// because of an exclusive grant, a balloon grew) is stated once, in
/// [`Decision::pools`]; containers with a change of their own are in
/// [`Decision::containers`]. A container may appear in both, with the same
/// assignment (the container asked about by [`Policy::allocate`] always is
/// in `containers`). Read it per container with [`Decision::iter`],
/// [`Decision::get`] or [`Decision::expand`]: together they name exactly the
/// containers whose assignment changed (plus the one allocated).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Containers whose own assignment changed, with the new assignment.
    pub containers: BTreeMap<ContainerKey, Assignment>,
    /// Pools whose CPUs or memory nodes changed, with their members.
    pub pools: Vec<PoolChange>,
}

impl Decision {
    /// Every affected container once, with its new assignment:
    /// `containers` in key order, then the other members of each pool.
    pub fn iter(&self) -> impl Iterator<Item = (&ContainerKey, &Assignment)> + '_ {
        self.containers
            .iter()
            .chain(self.pools.iter().flat_map(move |p| {
                p.members
                    .iter()
                    .filter(move |k| !self.containers.contains_key(*k))
                    .map(move |k| (k, &p.assignment))
            }))
    }

    /// The new assignment of `key`, if the decision changes it.
    pub fn get(&self, key: &ContainerKey) -> Option<&Assignment> {
        self.containers.get(key).or_else(|| {
            self.pools
                .iter()
                .find(|p| p.members.contains(key))
                .map(|p| &p.assignment)
        })
    }

    /// True when the decision changes `key`'s assignment.
    pub fn contains(&self, key: &ContainerKey) -> bool {
        self.get(key).is_some()
    }

    /// Number of affected containers.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// True when no container is affected.
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty() && self.pools.iter().all(|p| p.members.is_empty())
    }

    /// The per-container list: every affected container with its own copy
    /// of its new assignment.
    pub fn expand(&self) -> BTreeMap<ContainerKey, Assignment> {
        self.iter().map(|(k, a)| (k.clone(), a.clone())).collect()
    }
}

impl From<BTreeMap<ContainerKey, Assignment>> for Decision {
    /// A decision listing each container on its own.
    fn from(containers: BTreeMap<ContainerKey, Assignment>) -> Decision {
        Decision {
            containers,
            pools: Vec::new(),
        }
    }
}

/// Which policy to run.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    None,
    Static,
    TopologyAware,
    Balloons,
}

impl PolicyKind {
    /// Config name: `none`, `static`, `topology-aware`, `balloons`.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::None => "none",
            PolicyKind::Static => "static",
            PolicyKind::TopologyAware => "topology-aware",
            PolicyKind::Balloons => "balloons",
        }
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(PolicyKind::None),
            "static" => Ok(PolicyKind::Static),
            "topology-aware" => Ok(PolicyKind::TopologyAware),
            "balloons" => Ok(PolicyKind::Balloons),
            other => Err(PolicyError::BadConfig(format!(
                "unknown policy {other:?}: expected none, static, topology-aware or balloons"
            ))),
        }
    }
}

/// One balloon type of the `balloons` policy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonType {
    /// Name, used by the `balloon.steward.dev/name` annotation.
    pub name: String,
    /// A balloon never has fewer CPUs (0 allowed: an empty balloon holds none).
    #[serde(default)]
    pub min_cpus: u32,
    /// A balloon never grows beyond this many CPUs (0 = unlimited).
    #[serde(default)]
    pub max_cpus: u32,
    /// Balloons of this type that exist even when empty.
    #[serde(default)]
    pub min_balloons: u32,
    /// At most this many balloons of this type (0 = unlimited).
    #[serde(default)]
    pub max_balloons: u32,
    /// Pods of these namespaces go to this type without an annotation.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Take the balloon's CPUs from the isolated set.
    #[serde(default)]
    pub prefer_isolated: bool,
}

/// Policy parameters (from the config file).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// CPUs kept for the system and kubelet; never handed to a container
    /// outside `reserved_namespaces`, never exclusive.
    pub reserved_cpus: CpuSet,
    /// Pods in these namespaces run on the reserved CPUs (when any).
    pub reserved_namespaces: Vec<String>,
    /// Memory kind overrides per NUMA node id (the discovery heuristic calls
    /// CPU-less nodes PMEM).
    pub memory_kinds: BTreeMap<u32, MemoryKind>,
    /// Balloon types (`balloons` policy). A type named `default` takes every
    /// container without a balloon annotation or namespace match; it is
    /// created implicitly when not listed.
    pub balloons: Vec<BalloonType>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            reserved_cpus: CpuSet::new(),
            reserved_namespaces: vec!["kube-system".to_string()],
            memory_kinds: BTreeMap::new(),
            balloons: Vec::new(),
        }
    }
}

/// Why a policy operation was refused. A refused operation changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("unknown annotation {key:?}: known are {known}", known = KNOWN_ANNOTATIONS.join(", "))]
    UnknownAnnotation { key: String },
    #[error("annotation {key:?} has a malformed value {value:?}: {reason}")]
    BadAnnotation {
        key: String,
        value: String,
        reason: String,
    },
    #[error("invalid request for container {key}: {reason}")]
    BadRequest { key: ContainerKey, reason: String },
    #[error("cannot place container {key}: {reason}")]
    Insufficient { key: ContainerKey, reason: String },
    #[error("invalid policy configuration: {0}")]
    BadConfig(String),
    #[error("invalid topology: {0}")]
    Topology(#[from] TopologyError),
}

/// A CPU/memory allocation policy. Every method is deterministic: the same
/// sequence of calls on the same topology and config gives the same
/// decisions. A call that returns an error changes nothing.
pub trait Policy: Send {
    /// Which policy this is.
    fn kind(&self) -> PolicyKind;
    /// Places a container (or re-places it, when its key is already
    /// known: e.g. after a resource update; its CPUs are kept when possible).
    fn allocate(&mut self, req: &ContainerRequest) -> Result<Decision, PolicyError>;
    /// Forgets a container; unknown keys are a no-op with an empty decision.
    fn release(&mut self, key: &ContainerKey) -> Decision;
    /// Current assignment of every known container.
    fn assignments(&self) -> &BTreeMap<ContainerKey, Assignment>;
    /// Replaces the state with persisted containers (after a restart).
    /// Assignments still valid are kept (exclusive CPUs first, by key);
    /// others are re-placed. The decision lists every container whose
    /// assignment differs from the persisted one.
    fn restore(
        &mut self,
        existing: Vec<(ContainerRequest, Assignment)>,
    ) -> Result<Decision, PolicyError>;
    /// Applies new parameters, re-placing containers as needed.
    fn reconfigure(&mut self, cfg: &PolicyConfig) -> Result<Decision, PolicyError>;
    /// Exclusive CPUs held for pods that do not run here yet (their
    /// reservations): pod uid → (NUMA node, CPUs). A new exclusive
    /// placement of any other pod leaves that many CPUs free on each NUMA
    /// node; a pod that already holds exclusive CPUs no longer counts.
    /// Honoured by `static` and `topology-aware`; `balloons` and `none`
    /// hand out no per-pod exclusive CPUs to hold.
    fn set_holds(&mut self, holds: BTreeMap<String, (u32, u32)>);
}

/// Builds a policy over a topology.
pub fn new_policy(
    kind: PolicyKind,
    topology: &Topology,
    cfg: &PolicyConfig,
) -> Result<Box<dyn Policy>, PolicyError> {
    Ok(match kind {
        PolicyKind::None => Box::new(engine::Engine::<none::NonePlacer>::new(topology, cfg)?),
        PolicyKind::Static => Box::new(engine::Engine::<static_policy::StaticPlacer>::new(
            topology, cfg,
        )?),
        PolicyKind::TopologyAware => Box::new(
            engine::Engine::<topology_aware::TopologyAwarePlacer>::new(topology, cfg)?,
        ),
        PolicyKind::Balloons => Box::new(engine::Engine::<balloons::BalloonsPlacer>::new(
            topology, cfg,
        )?),
    })
}
