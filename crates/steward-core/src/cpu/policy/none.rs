//! The `none` policy: no placement decisions. Every container runs on all
//! online CPUs except the reserved ones (pods of reserved namespaces on the
//! reserved CPUs) and may use every memory node — what the kernel would do
//! without a resource manager, minus the reservation.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::engine::{Changes, Env, Placer, PoolId, PoolView, View};
use crate::cpu::model::Hints;
use crate::cpu::{Assignment, ContainerKey, ContainerRequest, PolicyError, PolicyKind};

#[derive(Clone)]
pub(crate) struct NonePlacer {
    env: Arc<Env>,
    shared: Assignment,
    reserved_pods: BTreeSet<ContainerKey>,
    placed: BTreeSet<ContainerKey>,
    dirty: Vec<ContainerKey>,
}

impl Placer for NonePlacer {
    const KIND: PolicyKind = PolicyKind::None;

    fn build(env: Arc<Env>) -> Result<Self, PolicyError> {
        let cpus = env.topo.online_cpus().difference(&env.not_placed);
        if cpus.is_empty() {
            return Err(PolicyError::BadConfig(
                "reserved_cpus leave no CPU for containers".into(),
            ));
        }
        Ok(NonePlacer {
            shared: Assignment {
                cpus,
                mems: env.all_mems.clone(),
                exclusive: false,
                pool: "shared".into(),
            },
            env,
            reserved_pods: BTreeSet::new(),
            placed: BTreeSet::new(),
            dirty: Vec::new(),
        })
    }

    fn place(
        &mut self,
        req: &ContainerRequest,
        _hints: &Hints,
        _keep: Option<&Assignment>,
    ) -> Result<(), PolicyError> {
        if self.env.is_reserved_pod(req) {
            self.reserved_pods.insert(req.key.clone());
        }
        self.placed.insert(req.key.clone());
        self.dirty.push(req.key.clone());
        Ok(())
    }

    fn remove(&mut self, key: &ContainerKey) {
        self.placed.remove(key);
        self.reserved_pods.remove(key);
    }

    fn view(&self, key: &ContainerKey) -> Option<View<'_>> {
        if !self.placed.contains(key) {
            None
        } else if self.reserved_pods.contains(key) {
            Some(self.env.reserved_view())
        } else {
            Some(View::of(&self.shared))
        }
    }

    fn pool(&self, _id: PoolId) -> Option<PoolView<'_>> {
        // the pools of this policy never change
        None
    }

    fn take_changes(&mut self) -> Changes {
        Changes {
            keys: std::mem::take(&mut self.dirty),
            pools: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests;
