//! The bookkeeping every policy shares: requests, materialised assignments,
//! change detection, atomic re-placement, restore and reconfigure. A policy
//! only implements [`Placer`].

use std::collections::BTreeMap;
use std::sync::Arc;

use super::alloc::Picker;
use super::request::{Hints, validate_request};
use super::{
    Assignment, ContainerKey, ContainerRequest, CpuSet, Decision, Policy, PolicyConfig,
    PolicyError, PolicyKind, Qos, Topology,
};

/// Immutable inputs of a policy instance.
#[derive(Debug)]
pub(crate) struct Env {
    pub topo: Topology,
    pub cfg: PolicyConfig,
    pub picker: Picker,
    /// `cfg.reserved_cpus` (validated: online CPUs only).
    pub reserved: CpuSet,
    /// NUMA nodes with memory.
    pub all_mems: CpuSet,
    /// The assignment of pods on the reserved CPUs.
    pub reserved_assignment: Assignment,
}

impl Env {
    pub fn new(topo: &Topology, cfg: &PolicyConfig) -> Result<Env, PolicyError> {
        let topo = topo.clone().with_memory_kinds(&cfg.memory_kinds)?;
        let stray = cfg.reserved_cpus.difference(topo.online_cpus());
        if !stray.is_empty() {
            return Err(PolicyError::BadConfig(format!(
                "reserved_cpus {} includes CPUs that are not online: {stray}",
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

/// Number of exclusive CPUs a container qualifies for under the kubelet
/// static rules: Guaranteed, integer CPU request, not asking to share.
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
    /// Containers whose assignment may have changed since the last call
    /// (`None`: any of them). Only a hint for speed: the engine compares.
    fn take_dirty(&mut self) -> Option<Vec<ContainerKey>>;
}

pub(crate) struct Engine<P: Placer> {
    /// The topology as given, before config overrides.
    base: Topology,
    env: Arc<Env>,
    placer: P,
    requests: BTreeMap<ContainerKey, ContainerRequest>,
    assignments: BTreeMap<ContainerKey, Assignment>,
}

impl<P: Placer> Engine<P> {
    pub fn new(topo: &Topology, cfg: &PolicyConfig) -> Result<Self, PolicyError> {
        let env = Arc::new(Env::new(topo, cfg)?);
        Ok(Engine {
            base: topo.clone(),
            placer: P::build(env.clone())?,
            env,
            requests: BTreeMap::new(),
            assignments: BTreeMap::new(),
        })
    }

    /// Recomputes every assignment; returns those that differ from `before`
    /// (keys absent from `before` always count as changed).
    fn sync(&mut self, before: &BTreeMap<ContainerKey, Assignment>) -> Decision {
        let _ = self.placer.take_dirty();
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
        self.assignments = next;
        Decision { changed }
    }

    /// Updates the assignments the placer reports dirty; returns the changes.
    fn refresh(&mut self) -> Decision {
        let mut changed = BTreeMap::new();
        let dirty = self.placer.take_dirty();
        let Engine {
            placer,
            requests,
            assignments,
            ..
        } = self;
        let mut update = |key: &ContainerKey| match placer.view(key) {
            Some(v) => match assignments.get_mut(key) {
                Some(a) if v.matches(a) => {}
                Some(a) => {
                    a.cpus.clone_from(v.cpus);
                    a.mems.clone_from(v.mems);
                    a.exclusive = v.exclusive;
                    a.pool.clear();
                    a.pool.push_str(v.pool);
                    changed.insert(key.clone(), a.clone());
                }
                None => {
                    let a = v.to_owned();
                    changed.insert(key.clone(), a.clone());
                    assignments.insert(key.clone(), a);
                }
            },
            None => {
                assignments.remove(key);
            }
        };
        match dirty {
            None => requests.keys().for_each(&mut update),
            Some(keys) => keys
                .iter()
                .filter(|k| requests.contains_key(*k))
                .for_each(&mut update),
        }
        Decision { changed }
    }

    /// Places `entries` into a fresh placer built on `env`, keeping the
    /// given assignments where valid; exclusive ones first, then by key.
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
        let hints = validate_request(req)?;
        if self.requests.contains_key(&req.key) {
            let mut trial = self.placer.clone();
            trial.remove(&req.key);
            trial.place(req, &hints, self.assignments.get(&req.key))?;
            self.placer = trial;
        } else {
            self.placer.place(req, &hints, None)?;
        }
        self.requests.insert(req.key.clone(), req.clone());
        let mut d = self.refresh();
        // the requested container is always reported
        if let Some(a) = self.assignments.get(&req.key) {
            d.changed.insert(req.key.clone(), a.clone());
        }
        Ok(d)
    }

    fn release(&mut self, key: &ContainerKey) -> Decision {
        if self.requests.remove(key).is_none() {
            return Decision::default();
        }
        self.placer.remove(key);
        self.assignments.remove(key);
        let mut d = self.refresh();
        d.changed.remove(key);
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
        let entries = existing.into_iter().map(|(r, a)| (r, Some(a))).collect();
        let (placer, requests) = Self::rebuild(self.env.clone(), entries)?;
        self.placer = placer;
        self.requests = requests;
        Ok(self.sync(&persisted))
    }

    fn reconfigure(&mut self, cfg: &PolicyConfig) -> Result<Decision, PolicyError> {
        let env = Arc::new(Env::new(&self.base, cfg)?);
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
