//! The model the policies decide over: CPU sets, the machine's topology,
//! what a container asks for (and how that is read from CRI and
//! annotations), and the picker that chooses CPUs by topology. Nothing here
//! knows a policy.

mod cpuset;
mod picker;
mod request;
mod topology;

#[cfg(test)]
mod tests;

pub use cpuset::{CpuSet, CpuSetError, MAX_ID};
pub use picker::Picker;
pub(crate) use request::validate_request;
pub use request::{
    ANN_BALLOON, ANN_MEMORY_TIER, ANN_PREFER_ISOLATED, ANN_PREFER_SHARED, CONTAINER_SUFFIX,
    ContainerKey, ContainerRequest, ContainerResources, CriResources, DerivedResources, Hints,
    KNOWN_ANNOTATIONS, Qos, cpu_limit_from_quota, cpu_request_from_shares, derive_from_cri,
    is_policy_annotation, qos_from_cgroup_parent, qos_of,
};
pub use topology::{Core, Cpu, MemoryKind, NumaNode, SyntheticSpec, Topology, TopologyError};
