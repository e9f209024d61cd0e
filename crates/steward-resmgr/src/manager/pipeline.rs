//! The request pipeline: intercepted CRI calls that change allocations.
//! `CreateContainer` and `UpdateContainerResources` decide under the lock
//! and relay the edited request; the calls that only end something
//! (`StopContainer`, `RemovePodSandbox`, ...) are relayed first and then act
//! under the lock ([`ResourceManager::relay_then`]), so a long stop does not
//! block allocations. Intercepted handlers run to completion even if the
//! kubelet hangs up.

use std::future::Future;
use std::time::Duration;

use steward_core::cpu::{ContainerKey, ContainerRequest};
use steward_proto::cri::runtime::v1 as cri;
use tracing::{error, warn};

use super::placement::PodEnd;
use super::{ControlReport, Event, ResourceManager, State, cgroups_path_from_info};
use crate::cache::{ContainerState, PodRecord};
use crate::cgroups::normalize_cgroups_path;
use crate::control::cri::edit_create;
use crate::control::rdt::RdtOutcome;
use crate::error::ResmgrError;
use crate::requests::validate_annotations;

/// Deadline for intercepted calls forwarded on the kubelet's behalf (the
/// kubelet's own default request timeout is 2 minutes).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(240);

impl ResourceManager {
    /// Relay a call that ends something to the runtime, then act on what
    /// it ended under the pipeline lock and persist the cache. Nothing is
    /// changed when the runtime refuses the call.
    async fn relay_then<T>(
        &self,
        call: &'static str,
        limit: Duration,
        relayed: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
        act: impl AsyncFnOnce(&mut State, &T),
    ) -> Result<T, ResmgrError> {
        let resp = self.call(call, limit, relayed).await?;
        let mut st = self.state.lock().await;
        act(&mut st, &resp).await;
        self.save(&st);
        Ok(resp)
    }

    /// `RunPodSandbox`: relay, then record the pod.
    pub async fn run_pod_sandbox(
        &self,
        req: cri::RunPodSandboxRequest,
    ) -> Result<cri::RunPodSandboxResponse, ResmgrError> {
        let config = req
            .config
            .clone()
            .ok_or_else(|| ResmgrError::InvalidRequest("RunPodSandbox without a config".into()))?;
        validate_annotations(&config.annotations)?;
        self.relay_then(
            "RunPodSandbox",
            FORWARD_TIMEOUT,
            self.upstream.runtime().run_pod_sandbox(req),
            async |st, resp| {
                let pod = PodRecord::from_config(&resp.pod_sandbox_id, &config);
                st.cache.data_mut().pods.insert(pod.id.clone(), pod);
            },
        )
        .await
    }

    /// `StopPodSandbox`: relay, then release the pod's containers.
    pub async fn stop_pod_sandbox(
        &self,
        req: cri::StopPodSandboxRequest,
    ) -> Result<cri::StopPodSandboxResponse, ResmgrError> {
        let id = req.pod_sandbox_id.clone();
        self.pod_sandbox_ended(
            id,
            PodEnd::Stopped,
            self.upstream.runtime().stop_pod_sandbox(req),
        )
        .await
    }

    /// `RemovePodSandbox`: relay, then forget the pod and its containers.
    pub async fn remove_pod_sandbox(
        &self,
        req: cri::RemovePodSandboxRequest,
    ) -> Result<cri::RemovePodSandboxResponse, ResmgrError> {
        let id = req.pod_sandbox_id.clone();
        self.pod_sandbox_ended(
            id,
            PodEnd::Removed,
            self.upstream.runtime().remove_pod_sandbox(req),
        )
        .await
    }

    /// The one path of `StopPodSandbox` and `RemovePodSandbox`: relay the
    /// call, then end pod `id` as the call says under the lock.
    async fn pod_sandbox_ended<T>(
        &self,
        id: String,
        end: PodEnd,
        relayed: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, ResmgrError> {
        self.relay_then(end.call(), FORWARD_TIMEOUT, relayed, async |st, _| {
            self.pod_ended_locked(st, &id, end).await
        })
        .await
    }

    /// `CreateContainer`: allocate, edit the request, relay, then push the
    /// decision to the other containers it changed. On any failure the
    /// allocation is rolled back and the runtime has not been told anything.
    pub(super) async fn create_container_decided(
        &self,
        req: cri::CreateContainerRequest,
    ) -> Result<cri::CreateContainerResponse, ResmgrError> {
        let config = req.config.as_ref().ok_or_else(|| {
            ResmgrError::InvalidRequest("CreateContainer without a config".into())
        })?;
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ResmgrError::InvalidRequest("CreateContainer without a container name".into())
            })?;
        let kubelet = config
            .linux
            .as_ref()
            .and_then(|l| l.resources.clone())
            .unwrap_or_default();
        let mut st = self.state.lock().await;
        let pod = req
            .sandbox_config
            .as_ref()
            .map(|sc| PodRecord::from_config(&req.pod_sandbox_id, sc));
        let placed = self
            .place(&mut st, &req.pod_sandbox_id, pod, name, kubelet, Vec::new())
            .await?;
        let mut forwarded = req.clone();
        edit_create(&mut forwarded, placed.resources.clone());
        let created = self
            .call(
                "CreateContainer",
                FORWARD_TIMEOUT,
                self.upstream.runtime().create_container(forwarded),
            )
            .await;
        let resp = match created {
            Ok(r) => r,
            Err(e) => {
                self.unplace(&mut st, placed).await;
                return Err(e);
            }
        };
        self.commit_placed(&mut st, placed, &resp.container_id)
            .await;
        self.save(&st);
        Ok(resp)
    }

    pub(super) async fn rollback(
        &self,
        st: &mut State,
        key: &ContainerKey,
        prior: Option<&ContainerRequest>,
    ) {
        let d = match prior {
            Some(r) => match st.policy.allocate(r) {
                Ok(d) => d,
                Err(e) => {
                    error!(%key, error = %e, "restoring the previous allocation failed");
                    st.policy.release(key)
                }
            },
            None => st.policy.release(key),
        };
        // Others go back to what the cache (and so the runtime) has; only
        // real differences are sent.
        self.apply_decision(st, &d, None).await;
    }

    /// `StartContainer`: relay, then apply the out-of-band controllers and
    /// read back what the container got.
    pub async fn start_container(
        &self,
        req: cri::StartContainerRequest,
    ) -> Result<cri::StartContainerResponse, ResmgrError> {
        let id = req.container_id.clone();
        let resp = self
            .call(
                "StartContainer",
                FORWARD_TIMEOUT,
                self.upstream.runtime().start_container(req),
            )
            .await?;
        let spec_path = self
            .call(
                "ContainerStatus",
                self.upstream.timeout(),
                self.upstream
                    .runtime()
                    .container_status(cri::ContainerStatusRequest {
                        container_id: id.clone(),
                        verbose: true,
                    }),
            )
            .await
            .ok()
            .and_then(|s| cgroups_path_from_info(&s.info));
        let mut st = self.state.lock().await;
        let Some(pod_id) = st
            .cache
            .data()
            .containers
            .get(&id)
            .map(|c| c.pod_id.clone())
        else {
            warn!(container_id = %id, "started a container the cache does not know");
            return Ok(resp);
        };
        let parent = st
            .cache
            .data()
            .pods
            .get(&pod_id)
            .map(|p| p.cgroup_parent.clone())
            .unwrap_or_default();
        let cgroup = spec_path.unwrap_or_else(|| {
            normalize_cgroups_path(&format!("{}/{id}", parent.trim_end_matches('/')))
        });
        if let Some(c) = st.cache.data_mut().containers.get_mut(&id) {
            c.state = ContainerState::Running;
            c.cgroups_path = Some(cgroup);
        }
        self.out_of_band(&st, &id);
        self.verify_locked(&mut st, Some(&id)).await;
        self.save(&st);
        Ok(resp)
    }

    pub(super) fn out_of_band(&self, st: &State, id: &str) {
        let Some(c) = st.cache.data().containers.get(id) else {
            return;
        };
        let Some(cgroup) = c.cgroups_path.clone() else {
            return;
        };
        if let Some(class) = &c.blockio_class {
            let r = match st.blockio.apply(id, &cgroup, class) {
                Ok(out) => ControlReport {
                    container_id: id.to_owned(),
                    controller: "blockio",
                    applied: !out.written.is_empty(),
                    detail: format!(
                        "class {class}: wrote {:?}; skipped {:?}",
                        out.written
                            .iter()
                            .map(|(p, v)| format!("{}={v}", p.display()))
                            .collect::<Vec<_>>(),
                        out.skipped
                    ),
                },
                Err(e) => ControlReport {
                    container_id: id.to_owned(),
                    controller: "blockio",
                    applied: false,
                    detail: format!("class {class}: {e}"),
                },
            };
            self.report(r);
        }
        if let Some(class) = &c.rdt_class {
            let pids = self.cgroups.read_pids(&cgroup).unwrap_or_default();
            let r = match st.rdt.assign(id, class, &pids) {
                Ok(RdtOutcome::Assigned { group, pids }) => ControlReport {
                    container_id: id.to_owned(),
                    controller: "rdt",
                    applied: true,
                    detail: format!("class {class}: {pids} pids into {}", group.display()),
                },
                Ok(RdtOutcome::Unavailable(why)) => ControlReport {
                    container_id: id.to_owned(),
                    controller: "rdt",
                    applied: false,
                    detail: format!("class {class}: not applied: {why}"),
                },
                Err(e) => ControlReport {
                    container_id: id.to_owned(),
                    controller: "rdt",
                    applied: false,
                    detail: format!("class {class}: {e}"),
                },
            };
            self.report(r);
        }
    }

    /// `StopContainer`: relay, then release the container's resources.
    pub async fn stop_container(
        &self,
        req: cri::StopContainerRequest,
    ) -> Result<cri::StopContainerResponse, ResmgrError> {
        let id = req.container_id.clone();
        // The stop timeout is the kubelet's; give it room.
        let limit = FORWARD_TIMEOUT + Duration::from_secs(u64::try_from(req.timeout).unwrap_or(0));
        self.relay_then(
            "StopContainer",
            limit,
            self.upstream.runtime().stop_container(req),
            async |st, _| self.container_stopped_locked(st, &id).await,
        )
        .await
    }

    /// `RemoveContainer`: relay, then forget the container.
    pub async fn remove_container(
        &self,
        req: cri::RemoveContainerRequest,
    ) -> Result<cri::RemoveContainerResponse, ResmgrError> {
        let id = req.container_id.clone();
        self.relay_then(
            "RemoveContainer",
            FORWARD_TIMEOUT,
            self.upstream.runtime().remove_container(req),
            async |st, _| self.container_removed_locked(st, &id).await,
        )
        .await
    }

    /// `UpdateContainerResources` from the kubelet: re-place the container
    /// if its request changed, keep its cpuset ours, relay.
    pub async fn update_container_resources(
        &self,
        req: cri::UpdateContainerResourcesRequest,
    ) -> Result<cri::UpdateContainerResourcesResponse, ResmgrError> {
        let Some(linux) = req.linux.clone() else {
            return self
                .call(
                    "UpdateContainerResources",
                    FORWARD_TIMEOUT,
                    self.upstream.runtime().update_container_resources(req),
                )
                .await;
        };
        let mut st = self.state.lock().await;
        let Some(plan) = self.replace_plan(&mut st, &req.container_id, linux).await? else {
            drop(st);
            return self
                .call(
                    "UpdateContainerResources",
                    FORWARD_TIMEOUT,
                    self.upstream.runtime().update_container_resources(req),
                )
                .await;
        };
        let mut forwarded = req.clone();
        forwarded.linux = Some(plan.resources.clone());
        let result = self
            .call(
                "UpdateContainerResources",
                FORWARD_TIMEOUT,
                self.upstream
                    .runtime()
                    .update_container_resources(forwarded),
            )
            .await;
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                self.undo_replace(&mut st, plan).await;
                return Err(e);
            }
        };
        self.commit_replace(&mut st, plan).await;
        self.save(&st);
        Ok(resp)
    }

    /// `ListContainers`: relayed without the lock; a full listing is handed
    /// to the event pipeline to spot drift.
    pub async fn list_containers(
        &self,
        req: cri::ListContainersRequest,
    ) -> Result<cri::ListContainersResponse, ResmgrError> {
        let full = req
            .filter
            .as_ref()
            .is_none_or(|f| *f == cri::ContainerFilter::default());
        let resp = self
            .call(
                "ListContainers",
                FORWARD_TIMEOUT,
                self.upstream.runtime().list_containers(req),
            )
            .await?;
        if full {
            self.post(Event::Observed(resp.containers.clone()));
        }
        Ok(resp)
    }
}
