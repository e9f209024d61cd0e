//! CPUs prepared for DRA claims (driver `cpu.steward.dev`): the resource
//! manager's side of the one CPU ledger. A prepared claim's CPUs are
//! recorded in the cache (durably, before prepare answers), taken out of
//! every pool the policy hands out (`Policy::set_claims`), and given to the
//! containers of the pods the claim is reserved for that name the claim
//! (`claimed_by`, from the environment the claim's CDI device sets).
//!
//! The DRA transport (`crate::dra`) calls these; nothing here speaks to
//! kubelet or the API server.

use std::collections::BTreeMap;

use steward_core::cpu::{CpuSet, devices};
use tracing::{info, warn};

use super::{ResourceManager, State, policy_err};
pub use crate::cache::CpuClaim;
use crate::error::ResmgrError;

/// What the CPU devices' publisher needs: which CPUs to publish.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuDevices {
    /// CPUs a claim may be given, plus those prepared for claims.
    pub cpus: CpuSet,
}

/// The claims of `st`'s policy, CPUs only.
fn policy_claims(claims: &BTreeMap<String, CpuClaim>) -> BTreeMap<String, CpuSet> {
    claims
        .iter()
        .map(|(uid, c)| (uid.clone(), c.cpus.clone()))
        .collect()
}

impl ResourceManager {
    /// Prepares `claim`: checks every CPU is one a claim may take (online,
    /// not reserved or pinned exclusively, not another claim's), records it
    /// durably and takes its CPUs out of the pools (containers sharing them
    /// are moved off and updated). Preparing a claim again with the same
    /// CPUs succeeds and changes nothing; with other CPUs it is refused.
    pub async fn prepare_cpu_claim(&self, claim: CpuClaim) -> Result<(), ResmgrError> {
        let mut st = self.state.lock().await;
        if let Some(had) = st.cache.data().cpu_claims.get(&claim.uid) {
            if had.cpus == claim.cpus {
                if had.pods != claim.pods {
                    st.cache
                        .data_mut()
                        .cpu_claims
                        .insert(claim.uid.clone(), claim);
                    self.save_claims(&st)?;
                }
                return Ok(());
            }
            return Err(ResmgrError::InvalidRequest(format!(
                "CPU claim {} is prepared here with CPUs {}, not {}",
                claim.uid, had.cpus, claim.cpus
            )));
        }
        let mut next = st.cache.data().cpu_claims.clone();
        next.insert(claim.uid.clone(), claim.clone());
        let d = st
            .policy
            .set_claims(policy_claims(&next))
            .map_err(policy_err)?;
        st.cache
            .data_mut()
            .cpu_claims
            .insert(claim.uid.clone(), claim.clone());
        if let Err(e) = self.save_claims(&st) {
            // not durable: not prepared
            st.cache.data_mut().cpu_claims.remove(&claim.uid);
            let back = policy_claims(&st.cache.data().cpu_claims);
            if let Err(e) = st.policy.set_claims(back) {
                warn!(error = %e, "restoring the CPU claims after a failed save");
            }
            return Err(e);
        }
        info!(claim = %claim.uid, namespace = %claim.namespace, name = %claim.name,
              cpus = %claim.cpus, moved = d.len(), "CPU claim prepared");
        self.metrics.event("cpu-claim-prepared");
        self.apply_decision(&mut st, &d, None).await;
        self.save(&st);
        drop(st);
        // NRI: the moved containers' updates go out now, not with the
        // next call or read-back
        self.flush_outbox().await;
        Ok(())
    }

    /// Forgets claim `uid` and gives its CPUs back to the pools. Unknown
    /// claims are a no-op.
    pub async fn unprepare_cpu_claim(&self, uid: &str) -> Result<(), ResmgrError> {
        let mut st = self.state.lock().await;
        let Some(gone) = st.cache.data_mut().cpu_claims.remove(uid) else {
            return Ok(());
        };
        let rest = policy_claims(&st.cache.data().cpu_claims);
        let d = match st.policy.set_claims(rest) {
            Ok(d) => d,
            Err(e) => {
                st.cache.data_mut().cpu_claims.insert(uid.to_owned(), gone);
                return Err(policy_err(e));
            }
        };
        info!(claim = %uid, cpus = %gone.cpus, "CPU claim unprepared");
        self.metrics.event("cpu-claim-unprepared");
        self.apply_decision(&mut st, &d, None).await;
        self.save(&st);
        drop(st);
        self.flush_outbox().await;
        Ok(())
    }

    /// Every prepared claim, by UID.
    pub async fn cpu_claims(&self) -> BTreeMap<String, CpuClaim> {
        self.state.lock().await.cache.data().cpu_claims.clone()
    }

    /// The CPUs to publish as devices now; call again after
    /// [`ResourceManager::saved`] wakes.
    pub async fn cpu_devices(&self) -> CpuDevices {
        let st = self.state.lock().await;
        let pinned = st
            .policy
            .assignments()
            .values()
            .filter(|a| a.exclusive && a.pool != steward_core::cpu::CLAIM_POOL)
            .fold(CpuSet::new(), |acc, a| acc.union(&a.cpus));
        let claimed = st
            .policy
            .claims()
            .values()
            .fold(CpuSet::new(), |acc, c| acc.union(c));
        let free = devices::publishable(
            &st.topology,
            &st.config.policy.config.reserved_cpus,
            &pinned,
        );
        CpuDevices {
            cpus: free.union(&claimed),
        }
    }

    /// The node's topology (for the devices' attributes).
    pub async fn topology(&self) -> steward_core::cpu::Topology {
        self.state.lock().await.topology.clone()
    }

    /// Saves the cache, failing when it is not durable.
    fn save_claims(&self, st: &State) -> Result<(), ResmgrError> {
        st.cache.save().inspect_err(|e| {
            warn!(error = %e, "persisting a CPU claim failed");
            self.metrics.event("cache-save-failed");
        })
    }
}

/// The claims a container of pod `pod_uid` runs on: those the runtime
/// shows it names (`named`: from its environment, `devices::claims_in_env`),
/// each of which must be prepared here for that pod. A claim named but not
/// prepared for the pod is refused, so a pod cannot take another pod's CPUs
/// by setting the variable itself.
pub(crate) fn claimed_by(
    claims: &BTreeMap<String, CpuClaim>,
    pod_uid: &str,
    named: Vec<String>,
) -> Result<Vec<String>, ResmgrError> {
    for uid in &named {
        match claims.get(uid) {
            Some(c) if c.pods.contains(pod_uid) => {}
            Some(_) => {
                return Err(ResmgrError::InvalidRequest(format!(
                    "the container names CPU claim {uid}, which is not reserved for its pod"
                )));
            }
            None => {
                return Err(ResmgrError::InvalidRequest(format!(
                    "the container names CPU claim {uid}, which is not prepared on this node"
                )));
            }
        }
    }
    Ok(named)
}

#[cfg(test)]
mod tests;
