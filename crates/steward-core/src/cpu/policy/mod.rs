//! The allocation policies, one file per policy, and what they share.
//!
//! - [`Policy`] is what callers see: `allocate`, `release`, `restore`,
//!   `reconfigure`, `set_holds`. One type implements it for every policy:
//!   `Engine<P>` (`engine.rs`), which keeps the requests and
//!   the materialised assignments, validates requests, makes re-placement
//!   atomic and reports only what changed.
//! - A policy is a `Placer` (in `engine.rs`): build from the environment
//!   (topology, config, picker, reserved CPUs), `place` / `remove` one
//!   container, `view` a container's assignment, name the `pool`s whose
//!   assignment changed and `take_changes` since the last call. A placer
//!   changes nothing when `place` fails; the engine relies on it.
//!
//! The policies: `none.rs` (every container on every non-reserved CPU: the
//! smallest placer, and the template for a new one), `static.rs` (kubelet
//! CPU manager parity), `topology_aware.rs` (a pool tree), `balloons.rs`
//! (pools that grow and shrink).
//!
//! To add a policy `foo`:
//! 1. write `foo.rs` with a `FooPlacer` implementing `Placer` (start from a
//!    copy of `none.rs`), and declare it below;
//! 2. add `PolicyKind::Foo` with its config name (`as_str`, `from_str`);
//! 3. add the arm `PolicyKind::Foo => Engine::<foo::FooPlacer>` to
//!    [`new_policy`];
//! 4. run the property tests of `tests.rs` against it (they check the
//!    invariants every policy keeps: no CPU both exclusive and shared, no
//!    reserved CPU outside reserved pods, decisions that name exactly what
//!    changed), and give it a `foo/tests.rs` of its own.
//!
//! Parameters a policy needs go in [`PolicyConfig`] (`config.rs`); what it
//! decides is an [`Assignment`] per container, reported in a [`Decision`]
//! (`decision.rs`).

mod balloons;
mod claims;
mod config;
mod decision;
mod engine;
mod none;
mod r#static;
mod topology_aware;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

pub use claims::CLAIM_POOL;
pub use config::{BalloonType, PolicyConfig};
pub use decision::{Assignment, Decision, Members, PoolChange};

use crate::cpu::{ContainerKey, ContainerRequest, PolicyError, Topology};
use engine::Engine;

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
    /// The CPUs prepared for DRA claims on this node: claim UID → CPUs.
    /// They leave every pool the policy hands out (containers sharing them
    /// move off); containers naming a claim run on its CPUs. Refused,
    /// changing nothing, when a claim names a CPU that is offline,
    /// reserved, pinned exclusively by the policy or another claim's. A
    /// container whose claims are all gone is placed as any other.
    fn set_claims(
        &mut self,
        claims: BTreeMap<String, crate::cpu::CpuSet>,
    ) -> Result<Decision, PolicyError>;
    /// The claims last set.
    fn claims(&self) -> &BTreeMap<String, crate::cpu::CpuSet>;
}

/// Builds a policy over a topology.
pub fn new_policy(
    kind: PolicyKind,
    topology: &Topology,
    cfg: &PolicyConfig,
) -> Result<Box<dyn Policy>, PolicyError> {
    Ok(match kind {
        PolicyKind::None => Box::new(Engine::<none::NonePlacer>::new(topology, cfg)?),
        PolicyKind::Static => Box::new(Engine::<r#static::StaticPlacer>::new(topology, cfg)?),
        PolicyKind::TopologyAware => Box::new(Engine::<topology_aware::TopologyAwarePlacer>::new(
            topology, cfg,
        )?),
        PolicyKind::Balloons => Box::new(Engine::<balloons::BalloonsPlacer>::new(topology, cfg)?),
    })
}
