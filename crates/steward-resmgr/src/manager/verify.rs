//! Read-back: each running container's `cpuset.cpus`, `cpuset.mems` and
//! memory limit as cgroupfs shows them, against what was assigned. Drift is
//! logged, counted and repaired by updating the container again.

use tracing::warn;

use super::{ResourceManager, State, same_cpus};
use crate::cache::ContainerState;

/// The result of reading back one container's cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Container id.
    pub container_id: String,
    /// Hierarchy-relative cgroup path.
    pub cgroup: String,
    /// CPUs the policy assigned.
    pub expected_cpus: String,
    /// CPUs cgroupfs shows.
    pub actual_cpus: Option<String>,
    /// Memory limit the runtime was told (None = unlimited).
    pub expected_memory: Option<u64>,
    /// Memory limit cgroupfs shows (None = unlimited).
    pub actual_memory: Option<u64>,
    /// What differed.
    pub drift: Vec<String>,
    /// Whether a differing container was updated again successfully.
    pub repaired: bool,
    /// Reading failed.
    pub error: Option<String>,
}

impl ResourceManager {
    /// Read back every running container's cgroups; drift is logged,
    /// counted and repaired by updating the container again.
    pub async fn verify(&self) -> Vec<VerifyReport> {
        let mut st = self.state.lock().await;
        self.verify_locked(&mut st, None).await
    }

    pub(super) async fn verify_locked(
        &self,
        st: &mut State,
        only: Option<&str>,
    ) -> Vec<VerifyReport> {
        let mut out = Vec::new();
        let containers: Vec<_> = st.cache.data().containers.values().cloned().collect();
        for c in &containers {
            if only.is_some_and(|id| id != c.id) {
                continue;
            }
            if c.state != ContainerState::Running || c.assignment.is_none() {
                continue;
            }
            let Some(cgroup) = c.cgroups_path.clone() else {
                continue;
            };
            let expected_memory = u64::try_from(c.resources.memory_limit_in_bytes)
                .ok()
                .filter(|v| *v > 0)
                .map(|v| v / 4096 * 4096);
            let mut r = VerifyReport {
                container_id: c.id.clone(),
                cgroup: cgroup.clone(),
                expected_cpus: c.resources.cpuset_cpus.clone(),
                actual_cpus: None,
                expected_memory,
                actual_memory: None,
                drift: Vec::new(),
                repaired: false,
                error: None,
            };
            match (
                self.cgroups.read_cpus(&cgroup),
                self.cgroups.read_memory_limit(&cgroup),
            ) {
                (Ok(cpus), Ok(mem)) => {
                    if !same_cpus(&cpus, &r.expected_cpus) {
                        r.drift.push(format!(
                            "cpuset.cpus is {cpus}, assigned {}",
                            r.expected_cpus
                        ));
                        self.metrics.drift("cpuset");
                    }
                    if mem != expected_memory {
                        r.drift.push(format!(
                            "memory limit is {mem:?}, the runtime was told {expected_memory:?}"
                        ));
                        self.metrics.drift("memory");
                    }
                    if !c.resources.cpuset_mems.is_empty()
                        && let Ok(mems) = self.cgroups.read_mems(&cgroup)
                        && !same_cpus(&mems, &c.resources.cpuset_mems)
                    {
                        r.drift.push(format!(
                            "cpuset.mems is {mems}, assigned {}",
                            c.resources.cpuset_mems
                        ));
                        self.metrics.drift("cpuset-mems");
                    }
                    r.actual_cpus = Some(cpus);
                    r.actual_memory = mem;
                }
                (a, b) => {
                    let e = a
                        .err()
                        .or(b.err())
                        .map(|e| e.to_string())
                        .unwrap_or_default();
                    r.error = Some(e);
                }
            }
            if !r.drift.is_empty() {
                warn!(container_id = %c.id, drift = ?r.drift, "applied resources drifted; re-applying");
                let res = self.push_update(st, &c.id, &c.resources).await;
                r.repaired = res.is_ok();
            }
            out.push(r);
        }
        out
    }
}
