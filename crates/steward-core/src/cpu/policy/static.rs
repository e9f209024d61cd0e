//! The `static` policy: parity with kubelet's CPU manager static policy.
//!
//! - A container of a Guaranteed pod whose CPU request is a whole number of
//!   CPUs gets that many exclusive CPUs, picked by [`crate::cpu::Picker`] (fewest
//!   sockets/NUMA nodes, whole cores before SMT siblings). Opt out with
//!   `cpu.steward.dev/prefer-shared: "true"`.
//! - Every other container runs on the shared pool: allocatable CPUs minus
//!   all exclusive ones. When the pool shrinks or grows, every shared
//!   container is in the decision.
//! - Reserved CPUs are never exclusive and never in the shared pool; pods of
//!   `reserved_namespaces` run on them.
//! - Isolated CPUs (isolcpus) are not in the shared pool (the scheduler does
//!   not balance onto them); they are handed out as exclusive CPUs only to
//!   containers annotated `cpu.steward.dev/prefer-isolated: "true"`, which
//!   fall back to ordinary CPUs when too few isolated ones are free.
//! - The shared pool always keeps at least one CPU: an exclusive request
//!   that would empty it is refused.
//! - Memory nodes are not restricted (like kubelet's CPU manager): every
//!   node with memory.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::engine::{
    Changes, Env, Placer, PoolId, PoolView, View, exclusive_cpus_wanted, withheld,
};
use crate::cpu::model::Hints;
use crate::cpu::{
    Assignment, ContainerKey, ContainerRequest, CpuSet, Members, PolicyError, PolicyKind,
};

/// The one pool of this policy whose assignment changes.
const SHARED: PoolId = 0;

#[derive(Clone)]
pub(crate) struct StaticPlacer {
    env: Arc<Env>,
    /// online − reserved − isolated.
    allocatable: CpuSet,
    /// isolated − reserved.
    isolated: CpuSet,
    exclusive: BTreeMap<ContainerKey, CpuSet>,
    /// Union of `exclusive`.
    taken: CpuSet,
    shared_members: Members,
    reserved_members: BTreeSet<ContainerKey>,
    /// Cached shared assignment (allocatable − taken).
    shared: Assignment,
    /// Containers placed since the last `take_changes`.
    dirty: Vec<ContainerKey>,
    /// The shared pool changed since the last `take_changes`.
    shared_dirty: bool,
}

impl StaticPlacer {
    fn shared_assignment(env: &Env, allocatable: &CpuSet, taken: &CpuSet) -> Assignment {
        Assignment {
            cpus: allocatable.difference(taken),
            mems: env.all_mems.clone(),
            exclusive: false,
            pool: "shared".into(),
        }
    }

    /// Recomputes the shared pool after `taken` changed.
    fn shared_changed(&mut self) {
        self.shared.cpus = self.allocatable.difference(&self.taken);
        self.shared_dirty = true;
    }

    fn pick(
        &self,
        req: &ContainerRequest,
        hints: &Hints,
        n: usize,
        keep: Option<&Assignment>,
    ) -> Result<CpuSet, PolicyError> {
        let free_isolated = self.isolated.difference(&self.taken);
        let free_shared = self.shared.cpus.clone();
        let want_isolated = hints.prefer_isolated == Some(true);
        // a kept set must be all-free, all-isolated (when allowed) or all-shared
        if let Some(k) = keep.filter(|k| k.exclusive && k.cpus.len() == n) {
            let isolated_ok = want_isolated && k.cpus.is_subset(&free_isolated);
            let shared_ok = k.cpus.is_subset(&free_shared) && free_shared.len() > n;
            if isolated_ok || shared_ok {
                return Ok(k.cpus.clone());
            }
        }
        if want_isolated
            && free_isolated.len() >= n
            && let Some(c) = self.env.picker.take(&free_isolated, n)
        {
            return Ok(c);
        }
        if free_shared.len() <= n {
            return Err(PolicyError::Insufficient {
                key: req.key.clone(),
                reason: format!(
                    "needs {n} exclusive CPUs but the shared pool has {} and must keep at least one",
                    free_shared.len()
                ),
            });
        }
        // Held CPUs stay shared until their pod takes them; the pool must
        // keep one CPU after that too.
        let held = withheld(&free_shared, &self.env.topo, &hints.withhold);
        let avail = free_shared.difference(&held);
        if free_shared.len() <= n + held.len() {
            return Err(PolicyError::Insufficient {
                key: req.key.clone(),
                reason: format!(
                    "needs {n} exclusive CPUs; {} of the {} free are reserved for other pods and the shared pool must keep at least one",
                    held.len(),
                    free_shared.len()
                ),
            });
        }
        self.env
            .picker
            .take(&avail, n)
            .ok_or_else(|| PolicyError::Insufficient {
                key: req.key.clone(),
                reason: format!("no {n} CPUs available"),
            })
    }
}

impl Placer for StaticPlacer {
    const KIND: PolicyKind = PolicyKind::Static;

    fn build(env: Arc<Env>) -> Result<Self, PolicyError> {
        let allocatable = env
            .topo
            .online_cpus()
            .difference(&env.not_placed)
            .difference(env.topo.isolated_cpus());
        if allocatable.is_empty() {
            return Err(PolicyError::BadConfig(
                "reserved and isolated CPUs leave no CPU for the shared pool".into(),
            ));
        }
        let isolated = env.topo.isolated_cpus().difference(&env.not_placed);
        let taken = CpuSet::new();
        Ok(StaticPlacer {
            shared: Self::shared_assignment(&env, &allocatable, &taken),
            env,
            allocatable,
            isolated,
            exclusive: BTreeMap::new(),
            taken,
            shared_members: Members::default(),
            reserved_members: BTreeSet::new(),
            dirty: Vec::new(),
            shared_dirty: false,
        })
    }

    fn place(
        &mut self,
        req: &ContainerRequest,
        hints: &Hints,
        keep: Option<&Assignment>,
    ) -> Result<(), PolicyError> {
        self.dirty.push(req.key.clone());
        if self.env.is_reserved_pod(req) {
            self.reserved_members.insert(req.key.clone());
            return Ok(());
        }
        let n = exclusive_cpus_wanted(req, hints);
        if n == 0 {
            Arc::make_mut(&mut self.shared_members).insert(req.key.clone());
            return Ok(());
        }
        let cpus = self.pick(req, hints, n, keep)?;
        self.taken.union_with(&cpus);
        self.exclusive.insert(req.key.clone(), cpus);
        self.shared_changed();
        Ok(())
    }

    fn remove(&mut self, key: &ContainerKey) {
        if self.shared_members.contains(key) {
            Arc::make_mut(&mut self.shared_members).remove(key);
        }
        self.reserved_members.remove(key);
        if let Some(cpus) = self.exclusive.remove(key) {
            self.taken.difference_with(&cpus);
            self.shared_changed();
        }
    }

    fn view(&self, key: &ContainerKey) -> Option<View<'_>> {
        if let Some(cpus) = self.exclusive.get(key) {
            return Some(View {
                cpus,
                mems: &self.env.all_mems,
                exclusive: true,
                pool: "exclusive",
            });
        }
        if self.shared_members.contains(key) {
            return Some(View::of(&self.shared));
        }
        if self.reserved_members.contains(key) {
            return Some(self.env.reserved_view());
        }
        None
    }

    fn pool(&self, id: PoolId) -> Option<PoolView<'_>> {
        (id == SHARED).then(|| PoolView {
            view: View::of(&self.shared),
            members: &self.shared_members,
        })
    }

    fn take_changes(&mut self) -> Changes {
        Changes {
            keys: std::mem::take(&mut self.dirty),
            pools: if std::mem::take(&mut self.shared_dirty) {
                vec![SHARED]
            } else {
                Vec::new()
            },
        }
    }
}

#[cfg(test)]
mod tests;
