//! The bookkeeping every policy shares: requests, materialised assignments,
//! change detection, atomic re-placement, restore and reconfigure. A policy
//! only implements [`Placer`].

use std::collections::BTreeMap;
use std::sync::Arc;

use super::claims;
use crate::cpu::Picker;
use crate::cpu::model::{Hints, validate_request};
use crate::cpu::{
    Assignment, ContainerKey, ContainerRequest, CpuSet, Decision, Members, Policy, PolicyConfig,
    PolicyError, PolicyKind, PoolChange, Qos, Topology,
};

/// Immutable inputs of a policy instance.
#[derive(Debug)]
pub(crate) struct Env {
    pub topo: Topology,
    pub cfg: PolicyConfig,
    pub picker: Picker,
    /// `cfg.reserved_cpus` (validated: online CPUs only).
    pub reserved: CpuSet,
    /// CPUs prepared for DRA claims ([`Policy::set_claims`]).
    pub claimed: CpuSet,
    /// What no placer hands out: `reserved` and `claimed`.
    pub not_placed: CpuSet,
    /// NUMA nodes with memory.
    pub all_mems: CpuSet,
    /// The assignment of pods on the reserved CPUs.
    pub reserved_assignment: Assignment,
}

impl Env {
    pub fn new(topo: &Topology, cfg: &PolicyConfig, claimed: &CpuSet) -> Result<Env, PolicyError> {
        let topo = topo.clone().with_memory_kinds(&cfg.memory_kinds)?;
        let stray = cfg.reserved_cpus.difference(topo.online_cpus());
        if !stray.is_empty() {
            return Err(PolicyError::BadConfig(format!(
                "reserved_cpus {} includes CPUs that are not online: {stray}",
                cfg.reserved_cpus
            )));
        }
        let both = cfg.reserved_cpus.intersection(claimed);
        if !both.is_empty() {
            return Err(PolicyError::BadConfig(format!(
                "reserved_cpus {} includes CPUs prepared for DRA claims: {both}",
                cfg.reserved_cpus
            )));
        }
        let mut all_mems: CpuSet = topo
            .nodes()
            .filter(|n| n.memory_bytes > 0)
            .map(|n| n.id)
            .collect();
        if all_mems.is_empty() {
            all_mems = topo.node_ids();
        }
        Ok(Env {
            reserved_assignment: Assignment {
                cpus: cfg.reserved_cpus.clone(),
                mems: topo.nodes_of(&cfg.reserved_cpus),
                exclusive: false,
                pool: "reserved".to_string(),
            },
            picker: Picker::new(&topo),
            reserved: cfg.reserved_cpus.clone(),
            claimed: claimed.clone(),
            not_placed: cfg.reserved_cpus.union(claimed),
            all_mems,
            cfg: cfg.clone(),
            topo,
        })
    }

    /// True when the pod runs on the reserved CPUs.
    pub fn is_reserved_pod(&self, req: &ContainerRequest) -> bool {
        !self.reserved.is_empty() && self.cfg.reserved_namespaces.contains(&req.pod_namespace)
    }

    /// View of the assignment of a container on the reserved CPUs.
    pub fn reserved_view(&self) -> View<'_> {
        View::of(&self.reserved_assignment)
    }
}

/// A borrowed assignment, so unchanged containers cost no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct View<'a> {
    pub cpus: &'a CpuSet,
    pub mems: &'a CpuSet,
    pub exclusive: bool,
    pub pool: &'a str,
}

impl<'a> View<'a> {
    pub fn of(a: &'a Assignment) -> View<'a> {
        View {
            cpus: &a.cpus,
            mems: &a.mems,
            exclusive: a.exclusive,
            pool: &a.pool,
        }
    }

    fn matches(&self, a: &Assignment) -> bool {
        self.exclusive == a.exclusive
            && self.cpus == &a.cpus
            && self.mems == &a.mems
            && self.pool == a.pool
    }

    fn to_owned(self) -> Assignment {
        Assignment {
            cpus: self.cpus.clone(),
            mems: self.mems.clone(),
            exclusive: self.exclusive,
            pool: self.pool.to_string(),
        }
    }
}

/// Sets `key`'s materialised assignment to `v`; true when it changed
/// (or was absent).
fn set(
    assignments: &mut BTreeMap<ContainerKey, Assignment>,
    key: &ContainerKey,
    v: View<'_>,
) -> bool {
    match assignments.get_mut(key) {
        Some(a) => assign(a, v),
        None => {
            assignments.insert(key.clone(), v.to_owned());
            true
        }
    }
}

/// Overwrites `a` with `v` (without allocating when the pool name fits);
/// true when it differed.
fn assign(a: &mut Assignment, v: View<'_>) -> bool {
    if v.matches(a) {
        return false;
    }
    a.cpus.clone_from(v.cpus);
    a.mems.clone_from(v.mems);
    a.exclusive = v.exclusive;
    if a.pool != v.pool {
        a.pool.clear();
        a.pool.push_str(v.pool);
    }
    true
}

/// Sets the materialised assignment of every member of `pool` to the
/// pool's view; returns the members whose assignment changed (or that
/// are in `reported` already).
fn update_members<'p>(
    assignments: &mut BTreeMap<ContainerKey, Assignment>,
    pool: &PoolView<'p>,
    reported: &BTreeMap<ContainerKey, Assignment>,
) -> Vec<&'p ContainerKey> {
    let members: &'p Members = pool.members;
    let mut changed = Vec::with_capacity(members.len());
    let mut missing = Vec::new();
    let mut note = |k: &'p ContainerKey, differs: bool| {
        if differs || reported.contains_key(k) {
            changed.push(k);
        }
    };
    // a large pool: one merged walk (both are sorted by key) instead of a
    // lookup per member
    if members.len().saturating_mul(8) >= assignments.len() {
        let mut it = assignments.iter_mut().peekable();
        for k in members.iter() {
            while it.next_if(|(a, _)| *a < k).is_some() {}
            match it.next_if(|(a, _)| *a == k) {
                Some((_, a)) => note(k, assign(a, pool.view)),
                None => missing.push(k),
            }
        }
    } else {
        for k in members.iter() {
            match assignments.get_mut(k) {
                Some(a) => note(k, assign(a, pool.view)),
                None => missing.push(k),
            }
        }
    }
    for k in missing {
        assignments.insert(k.clone(), pool.view.to_owned());
        note(k, true);
    }
    changed
}

/// Number of exclusive CPUs a container qualifies for under the kubelet
/// static rules: Guaranteed, integer CPU request, not asking to share.
///
/// `req.qos` and `req.cpu_request_milli` are trusted as the pod spec: the
/// adapter that builds the request must take them from what the runtime
/// carries (the resource manager's `requests::derive`), where a pod's
/// annotations can only narrow them, never from an annotation alone.
pub(crate) fn exclusive_cpus_wanted(req: &ContainerRequest, hints: &Hints) -> usize {
    if req.qos == Qos::Guaranteed
        && req.cpu_request_milli > 0
        && req.cpu_request_milli.is_multiple_of(1000)
        && hints.prefer_shared != Some(true)
    {
        (req.cpu_request_milli / 1000) as usize
    } else {
        0
    }
}

/// Identifies a pool of a placer (stable while the pool exists).
pub(crate) type PoolId = u64;

/// A pool whose members all run on one assignment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolView<'a> {
    pub view: View<'a>,
    pub members: &'a Members,
}

/// What may have changed since the last [`Placer::take_changes`]. Only a
/// hint for speed: the engine compares before reporting.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    /// Containers whose own assignment may have changed.
    pub keys: Vec<ContainerKey>,
    /// Pools whose assignment may have changed.
    pub pools: Vec<PoolId>,
}

/// The policy-specific part.
pub(crate) trait Placer: Clone + Send + Sized + 'static {
    const KIND: PolicyKind;
    fn build(env: Arc<Env>) -> Result<Self, PolicyError>;
    /// Places a container not currently placed. `keep` is an earlier
    /// assignment to keep if still valid. Must change nothing on error.
    fn place(
        &mut self,
        req: &ContainerRequest,
        hints: &Hints,
        keep: Option<&Assignment>,
    ) -> Result<(), PolicyError>;
    /// Removes a placed container (no-op when unknown).
    fn remove(&mut self, key: &ContainerKey);
    /// Current assignment of a placed container.
    fn view(&self, key: &ContainerKey) -> Option<View<'_>>;
    /// A pool named by [`Changes::pools`], if it still exists. Its members'
    /// views must equal its view.
    fn pool(&self, id: PoolId) -> Option<PoolView<'_>>;
    /// What may have changed since the last call.
    fn take_changes(&mut self) -> Changes;
}

pub(crate) struct Engine<P: Placer> {
    /// The topology as given, before config overrides.
    base: Topology,
    env: Arc<Env>,
    placer: P,
    requests: BTreeMap<ContainerKey, ContainerRequest>,
    assignments: BTreeMap<ContainerKey, Assignment>,
    /// pod uid → (NUMA node, CPUs) held for it ([`Policy::set_holds`]).
    holds: BTreeMap<String, (u32, u32)>,
    /// claim uid → CPUs ([`Policy::set_claims`]).
    claims: BTreeMap<String, CpuSet>,
    /// Containers running on their claims' CPUs (not in `requests`, not
    /// known to the placer).
    claimed: BTreeMap<ContainerKey, ContainerRequest>,
}

/// The CPUs of `free` to leave alone for `withhold`: on each NUMA node,
/// the highest-numbered `n` of its CPUs in `free` (all of them when fewer).
pub(crate) fn withheld(free: &CpuSet, topo: &Topology, withhold: &BTreeMap<u32, usize>) -> CpuSet {
    let mut out = CpuSet::new();
    for (node, n) in withhold {
        let mine: Vec<u32> = free.intersection(&topo.node_cpus(*node)).iter().collect();
        for c in mine.iter().rev().take(*n) {
            out.insert(*c);
        }
    }
    out
}

impl<P: Placer> Engine<P> {
    /// What a new exclusive placement for pod `uid` leaves free per NUMA
    /// node: the holds of other pods not yet holding exclusive CPUs.
    fn withhold_for(&self, uid: &str) -> BTreeMap<u32, usize> {
        if self.holds.is_empty() {
            return BTreeMap::new();
        }
        let running: std::collections::BTreeSet<&str> = self
            .assignments
            .iter()
            .filter(|(_, a)| a.exclusive)
            .map(|(k, _)| k.pod_uid.as_str())
            .collect();
        let mut out: BTreeMap<u32, usize> = BTreeMap::new();
        for (pod, (node, cpus)) in &self.holds {
            if pod != uid && !running.contains(pod.as_str()) {
                *out.entry(*node).or_default() += *cpus as usize;
            }
        }
        out
    }

    pub fn new(topo: &Topology, cfg: &PolicyConfig) -> Result<Self, PolicyError> {
        let env = Arc::new(Env::new(topo, cfg, &CpuSet::new())?);
        Ok(Engine {
            base: topo.clone(),
            placer: P::build(env.clone())?,
            env,
            requests: BTreeMap::new(),
            assignments: BTreeMap::new(),
            holds: BTreeMap::new(),
            claims: BTreeMap::new(),
            claimed: BTreeMap::new(),
        })
    }

    /// Recomputes every assignment; returns those that differ from `before`
    /// (keys absent from `before` always count as changed).
    fn sync(&mut self, before: &BTreeMap<ContainerKey, Assignment>) -> Decision {
        let _ = self.placer.take_changes();
        let mut next = BTreeMap::new();
        let mut changed = BTreeMap::new();
        for key in self.requests.keys() {
            if let Some(v) = self.placer.view(key) {
                let a = v.to_owned();
                if before.get(key) != Some(&a) {
                    changed.insert(key.clone(), a.clone());
                }
                next.insert(key.clone(), a);
            }
        }
        for (key, req) in &self.claimed {
            if let Ok(Some(a)) =
                claims::assignment(&self.env.topo, &self.env.all_mems, &self.claims, req)
            {
                if before.get(key) != Some(&a) {
                    changed.insert(key.clone(), a.clone());
                }
                next.insert(key.clone(), a);
            }
        }
        self.assignments = next;
        Decision::from(changed)
    }

    /// Updates the assignments the placer reports changed; returns the
    /// changes. `asked` is always reported (when placed).
    fn refresh(&mut self, asked: Option<&ContainerKey>) -> Decision {
        let Changes { keys, mut pools } = self.placer.take_changes();
        let Engine {
            placer,
            requests,
            assignments,
            ..
        } = self;
        let mut containers = BTreeMap::new();
        let mut update = |key: &ContainerKey| match placer.view(key) {
            Some(v) => {
                if set(assignments, key, v) {
                    containers.insert(key.clone(), v.to_owned());
                }
            }
            None => {
                assignments.remove(key);
            }
        };
        keys.iter()
            .chain(asked)
            .filter(|k| requests.contains_key(*k))
            .for_each(&mut update);
        if let Some(k) = asked
            && !containers.contains_key(k)
            && let Some(a) = assignments.get(k)
        {
            containers.insert(k.clone(), a.clone());
        }
        let mut changes = Vec::new();
        pools.sort_unstable();
        pools.dedup();
        for id in pools {
            let Some(pool) = placer.pool(id) else {
                continue;
            };
            let changed = update_members(assignments, &pool, &containers);
            if changed.iter().all(|k| containers.contains_key(*k)) {
                // nothing beyond what is listed already
            } else if changed.len() == pool.members.len() {
                changes.push(PoolChange {
                    assignment: pool.view.to_owned(),
                    members: pool.members.clone(),
                });
            } else {
                // only some members changed: name them one by one
                for k in changed {
                    containers.insert(k.clone(), pool.view.to_owned());
                }
            }
        }
        Decision {
            containers,
            pools: changes,
        }
    }

    /// Places `entries` into a fresh placer built on `env`, keeping the
    /// given assignments where valid; exclusive ones first, then by key.
    /// Runs `req` on its claims' CPUs (assignment `a`), out of the placer.
    fn run_on_claims(&mut self, req: &ContainerRequest, a: Assignment) -> Decision {
        let mut d = if self.requests.remove(&req.key).is_some() {
            self.placer.remove(&req.key);
            self.assignments.remove(&req.key);
            self.refresh(None)
        } else {
            Decision::default()
        };
        self.claimed.insert(req.key.clone(), req.clone());
        self.assignments.insert(req.key.clone(), a.clone());
        d.containers.insert(req.key.clone(), a);
        d
    }

    fn rebuild(
        env: Arc<Env>,
        mut entries: Vec<(ContainerRequest, Option<Assignment>)>,
    ) -> Result<(P, BTreeMap<ContainerKey, ContainerRequest>), PolicyError> {
        let mut placer = P::build(env)?;
        entries.sort_by(|(ra, aa), (rb, ab)| {
            let ea = aa.as_ref().is_some_and(|a| a.exclusive);
            let eb = ab.as_ref().is_some_and(|a| a.exclusive);
            eb.cmp(&ea).then_with(|| ra.key.cmp(&rb.key))
        });
        let mut requests = BTreeMap::new();
        for (req, keep) in entries {
            if requests.contains_key(&req.key) {
                return Err(PolicyError::BadRequest {
                    key: req.key.clone(),
                    reason: "container listed twice".into(),
                });
            }
            let hints = validate_request(&req)?;
            placer.place(&req, &hints, keep.as_ref())?;
            requests.insert(req.key.clone(), req);
        }
        Ok((placer, requests))
    }
}

impl<P: Placer> Policy for Engine<P> {
    fn kind(&self) -> PolicyKind {
        P::KIND
    }

    fn allocate(&mut self, req: &ContainerRequest) -> Result<Decision, PolicyError> {
        let mut hints = validate_request(req)?;
        if let Some(a) = claims::assignment(&self.env.topo, &self.env.all_mems, &self.claims, req)?
        {
            return Ok(self.run_on_claims(req, a));
        }

        hints.withhold = self.withhold_for(&req.key.pod_uid);
        if self.requests.contains_key(&req.key) {
            let mut trial = self.placer.clone();
            trial.remove(&req.key);
            trial.place(req, &hints, self.assignments.get(&req.key))?;
            self.placer = trial;
        } else {
            self.placer.place(req, &hints, None)?;
        }
        // a container that ran on claims runs as any other from now on
        self.claimed.remove(&req.key);
        self.requests.insert(req.key.clone(), req.clone());
        // the requested container is always reported
        Ok(self.refresh(Some(&req.key)))
    }

    fn release(&mut self, key: &ContainerKey) -> Decision {
        if self.claimed.remove(key).is_some() {
            self.assignments.remove(key);
            return Decision::default();
        }
        if self.requests.remove(key).is_none() {
            return Decision::default();
        }
        self.placer.remove(key);
        self.assignments.remove(key);
        let mut d = self.refresh(None);
        d.containers.remove(key);
        d
    }

    fn assignments(&self) -> &BTreeMap<ContainerKey, Assignment> {
        &self.assignments
    }

    fn restore(
        &mut self,
        existing: Vec<(ContainerRequest, Assignment)>,
    ) -> Result<Decision, PolicyError> {
        let persisted: BTreeMap<ContainerKey, Assignment> = existing
            .iter()
            .map(|(r, a)| (r.key.clone(), a.clone()))
            .collect();
        let (on_claims, others): (Vec<_>, Vec<_>) = existing
            .into_iter()
            .partition(|(r, _)| !r.cpu_claims.is_empty());
        let claimed: BTreeMap<ContainerKey, ContainerRequest> = on_claims
            .into_iter()
            .map(|(r, _)| (r.key.clone(), r))
            .collect();
        let (kept, orphans) =
            claims::split(&self.env.topo, &self.env.all_mems, &self.claims, claimed);
        let entries = others
            .into_iter()
            .map(|(r, a)| (r, Some(a)))
            .chain(orphans.into_iter().map(|r| (r, None)))
            .collect();
        let (placer, requests) = Self::rebuild(self.env.clone(), entries)?;
        self.placer = placer;
        self.requests = requests;
        self.claimed = kept.into_iter().map(|(k, (r, _))| (k, r)).collect();
        Ok(self.sync(&persisted))
    }

    fn set_holds(&mut self, holds: BTreeMap<String, (u32, u32)>) {
        self.holds = holds;
    }

    fn set_claims(&mut self, claims: BTreeMap<String, CpuSet>) -> Result<Decision, PolicyError> {
        let pinned = self
            .requests
            .keys()
            .filter_map(|k| self.assignments.get(k))
            .filter(|a| a.exclusive)
            .fold(CpuSet::new(), |mut all, a| {
                all.union_with(&a.cpus);
                all
            });
        let claimed_cpus = claims::validate(&self.env.topo, &self.env.reserved, &claims, &pinned)?;
        let env = Arc::new(Env::new(&self.base, &self.env.cfg, &claimed_cpus)?);
        let (kept, orphans) =
            claims::split(&env.topo, &env.all_mems, &claims, self.claimed.clone());
        let entries = self
            .requests
            .values()
            .map(|r| (r.clone(), self.assignments.get(&r.key).cloned()))
            .chain(orphans.into_iter().map(|r| (r, None)))
            .collect();
        let (placer, requests) = Self::rebuild(env.clone(), entries)?;
        self.env = env;
        self.placer = placer;
        self.requests = requests;
        self.claims = claims;
        self.claimed = kept.into_iter().map(|(k, (r, _))| (k, r)).collect();
        let before = std::mem::take(&mut self.assignments);
        Ok(self.sync(&before))
    }

    fn claims(&self) -> &BTreeMap<String, CpuSet> {
        &self.claims
    }

    fn reconfigure(&mut self, cfg: &PolicyConfig) -> Result<Decision, PolicyError> {
        let env = Arc::new(Env::new(&self.base, cfg, &self.env.claimed)?);
        let entries = self
            .requests
            .values()
            .map(|r| (r.clone(), self.assignments.get(&r.key).cloned()))
            .collect();
        let (placer, requests) = Self::rebuild(env.clone(), entries)?;
        self.env = env;
        self.placer = placer;
        self.requests = requests;
        let before = std::mem::take(&mut self.assignments);
        Ok(self.sync(&before))
    }
}
