//! Topology-aware CPU picking, in the spirit of kubelet's `takeByTopology`:
//! stay inside the fewest sockets / dies / NUMA nodes, take whole cores
//! before splitting SMT siblings, and pack partially used cores and nodes
//! first so large holes stay free for large requests.
//!
//! The machine is a tree (machine → socket → die → NUMA node → core →
//! thread). To take `n` CPUs from a group:
//! 1. if one child can hold all `n`, descend into the best such child:
//!    one that can serve `n` with whole free cores if any, then the one with
//!    the fewest free CPUs (best fit), then the lowest index;
//! 2. otherwise take children whole, most free first, until the remainder
//!    fits one child, and descend for the remainder as in 1.
//!
//! Every choice is ordered by plain integers, so the result is a function
//! of (topology, available set, n): deterministic.

use super::cpuset::CpuSet;
use super::topology::Topology;

#[derive(Debug, Clone)]
struct Group {
    cpus: CpuSet,
    /// Indices into `Topology::cores()` of the cores under this group.
    cores: Vec<usize>,
    children: Vec<Group>,
}

/// Precomputed group tree of a topology, used to pick CPUs.
#[derive(Debug, Clone)]
pub struct Picker {
    root: Group,
    core_cpus: Vec<CpuSet>,
    threads: usize,
}

impl Picker {
    /// Builds the group tree of `topo`.
    pub fn new(topo: &Topology) -> Picker {
        let cores = topo.cores();
        // levels of (socket, die, node) keys; cores are already sorted by them
        let key = |i: usize, level: usize| -> u32 {
            let c = &cores[i];
            match level {
                0 => c.socket,
                1 => c.die,
                _ => c.node,
            }
        };
        fn build(
            idx: Vec<usize>,
            level: usize,
            cores: &[super::topology::Core],
            key: &dyn Fn(usize, usize) -> u32,
        ) -> Group {
            let mut cpus = CpuSet::new();
            for &i in &idx {
                cpus.union_with(&cores[i].cpus);
            }
            let children = if level == 3 {
                // children are cores (leaves)
                idx.iter()
                    .map(|&i| Group {
                        cpus: cores[i].cpus.clone(),
                        cores: vec![i],
                        children: Vec::new(),
                    })
                    .collect()
            } else {
                let mut groups: Vec<(u32, Vec<usize>)> = Vec::new();
                for &i in &idx {
                    let k = key(i, level);
                    match groups.iter_mut().find(|(g, _)| *g == k) {
                        Some((_, v)) => v.push(i),
                        None => groups.push((k, vec![i])),
                    }
                }
                groups.sort_by_key(|(k, _)| *k);
                groups
                    .into_iter()
                    .map(|(_, v)| build(v, level + 1, cores, key))
                    .collect()
            };
            Group {
                cpus,
                cores: idx,
                children,
            }
        }
        let root = build((0..cores.len()).collect(), 0, cores, &key);
        Picker {
            root,
            core_cpus: cores.iter().map(|c| c.cpus.clone()).collect(),
            threads: topo.threads_per_core().max(1),
        }
    }

    /// Picks `n` CPUs out of `avail`; `None` when `avail` has fewer than
    /// `n` CPUs of this topology. `n == 0` gives the empty set.
    pub fn take(&self, avail: &CpuSet, n: usize) -> Option<CpuSet> {
        let avail = avail.intersection(&self.root.cpus);
        if avail.len() < n {
            return None;
        }
        let mut out = CpuSet::new();
        if n > 0 {
            self.take_from(&self.root, &avail, n, &mut out);
        }
        (out.len() == n).then_some(out)
    }

    /// CPUs of `avail` that sit on fully available cores.
    fn whole_core_cpus(&self, g: &Group, avail: &CpuSet) -> usize {
        g.cores
            .iter()
            .map(|&i| &self.core_cpus[i])
            .filter(|c| c.is_subset(avail))
            .map(|c| c.len())
            .sum()
    }

    fn take_from(&self, g: &Group, avail: &CpuSet, n: usize, out: &mut CpuSet) {
        let free = g.cpus.intersection(avail);
        if free.len() <= n {
            out.union_with(&free);
            return;
        }
        if g.children.is_empty() {
            // a core: its lowest free threads
            for id in free.iter().take(n) {
                out.insert(id);
            }
            return;
        }
        let frees: Vec<usize> = g
            .children
            .iter()
            .map(|c| c.cpus.intersection_len(avail))
            .collect();
        if let Some(i) = self.best_fit(g, avail, &frees, n) {
            self.take_from(&g.children[i], avail, n, out);
            return;
        }
        // no single child holds n: take whole children, most free first
        let mut order: Vec<usize> = (0..g.children.len()).filter(|&i| frees[i] > 0).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(frees[i]), i));
        let mut remaining = n;
        let mut taken = vec![false; g.children.len()];
        for &i in &order {
            if frees[i] > remaining {
                break;
            }
            out.union_with(&g.children[i].cpus.intersection(avail));
            remaining -= frees[i];
            taken[i] = true;
            if remaining == 0 {
                return;
            }
        }
        let rest: Vec<usize> = frees
            .iter()
            .enumerate()
            .map(|(i, &f)| if taken[i] { 0 } else { f })
            .collect();
        if let Some(i) = self.best_fit(g, avail, &rest, remaining) {
            self.take_from(&g.children[i], avail, remaining, out);
        }
    }

    fn best_fit(&self, g: &Group, avail: &CpuSet, frees: &[usize], n: usize) -> Option<usize> {
        let whole_needed = n - n % self.threads;
        (0..g.children.len())
            .filter(|&i| frees[i] >= n)
            .min_by_key(|&i| {
                let whole_ok = whole_needed == 0
                    || g.children[i].children.is_empty()
                    || self.whole_core_cpus(&g.children[i], avail) >= whole_needed;
                (!whole_ok, frees[i], i)
            })
    }
}
