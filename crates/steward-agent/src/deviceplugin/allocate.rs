//! kubelet's Allocate and GetPreferredAllocation on the slot keeper, and
//! the v1beta1 answer: what a container gets of the Instances its slots
//! belong to (environment, mounts, device nodes, CDI devices, annotations).

use std::collections::BTreeMap;
use std::time::Instant;

use steward_api::{InstanceDeviceSpec, InstanceMount};
use steward_core::slots::{AllocateError, parse_slot_id};
use steward_proto::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, DeviceSpec, Mount, PreferredAllocationRequest,
    PreferredAllocationResponse,
};
use tonic::Status;

use crate::claims::ClaimStore;
use crate::host_paths::HostPathPolicy;
use crate::slot_keeper::{ClaimRefused, SlotKeeper, State, now};

/// Annotation naming the slots handed to a container.
pub const SLOTS_ANNOTATION: &str = "steward.dev/slots";
/// Annotation naming the Instance of the slots.
pub const INSTANCE_ANNOTATION: &str = "steward.dev/instance";

/// Refuses ids that are not slots of `instance` (another Instance's slot
/// sent to this plugin) and ids named twice in one request. kubelet never
/// sends either; a plugin must not act on them.
fn own_slots(instance: &str, req: &AllocateRequest) -> Result<(), (Status, &'static str)> {
    let mut seen = std::collections::BTreeSet::new();
    for id in req.container_requests.iter().flat_map(|c| &c.devices_ids) {
        let own = id
            .rsplit_once('-')
            .is_some_and(|(i, n)| i == instance && n.parse::<u32>().is_ok());
        if !own {
            return Err((
                Status::not_found(format!(
                    "unknown device {id:?}: not a slot of {instance}; nothing was allocated"
                )),
                "unknown_device",
            ));
        }
        if !seen.insert(id.as_str()) {
            return Err((
                Status::invalid_argument(format!(
                    "device {id:?} is named twice in one Allocate; nothing was allocated"
                )),
                "duplicate_device",
            ));
        }
    }
    Ok(())
}

/// The mounts and device nodes of each Instance named by `req`, checked
/// against the node's host path policy and resolved on the node. One path
/// outside the policy refuses the whole request (nothing is claimed), naming
/// the path and the policy.
fn checked_edits(
    policy: &HostPathPolicy,
    st: &State,
    req: &AllocateRequest,
) -> Result<CheckedEdits, (Status, &'static str)> {
    let mut out = CheckedEdits::new();
    for id in req.container_requests.iter().flat_map(|c| &c.devices_ids) {
        let Some((name, _)) = parse_slot_id(id) else {
            continue;
        };
        if out.contains_key(name) {
            continue;
        }
        let Some(inst) = st.instances.get(name) else {
            continue;
        };
        let edits = policy
            .check_edits(&inst.mounts, &inst.device_specs)
            .map_err(|e| {
                (
                    Status::permission_denied(format!(
                        "Instance {}/{} is not served on this node: {e}; nothing was allocated",
                        inst.namespace, inst.name
                    )),
                    "host_path_refused",
                )
            })?;
        out.insert(name.to_owned(), edits);
    }
    Ok(out)
}

/// Checked `(mounts, device nodes)` by Instance name.
type CheckedEdits = BTreeMap<String, (Vec<InstanceMount>, Vec<InstanceDeviceSpec>)>;

/// The gRPC status kubelet is answered for a refused claim, and the
/// `result` label it is counted under.
fn refused_status(e: &ClaimRefused) -> (Status, &'static str) {
    let msg = e.to_string();
    let status = match e {
        ClaimRefused::Ledger(AllocateError::NoDevices) => Status::invalid_argument(msg),
        ClaimRefused::Ledger(AllocateError::UnknownDevice { .. }) => Status::not_found(msg),
        ClaimRefused::Ledger(AllocateError::ClusterUnreachable { .. }) => Status::unavailable(msg),
        ClaimRefused::Ledger(AllocateError::ClaimInFlight { .. }) => Status::aborted(msg),
        ClaimRefused::Ledger(_) => Status::failed_precondition(msg),
        ClaimRefused::Expired(_) => Status::aborted(msg),
        ClaimRefused::HeldElsewhere { .. } => Status::failed_precondition(msg),
        ClaimRefused::NotDurable { .. } => Status::unavailable(msg),
    };
    (status, e.label())
}

impl<L: ClaimStore, C: ClaimStore> SlotKeeper<L, C> {
    /// kubelet's Allocate: claims every slot durably (local, then cluster)
    /// before answering; on any failure nothing changed and the answer is an
    /// error saying why. Every id must be one of `instance`'s slots, each at
    /// most once, or nothing is allocated.
    pub async fn allocate(
        &self,
        instance: &str,
        req: &AllocateRequest,
    ) -> Result<AllocateResponse, Status> {
        let started = Instant::now();
        let result = match own_slots(instance, req) {
            Ok(()) => self.allocate_inner(req).await,
            Err(refused) => {
                tracing::warn!(%instance, error = %refused.0.message(), "Allocate refused");
                Err(refused)
            }
        };
        self.metrics
            .allocate_seconds
            .observe(started.elapsed().as_secs_f64());
        match &result {
            Ok(_) => self.metrics.allocation("ok"),
            Err((_, label)) => self.metrics.allocation(label),
        }
        result.map_err(|(s, _)| s)
    }

    async fn allocate_inner(
        &self,
        req: &AllocateRequest,
    ) -> Result<AllocateResponse, (Status, &'static str)> {
        let ids: Vec<String> = req
            .container_requests
            .iter()
            .flat_map(|c| c.devices_ids.iter().cloned())
            .collect();
        let mut st = self.lock().await;
        let edits = checked_edits(&self.host_paths, &st, req).inspect_err(|e| {
            tracing::warn!(devices = ?ids, error = %e.0.message(), "Allocate refused: host path outside the node's policy");
        })?;
        self.claim_durably(
            &mut st,
            || format!("{ids:?}"),
            |ledger| ledger.allocate(&ids, now()),
        )
        .await
        .map_err(|e| refused_status(&e))?;
        let response = self.response(&st, req, &edits);
        drop(st);
        self.follow_up();
        tracing::info!(devices = ?ids, "Allocate answered");
        Ok(response)
    }

    fn response(
        &self,
        st: &State,
        req: &AllocateRequest,
        edits: &CheckedEdits,
    ) -> AllocateResponse {
        let container_responses = req
            .container_requests
            .iter()
            .map(|c| {
                let mut out = ContainerAllocateResponse::default();
                let mut seen = Vec::new();
                for id in &c.devices_ids {
                    let Some((name, _)) = parse_slot_id(id) else {
                        continue;
                    };
                    if seen.contains(&name) {
                        continue;
                    }
                    seen.push(name);
                    let (Some(inst), Some((mounts, devices))) =
                        (st.instances.get(name), edits.get(name))
                    else {
                        continue;
                    };
                    let empty = BTreeMap::new();
                    let broker = st.broker.get(&inst.config_key()).unwrap_or(&empty);
                    out.envs.extend(inst.env(broker));
                    out.mounts.extend(mounts.iter().map(|m| Mount {
                        container_path: m.container_path.clone(),
                        host_path: m.host_path.clone(),
                        read_only: m.read_only,
                    }));
                    out.devices.extend(devices.iter().map(|d| DeviceSpec {
                        container_path: d.container_path.clone(),
                        host_path: d.host_path.clone(),
                        permissions: d.permissions.clone(),
                    }));
                    if self.cdi && !inst.cdi_name.is_empty() {
                        out.cdi_devices.push(CdiDevice {
                            name: inst.cdi_name.clone(),
                        });
                    }
                    out.annotations
                        .insert(INSTANCE_ANNOTATION.into(), inst.name.clone());
                }
                out.annotations
                    .insert(SLOTS_ANNOTATION.into(), c.devices_ids.join(","));
                out
            })
            .collect();
        AllocateResponse {
            container_responses,
        }
    }

    /// GetPreferredAllocation.
    pub async fn preferred(&self, req: &PreferredAllocationRequest) -> PreferredAllocationResponse {
        let st = self.lock().await;
        PreferredAllocationResponse {
            container_responses: req
                .container_requests
                .iter()
                .map(|c| ContainerPreferredAllocationResponse {
                    device_i_ds: st.ledger.preferred_allocation(
                        &c.available_device_i_ds,
                        &c.must_include_device_i_ds,
                        usize::try_from(c.allocation_size).unwrap_or(0),
                    ),
                })
                .collect(),
        }
    }
}
