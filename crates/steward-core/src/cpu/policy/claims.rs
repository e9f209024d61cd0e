//! CPUs prepared for DRA claims: what every policy shares about them.
//!
//! A claim's CPUs are chosen by kube-scheduler, not by a policy: the
//! engine takes them out of every placer's universe (`Env::not_placed`),
//! and a container that names claims (`ContainerRequest::cpu_claims`) runs
//! on exactly their CPUs, exclusively, in the pool [`CLAIM_POOL`], without
//! the placer. So no CPU is given twice between a claim and a policy.

use std::collections::BTreeMap;

use crate::cpu::{Assignment, ContainerKey, ContainerRequest, CpuSet, PolicyError, Topology};

/// The pool name of containers running on their claims' CPUs.
pub const CLAIM_POOL: &str = "dra-claim";

/// Checks a set of claims against the machine, its `reserved` CPUs and the
/// CPUs the placer gave exclusively (`pinned`); returns the union of their
/// CPUs.
pub(crate) fn validate(
    topo: &Topology,
    reserved: &CpuSet,
    claims: &BTreeMap<String, CpuSet>,
    pinned: &CpuSet,
) -> Result<CpuSet, PolicyError> {
    let mut all = CpuSet::new();
    for (uid, cpus) in claims {
        let refuse = |reason: String| {
            Err(PolicyError::ClaimRefused {
                claim: uid.clone(),
                reason,
            })
        };
        if cpus.is_empty() {
            return refuse("it names no CPU".into());
        }
        let offline = cpus.difference(topo.online_cpus());
        if !offline.is_empty() {
            return refuse(format!("CPUs {offline} are not online"));
        }
        let on_reserved = cpus.intersection(reserved);
        if !on_reserved.is_empty() {
            return refuse(format!("CPUs {on_reserved} are reserved for the system"));
        }
        let busy = cpus.intersection(pinned);
        if !busy.is_empty() {
            return refuse(format!(
                "CPUs {busy} are pinned exclusively to a running container"
            ));
        }
        let twice = cpus.intersection(&all);
        if !twice.is_empty() {
            return refuse(format!("CPUs {twice} are prepared for another claim"));
        }
        all.union_with(cpus);
    }
    Ok(all)
}

/// The assignment of a container running on its claims' CPUs (its memory
/// on their NUMA nodes that have memory, else on `all_mems`); `None` when
/// it names no claim.
pub(crate) fn assignment(
    topo: &Topology,
    all_mems: &CpuSet,
    claims: &BTreeMap<String, CpuSet>,
    req: &ContainerRequest,
) -> Result<Option<Assignment>, PolicyError> {
    if req.cpu_claims.is_empty() {
        return Ok(None);
    }
    let mut cpus = CpuSet::new();
    for uid in &req.cpu_claims {
        let Some(mine) = claims.get(uid) else {
            return Err(PolicyError::BadRequest {
                key: req.key.clone(),
                reason: format!("CPU claim {uid} is not prepared on this node"),
            });
        };
        cpus.union_with(mine);
    }
    let mut mems = topo.nodes_of(&cpus).intersection(all_mems);
    if mems.is_empty() {
        mems = all_mems.clone();
    }
    Ok(Some(Assignment {
        cpus,
        mems,
        exclusive: true,
        pool: CLAIM_POOL.to_owned(),
    }))
}

/// The containers of `claimed` whose claims are all still in `claims`
/// (with their assignments), and the requests of the others with their
/// claims dropped, to be placed by the policy as any container.
pub(crate) fn split(
    topo: &Topology,
    all_mems: &CpuSet,
    claims: &BTreeMap<String, CpuSet>,
    claimed: BTreeMap<ContainerKey, ContainerRequest>,
) -> (
    BTreeMap<ContainerKey, (ContainerRequest, Assignment)>,
    Vec<ContainerRequest>,
) {
    let mut kept = BTreeMap::new();
    let mut orphans = Vec::new();
    for (key, mut req) in claimed {
        match assignment(topo, all_mems, claims, &req) {
            Ok(Some(a)) => {
                kept.insert(key, (req, a));
            }
            _ => {
                req.cpu_claims.clear();
                orphans.push(req);
            }
        }
    }
    (kept, orphans)
}
