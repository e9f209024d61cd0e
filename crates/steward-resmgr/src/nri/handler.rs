//! The resource manager as an NRI [`Handler`]: each call of the runtime
//! becomes the manager's transport-neutral entry point; updates of other
//! containers are answered with the call where NRI lets them be
//! (CreateContainer, UpdateContainer, StopContainer, Synchronize) and sent
//! with `UpdateContainers` otherwise (the lifecycle events).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use steward_nri::proto::nri::{
    ConfigureRequest, Container, ContainerUpdate, CreateContainerRequest, CreateContainerResponse,
    Event, PodSandbox, StateChangeEvent, StopContainerRequest, StopContainerResponse,
    UpdateContainerRequest, UpdateContainerResponse,
};
use steward_nri::{Code, EventMask, Handler, RpcStatus};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::convert;
use crate::cgroups::normalize_cgroups_path;
use crate::manager::{ResourceManager, Updates};

/// How many CreateContainer answer times are kept.
const KEEP_TIMES: usize = 1024;

/// The handler; cheap to clone (one per session).
#[derive(Clone)]
pub struct ResmgrHandler {
    manager: Arc<ResourceManager>,
    /// Updates to send with `UpdateContainers`.
    updates: mpsc::UnboundedSender<Updates>,
    /// How long CreateContainer decisions took, newest last.
    create_times: Arc<Mutex<VecDeque<Duration>>>,
    /// Exclusive containers found unpinned at Synchronize and re-pinned.
    fail_open: Arc<AtomicUsize>,
}

impl ResmgrHandler {
    pub(crate) fn new(
        manager: Arc<ResourceManager>,
        updates: mpsc::UnboundedSender<Updates>,
    ) -> Self {
        Self {
            manager,
            updates,
            create_times: Arc::new(Mutex::new(VecDeque::new())),
            fail_open: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// How long CreateContainer answers took, oldest first.
    pub fn create_times(&self) -> Vec<Duration> {
        self.create_times
            .lock()
            .map(|q| q.iter().copied().collect())
            .unwrap_or_default()
    }

    /// How many exclusive containers were found unpinned (created while
    /// the plugin was not connected or answered too late) and re-pinned.
    pub fn fail_open_repinned(&self) -> usize {
        self.fail_open.load(Ordering::Relaxed)
    }

    fn send_later(&self, u: Updates) {
        if !u.is_empty() {
            let _ = self.updates.send(u);
        }
    }

    fn note_time(&self, d: Duration) {
        if let Ok(mut q) = self.create_times.lock() {
            if q.len() >= KEEP_TIMES {
                q.pop_front();
            }
            q.push_back(d);
        }
    }
}

fn missing(what: &str) -> RpcStatus {
    RpcStatus::new(
        Code::InvalidArgument,
        format!("NRI call without its {what}"),
    )
}

impl Handler for ResmgrHandler {
    async fn configure(&self, req: ConfigureRequest) -> Result<EventMask, RpcStatus> {
        info!(
            runtime = %req.runtime_name,
            version = %req.runtime_version,
            request_timeout_ms = req.request_timeout,
            "NRI runtime configured us"
        );
        Ok(EventMask::of(&[
            Event::RunPodSandbox,
            Event::StopPodSandbox,
            Event::RemovePodSandbox,
            Event::CreateContainer,
            // Not StartContainer: the runtime sends it before the task
            // runs, when an update changes only the stored spec; the
            // read-back and any repair wait for the running container.
            Event::PostStartContainer,
            Event::UpdateContainer,
            Event::StopContainer,
            Event::RemoveContainer,
        ]))
    }

    async fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
    ) -> Result<Vec<ContainerUpdate>, RpcStatus> {
        let listing = convert::listing(&pods, &containers);
        match self.manager.synchronize(listing).await {
            Ok(s) => {
                self.fail_open
                    .fetch_add(s.fail_open.len(), Ordering::Relaxed);
                info!(
                    pods = pods.len(),
                    containers = containers.len(),
                    updates = s.updates.len(),
                    fail_open = s.fail_open.len(),
                    "synchronized with the runtime"
                );
                Ok(convert::updates(&s.updates))
            }
            Err(e) => {
                warn!(error = %e, "synchronizing with the runtime failed");
                Err(convert::status(&e))
            }
        }
    }

    async fn create_container(
        &self,
        req: CreateContainerRequest,
    ) -> Result<CreateContainerResponse, RpcStatus> {
        let t0 = Instant::now();
        let pod = req.pod.as_ref().ok_or_else(|| missing("pod"))?;
        let c = req.container.as_ref().ok_or_else(|| missing("container"))?;
        let kubelet = convert::kubelet_resources(c);
        let result = self
            .manager
            .container_creating_on_claims(
                convert::pod_record(pod),
                &c.id,
                c.name.clone(),
                kubelet.clone(),
                convert::named_claims(c),
            )
            .await;
        self.note_time(t0.elapsed());
        match result {
            Ok((decided, updates)) => {
                debug!(container_id = %c.id, cpus = %decided.cpuset_cpus, took_us = t0.elapsed().as_micros(), "container placed");
                Ok(CreateContainerResponse {
                    adjust: Some(convert::adjustment(&kubelet, &decided)),
                    update: convert::updates(&updates),
                    evict: Vec::new(),
                })
            }
            Err(e) => {
                warn!(pod = %pod.name, container = %c.name, error = %e, "container refused");
                Err(convert::status(&e))
            }
        }
    }

    async fn update_container(
        &self,
        req: UpdateContainerRequest,
    ) -> Result<UpdateContainerResponse, RpcStatus> {
        let Some(c) = req.container.as_ref() else {
            return Ok(UpdateContainerResponse::default());
        };
        let mut linux = req
            .linux_resources
            .as_ref()
            .map(convert::to_cri)
            .unwrap_or_else(|| convert::kubelet_resources(c));
        if linux.oom_score_adj == 0 {
            linux.oom_score_adj = convert::kubelet_resources(c).oom_score_adj;
        }
        match self.manager.container_updating(&c.id, linux).await {
            Ok((own, others)) => {
                let mut update: Vec<ContainerUpdate> = own
                    .map(|r| convert::update(&c.id, &crate::cache::ResourcesRecord::from_cri(&r)))
                    .into_iter()
                    .collect();
                update.extend(convert::updates(&others));
                Ok(UpdateContainerResponse {
                    update,
                    evict: Vec::new(),
                })
            }
            Err(e) => {
                warn!(container = %c.name, error = %e, "container update refused");
                Err(convert::status(&e))
            }
        }
    }

    async fn stop_container(
        &self,
        req: StopContainerRequest,
    ) -> Result<StopContainerResponse, RpcStatus> {
        let Some(c) = req.container.as_ref() else {
            return Ok(StopContainerResponse::default());
        };
        let updates = self.manager.container_stopped(&c.id).await;
        Ok(StopContainerResponse {
            update: convert::updates(&updates),
        })
    }

    async fn state_change(&self, ev: StateChangeEvent) -> Result<(), RpcStatus> {
        let updates = match (ev.event(), &ev.pod, &ev.container) {
            (Event::RunPodSandbox, Some(p), _) => {
                if let Err(e) = self.manager.pod_created(convert::pod_record(p)).await {
                    // Its containers are refused with the reason.
                    warn!(pod = %p.name, error = %e, "pod not recorded");
                }
                Vec::new()
            }
            (Event::StopPodSandbox, Some(p), _) => self.manager.pod_stopped(&p.id).await,
            (Event::RemovePodSandbox, Some(p), _) => self.manager.pod_removed(&p.id).await,
            (Event::PostStartContainer, _, Some(c)) => {
                let cgroup = c
                    .linux
                    .as_ref()
                    .map(|l| l.cgroups_path.clone())
                    .filter(|p| !p.is_empty())
                    .map(|p| normalize_cgroups_path(&p));
                self.manager.container_started(&c.id, cgroup).await
            }
            (Event::RemoveContainer, p, Some(c)) => {
                let pod = p.as_ref().map(|p| p.id.as_str());
                self.manager.container_removed(&c.id, pod).await
            }
            _ => Vec::new(),
        };
        self.send_later(updates);
        Ok(())
    }

    async fn shutdown(&self) {
        info!("the runtime is shutting down; will reconnect");
    }
}
