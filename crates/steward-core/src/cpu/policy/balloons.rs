//! The `balloons` policy: named pools ("balloons") of CPUs that grow and
//! shrink with the CPU requests of the containers in them.
//!
//! - Balloon types come from [`crate::cpu::PolicyConfig::balloons`]; a `default`
//!   type (no limits) exists even when not listed.
//! - A container goes to the type named by `balloon.steward.dev/name`, else
//!   to the type listing its namespace, else to `default`. Naming a type
//!   that does not exist is an error naming the annotation.
//! - A balloon holds `max(min_cpus, ceil(sum of requests / 1000), 1 if it
//!   has containers)` CPUs, never more than `max_cpus` (0 = unlimited).
//!   A container joins the first balloon of its type (lowest instance) that
//!   has room without growing, else the first that can grow (new CPUs are
//!   taken on the NUMA nodes the balloon already uses when possible), else a
//!   new balloon is created if `max_balloons` allows.
//! - On release a balloon shrinks (keeping its most compact CPUs); an empty
//!   balloon beyond `min_balloons` disappears.
//! - Balloons never share CPUs; every container of a balloon runs on all of
//!   its CPUs (`exclusive: false`, the pool is `type[instance]`). Reserved
//!   CPUs are never in a balloon; isolated CPUs only in `prefer_isolated`
//!   types.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::engine::{Changes, Env, Placer, PoolId, PoolView, View};
use crate::cpu::model::Hints;
use crate::cpu::{
    ANN_BALLOON, Assignment, BalloonType, ContainerKey, ContainerRequest, CpuSet, Members,
    PolicyError, PolicyKind,
};

#[derive(Debug, Clone)]
struct Balloon {
    ty: usize,
    instance: u32,
    /// `type[instance]`.
    name: String,
    cpus: CpuSet,
    /// NUMA nodes (with memory) of `cpus`.
    mems: CpuSet,
    members: Members,
    load_milli: u64,
}

impl Balloon {
    fn id(&self) -> PoolId {
        pool_id(self.ty, self.instance)
    }
}

/// A balloon's pool id: its type and instance.
fn pool_id(ty: usize, instance: u32) -> PoolId {
    ((ty as u64) << 32) | u64::from(instance)
}

#[derive(Clone)]
pub(crate) struct BalloonsPlacer {
    env: Arc<Env>,
    types: Arc<Vec<BalloonType>>,
    /// online − reserved − isolated.
    allocatable: CpuSet,
    /// isolated − reserved.
    isolated: CpuSet,
    balloons: Vec<Balloon>,
    /// Union of balloon CPUs.
    used: CpuSet,
    member_of: BTreeMap<ContainerKey, (usize, u32, u64)>,
    reserved_members: BTreeSet<ContainerKey>,
    /// Containers placed since the last `take_changes`.
    dirty: Vec<ContainerKey>,
    /// Balloons resized since the last `take_changes`.
    dirty_pools: Vec<PoolId>,
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 63
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

impl BalloonsPlacer {
    fn want(ty: &BalloonType, load_milli: u64, members: usize) -> usize {
        let by_load = load_milli.div_ceil(1000) as usize;
        let floor = usize::from(members > 0);
        (ty.min_cpus as usize).max(by_load).max(floor)
    }

    fn fits_max(ty: &BalloonType, n: usize) -> bool {
        ty.max_cpus == 0 || n <= ty.max_cpus as usize
    }

    fn free_for(&self, ty: &BalloonType) -> (CpuSet, CpuSet) {
        let free = self.allocatable.difference(&self.used);
        let free_iso = if ty.prefer_isolated {
            self.isolated.difference(&self.used)
        } else {
            CpuSet::new()
        };
        (free, free_iso)
    }

    /// `extra` more CPUs for a balloon currently on `near` (may be empty),
    /// preferring `hint` CPUs, then the NUMA nodes of `near`.
    fn grow_cpus(
        &self,
        ty: &BalloonType,
        near: &CpuSet,
        extra: usize,
        hint: Option<&CpuSet>,
    ) -> Option<CpuSet> {
        if extra == 0 {
            return Some(CpuSet::new());
        }
        let (free, free_iso) = self.free_for(ty);
        let mut sources = Vec::new();
        if let Some(h) = hint {
            sources.push(h.intersection(&free.union(&free_iso)));
        }
        if !free_iso.is_empty() {
            sources.push(free_iso.clone());
        }
        if !near.is_empty() {
            let mut local = CpuSet::new();
            for n in self.env.topo.nodes_of(near).iter() {
                local.union_with(&self.env.topo.node_cpus(n));
            }
            sources.push(local.intersection(&free));
        }
        sources.push(free);
        sources
            .iter()
            .filter(|s| s.len() >= extra)
            .find_map(|s| self.env.picker.take(s, extra))
    }

    /// Sets balloon `b`'s CPUs; its pool becomes dirty.
    fn set_cpus(&mut self, b: usize, cpus: CpuSet) {
        let mut mems = self
            .env
            .topo
            .nodes_of(&cpus)
            .intersection(&self.env.all_mems);
        if mems.is_empty() {
            mems = self.env.all_mems.clone();
        }
        let bl = &mut self.balloons[b];
        bl.cpus = cpus;
        bl.mems = mems;
        self.dirty_pools.push(bl.id());
    }

    /// Grows or shrinks balloon `b` to `want` CPUs; false (and no change)
    /// when it cannot grow.
    fn resize(&mut self, b: usize, want: usize, hint: Option<&CpuSet>) -> bool {
        let ty = &self.types[self.balloons[b].ty];
        let have = self.balloons[b].cpus.len();
        if want > have {
            match self.grow_cpus(ty, &self.balloons[b].cpus, want - have, hint) {
                Some(more) => {
                    self.used.union_with(&more);
                    let cpus = self.balloons[b].cpus.union(&more);
                    self.set_cpus(b, cpus);
                    true
                }
                None => false,
            }
        } else if want < have {
            let keep = self
                .env
                .picker
                .take(&self.balloons[b].cpus, want)
                .unwrap_or_else(|| self.balloons[b].cpus.clone());
            let freed = self.balloons[b].cpus.difference(&keep);
            self.used.difference_with(&freed);
            self.set_cpus(b, keep);
            true
        } else {
            true
        }
    }

    fn type_of(&self, req: &ContainerRequest, hints: &Hints) -> Result<usize, PolicyError> {
        if let Some(name) = &hints.balloon {
            return self
                .types
                .iter()
                .position(|t| &t.name == name)
                .ok_or_else(|| PolicyError::BadAnnotation {
                    key: ANN_BALLOON.to_string(),
                    value: name.clone(),
                    reason: format!(
                        "no balloon type of that name (configured: {})",
                        self.types
                            .iter()
                            .map(|t| t.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
        }
        if let Some(i) = self
            .types
            .iter()
            .position(|t| t.namespaces.contains(&req.pod_namespace))
        {
            return Ok(i);
        }
        self.types
            .iter()
            .position(|t| t.name == "default")
            .ok_or_else(|| PolicyError::BadConfig("no default balloon type".into()))
    }

    fn new_balloon(
        &mut self,
        ty: usize,
        hint: Option<&CpuSet>,
        instance: Option<u32>,
    ) -> Option<usize> {
        let t = &self.types[ty];
        let count = self.balloons.iter().filter(|b| b.ty == ty).count();
        if t.max_balloons != 0 && count >= t.max_balloons as usize {
            return None;
        }
        let taken: BTreeSet<u32> = self
            .balloons
            .iter()
            .filter(|b| b.ty == ty)
            .map(|b| b.instance)
            .collect();
        let instance = match instance {
            Some(i) if !taken.contains(&i) => i,
            _ => (0..).find(|i| !taken.contains(i)).unwrap_or(0),
        };
        let cpus = self.grow_cpus(t, &CpuSet::new(), t.min_cpus as usize, hint)?;
        self.used.union_with(&cpus);
        self.balloons.push(Balloon {
            ty,
            instance,
            name: format!("{}[{instance}]", t.name),
            cpus: CpuSet::new(),
            mems: CpuSet::new(),
            members: Members::default(),
            load_milli: 0,
        });
        let last = self.balloons.len() - 1;
        self.set_cpus(last, cpus);
        self.balloons.sort_by_key(|b| (b.ty, b.instance));
        self.balloons
            .iter()
            .position(|b| b.ty == ty && b.instance == instance)
    }

    fn join(&mut self, b: usize, key: &ContainerKey, milli: u64, hint: Option<&CpuSet>) -> bool {
        let bl = &self.balloons[b];
        let ty = &self.types[bl.ty];
        let want = Self::want(ty, bl.load_milli + milli, bl.members.len() + 1);
        if !Self::fits_max(ty, want) || !self.resize(b, want, hint) {
            return false;
        }
        let bl = &mut self.balloons[b];
        Arc::make_mut(&mut bl.members).insert(key.clone());
        bl.load_milli += milli;
        self.member_of
            .insert(key.clone(), (bl.ty, bl.instance, milli));
        self.dirty.push(key.clone());
        true
    }

    fn index(&self, ty: usize, instance: u32) -> Option<usize> {
        self.balloons
            .iter()
            .position(|b| b.ty == ty && b.instance == instance)
    }
}

impl Placer for BalloonsPlacer {
    const KIND: PolicyKind = PolicyKind::Balloons;

    fn build(env: Arc<Env>) -> Result<Self, PolicyError> {
        let mut types = env.cfg.balloons.clone();
        let mut names = BTreeSet::new();
        let mut namespaces = BTreeMap::new();
        for t in &types {
            if !valid_name(&t.name) {
                return Err(PolicyError::BadConfig(format!(
                    "balloon type name {:?} must be 1-63 characters of [A-Za-z0-9._-]",
                    t.name
                )));
            }
            if !names.insert(t.name.clone()) {
                return Err(PolicyError::BadConfig(format!(
                    "balloon type {:?} is defined twice",
                    t.name
                )));
            }
            if t.max_cpus != 0 && t.min_cpus > t.max_cpus {
                return Err(PolicyError::BadConfig(format!(
                    "balloon type {:?}: min_cpus {} exceeds max_cpus {}",
                    t.name, t.min_cpus, t.max_cpus
                )));
            }
            if t.max_balloons != 0 && t.min_balloons > t.max_balloons {
                return Err(PolicyError::BadConfig(format!(
                    "balloon type {:?}: min_balloons {} exceeds max_balloons {}",
                    t.name, t.min_balloons, t.max_balloons
                )));
            }
            for ns in &t.namespaces {
                if let Some(other) = namespaces.insert(ns.clone(), t.name.clone()) {
                    return Err(PolicyError::BadConfig(format!(
                        "namespace {ns:?} is claimed by balloon types {other:?} and {:?}",
                        t.name
                    )));
                }
            }
        }
        if !names.contains("default") {
            types.push(BalloonType {
                name: "default".into(),
                min_cpus: 0,
                max_cpus: 0,
                min_balloons: 0,
                max_balloons: 0,
                namespaces: Vec::new(),
                prefer_isolated: false,
            });
        }
        let allocatable = env
            .topo
            .online_cpus()
            .difference(&env.not_placed)
            .difference(env.topo.isolated_cpus());
        if allocatable.is_empty() {
            return Err(PolicyError::BadConfig(
                "reserved and isolated CPUs leave no CPU for balloons".into(),
            ));
        }
        let mut p = BalloonsPlacer {
            isolated: env.topo.isolated_cpus().difference(&env.not_placed),
            env,
            types: Arc::new(types),
            allocatable,
            balloons: Vec::new(),
            used: CpuSet::new(),
            member_of: BTreeMap::new(),
            reserved_members: BTreeSet::new(),
            dirty: Vec::new(),
            dirty_pools: Vec::new(),
        };
        for ty in 0..p.types.len() {
            for _ in 0..p.types[ty].min_balloons {
                if p.new_balloon(ty, None, None).is_none() {
                    return Err(PolicyError::BadConfig(format!(
                        "not enough CPUs for {} balloons of type {:?} with {} CPUs each",
                        p.types[ty].min_balloons, p.types[ty].name, p.types[ty].min_cpus
                    )));
                }
            }
        }
        Ok(p)
    }

    fn place(
        &mut self,
        req: &ContainerRequest,
        hints: &Hints,
        keep: Option<&Assignment>,
    ) -> Result<(), PolicyError> {
        if self.env.is_reserved_pod(req) {
            self.reserved_members.insert(req.key.clone());
            self.dirty.push(req.key.clone());
            return Ok(());
        }
        let ty = self.type_of(req, hints)?;
        let milli = req.cpu_request_milli;
        // an earlier balloon "type[i]" of the same type: rejoin it
        let kept = keep.and_then(|k| {
            let (name, rest) = k.pool.split_once('[')?;
            let i: u32 = rest.strip_suffix(']')?.parse().ok()?;
            (name == self.types[ty].name).then_some((i, k.cpus.clone()))
        });
        if let Some((i, cpus)) = &kept {
            let b = match self.index(ty, *i) {
                Some(b) => Some(b),
                None => self.new_balloon(ty, Some(cpus), Some(*i)),
            };
            if let Some(b) = b
                && self.join(b, &req.key, milli, Some(cpus))
            {
                return Ok(());
            }
        }
        let t = &self.types[ty];
        let mut order: Vec<usize> = (0..self.balloons.len())
            .filter(|&b| self.balloons[b].ty == ty)
            .collect();
        order.sort_by_key(|&b| {
            let bl = &self.balloons[b];
            let want = Self::want(t, bl.load_milli + milli, bl.members.len() + 1);
            (want > bl.cpus.len(), bl.instance)
        });
        for b in order {
            if self.join(b, &req.key, milli, None) {
                return Ok(());
            }
        }
        if let Some(b) = self.new_balloon(ty, None, None) {
            if self.join(b, &req.key, milli, None) {
                return Ok(());
            }
            // the new balloon cannot take it either: undo its creation
            let gone = self.balloons.remove(b);
            self.used.difference_with(&gone.cpus);
        }
        Err(PolicyError::Insufficient {
            key: req.key.clone(),
            reason: format!(
                "no balloon of type {:?} can take {milli}m more and no new one can be created",
                self.types[ty].name
            ),
        })
    }

    fn remove(&mut self, key: &ContainerKey) {
        self.reserved_members.remove(key);
        let Some((ty, instance, milli)) = self.member_of.remove(key) else {
            return;
        };
        let Some(b) = self.index(ty, instance) else {
            return;
        };
        Arc::make_mut(&mut self.balloons[b].members).remove(key);
        self.balloons[b].load_milli -= milli;
        let count = self.balloons.iter().filter(|x| x.ty == ty).count();
        if self.balloons[b].members.is_empty() && count > self.types[ty].min_balloons as usize {
            let gone = self.balloons.remove(b);
            self.used.difference_with(&gone.cpus);
        } else {
            let bl = &self.balloons[b];
            let want = Self::want(&self.types[ty], bl.load_milli, bl.members.len());
            // shrinking always succeeds
            self.resize(b, want, None);
        }
    }

    fn view(&self, key: &ContainerKey) -> Option<View<'_>> {
        if self.reserved_members.contains(key) {
            return Some(self.env.reserved_view());
        }
        let (ty, instance, _) = self.member_of.get(key)?;
        let b = &self.balloons[self.index(*ty, *instance)?];
        Some(View {
            cpus: &b.cpus,
            mems: &b.mems,
            exclusive: false,
            pool: &b.name,
        })
    }

    fn pool(&self, id: PoolId) -> Option<PoolView<'_>> {
        let b = self.balloons.iter().find(|b| b.id() == id)?;
        Some(PoolView {
            view: View {
                cpus: &b.cpus,
                mems: &b.mems,
                exclusive: false,
                pool: &b.name,
            },
            members: &b.members,
        })
    }

    fn take_changes(&mut self) -> Changes {
        Changes {
            keys: std::mem::take(&mut self.dirty),
            pools: std::mem::take(&mut self.dirty_pools),
        }
    }
}

#[cfg(test)]
mod tests;
