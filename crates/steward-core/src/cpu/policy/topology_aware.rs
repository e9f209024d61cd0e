//! The `topology-aware` policy.
//!
//! The machine is a tree of pools: `root` → `socketS` → `socketS/dieD` →
//! `nodeN` (levels with a single child are folded into their parent). A
//! pool's CPUs are the online CPUs under it minus reserved and isolated
//! ones; its memory is its NUMA nodes plus every CPU-less (PMEM/CXL/HBM)
//! node whose nearest CPU node is under it.
//!
//! A container goes to the *smallest* pool that can hold it (deepest
//! first), and among pools of a depth:
//! - exclusive requests to the tightest fit (fewest free CPUs), keeping big
//!   holes for big requests;
//! - shared requests to the pool with the most free shared capacity,
//!   spreading load.
//!
//! Exclusive CPUs: Guaranteed containers with an integer CPU request (as in
//! `static`), unless `cpu.steward.dev/prefer-shared: "true"`; a Burstable
//! container with ≥ 1000m annotated `prefer-shared: "false"` gets
//! `floor(request)` exclusive CPUs. With `cpu.steward.dev/prefer-isolated:
//! "true"` exclusive CPUs come from the pool's isolated CPUs when enough are
//! free. Everyone else shares the pool's non-exclusive CPUs.
//!
//! Capacity rule, checked for every pool Q after each placement: the CPU
//! requests of shared containers placed in Q or below fit Q's free shared
//! CPUs (`sum(milli) ≤ 1000 × |shared CPUs of Q|`), Q keeps at least one
//! shared CPU while such containers exist, and memory requests placed in Q
//! or below fit Q's memory (when known). A placement breaking it is tried
//! in the next pool; when none works the request is refused.
//!
//! Memory nodes (`cpuset.mems`): the pool's nodes of the tiers asked by
//! `memory.steward.dev/tier` (default `dram`); a pool without memory of an
//! asked tier cannot take the container.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::engine::{
    Changes, Env, Placer, PoolId, PoolView, View, exclusive_cpus_wanted, withheld,
};
use crate::cpu::model::Hints;
use crate::cpu::{
    Assignment, ContainerKey, ContainerRequest, CpuSet, Members, MemoryKind, PolicyError,
    PolicyKind, Qos,
};

#[derive(Debug, Clone)]
struct Pool {
    name: String,
    depth: usize,
    /// Pools under this one, itself included.
    subtree: Vec<usize>,
    /// This pool and its ancestors.
    up: Vec<usize>,
    /// Allocatable (non-reserved, non-isolated) CPUs.
    cpus: CpuSet,
    /// Isolated, non-reserved CPUs.
    isolated: CpuSet,
    /// Memory nodes by kind.
    mems: BTreeMap<MemoryKind, CpuSet>,
    /// Bytes of memory of all `mems` (0 = unknown: unlimited).
    mem_capacity: u64,
}

#[derive(Debug, Clone)]
struct Grant {
    pool: usize,
    /// Exclusive CPUs (empty for shared grants).
    exclusive: CpuSet,
    milli: u64,
    memory: u64,
    /// Memory nodes of the asked tiers in the pool.
    mems: CpuSet,
}

/// The shared containers of one pool with the same memory nodes: they all
/// run on one assignment.
#[derive(Debug, Clone)]
struct ShareGroup {
    pool: usize,
    mems: CpuSet,
    members: Members,
}

#[derive(Clone)]
pub(crate) struct TopologyAwarePlacer {
    env: Arc<Env>,
    pools: Arc<Vec<Pool>>,
    grants: BTreeMap<ContainerKey, Grant>,
    reserved_members: BTreeMap<ContainerKey, ()>,
    /// Union of exclusive grants.
    taken: CpuSet,
    /// Per pool: shared CPUs now (cpus − taken).
    shared_cpus: Vec<CpuSet>,
    /// Per pool, summed over its subtree: shared milli, shared container
    /// count, memory bytes.
    load_milli: Vec<u64>,
    load_count: Vec<u64>,
    load_mem: Vec<u64>,
    /// Shared containers by pool and memory nodes; the index is the pool
    /// id given to the engine (groups are never removed, only emptied).
    groups: Vec<ShareGroup>,
    /// Containers placed since the last `take_changes`.
    dirty: Vec<ContainerKey>,
    /// Groups whose pool's shared CPUs changed since the last
    /// `take_changes`.
    dirty_groups: Vec<PoolId>,
}

fn build_pools(env: &Env) -> Vec<Pool> {
    let topo = &env.topo;
    let usable = topo
        .online_cpus()
        .difference(&env.not_placed)
        .difference(topo.isolated_cpus());
    let isolated = topo.isolated_cpus().difference(&env.not_placed);
    // attach CPU-less nodes to the nearest node with CPUs
    let cpu_nodes: Vec<u32> = topo
        .nodes()
        .filter(|n| !topo.node_cpus(n.id).is_empty())
        .map(|n| n.id)
        .collect();
    let mut attached: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for n in topo.nodes().filter(|n| topo.node_cpus(n.id).is_empty()) {
        if let Some(best) = cpu_nodes
            .iter()
            .min_by_key(|&&c| (topo.distance(c, n.id), c))
        {
            attached.entry(*best).or_default().push(n.id);
        }
    }
    // (name, depth, parent, numa nodes)
    let mut raw: Vec<(String, usize, Option<usize>, Vec<u32>)> = Vec::new();
    let tree = topo.node_tree();
    let all: Vec<u32> = tree
        .values()
        .flat_map(|d| d.values().flat_map(|n| n.iter().copied()))
        .collect();
    raw.push(("root".into(), 0, None, all));
    for (socket, dies) in &tree {
        let socket_nodes: Vec<u32> = dies.values().flat_map(|n| n.iter().copied()).collect();
        let mut parent = 0;
        if tree.len() > 1 {
            raw.push((format!("socket{socket}"), 1, Some(0), socket_nodes.clone()));
            parent = raw.len() - 1;
        }
        for (die, nodes) in dies {
            let mut dparent = parent;
            if dies.len() > 1 {
                let depth = raw[parent].1 + 1;
                raw.push((
                    format!("socket{socket}/die{die}"),
                    depth,
                    Some(parent),
                    nodes.iter().copied().collect(),
                ));
                dparent = raw.len() - 1;
            }
            // a single node is folded into its die / socket / root pool
            if nodes.len() > 1 {
                for n in nodes {
                    let depth = raw[dparent].1 + 1;
                    raw.push((format!("node{n}"), depth, Some(dparent), vec![*n]));
                }
            }
        }
    }
    let count = raw.len();
    let mut pools: Vec<Pool> = raw
        .iter()
        .map(|(name, depth, _, nodes)| {
            let mut cpus = CpuSet::new();
            let mut mems: BTreeMap<MemoryKind, CpuSet> = BTreeMap::new();
            let mut mem_capacity = 0u64;
            for n in nodes {
                cpus.union_with(&topo.node_cpus(*n));
                let extra = attached.get(n).cloned().unwrap_or_default();
                for m in std::iter::once(*n).chain(extra) {
                    if let Some(node) = topo.node(m) {
                        mems.entry(node.kind).or_default().insert(m);
                        mem_capacity = mem_capacity.saturating_add(node.memory_bytes);
                    }
                }
            }
            Pool {
                name: name.clone(),
                depth: *depth,
                subtree: Vec::new(),
                up: Vec::new(),
                isolated: cpus.intersection(&isolated),
                cpus: cpus.intersection(&usable),
                mems,
                mem_capacity,
            }
        })
        .collect();
    for i in 0..count {
        let mut a = Some(i);
        while let Some(p) = a {
            pools[i].up.push(p);
            pools[p].subtree.push(i);
            a = raw[p].2;
        }
    }
    pools
}

/// What a request needs, resolved against hints.
struct Need {
    exclusive: usize,
    milli: u64,
    memory: u64,
    tiers: Vec<MemoryKind>,
    prefer_isolated: bool,
    /// CPUs per NUMA node held for other pods' reservations.
    withhold: BTreeMap<u32, usize>,
}

impl TopologyAwarePlacer {
    fn need(req: &ContainerRequest, hints: &Hints) -> Need {
        let mut exclusive = exclusive_cpus_wanted(req, hints);
        if exclusive == 0
            && req.qos == Qos::Burstable
            && hints.prefer_shared == Some(false)
            && req.cpu_request_milli >= 1000
        {
            exclusive = (req.cpu_request_milli / 1000) as usize;
        }
        Need {
            exclusive,
            milli: if exclusive > 0 {
                0
            } else {
                req.cpu_request_milli
            },
            memory: req.memory_request_bytes,
            tiers: hints
                .memory_tiers
                .clone()
                .unwrap_or_else(|| vec![MemoryKind::Dram]),
            prefer_isolated: hints.prefer_isolated == Some(true),
            withhold: hints.withhold.clone(),
        }
    }

    fn tier_mems(pool: &Pool, tiers: &[MemoryKind]) -> CpuSet {
        let mut out = CpuSet::new();
        for t in tiers {
            if let Some(s) = pool.mems.get(t) {
                out.union_with(s);
            }
        }
        out
    }

    /// Does the capacity rule hold if `extra` CPUs become exclusive and a
    /// grant of `milli`/`memory` (counting one shared container when
    /// `shared`) lands in pool `p`?
    fn fits(&self, p: usize, extra: &CpuSet, shared: bool, milli: u64, memory: u64) -> bool {
        for (q, pool) in self.pools.iter().enumerate() {
            let inside = pool.subtree.contains(&p);
            let free = self.shared_cpus[q].len() - self.shared_cpus[q].intersection_len(extra);
            let load = self.load_milli[q] + if inside { milli } else { 0 };
            let count = self.load_count[q] + u64::from(inside && shared);
            if load > free as u64 * 1000 || (count > 0 && free == 0) {
                return false;
            }
            let mem = self.load_mem[q] + if inside { memory } else { 0 };
            if pool.mem_capacity > 0 && mem > pool.mem_capacity {
                return false;
            }
        }
        true
    }

    /// Exclusive CPUs for `need` in pool `p`, if the pool can give them.
    fn pick_in(&self, p: usize, need: &Need, keep: Option<&CpuSet>) -> Option<CpuSet> {
        let pool = &self.pools[p];
        let n = need.exclusive;
        let free_iso = pool.isolated.difference(&self.taken);
        let free = &self.shared_cpus[p];
        let ok = |c: &CpuSet| self.fits(p, c, false, 0, need.memory);
        if let Some(k) = keep {
            let from_iso = need.prefer_isolated && k.is_subset(&free_iso);
            if k.len() == n && (from_iso || k.is_subset(free)) && ok(k) {
                return Some(k.clone());
            }
        }
        if need.prefer_isolated
            && free_iso.len() >= n
            && let Some(c) = self.env.picker.take(&free_iso, n)
            && ok(&c)
        {
            return Some(c);
        }
        // Held CPUs stay shared until their pod takes them: the pools must
        // fit without them too.
        let held = withheld(free, &self.env.topo, &need.withhold);
        let avail = free.difference(&held);
        if avail.len() < n {
            return None;
        }
        self.env
            .picker
            .take(&avail, n)
            .filter(|c| ok(c) && (held.is_empty() || ok(&c.union(&held))))
    }

    fn commit(&mut self, key: &ContainerKey, grant: Grant) {
        let shared = grant.exclusive.is_empty();
        for &a in &self.pools[grant.pool].up {
            if shared {
                self.load_milli[a] += grant.milli;
                self.load_count[a] += 1;
            }
            self.load_mem[a] += grant.memory;
        }
        self.dirty.push(key.clone());
        if shared {
            let g = match self
                .groups
                .iter()
                .position(|g| g.pool == grant.pool && g.mems == grant.mems)
            {
                Some(g) => g,
                None => {
                    self.groups.push(ShareGroup {
                        pool: grant.pool,
                        mems: grant.mems.clone(),
                        members: Members::default(),
                    });
                    self.groups.len() - 1
                }
            };
            Arc::make_mut(&mut self.groups[g].members).insert(key.clone());
        } else {
            self.taken.union_with(&grant.exclusive);
            for q in 0..self.pools.len() {
                if self.pools[q].cpus.intersection_len(&grant.exclusive) > 0 {
                    self.shared_cpus[q].difference_with(&grant.exclusive);
                    self.shared_changed(q);
                }
            }
        }
        self.grants.insert(key.clone(), grant);
    }

    /// The shared CPUs of pool `q` changed: so did its groups.
    fn shared_changed(&mut self, q: usize) {
        for (i, g) in self.groups.iter().enumerate() {
            if g.pool == q {
                self.dirty_groups.push(i as PoolId);
            }
        }
    }
}

impl Placer for TopologyAwarePlacer {
    const KIND: PolicyKind = PolicyKind::TopologyAware;

    fn build(env: Arc<Env>) -> Result<Self, PolicyError> {
        let pools = build_pools(&env);
        if pools.first().is_none_or(|p| p.cpus.is_empty()) {
            return Err(PolicyError::BadConfig(
                "reserved and isolated CPUs leave no CPU for containers".into(),
            ));
        }
        let n = pools.len();
        Ok(TopologyAwarePlacer {
            shared_cpus: pools.iter().map(|p| p.cpus.clone()).collect(),
            pools: Arc::new(pools),
            env,
            grants: BTreeMap::new(),
            reserved_members: BTreeMap::new(),
            taken: CpuSet::new(),
            load_milli: vec![0; n],
            load_count: vec![0; n],
            load_mem: vec![0; n],
            groups: Vec::new(),
            dirty: Vec::new(),
            dirty_groups: Vec::new(),
        })
    }

    fn place(
        &mut self,
        req: &ContainerRequest,
        hints: &Hints,
        keep: Option<&Assignment>,
    ) -> Result<(), PolicyError> {
        if self.env.is_reserved_pod(req) {
            self.reserved_members.insert(req.key.clone(), ());
            self.dirty.push(req.key.clone());
            return Ok(());
        }
        let need = Self::need(req, hints);
        let has_tier = |p: usize| !Self::tier_mems(&self.pools[p], &need.tiers).is_empty();
        // a kept assignment: same pool, and for exclusive the same CPUs
        if let Some(k) = keep
            && let Some(p) = self.pools.iter().position(|p| p.name == k.pool)
            && has_tier(p)
        {
            if need.exclusive > 0 && k.exclusive {
                if let Some(c) = self.pick_in(p, &need, Some(&k.cpus))
                    && c == k.cpus
                {
                    self.commit(&req.key, self.grant(p, c, &need));
                    return Ok(());
                }
            } else if need.exclusive == 0
                && !k.exclusive
                && self.fits(p, &CpuSet::new(), true, need.milli, need.memory)
            {
                self.commit(&req.key, self.grant(p, CpuSet::new(), &need));
                return Ok(());
            }
        }
        let mut order: Vec<usize> = (0..self.pools.len()).filter(|&p| has_tier(p)).collect();
        if order.is_empty() {
            return Err(PolicyError::Insufficient {
                key: req.key.clone(),
                reason: format!(
                    "no pool has memory of tier {}",
                    need.tiers
                        .iter()
                        .map(|t| t.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            });
        }
        if need.exclusive > 0 {
            order.sort_by_key(|&p| {
                (
                    std::cmp::Reverse(self.pools[p].depth),
                    self.shared_cpus[p].len(),
                    p,
                )
            });
            for p in order {
                if let Some(c) = self.pick_in(p, &need, None) {
                    self.commit(&req.key, self.grant(p, c, &need));
                    return Ok(());
                }
            }
            Err(PolicyError::Insufficient {
                key: req.key.clone(),
                reason: format!(
                    "no pool can give {} exclusive CPUs and {} bytes of memory while keeping its shared containers served",
                    need.exclusive, need.memory
                ),
            })
        } else {
            let room = |p: usize| {
                (self.shared_cpus[p].len() as u64 * 1000).saturating_sub(self.load_milli[p])
            };
            order.sort_by_key(|&p| {
                (
                    std::cmp::Reverse(self.pools[p].depth),
                    std::cmp::Reverse(room(p)),
                    p,
                )
            });
            for p in order {
                if self.fits(p, &CpuSet::new(), true, need.milli, need.memory) {
                    self.commit(&req.key, self.grant(p, CpuSet::new(), &need));
                    return Ok(());
                }
            }
            Err(PolicyError::Insufficient {
                key: req.key.clone(),
                reason: format!(
                    "no pool has {}m of shared CPU and {} bytes of memory free",
                    need.milli, need.memory
                ),
            })
        }
    }

    fn remove(&mut self, key: &ContainerKey) {
        self.reserved_members.remove(key);
        let Some(g) = self.grants.remove(key) else {
            return;
        };
        let shared = g.exclusive.is_empty();
        for &a in &self.pools[g.pool].up {
            if shared {
                self.load_milli[a] -= g.milli;
                self.load_count[a] -= 1;
            }
            self.load_mem[a] -= g.memory;
        }
        if shared {
            if let Some(group) = self
                .groups
                .iter_mut()
                .find(|x| x.pool == g.pool && x.mems == g.mems)
            {
                Arc::make_mut(&mut group.members).remove(key);
            }
        } else {
            self.taken.difference_with(&g.exclusive);
            for q in 0..self.pools.len() {
                let back = self.pools[q].cpus.intersection(&g.exclusive);
                if !back.is_empty() {
                    self.shared_cpus[q].union_with(&back);
                    self.shared_changed(q);
                }
            }
        }
    }

    fn view(&self, key: &ContainerKey) -> Option<View<'_>> {
        if self.reserved_members.contains_key(key) {
            return Some(self.env.reserved_view());
        }
        let g = self.grants.get(key)?;
        let exclusive = !g.exclusive.is_empty();
        Some(View {
            cpus: if exclusive {
                &g.exclusive
            } else {
                &self.shared_cpus[g.pool]
            },
            mems: &g.mems,
            exclusive,
            pool: &self.pools[g.pool].name,
        })
    }

    fn pool(&self, id: PoolId) -> Option<PoolView<'_>> {
        let g = self.groups.get(usize::try_from(id).ok()?)?;
        Some(PoolView {
            view: View {
                cpus: &self.shared_cpus[g.pool],
                mems: &g.mems,
                exclusive: false,
                pool: &self.pools[g.pool].name,
            },
            members: &g.members,
        })
    }

    fn take_changes(&mut self) -> Changes {
        Changes {
            keys: std::mem::take(&mut self.dirty),
            pools: std::mem::take(&mut self.dirty_groups),
        }
    }
}

impl TopologyAwarePlacer {
    fn grant(&self, pool: usize, exclusive: CpuSet, need: &Need) -> Grant {
        Grant {
            pool,
            exclusive,
            milli: need.milli,
            memory: need.memory,
            mems: Self::tier_mems(&self.pools[pool], &need.tiers),
        }
    }
}

#[cfg(test)]
mod tests;
