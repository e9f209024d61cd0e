//! A policy's parameters, as the config file states them.

use std::collections::BTreeMap;

use crate::cpu::{CpuSet, MemoryKind};

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
