//! Reading an allocated ResourceClaim at NodePrepareResources: kubelet
//! names the claim only (namespace, name, UID); the CPUs the scheduler
//! allocated and the pods using the claim are in the API.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use kube::Api;
use steward_core::cpu::CpuSet;
use steward_core::cpu::devices::{CPU_DRIVER, cpu_of_device};

use crate::manager::CpuClaim;

/// The claim as kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimName {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ClaimName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (UID {})", self.namespace, self.name, self.uid)
    }
}

/// What a prepare needs of a claim: the claim for the ledger, and the
/// allocation results of this driver on this node (what the answer lists).
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatedCpus {
    pub claim: CpuClaim,
    pub results: Vec<DeviceRequestAllocationResult>,
}

/// Why a claim cannot be prepared: the per-claim error kubelet gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// kubelet named no namespace, name or UID, or a UID that is not one.
    #[error("claim {0} lacks a namespace or name, or has an invalid UID")]
    Incomplete(ClaimName),
    /// The API has no such claim.
    #[error("ResourceClaim {0} no longer exists")]
    Gone(ClaimName),
    /// The claim of that name has another UID (deleted and recreated).
    #[error("ResourceClaim {claim} has UID {found:?}: it was replaced")]
    Replaced { claim: ClaimName, found: String },
    /// The claim could not be read (API error or no answer in time).
    #[error("reading ResourceClaim {claim}: {reason}")]
    Unreadable { claim: ClaimName, reason: String },
    /// The claim has no allocation.
    #[error("ResourceClaim {0} is not allocated")]
    NotAllocated(ClaimName),
    /// The allocation names no device of this driver on this node.
    #[error("ResourceClaim {claim} has no device of driver {CPU_DRIVER} in pool {pool} allocated")]
    NoDevices { claim: ClaimName, pool: String },
    /// A device of this driver that names no CPU.
    #[error("ResourceClaim {claim}: device {device:?} of driver {CPU_DRIVER} is not a CPU")]
    UnknownDevice { claim: ClaimName, device: String },
}

/// Whether `uid` may name a file and a CDI device: a Kubernetes UID is
/// letters, digits and dashes.
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 128
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Checks what kubelet sent before anything is read or written.
pub fn check(claim: &ClaimName) -> Result<(), ClaimError> {
    if claim.namespace.is_empty() || claim.name.is_empty() || !valid_uid(&claim.uid) {
        return Err(ClaimError::Incomplete(claim.clone()));
    }
    Ok(())
}

/// The allocation results of driver [`CPU_DRIVER`] in pool `pool` of
/// `obj`, or `None` when it has no allocation.
pub fn results_of(obj: &ResourceClaim, pool: &str) -> Option<Vec<DeviceRequestAllocationResult>> {
    let allocation = obj.status.as_ref()?.allocation.as_ref()?;
    Some(
        allocation
            .devices
            .as_ref()
            .and_then(|d| d.results.as_ref())
            .into_iter()
            .flatten()
            .filter(|r| r.driver == CPU_DRIVER && r.pool == pool)
            .cloned()
            .collect(),
    )
}

/// The claim `claim` as read (`obj`), for the ledger: its CPUs on node
/// `pool`, the UIDs of the pods it is reserved for.
pub fn allocated(
    claim: &ClaimName,
    obj: &ResourceClaim,
    pool: &str,
) -> Result<AllocatedCpus, ClaimError> {
    let uid = obj.metadata.uid.clone().unwrap_or_default();
    if uid != claim.uid {
        return Err(ClaimError::Replaced {
            claim: claim.clone(),
            found: uid,
        });
    }
    let Some(results) = results_of(obj, pool) else {
        return Err(ClaimError::NotAllocated(claim.clone()));
    };
    if results.is_empty() {
        return Err(ClaimError::NoDevices {
            claim: claim.clone(),
            pool: pool.to_owned(),
        });
    }
    let mut cpus = CpuSet::new();
    for r in &results {
        let Some(cpu) = cpu_of_device(&r.device) else {
            return Err(ClaimError::UnknownDevice {
                claim: claim.clone(),
                device: r.device.clone(),
            });
        };
        cpus.insert(cpu);
    }
    let pods: BTreeSet<String> = obj
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
        .map(|r| r.uid.clone())
        .collect();
    Ok(AllocatedCpus {
        claim: CpuClaim {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            cpus,
            pods,
        },
        results,
    })
}

/// Reads `claim` from the API (bounded by `timeout`) and its CPUs on node
/// `pool`.
pub async fn read(
    client: &kube::Client,
    claim: &ClaimName,
    pool: &str,
    timeout: Duration,
) -> Result<AllocatedCpus, ClaimError> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &claim.namespace);
    let obj = match tokio::time::timeout(timeout, api.get_opt(&claim.name)).await {
        Ok(Ok(Some(obj))) => obj,
        Ok(Ok(None)) => return Err(ClaimError::Gone(claim.clone())),
        Ok(Err(e)) => {
            return Err(ClaimError::Unreadable {
                claim: claim.clone(),
                reason: e.to_string(),
            });
        }
        Err(_) => {
            return Err(ClaimError::Unreadable {
                claim: claim.clone(),
                reason: format!("no answer within {timeout:?}"),
            });
        }
    };
    allocated(claim, &obj, pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> ClaimName {
        ClaimName {
            uid: "u1".into(),
            namespace: "default".into(),
            name: "cpus".into(),
        }
    }

    fn claim(uid: &str, devices: &[(&str, &str, &str)]) -> ResourceClaim {
        let results: Vec<serde_json::Value> = devices
            .iter()
            .map(|(driver, pool, device)| {
                serde_json::json!({"request": "cpus", "driver": driver, "pool": pool, "device": device})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cpus", "namespace": "default", "uid": uid},
            "spec": {"devices": {}},
            "status": {
                "allocation": {"devices": {"results": results}},
                "reservedFor": [
                    {"resource": "pods", "name": "web", "uid": "pod-1"},
                    {"resource": "things", "apiGroup": "example.com", "name": "x", "uid": "x-1"}
                ]
            }
        }))
        .unwrap()
    }

    #[test]
    fn the_cpus_of_this_driver_and_node_and_the_pods_are_taken() {
        let obj = claim(
            "u1",
            &[
                ("cpu.steward.dev", "n1", "cpu-2"),
                ("cpu.steward.dev", "n1", "cpu-3"),
                ("cpu.steward.dev", "n2", "cpu-5"),
                ("steward.dev", "n1", "cam-0"),
            ],
        );
        let got = allocated(&name(), &obj, "n1").unwrap();
        assert_eq!(got.claim.cpus, CpuSet::parse("2-3").unwrap());
        assert_eq!(got.claim.pods, BTreeSet::from(["pod-1".to_owned()]));
        assert_eq!(got.results.len(), 2);
    }

    #[test]
    fn a_device_that_is_no_cpu_a_replaced_or_empty_claim_is_refused() {
        let obj = claim("u1", &[("cpu.steward.dev", "n1", "gpu-0")]);
        assert!(matches!(
            allocated(&name(), &obj, "n1"),
            Err(ClaimError::UnknownDevice { device, .. }) if device == "gpu-0"
        ));
        let obj = claim("u2", &[("cpu.steward.dev", "n1", "cpu-1")]);
        assert!(matches!(
            allocated(&name(), &obj, "n1"),
            Err(ClaimError::Replaced { .. })
        ));
        let obj = claim("u1", &[("steward.dev", "n1", "cam-0")]);
        assert!(matches!(
            allocated(&name(), &obj, "n1"),
            Err(ClaimError::NoDevices { .. })
        ));
    }

    #[test]
    fn a_uid_that_could_leave_the_cdi_directory_is_refused() {
        for uid in ["", "../x", "a/b", "a b", "a.json"] {
            let mut n = name();
            n.uid = uid.into();
            assert!(check(&n).is_err(), "{uid:?}");
        }
        assert!(check(&name()).is_ok());
    }
}
