//! Reading an allocated ResourceClaim the way a DRA driver must at
//! NodePrepareResources: kubelet names the claim only (namespace, name,
//! UID); the devices the scheduler allocated and the pods using it are in
//! the API.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use steward_core::dra::{DRIVER, SLOTS_CAPACITY};
use steward_core::ledger::{ClaimRef, Holder, PodRef};

use super::prepare::AllocatedDevice;

/// What a prepare needs of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedClaim {
    /// The devices of driver [`DRIVER`] allocated to it (results of other
    /// drivers are theirs to prepare).
    pub devices: Vec<AllocatedDevice>,
    /// Each pod the claim is reserved for, once per container naming the
    /// claim (with no container when the pod could not be read).
    pub users: Vec<Holder>,
}

/// Why a claim cannot be prepared, as read from the API: the per-claim
/// error kubelet gets, and the `result` label of
/// `steward_dra_prepares_total` it is counted under ([`ClaimReadError::label`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimReadError {
    /// The API has no such claim.
    #[error("ResourceClaim {0} no longer exists")]
    Gone(ClaimRef),
    /// The claim of that name has another UID (deleted and recreated).
    #[error("ResourceClaim {claim} has UID {found:?}, kubelet asked for {:?}: it was replaced", claim.uid)]
    Replaced { claim: ClaimRef, found: String },
    /// The claim could not be read (API error or no answer in time).
    #[error("reading ResourceClaim {claim}: {reason}")]
    Unreadable { claim: ClaimRef, reason: String },
    /// The claim has no allocation.
    #[error("ResourceClaim {0} is not allocated")]
    NotAllocated(ClaimRef),
    /// The allocation names no device of this driver.
    #[error("ResourceClaim {0} has no device of driver {DRIVER} allocated")]
    NoDevices(ClaimRef),
}

impl ClaimReadError {
    /// The `result` label: `claim_gone`, `claim_replaced`,
    /// `claim_unreadable`, `not_allocated` or `no_devices`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Gone(_) => "claim_gone",
            Self::Replaced { .. } => "claim_replaced",
            Self::Unreadable { .. } => "claim_unreadable",
            Self::NotAllocated(_) => "not_allocated",
            Self::NoDevices(_) => "no_devices",
        }
    }
}

/// Reads `claim` and its allocation. The error is the per-claim error
/// kubelet gets: the claim is gone, replaced or unreadable, not
/// allocated, or has no device of this driver.
pub async fn read_claim(
    client: &kube::Client,
    claim: &ClaimRef,
    timeout: Duration,
) -> Result<AllocatedClaim, ClaimReadError> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &claim.namespace);
    let obj = match tokio::time::timeout(timeout, api.get_opt(&claim.name)).await {
        Ok(Ok(Some(obj))) => obj,
        Ok(Ok(None)) => return Err(ClaimReadError::Gone(claim.clone())),
        Ok(Err(e)) => {
            return Err(ClaimReadError::Unreadable {
                claim: claim.clone(),
                reason: e.to_string(),
            });
        }
        Err(_) => {
            return Err(ClaimReadError::Unreadable {
                claim: claim.clone(),
                reason: format!("no answer within {timeout:?}"),
            });
        }
    };
    let uid = obj.metadata.uid.clone().unwrap_or_default();
    if uid != claim.uid {
        return Err(ClaimReadError::Replaced {
            claim: claim.clone(),
            found: uid,
        });
    }
    let status = obj.status.unwrap_or_default();
    let Some(allocation) = status.allocation else {
        return Err(ClaimReadError::NotAllocated(claim.clone()));
    };
    let devices: Vec<AllocatedDevice> = allocation
        .devices
        .and_then(|d| d.results)
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.driver == DRIVER)
        .map(|r| {
            let slots = r
                .consumed_capacity
                .as_ref()
                .and_then(|c| c.get(SLOTS_CAPACITY))
                .map(|q| q.0.clone());
            AllocatedDevice {
                request: r.request,
                pool: r.pool,
                device: r.device,
                share_id: r.share_id.unwrap_or_default(),
                slots,
            }
        })
        .collect();
    if devices.is_empty() {
        return Err(ClaimReadError::NoDevices(claim.clone()));
    }
    let mut users = Vec::new();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &claim.namespace);
    for r in status.reserved_for.unwrap_or_default() {
        if r.resource != "pods" || r.api_group.as_deref().is_some_and(|g| !g.is_empty()) {
            continue;
        }
        let pod_ref = PodRef::new(&r.uid, &claim.namespace, &r.name);
        let pod = match tokio::time::timeout(timeout, pods.get_opt(&r.name)).await {
            Ok(Ok(Some(p))) if p.metadata.uid.as_deref() == Some(r.uid.as_str()) => Some(p),
            _ => None,
        };
        let containers = pod
            .map(|p| containers_using(&p, &claim.name))
            .unwrap_or_default();
        if containers.is_empty() {
            users.push(Holder::new(pod_ref, None));
        } else {
            users.extend(
                containers
                    .into_iter()
                    .map(|c| Holder::new(pod_ref.clone(), Some(c))),
            );
        }
    }
    Ok(AllocatedClaim { devices, users })
}

/// The containers (init containers included) of `pod` that name the claim
/// object `claim_name` in `resources.claims`, through the pod's claim
/// entries (a direct `resourceClaimName`, or a claim generated from a
/// template as recorded in `status.resourceClaimStatuses`).
pub fn containers_using(pod: &Pod, claim_name: &str) -> Vec<String> {
    let spec = pod.spec.as_ref();
    let mut entries: Vec<&str> = spec
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.resource_claim_name.as_deref() == Some(claim_name))
        .map(|c| c.name.as_str())
        .collect();
    entries.extend(
        pod.status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| c.resource_claim_name.as_deref() == Some(claim_name))
            .map(|c| c.name.as_str()),
    );
    let Some(spec) = spec else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .filter(|c| {
            c.resources
                .as_ref()
                .and_then(|r| r.claims.as_ref())
                .is_some_and(|cs| cs.iter().any(|rc| entries.contains(&rc.name.as_str())))
        })
        .map(|c| c.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_are_found_through_direct_and_templated_claim_entries() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {
                "resourceClaims": [
                    {"name": "cam", "resourceClaimName": "cam-claim"},
                    {"name": "gpu", "resourceClaimTemplateName": "gpu-tpl"}
                ],
                "initContainers": [
                    {"name": "init", "resources": {"claims": [{"name": "gpu"}]}}
                ],
                "containers": [
                    {"name": "main", "resources": {"claims": [{"name": "cam"}]}},
                    {"name": "side"}
                ]
            },
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x1"}]}
        }))
        .unwrap();
        assert_eq!(containers_using(&pod, "cam-claim"), ["main"]);
        assert_eq!(containers_using(&pod, "p-gpu-x1"), ["init"]);
        assert!(containers_using(&pod, "other").is_empty());
    }
}
