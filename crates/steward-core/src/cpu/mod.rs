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
//! Two parts:
//! - `model/`: what is decided over — [`CpuSet`], [`Topology`], the
//!   container's request ([`ContainerRequest`], [`Qos`], annotations) and
//!   the topology-aware CPU [`Picker`]. It knows no policy.
//! - `policy/`: the [`Policy`] trait, the engine every policy shares, and
//!   one file per policy; its module doc says how to add one.
//!
//! Policies:
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

pub mod devices;
mod model;
mod policy;

#[cfg(test)]
mod testing;

pub use model::{
    ANN_BALLOON, ANN_MEMORY_TIER, ANN_PREFER_ISOLATED, ANN_PREFER_SHARED, CONTAINER_SUFFIX,
    ContainerKey, ContainerRequest, ContainerResources, Core, Cpu, CpuSet, CpuSetError,
    CriResources, DerivedResources, Hints, KNOWN_ANNOTATIONS, MAX_ID, MemoryKind, NumaNode, Picker,
    Qos, SyntheticSpec, Topology, TopologyError, cpu_limit_from_quota, cpu_request_from_shares,
    derive_from_cri, is_policy_annotation, qos_from_cgroup_parent, qos_of,
};
pub use policy::{
    Assignment, BalloonType, CLAIM_POOL, Decision, Members, Policy, PolicyConfig, PolicyKind,
    PoolChange, new_policy,
};

/// Why a policy operation was refused. A refused operation changes nothing.
///
/// It lives at the root because both parts speak it: the model refuses a
/// malformed request or annotation, a policy a placement.
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
    #[error("CPU claim {claim} cannot be prepared: {reason}")]
    ClaimRefused { claim: String, reason: String },
    #[error("invalid topology: {0}")]
    Topology(#[from] TopologyError),
}
