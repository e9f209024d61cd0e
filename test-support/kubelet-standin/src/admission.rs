//! Pod admission, container by container, the way kubelet's devicemanager
//! allocates devices (init containers first, reusing their devices for later
//! containers of the same pod), followed by PreStartContainer at container start.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use steward_proto::deviceplugin::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, DevicePluginOptions, PreStartContainerRequest,
    PreferredAllocationRequest, device_plugin_client::DevicePluginClient,
};
use tonic::transport::Channel;
use tracing::{info, warn};

use crate::dra::{self, FAILED_PREPARE_DYNAMIC_RESOURCES};
use crate::endpoint::RPC_TIMEOUT;
use crate::error::{Error, go_status_text};
use crate::manager::{self, Allocation, ContainerDevices};
use crate::mirror;
use crate::pods::{ContainerSpec, Phase, PodSpec, PodStatus};
use crate::shared::Shared;

/// Reason kubelet gives pods whose device allocation failed.
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";
/// Container waiting reason when kubelet cannot build the container config
/// (PreStartContainer failing is one cause).
pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";

/// A pod the stand-in admitted, with what the plugins answered.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmittedPod {
    pub uid: String,
    /// Container → resource → device IDs handed to `Allocate`.
    pub devices: ContainerDevices,
    /// Container → resource → the plugin's `ContainerAllocateResponse`.
    pub responses: BTreeMap<String, BTreeMap<String, ContainerAllocateResponse>>,
    /// Container → CDI device IDs of the DRA claims it uses (what kubelet
    /// puts into the CRI `ContainerConfig.CDI_devices`); only containers
    /// that use claims have an entry.
    pub cdi_devices: BTreeMap<String, Vec<String>>,
}

struct Rejection {
    reason: String,
    message: String,
}

fn unexpected(err: impl std::fmt::Display) -> Rejection {
    Rejection {
        reason: UNEXPECTED_ADMISSION_ERROR.to_string(),
        message: format!("Allocate failed due to {err}, which is unexpected"),
    }
}

fn positive(c: &ContainerSpec) -> impl Iterator<Item = (&String, usize)> {
    c.resources
        .iter()
        .filter_map(|(r, n)| usize::try_from(*n).ok().filter(|n| *n > 0).map(|n| (r, n)))
}

/// Effective pod request of a resource: max(any init container, sum of app containers).
fn pod_request(spec: &PodSpec, resource: &str) -> i64 {
    let init = spec
        .init_containers
        .iter()
        .filter_map(|c| c.resources.get(resource))
        .copied()
        .max()
        .unwrap_or(0);
    let app: i64 = spec
        .containers
        .iter()
        .filter_map(|c| c.resources.get(resource))
        .sum();
    init.max(app)
}

fn endpoint_of(
    shared: &Shared,
    resource: &str,
) -> Option<(DevicePluginClient<Channel>, DevicePluginOptions)> {
    let st = shared.lock();
    st.resources
        .get(resource)
        .and_then(|e| e.endpoint.as_ref())
        .map(|ep| (ep.client.clone(), ep.options))
}

pub(crate) async fn add_pod(shared: &Arc<Shared>, mut spec: PodSpec) -> Result<AdmittedPod, Error> {
    spec.validate().map_err(Error::InvalidPod)?;
    if !spec.resource_claims.is_empty() && shared.api.is_none() {
        return Err(Error::InvalidPod(
            "pods with resource claims need an API client (kubelet reads the ResourceClaims)"
                .to_string(),
        ));
    }
    let _serial = shared.admission.lock().await;
    if let Some(uid) = &spec.uid
        && shared.lock().pods.contains_key(uid)
    {
        return Err(Error::InvalidPod(format!(
            "a pod with uid {uid} already exists"
        )));
    }
    let uid = match &shared.api {
        // A Pod object created beforehand (`Kubelet::create_pod_object`)
        // with this UID is the pod; otherwise the API server assigns one.
        Some(api) => match mirror::existing_pod_uid(api, &spec).await? {
            Some(existing) if spec.uid.as_ref() == Some(&existing) => existing,
            _ => mirror::create_pod(api, &shared.node_name, &spec).await?,
        },
        None => spec
            .uid
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
    };
    spec.uid = Some(uid.clone());
    // Extended resources the scheduler backed by DRA on this node are
    // served from the claim it made, not by a device plugin.
    if let Some(api) = &shared.api
        && let Some(claim) = mirror::extended_resource_claim(api, &spec).await?
    {
        spec = spec
            .with_extended_claim(&claim)
            .map_err(Error::InvalidPod)?;
        spec.validate().map_err(Error::InvalidPod)?;
    }
    {
        let mut st = shared.lock();
        st.pods.insert(
            uid.clone(),
            PodStatus {
                uid: uid.clone(),
                spec: spec.clone(),
                phase: Phase::Pending,
                reason: None,
                message: None,
            },
        );
        st.admitting = Some(uid.clone());
        shared.write_pods(&st);
    }
    shared.notify();
    info!(pod = %spec.name, namespace = %spec.namespace, pod_uid = %uid, "admitting pod");

    let allocated = allocate_pod(shared, &uid, &spec).await;
    shared.lock().admitting = None;
    let mut admitted = match allocated {
        Ok(a) => a,
        Err(rejection) => {
            warn!(pod_uid = %uid, reason = %rejection.reason, message = %rejection.message, "pod rejected");
            set_status(
                shared,
                &uid,
                Phase::Failed,
                Some(rejection.reason.clone()),
                Some(format!("Pod was rejected: {}", rejection.message)),
            )
            .await;
            return Err(Error::Admission {
                uid,
                reason: rejection.reason,
                message: rejection.message,
            });
        }
    };

    // SyncPod: DRA resources are prepared before the sandbox and the
    // containers are created (after admission, before PreStartContainer).
    if let Err(message) = dra::prepare_pod(shared, &uid, &spec).await {
        let event = format!("Failed to prepare dynamic resources: {message}");
        warn!(pod_uid = %uid, %message, "cannot prepare dynamic resources");
        set_status(
            shared,
            &uid,
            Phase::Pending,
            Some(FAILED_PREPARE_DYNAMIC_RESOURCES.to_string()),
            Some(event.clone()),
        )
        .await;
        if let Some(api) = &shared.api
            && let Err(e) = mirror::warning_event(
                api,
                &shared.node_name,
                &spec,
                &uid,
                FAILED_PREPARE_DYNAMIC_RESOURCES,
                &event,
            )
            .await
        {
            warn!(pod_uid = %uid, error = %e, "failed to record the event");
        }
        return Err(Error::PrepareResources { uid, message });
    }
    admitted.cdi_devices = dra::cdi_devices(&shared.lock().dra_claims, &spec);

    if let Err((container, message)) = pre_start(shared, &uid, &spec, &admitted.devices).await {
        warn!(pod_uid = %uid, %container, %message, "container cannot start");
        set_status(
            shared,
            &uid,
            Phase::Pending,
            Some(CREATE_CONTAINER_CONFIG_ERROR.to_string()),
            Some(message.clone()),
        )
        .await;
        return Err(Error::ContainerStart {
            uid,
            container,
            message,
        });
    }
    set_status(shared, &uid, Phase::Running, None, None).await;
    info!(pod_uid = %uid, "pod running");
    Ok(admitted)
}

/// Updates the local pod record and mirrors it to the API server (if any).
pub(crate) async fn set_status(
    shared: &Shared,
    uid: &str,
    phase: Phase,
    reason: Option<String>,
    message: Option<String>,
) {
    let snapshot = {
        let mut st = shared.lock();
        let Some(pod) = st.pods.get_mut(uid) else {
            return;
        };
        pod.phase = phase;
        pod.reason = reason;
        pod.message = message;
        let snapshot = pod.clone();
        shared.write_pods(&st);
        snapshot
    };
    shared.notify();
    if let Some(api) = &shared.api
        && let Err(e) = mirror::patch_pod_status(api, &snapshot).await
    {
        warn!(pod_uid = %uid, error = %e, "failed to mirror pod status");
    }
}

async fn allocate_pod(
    shared: &Shared,
    uid: &str,
    spec: &PodSpec,
) -> Result<AdmittedPod, Rejection> {
    {
        let mut st = shared.lock();
        // UpdateAllocatedDevices: devices of pods that are gone or terminated
        // become free again.
        if st.remove_inactive_pods() {
            shared.write_checkpoint_logged(&st);
        }
        // The node-level predicate: an extended resource nobody provides.
        for c in spec.init_containers.iter().chain(&spec.containers) {
            for (resource, _) in positive(c) {
                if !st.is_device_plugin_resource(resource) {
                    return Err(Rejection {
                        reason: format!("OutOf{resource}"),
                        message: format!(
                            "Node didn't have enough resource: {resource}, requested: {}, used: 0, capacity: 0",
                            pod_request(spec, resource)
                        ),
                    });
                }
            }
        }
    }

    let mut admitted = AdmittedPod {
        uid: uid.to_string(),
        devices: BTreeMap::new(),
        responses: BTreeMap::new(),
        cdi_devices: BTreeMap::new(),
    };
    // devicesToReuse: resource → devices of this pod's init containers.
    let mut reuse: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let containers = spec
        .init_containers
        .iter()
        .map(|c| (true, c))
        .chain(spec.containers.iter().map(|c| (false, c)));
    for (is_init, container) in containers {
        for (resource, required) in positive(container) {
            let (ids, response) = allocate_container_resource(
                shared,
                uid,
                container,
                resource,
                required,
                reuse.get(resource),
            )
            .await?;
            admitted
                .devices
                .entry(container.name.clone())
                .or_default()
                .insert(resource.clone(), ids);
            admitted
                .responses
                .entry(container.name.clone())
                .or_default()
                .insert(resource.clone(), response);
        }
        {
            let st = shared.lock();
            shared.write_checkpoint(&st).map_err(unexpected)?;
        }
        if let Some(held) = admitted.devices.get(&container.name) {
            for (resource, ids) in held {
                let set = reuse.entry(resource.clone()).or_default();
                if is_init {
                    set.extend(ids.iter().cloned());
                } else {
                    set.retain(|d| !ids.contains(d));
                }
            }
        }
    }
    shared.notify();
    Ok(admitted)
}

async fn allocate_container_resource(
    shared: &Shared,
    uid: &str,
    container: &ContainerSpec,
    resource: &str,
    required: usize,
    reusable: Option<&BTreeSet<String>>,
) -> Result<(BTreeSet<String>, ContainerAllocateResponse), Rejection> {
    let selection = {
        let st = shared.lock();
        manager::begin_selection(&st, resource, required, reusable).map_err(unexpected)?
    };
    let (mut client, options) = endpoint_of(shared, resource)
        .ok_or_else(|| unexpected(format!("unknown Device Plugin {resource}")))?;

    let chosen = if selection.needed() == 0 {
        selection.allocated
    } else {
        let preferred = if options.get_preferred_allocation_available {
            let available: Vec<String> = selection
                .available
                .union(&selection.allocated)
                .cloned()
                .collect();
            let request = PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_i_ds: available,
                    must_include_device_i_ds: selection.allocated.iter().cloned().collect(),
                    allocation_size: i32::try_from(required).unwrap_or(i32::MAX),
                }],
            };
            let response = tokio::time::timeout(RPC_TIMEOUT, client.get_preferred_allocation(request))
                .await
                .map_err(|_| unexpected("device plugin GetPreferredAllocation rpc failed with err: context deadline exceeded"))?
                .map_err(|s| {
                    unexpected(format!(
                        "device plugin GetPreferredAllocation rpc failed with err: {}",
                        go_status_text(&s)
                    ))
                })?
                .into_inner();
            Some(
                response
                    .container_responses
                    .into_iter()
                    .next()
                    .map(|r| r.device_i_ds)
                    .unwrap_or_default(),
            )
        } else {
            None
        };
        manager::finish_selection(selection, preferred.as_deref()).map_err(unexpected)?
    };

    let request = AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: chosen.iter().cloned().collect(),
        }],
    };
    let started = std::time::Instant::now();
    let response = tokio::time::timeout(RPC_TIMEOUT, client.allocate(request))
        .await
        .map_err(|_| unexpected("context deadline exceeded"))?
        .map_err(|s| unexpected(go_status_text(&s)))?
        .into_inner();
    let took = started.elapsed();
    let Some(container_response) = response.container_responses.first().cloned() else {
        return Err(unexpected(format!(
            "no containers return in allocation response {response:?}"
        )));
    };
    {
        let mut st = shared.lock();
        st.alloc_durations
            .entry(resource.to_string())
            .or_default()
            .push(took);
        let devices = st.devices_per_numa(resource, &chosen);
        st.pod_devices
            .entry(uid.to_string())
            .or_default()
            .entry(container.name.clone())
            .or_default()
            .insert(
                resource.to_string(),
                Allocation {
                    devices,
                    response: Some(container_response.clone()),
                },
            );
    }
    info!(pod_uid = %uid, container = %container.name, %resource, devices = ?chosen, "allocated devices");
    Ok((chosen, container_response))
}

/// PreStartContainer for every container (init containers first) and
/// resource whose plugin asked for it. Returns the failing container.
async fn pre_start(
    shared: &Shared,
    uid: &str,
    spec: &PodSpec,
    devices: &ContainerDevices,
) -> Result<(), (String, String)> {
    for container in spec.init_containers.iter().chain(&spec.containers) {
        let Some(held) = devices.get(&container.name) else {
            continue;
        };
        for (resource, ids) in held {
            let Some((mut client, options)) = endpoint_of(shared, resource) else {
                return Err((
                    container.name.clone(),
                    format!("endpoint of {resource} has been stopped"),
                ));
            };
            if !options.pre_start_required {
                continue;
            }
            let request = PreStartContainerRequest {
                devices_ids: ids.iter().cloned().collect(),
            };
            let result =
                tokio::time::timeout(RPC_TIMEOUT, client.pre_start_container(request)).await;
            let failure = match result {
                Ok(Ok(_)) => None,
                Ok(Err(s)) => Some(go_status_text(&s)),
                Err(_) => Some("context deadline exceeded".to_string()),
            };
            if let Some(err) = failure {
                return Err((
                    container.name.clone(),
                    format!("device plugin PreStartContainer rpc failed with err: {err}"),
                ));
            }
            info!(pod_uid = %uid, container = %container.name, %resource, "PreStartContainer done");
        }
    }
    Ok(())
}
