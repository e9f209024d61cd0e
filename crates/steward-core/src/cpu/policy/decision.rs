//! What a policy decides: the [`Assignment`] of one container and the
//! [`Decision`] listing every container (or pool of containers) whose
//! assignment changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::cpu::{ContainerKey, CpuSet};

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
/// assignment (the container asked about by [`crate::cpu::Policy::allocate`] always is
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
