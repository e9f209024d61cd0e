//! The safety net under unprepare: kubelet unprepares every claim it
//! prepared, but a node whose kubelet state was wiped would otherwise keep
//! a claim's CPUs out of every pool forever. Every interval, each claim
//! prepared here that this loop has seen for at least one interval is read
//! back from the API; one whose ResourceClaim is gone, was replaced (another
//! UID) or no longer has CPUs of this node allocated is unprepared (its
//! CPUs given back, its CDI spec removed). A claim keeps its allocation
//! while any pod still uses it, so a live pod's CPUs are never taken; a
//! claim that cannot be read is kept.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Weak;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use tokio::time::Instant;

use super::cdi;
use super::claim::results_of;
use crate::manager::{CpuClaim, ResourceManager};

/// Why a prepared claim is stale, or `None` to keep it. `pool` is this
/// node.
pub fn stale(prepared: &CpuClaim, claim: Option<&ResourceClaim>, pool: &str) -> Option<String> {
    let Some(claim) = claim else {
        return Some("the ResourceClaim no longer exists".into());
    };
    if claim.metadata.uid.as_deref() != Some(prepared.uid.as_str()) {
        return Some("the ResourceClaim was replaced".into());
    }
    match results_of(claim, pool) {
        Some(results) if !results.is_empty() => None,
        _ => Some(format!(
            "the ResourceClaim no longer has CPUs of node {pool} allocated"
        )),
    }
}

/// The prepared claims old enough to be read back at `now`, and the
/// first-seen times kept for the next sweep (claims no longer prepared are
/// forgotten).
fn due(
    prepared: &BTreeMap<String, CpuClaim>,
    seen: &mut BTreeMap<String, Instant>,
    now: Instant,
    interval: Duration,
) -> Vec<CpuClaim> {
    seen.retain(|uid, _| prepared.contains_key(uid));
    prepared
        .iter()
        .filter(|(uid, _)| {
            let first = *seen.entry((*uid).clone()).or_insert(now);
            now.duration_since(first) >= interval
        })
        .map(|(_, c)| c.clone())
        .collect()
}

/// Sweeps every `interval` until dropped or the manager is gone; `node`
/// is this node (the pool of its CPUs).
pub async fn collect(
    manager: Weak<ResourceManager>,
    client: kube::Client,
    node: String,
    cdi_dir: PathBuf,
    interval: Duration,
    op_timeout: Duration,
) {
    let mut seen: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        let Some(m) = manager.upgrade() else { return };
        let prepared = m.cpu_claims().await;
        drop(m);
        let due = due(&prepared, &mut seen, Instant::now(), interval);
        for claim in due {
            let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &claim.namespace);
            let obj = match tokio::time::timeout(op_timeout, api.get_opt(&claim.name)).await {
                Ok(Ok(obj)) => obj,
                Ok(Err(e)) => {
                    tracing::debug!(claim = %claim.name, namespace = %claim.namespace, error = %e, "cannot read a prepared CPU claim back; kept");
                    continue;
                }
                Err(_) => continue,
            };
            let Some(why) = stale(&claim, obj.as_ref(), &node) else {
                continue;
            };
            let Some(m) = manager.upgrade() else { return };
            tracing::warn!(claim = %claim.name, namespace = %claim.namespace, claim_uid = %claim.uid, reason = %why, "unpreparing a CPU claim kubelet never unprepared");
            if let Err(e) = m.unprepare_cpu_claim(&claim.uid).await {
                tracing::warn!(claim_uid = %claim.uid, error = %e, "unpreparing a stale CPU claim failed; next sweep");
                continue;
            }
            if super::claim::valid_uid(&claim.uid)
                && let Err(e) = cdi::remove(&cdi_dir, &claim.uid)
            {
                tracing::warn!(claim_uid = %claim.uid, error = %e, "removing a stale CPU claim's CDI spec failed");
            }
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steward_core::cpu::CpuSet;

    fn prepared(uid: &str) -> CpuClaim {
        CpuClaim {
            uid: uid.into(),
            namespace: "default".into(),
            name: "cpus".into(),
            cpus: CpuSet::parse("1").unwrap(),
            pods: Default::default(),
        }
    }

    fn claim(uid: &str, pool: &str) -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cpus", "namespace": "default", "uid": uid},
            "spec": {"devices": {}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "cpus", "driver": "cpu.steward.dev", "pool": pool, "device": "cpu-1"}
            ]}}}
        }))
        .unwrap()
    }

    #[test]
    fn only_a_claim_gone_replaced_or_moved_off_this_node_is_stale() {
        let p = prepared("u1");
        assert_eq!(stale(&p, Some(&claim("u1", "n1")), "n1"), None);
        assert!(stale(&p, None, "n1").unwrap().contains("no longer exists"));
        assert!(
            stale(&p, Some(&claim("u2", "n1")), "n1")
                .unwrap()
                .contains("replaced")
        );
        assert!(stale(&p, Some(&claim("u1", "n2")), "n1").is_some());
    }

    #[test]
    fn a_claim_is_read_back_only_once_seen_for_an_interval() {
        let interval = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut seen = BTreeMap::new();
        let all = BTreeMap::from([("u1".to_owned(), prepared("u1"))]);
        assert!(due(&all, &mut seen, t0, interval).is_empty());
        assert_eq!(due(&all, &mut seen, t0 + interval, interval).len(), 1);
        assert!(due(&BTreeMap::new(), &mut seen, t0 + interval, interval).is_empty());
        assert!(seen.is_empty());
    }
}
