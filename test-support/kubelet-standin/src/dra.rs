//! kubelet's DRA manager (`pkg/kubelet/cm/dra`): prepares a pod's
//! ResourceClaims with the drivers' `NodePrepareResources` before its
//! containers start, hands the CDI device IDs to the containers that use
//! them, and unprepares a claim when the last pod on the node using it is
//! done. Claim infos live in the stand-in's state and in the
//! `dra_manager_state` checkpoint ([`crate::dra_state`]).
//!
//! Prepare follows kubelet 1.34: a validation pass (fetch each claim, the
//! pod must be in `status.reservedFor`, the claim must be allocated, every
//! driver of its allocation results must be registered) that changes
//! nothing; then the pod is added to the claim infos (checkpointed); then
//! one `NodePrepareResources` per driver for the claims not prepared yet;
//! a per-claim `error` or a missing result fails the pod; then the claims
//! are marked prepared (checkpointed). Errors carry kubelet's texts,
//! prefixed `prepare dynamic resources: `.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use steward_proto::dra::v1::dra_plugin_client::DraPluginClient;
use steward_proto::dra::v1::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use steward_proto::podresources::v1::{CdiDevice, ClaimResource, DynamicResource};
use tonic::transport::Channel;
use tracing::{debug, info};

use crate::dra_state::{ClaimInfo, ClaimInfos, DriverState, PreparedDevice};
use crate::error::go_status_text;
use crate::manager::State;
use crate::pods::{ContainerSpec, PodSpec};
use crate::shared::Shared;

/// Event reason (and the stand-in's pod reason) when preparing fails.
pub const FAILED_PREPARE_DYNAMIC_RESOURCES: &str = "FailedPrepareDynamicResources";
/// kubelet's default timeout for calls to DRA plugins.
const CALL_TIMEOUT: Duration = Duration::from_secs(45);

fn api_error_text(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

fn is_reserved_for(claim: &ResourceClaim, pod_uid: &str) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .is_some_and(|r| {
            r.iter().any(|c| {
                c.resource == "pods"
                    && c.api_group.as_deref().unwrap_or_default().is_empty()
                    && c.uid == pod_uid
            })
        })
}

/// A new claim info: one (empty) driver state per driver of the allocation.
fn claim_info_from(claim: &ResourceClaim) -> Result<ClaimInfo, String> {
    let allocation = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or_else(|| "not allocated".to_string())?;
    let drivers = allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .map(|r| {
            r.iter()
                .map(|r| (r.driver.clone(), DriverState::default()))
                .collect()
        })
        .unwrap_or_default();
    Ok(ClaimInfo {
        uid: claim.metadata.uid.clone().unwrap_or_default(),
        name: claim.metadata.name.clone().unwrap_or_default(),
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        pod_uids: BTreeSet::new(),
        drivers,
        prepared: false,
    })
}

fn wire_claim(info: &ClaimInfo) -> Claim {
    Claim {
        namespace: info.namespace.clone(),
        uid: info.uid.clone(),
        name: info.name.clone(),
    }
}

/// `PrepareResources` for the pod. `Err` is kubelet's error text.
pub(crate) async fn prepare_pod(
    shared: &Shared,
    pod_uid: &str,
    spec: &PodSpec,
) -> Result<(), String> {
    if spec.resource_claims.is_empty() {
        return Ok(());
    }
    let _ops = shared.dra_ops.lock().await;
    prepare(shared, pod_uid, spec)
        .await
        .map_err(|e| format!("prepare dynamic resources: {e}"))
}

async fn prepare(shared: &Shared, pod_uid: &str, spec: &PodSpec) -> Result<(), String> {
    let api = shared
        .api
        .clone()
        .ok_or_else(|| "no API client to read ResourceClaims with".to_string())?;
    let claims_api: Api<ResourceClaim> = Api::namespaced(api, &spec.namespace);

    // Validation pass: nothing changes if anything is wrong.
    let mut fresh = Vec::new();
    for pod_claim in &spec.resource_claims {
        let name = &pod_claim.resource_claim_name;
        let claim = claims_api
            .get(name)
            .await
            .map_err(|e| format!("fetch ResourceClaim {name}: {}", api_error_text(&e)))?;
        if !is_reserved_for(&claim, pod_uid) {
            return Err(format!(
                "pod {} ({pod_uid}) is not allowed to use ResourceClaim {name} ({})",
                spec.name,
                claim.metadata.uid.as_deref().unwrap_or_default()
            ));
        }
        let info = claim_info_from(&claim).map_err(|e| format!("ResourceClaim {name}: {e}"))?;
        let st = shared.lock();
        for driver in info.drivers.keys() {
            st.dra_plugins.client(driver)?;
        }
        fresh.push(info);
    }

    // The pod joins the claim infos; claims not prepared yet are batched per driver.
    let mut batches: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
    let mut to_mark: Vec<(String, String)> = Vec::new();
    {
        let mut st = shared.lock();
        for info in fresh {
            let key = (info.namespace.clone(), info.name.clone());
            let entry = st
                .dra_claims
                .entry(key.clone())
                .or_insert_with(|| info.clone());
            if entry.uid != info.uid {
                return Err(format!(
                    "old ResourceClaim with same name {} and different UID {} still exists (previous pod force-deleted?!)",
                    info.name, entry.uid
                ));
            }
            entry.pod_uids.insert(pod_uid.to_string());
            if entry.prepared {
                debug!(claim = %info.name, "resources already prepared");
                continue;
            }
            for driver in entry.drivers.keys() {
                batches
                    .entry(driver.clone())
                    .or_default()
                    .push(wire_claim(entry));
            }
            to_mark.push(key);
        }
        shared
            .write_dra_checkpoint(&st)
            .map_err(|e| format!("checkpoint ResourceClaim cache: {e}"))?;
    }

    for (driver, claims) in batches {
        let mut client = plugin_client(shared, &driver)?;
        let request = NodePrepareResourcesRequest {
            claims: claims.clone(),
        };
        let response = tokio::time::timeout(CALL_TIMEOUT, client.node_prepare_resources(request))
            .await
            .map_err(|_| "NodePrepareResources: context deadline exceeded".to_string())?
            .map_err(|s| format!("NodePrepareResources: {}", go_status_text(&s)))?
            .into_inner();
        if let Some(unknown) = response
            .claims
            .keys()
            .find(|uid| !claims.iter().any(|c| &c.uid == *uid))
        {
            return Err(format!(
                "NodePrepareResources returned result for unknown claim UID {unknown}"
            ));
        }
        let mut skipped = 0;
        for claim in &claims {
            let Some(result) = response.claims.get(&claim.uid) else {
                skipped += 1;
                continue;
            };
            if !result.error.is_empty() {
                return Err(format!(
                    "NodePrepareResources failed for ResourceClaim {}: {}",
                    claim.name, result.error
                ));
            }
            let devices = result
                .devices
                .iter()
                .map(|d| PreparedDevice {
                    pool_name: d.pool_name.clone(),
                    device_name: d.device_name.clone(),
                    share_id: d.share_id.clone(),
                    request_names: d.request_names.clone(),
                    cdi_device_ids: d.cdi_device_ids.clone(),
                })
                .collect();
            let mut st = shared.lock();
            let info = st
                .dra_claims
                .get_mut(&(claim.namespace.clone(), claim.name.clone()))
                .ok_or_else(|| {
                    format!(
                        "internal error: unable to get claim info for ResourceClaim {} in namespace {}",
                        claim.name, claim.namespace
                    )
                })?;
            info.drivers.insert(driver.clone(), DriverState { devices });
        }
        if skipped != 0 {
            return Err(format!(
                "NodePrepareResources skipped {skipped} ResourceClaims"
            ));
        }
    }

    let mut st = shared.lock();
    for key in &to_mark {
        if let Some(info) = st.dra_claims.get_mut(key) {
            info.prepared = true;
        }
    }
    shared
        .write_dra_checkpoint(&st)
        .map_err(|e| format!("checkpoint ResourceClaim state: {e}"))?;
    drop(st);
    shared.notify();
    info!(%pod_uid, claims = to_mark.len(), "dynamic resources prepared");
    Ok(())
}

fn plugin_client(shared: &Shared, driver: &str) -> Result<DraPluginClient<Channel>, String> {
    shared.lock().dra_plugins.client(driver)
}

/// `UnprepareResources` for the pod: claims only this pod uses are
/// unprepared (one `NodeUnprepareResources` per driver) and forgotten; the
/// pod is dropped from shared ones. `Err` is kubelet's error text.
pub(crate) async fn unprepare_pod(shared: &Shared, pod_uid: &str) -> Result<(), String> {
    if !shared
        .lock()
        .dra_claims
        .values()
        .any(|c| c.pod_uids.contains(pod_uid))
    {
        return Ok(());
    }
    let _ops = shared.dra_ops.lock().await;
    unprepare(shared, pod_uid)
        .await
        .map_err(|e| format!("unprepare dynamic resources: {e}"))
}

async fn unprepare(shared: &Shared, pod_uid: &str) -> Result<(), String> {
    let mut batches: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
    let mut done: Vec<(String, String)> = Vec::new();
    {
        let mut st = shared.lock();
        for (key, info) in st.dra_claims.iter_mut() {
            if !info.pod_uids.contains(pod_uid) {
                continue;
            }
            if info.pod_uids.len() > 1 {
                // Checkpointed once the call below succeeds, like kubelet.
                info.pod_uids.remove(pod_uid);
                debug!(claim = %info.name, "other pods still use the claim");
                continue;
            }
            for driver in info.drivers.keys() {
                batches
                    .entry(driver.clone())
                    .or_default()
                    .push(wire_claim(info));
            }
            done.push(key.clone());
        }
    }
    for (driver, claims) in batches {
        let mut client = plugin_client(shared, &driver)?;
        let request = NodeUnprepareResourcesRequest {
            claims: claims.clone(),
        };
        let response = tokio::time::timeout(CALL_TIMEOUT, client.node_unprepare_resources(request))
            .await
            .map_err(|_| "NodeUnprepareResources: context deadline exceeded".to_string())?
            .map_err(|s| format!("NodeUnprepareResources: {}", go_status_text(&s)))?
            .into_inner();
        if let Some(unknown) = response
            .claims
            .keys()
            .find(|uid| !claims.iter().any(|c| &c.uid == *uid))
        {
            return Err(format!(
                "NodeUnprepareResources returned result for unknown claim UID {unknown}"
            ));
        }
        let mut skipped = 0;
        for claim in &claims {
            match response.claims.get(&claim.uid) {
                None => skipped += 1,
                Some(r) if !r.error.is_empty() => {
                    return Err(format!(
                        "NodeUnprepareResources failed for ResourceClaim {}: {}",
                        claim.name, r.error
                    ));
                }
                Some(_) => {}
            }
        }
        if skipped != 0 {
            return Err(format!(
                "NodeUnprepareResources skipped {skipped} ResourceClaims"
            ));
        }
    }
    let mut st = shared.lock();
    for key in &done {
        st.dra_claims.remove(key);
    }
    shared
        .write_dra_checkpoint(&st)
        .map_err(|e| format!("checkpoint ResourceClaim state: {e}"))?;
    drop(st);
    shared.notify();
    info!(%pod_uid, claims = done.len(), "dynamic resources unprepared");
    Ok(())
}

/// The pod claims a container uses, with the requests it asks for.
fn container_claims<'a>(
    spec: &'a PodSpec,
    container: &'a ContainerSpec,
) -> impl Iterator<Item = (&'a str, Vec<Option<&'a str>>)> + 'a {
    spec.resource_claims.iter().filter_map(move |pc| {
        let requests: Vec<Option<&str>> = container
            .claims
            .iter()
            .filter(|c| c.name == pc.name)
            .map(|c| c.request.as_deref())
            .collect();
        (!requests.is_empty()).then_some((pc.resource_claim_name.as_str(), requests))
    })
}

/// `GetResources`: container → CDI device IDs, for every container that uses
/// a claim (init containers included).
pub(crate) fn cdi_devices(claims: &ClaimInfos, spec: &PodSpec) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for c in spec.init_containers.iter().chain(&spec.containers) {
        if c.claims.is_empty() {
            continue;
        }
        let mut ids = Vec::new();
        for (claim_name, requests) in container_claims(spec, c) {
            if let Some(info) = claims.get(&(spec.namespace.clone(), claim_name.to_string())) {
                for r in requests {
                    ids.extend(info.cdi_devices(r));
                }
            }
        }
        out.insert(c.name.clone(), ids);
    }
    out
}

/// podresources' `dynamic_resources` of one container: one entry per claim
/// it uses, one `ClaimResource` per prepared device. Like kubelet, nothing
/// when a claim is unknown to the DRA manager.
pub(crate) fn dynamic_resources(
    state: &State,
    spec: &PodSpec,
    container: &ContainerSpec,
) -> Vec<DynamicResource> {
    let mut out = Vec::new();
    for (claim_name, _) in container_claims(spec, container) {
        let Some(info) = state
            .dra_claims
            .get(&(spec.namespace.clone(), claim_name.to_string()))
        else {
            return Vec::new();
        };
        let claim_resources = info
            .drivers
            .iter()
            .flat_map(|(driver, ds)| {
                ds.devices.iter().map(move |d| ClaimResource {
                    cdi_devices: d
                        .cdi_device_ids
                        .iter()
                        .map(|name| CdiDevice { name: name.clone() })
                        .collect(),
                    driver_name: driver.clone(),
                    pool_name: d.pool_name.clone(),
                    device_name: d.device_name.clone(),
                    share_id: None, // the stand-in keeps no share IDs
                })
            })
            .collect();
        out.push(DynamicResource {
            claim_name: info.name.clone(),
            claim_namespace: info.namespace.clone(),
            claim_resources,
        });
    }
    out
}
