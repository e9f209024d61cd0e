//! The resource manager: the request pipeline (intercepted CRI calls), the
//! event pipeline (re-sync, observed drift, configuration, verification,
//! retries), both serialized by one lock over the cache and the policy.
//! Calls that are relayed untouched never touch that lock.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use steward_core::cpu::{
    Assignment, ContainerKey, ContainerRequest, CpuSet, Decision, Policy, PolicyError, PolicyKind,
    Topology, new_policy,
};
use steward_proto::cri::runtime::v1 as cri;
use tokio::sync::{Mutex, mpsc};
use tracing::{debug, error, info, warn};

use crate::cache::{
    AssignmentRecord, Cache, CacheData, ContainerRecord, ContainerState, PodRecord, PodState,
    RequestRecord, ResourcesRecord,
};
use crate::cgroups::{Cgroups, normalize_cgroups_path};
use crate::config::FileConfig;
use crate::control::blockio::BlockIoController;
use crate::control::cri::{edit_create, resources_for, update_request};
use crate::control::rdt::{RdtController, RdtOutcome};
use crate::error::ResmgrError;
use crate::metrics::Metrics;
use crate::relay::Upstream;
use crate::requests::{
    PodFacts, classes_for, derive_request, validate_annotations, validate_resources,
};

/// Deadline for intercepted calls forwarded on the kubelet's behalf (the
/// kubelet's own default request timeout is 2 minutes).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(240);
/// Out-of-band reports kept for inspection.
const MAX_REPORTS: usize = 256;

/// Events handled by the event pipeline, under the same lock as requests.
#[derive(Debug)]
pub enum Event {
    /// Re-sync the cache with the runtime.
    Resync(&'static str),
    /// A full `ListContainers` answer seen on its way to the kubelet.
    Observed(Vec<cri::Container>),
    /// A new configuration.
    Config(Box<FileConfig>),
    /// Read back every container's cgroups.
    Verify,
    /// Retry updates that failed.
    Rebalance,
}

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

/// What an out-of-band controller did for a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlReport {
    /// Container id.
    pub container_id: String,
    /// `blockio` or `rdt`.
    pub controller: &'static str,
    /// Applied, or a clean no-op.
    pub applied: bool,
    /// Details.
    pub detail: String,
}

/// What a re-sync found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResyncReport {
    /// Pods in the cache the runtime no longer has.
    pub pods_vanished: Vec<String>,
    /// Containers in the cache the runtime no longer has.
    pub containers_vanished: Vec<String>,
    /// Containers the cache had running that the runtime says exited.
    pub containers_exited: Vec<String>,
    /// Pods the runtime has that the cache did not.
    pub pods_adopted: Vec<String>,
    /// Containers the runtime has that the cache did not.
    pub containers_adopted: Vec<String>,
    /// Containers whose runtime resources differed and were re-applied.
    pub resources_repaired: Vec<String>,
}

impl ResyncReport {
    /// Whether anything differed.
    pub fn is_clean(&self) -> bool {
        *self == Self::default()
    }
}

pub(crate) struct State {
    cache: Cache,
    policy: Box<dyn Policy>,
    topology: Topology,
    config: FileConfig,
    blockio: BlockIoController,
    rdt: RdtController,
    /// Containers whose last update failed, to retry.
    pending: BTreeSet<String>,
}

/// Holds the pipeline lock; see [`ResourceManager::pause_pipeline`].
pub struct PipelineGuard<'a> {
    _guard: tokio::sync::MutexGuard<'a, State>,
}

/// The resource manager. Shared by the router, the event loop and the
/// background tasks.
pub struct ResourceManager {
    state: Mutex<State>,
    upstream: Upstream,
    events: mpsc::Sender<Event>,
    metrics: Metrics,
    cgroups: Arc<dyn Cgroups>,
    allow_policy_switch: bool,
    reports: std::sync::Mutex<VecDeque<ControlReport>>,
}

fn policy_err(e: PolicyError) -> ResmgrError {
    match e {
        PolicyError::UnknownAnnotation { .. }
        | PolicyError::BadAnnotation { .. }
        | PolicyError::BadRequest { .. } => ResmgrError::InvalidRequest(e.to_string()),
        other => ResmgrError::Policy(other.to_string()),
    }
}

fn pod_facts(p: &PodRecord) -> PodFacts<'_> {
    PodFacts {
        uid: &p.uid,
        name: &p.name,
        namespace: &p.namespace,
        cgroup_parent: &p.cgroup_parent,
        annotations: &p.annotations,
    }
}

fn same_cpus(a: &str, b: &str) -> bool {
    match (CpuSet::parse(a), CpuSet::parse(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a.trim() == b.trim(),
    }
}

/// Extract `runtimeSpec.linux.cgroupsPath` from a verbose ContainerStatus.
fn cgroups_path_from_info(info: &std::collections::HashMap<String, String>) -> Option<String> {
    let raw = info.get("info")?;
    let v: serde_json::Value = serde_json::from_str(raw).ok()?;
    let p = v.pointer("/runtimeSpec/linux/cgroupsPath")?.as_str()?;
    (!p.is_empty()).then(|| normalize_cgroups_path(p))
}

impl ResourceManager {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cache: Cache,
        policy: Box<dyn Policy>,
        topology: Topology,
        config: FileConfig,
        upstream: Upstream,
        events: mpsc::Sender<Event>,
        metrics: Metrics,
        cgroups: Arc<dyn Cgroups>,
        resctrl_root: &std::path::Path,
        allow_policy_switch: bool,
    ) -> Self {
        let blockio = BlockIoController::new(cgroups.clone(), config.blockio.classes.clone());
        let rdt = RdtController::new(resctrl_root, config.rdt.classes.clone());
        Self {
            state: Mutex::new(State {
                cache,
                policy,
                topology,
                config,
                blockio,
                rdt,
                pending: BTreeSet::new(),
            }),
            upstream,
            events,
            metrics,
            cgroups,
            allow_policy_switch,
            reports: std::sync::Mutex::new(VecDeque::new()),
        }
    }

    // ----- helpers ----------------------------------------------------------

    async fn call<T, F>(
        &self,
        name: &'static str,
        limit: Duration,
        fut: F,
    ) -> Result<T, ResmgrError>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(limit, fut).await {
            Err(_) => {
                self.upstream.set_healthy(false);
                Err(ResmgrError::RuntimeUnreachable {
                    path: self.upstream.path().to_path_buf(),
                    reason: format!("{name} timed out after {limit:?}"),
                })
            }
            Ok(Err(status)) => Err(self.upstream.classify(name, status)),
            Ok(Ok(resp)) => {
                self.upstream.set_healthy(true);
                Ok(resp.into_inner())
            }
        }
    }

    fn save(&self, st: &State) {
        self.metrics
            .set_containers(st.cache.data().containers.len());
        if let Err(e) = st.cache.save() {
            // The in-memory cache is still right; the next save retries.
            error!(error = %e, "persisting the cache failed");
            self.metrics.event("cache-save-failed");
        }
    }

    fn report(&self, r: ControlReport) {
        if let Ok(mut q) = self.reports.lock() {
            if q.len() >= MAX_REPORTS {
                q.pop_front();
            }
            q.push_back(r);
        }
    }

    /// Queue an event for the event pipeline (dropped when it is full).
    pub fn post(&self, e: Event) {
        if let Err(e) = self.events.try_send(e) {
            debug!(error = %e, "event queue full; event dropped");
        }
    }

    /// Push a decision to every affected container other than `except`:
    /// record the new assignment and send `UpdateContainerResources` where
    /// it differs from what the runtime has.
    async fn apply_decision(&self, st: &mut State, d: &Decision, except: Option<&str>) {
        for (key, a) in d.iter() {
            for id in st.cache.ids_for_key(key) {
                if Some(id.as_str()) == except {
                    continue;
                }
                let cri_cfg = st.config.cri.clone();
                let Some(rec) = st.cache.data_mut().containers.get_mut(&id) else {
                    continue;
                };
                if rec.assignment.is_none() {
                    continue; // an old attempt that no longer holds the key
                }
                let want = AssignmentRecord::from_assignment(a);
                let resources = ResourcesRecord::from_cri(&resources_for(
                    &rec.kubelet_resources.to_cri(),
                    a,
                    &cri_cfg,
                ));
                if rec.assignment.as_ref() == Some(&want) && rec.resources == resources {
                    continue;
                }
                rec.assignment = Some(want);
                rec.resources = resources.clone();
                info!(container_id = %id, cpus = %a.cpus, pool = %a.pool, "assignment changed; updating container");
                self.metrics.event("container-update");
                let req = update_request(&id, &resources);
                let result = self
                    .call(
                        "UpdateContainerResources",
                        self.upstream.timeout(),
                        self.upstream.runtime().update_container_resources(req),
                    )
                    .await;
                if let Err(e) = result {
                    warn!(container_id = %id, error = %e, "updating container failed; will retry");
                    self.metrics.update_failed();
                    st.pending.insert(id.clone());
                } else {
                    st.pending.remove(&id);
                }
            }
        }
    }

    /// Release a container's resources if it holds them.
    async fn release_container(&self, st: &mut State, id: &str) {
        let holds = st
            .cache
            .data()
            .containers
            .get(id)
            .is_some_and(|c| c.assignment.is_some());
        if !holds {
            return;
        }
        let Some(key) = st.cache.key_of(id) else {
            return;
        };
        if let Some(c) = st.cache.data_mut().containers.get_mut(id) {
            c.assignment = None;
        }
        st.pending.remove(id);
        let d = st.policy.release(&key);
        debug!(container_id = %id, %key, others = d.len(), "released");
        self.apply_decision(st, &d, Some(id)).await;
    }

    // ----- request pipeline -------------------------------------------------

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
        let resp = self
            .call(
                "RunPodSandbox",
                FORWARD_TIMEOUT,
                self.upstream.runtime().run_pod_sandbox(req),
            )
            .await?;
        let mut st = self.state.lock().await;
        let pod = PodRecord::from_config(&resp.pod_sandbox_id, &config);
        st.cache.data_mut().pods.insert(pod.id.clone(), pod);
        self.save(&st);
        Ok(resp)
    }

    /// `StopPodSandbox`: relay, then release the pod's containers.
    pub async fn stop_pod_sandbox(
        &self,
        req: cri::StopPodSandboxRequest,
    ) -> Result<cri::StopPodSandboxResponse, ResmgrError> {
        let id = req.pod_sandbox_id.clone();
        let resp = self
            .call(
                "StopPodSandbox",
                FORWARD_TIMEOUT,
                self.upstream.runtime().stop_pod_sandbox(req),
            )
            .await?;
        let mut st = self.state.lock().await;
        let ids = containers_of_pod(&st, &id);
        for cid in &ids {
            self.release_container(&mut st, cid).await;
            if let Some(c) = st.cache.data_mut().containers.get_mut(cid) {
                c.state = ContainerState::Exited;
            }
        }
        if let Some(p) = st.cache.data_mut().pods.get_mut(&id) {
            p.state = PodState::NotReady;
        }
        self.save(&st);
        Ok(resp)
    }

    /// `RemovePodSandbox`: relay, then forget the pod and its containers.
    pub async fn remove_pod_sandbox(
        &self,
        req: cri::RemovePodSandboxRequest,
    ) -> Result<cri::RemovePodSandboxResponse, ResmgrError> {
        let id = req.pod_sandbox_id.clone();
        let resp = self
            .call(
                "RemovePodSandbox",
                FORWARD_TIMEOUT,
                self.upstream.runtime().remove_pod_sandbox(req),
            )
            .await?;
        let mut st = self.state.lock().await;
        let ids = containers_of_pod(&st, &id);
        for cid in &ids {
            self.release_container(&mut st, cid).await;
            st.cache.data_mut().containers.remove(cid);
        }
        st.cache.data_mut().pods.remove(&id);
        self.save(&st);
        Ok(resp)
    }

    /// `CreateContainer`: allocate, edit the request, relay, then push the
    /// decision to the other containers it changed. On any failure the
    /// allocation is rolled back and the runtime has not been told anything.
    pub async fn create_container(
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
        validate_resources(&kubelet)?;
        if let Some(sc) = &req.sandbox_config {
            validate_annotations(&sc.annotations)?;
        }

        let mut st = self.state.lock().await;
        let pod = match &req.sandbox_config {
            Some(sc) => PodRecord::from_config(&req.pod_sandbox_id, sc),
            None => st
                .cache
                .data()
                .pods
                .get(&req.pod_sandbox_id)
                .cloned()
                .ok_or_else(|| ResmgrError::NotFound {
                    kind: "pod sandbox",
                    id: req.pod_sandbox_id.clone(),
                })?,
        };
        let request = derive_request(&pod_facts(&pod), &name, &kubelet)?;
        let classes = classes_for(&pod.annotations, &name);
        if let Some(c) = &classes.blockio
            && !st.blockio.knows(c)
        {
            return Err(ResmgrError::Annotation {
                key: crate::requests::BLOCKIO_POD.into(),
                reason: format!("block I/O class {c:?} is not configured"),
            });
        }
        if let Some(c) = &classes.rdt
            && !st.rdt.knows(c)
        {
            return Err(ResmgrError::Annotation {
                key: crate::requests::RDT_POD.into(),
                reason: format!("RDT class {c:?} is not configured"),
            });
        }

        let key = request.key.clone();
        let prior = st.policy.assignments().get(&key).is_some();
        let prior_request = if prior {
            st.cache
                .ids_for_key(&key)
                .into_iter()
                .filter_map(|id| st.cache.data().containers.get(&id))
                .find(|c| c.assignment.is_some())
                .and_then(|c| {
                    st.cache
                        .data()
                        .pods
                        .get(&c.pod_id)
                        .map(|p| c.request.to_request(p, &c.name))
                })
        } else {
            None
        };
        let decision = st.policy.allocate(&request).map_err(policy_err)?;
        let Some(own) = st.policy.assignments().get(&key).cloned() else {
            self.rollback(&mut st, &key, prior_request.as_ref()).await;
            return Err(ResmgrError::Policy(format!(
                "policy gave {key} no assignment"
            )));
        };
        let resources = resources_for(&kubelet, &own, &st.config.cri);
        let mut forwarded = req.clone();
        edit_create(&mut forwarded, resources.clone());
        debug!(%key, cpus = %own.cpus, mems = %own.mems, pool = %own.pool, "creating container");

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
                self.rollback(&mut st, &key, prior_request.as_ref()).await;
                return Err(e);
            }
        };
        let id = resp.container_id.clone();
        // An earlier attempt of the same container hands the key over.
        for old in st.cache.ids_for_key(&key) {
            if let Some(c) = st.cache.data_mut().containers.get_mut(&old) {
                c.assignment = None;
            }
        }
        let seq = st.cache.next_seq();
        st.cache
            .data_mut()
            .pods
            .entry(pod.id.clone())
            .or_insert_with(|| pod.clone());
        st.cache.data_mut().containers.insert(
            id.clone(),
            ContainerRecord {
                id: id.clone(),
                pod_id: pod.id.clone(),
                name,
                request: RequestRecord::from_request(&request),
                assignment: Some(AssignmentRecord::from_assignment(&own)),
                kubelet_resources: ResourcesRecord::from_cri(&kubelet),
                resources: ResourcesRecord::from_cri(&resources),
                state: ContainerState::Created,
                cgroups_path: None,
                blockio_class: classes.blockio,
                rdt_class: classes.rdt,
                seq,
            },
        );
        self.apply_decision(&mut st, &decision, Some(&id)).await;
        self.save(&st);
        Ok(resp)
    }

    async fn rollback(&self, st: &mut State, key: &ContainerKey, prior: Option<&ContainerRequest>) {
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

    fn out_of_band(&self, st: &State, id: &str) {
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
        let resp = self
            .call(
                "StopContainer",
                limit,
                self.upstream.runtime().stop_container(req),
            )
            .await?;
        let mut st = self.state.lock().await;
        self.release_container(&mut st, &id).await;
        if let Some(c) = st.cache.data_mut().containers.get_mut(&id) {
            c.state = ContainerState::Exited;
        }
        self.save(&st);
        Ok(resp)
    }

    /// `RemoveContainer`: relay, then forget the container.
    pub async fn remove_container(
        &self,
        req: cri::RemoveContainerRequest,
    ) -> Result<cri::RemoveContainerResponse, ResmgrError> {
        let id = req.container_id.clone();
        let resp = self
            .call(
                "RemoveContainer",
                FORWARD_TIMEOUT,
                self.upstream.runtime().remove_container(req),
            )
            .await?;
        let mut st = self.state.lock().await;
        self.release_container(&mut st, &id).await;
        st.cache.data_mut().containers.remove(&id);
        self.save(&st);
        Ok(resp)
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
        validate_resources(&linux)?;
        let mut st = self.state.lock().await;
        let id = req.container_id.clone();
        let known = st.cache.data().containers.get(&id).cloned();
        let Some(rec) = known.filter(|c| c.assignment.is_some()) else {
            drop(st);
            return self
                .call(
                    "UpdateContainerResources",
                    FORWARD_TIMEOUT,
                    self.upstream.runtime().update_container_resources(req),
                )
                .await;
        };
        let pod = st
            .cache
            .data()
            .pods
            .get(&rec.pod_id)
            .cloned()
            .ok_or_else(|| ResmgrError::NotFound {
                kind: "pod sandbox",
                id: rec.pod_id.clone(),
            })?;
        let new_request = derive_request(&pod_facts(&pod), &rec.name, &linux)?;
        let old_request = rec.request.to_request(&pod, &rec.name);
        let changed = RequestRecord::from_request(&new_request) != rec.request;
        let decision = if changed {
            st.policy.allocate(&new_request).map_err(policy_err)?
        } else {
            Decision::default()
        };
        let key = new_request.key.clone();
        let own = st
            .policy
            .assignments()
            .get(&key)
            .cloned()
            .ok_or_else(|| ResmgrError::Policy(format!("{key} has no assignment")))?;
        let resources = resources_for(&linux, &own, &st.config.cri);
        let mut forwarded = req.clone();
        forwarded.linux = Some(resources.clone());
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
                if changed {
                    self.rollback(&mut st, &key, Some(&old_request)).await;
                }
                return Err(e);
            }
        };
        if let Some(c) = st.cache.data_mut().containers.get_mut(&id) {
            c.request = RequestRecord::from_request(&new_request);
            c.kubelet_resources = ResourcesRecord::from_cri(&linux);
            c.resources = ResourcesRecord::from_cri(&resources);
            c.assignment = Some(AssignmentRecord::from_assignment(&own));
        }
        self.apply_decision(&mut st, &decision, Some(&id)).await;
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

    // ----- event pipeline ---------------------------------------------------

    /// Handle one event under the lock.
    pub async fn handle(&self, e: Event) {
        match e {
            Event::Resync(reason) => {
                self.metrics.event("resync");
                match self.resync(reason).await {
                    Ok(r) if r.is_clean() => debug!(%reason, "re-sync: cache matches the runtime"),
                    Ok(r) => info!(%reason, report = ?r, "re-sync repaired drift"),
                    Err(e) => warn!(%reason, error = %e, "re-sync failed"),
                }
            }
            Event::Observed(list) => self.observed(list).await,
            Event::Config(cfg) => {
                self.metrics.event("config");
                if let Err(e) = self.apply_config(*cfg).await {
                    error!(error = %e, "configuration not applied");
                }
            }
            Event::Verify => {
                self.metrics.event("verify");
                self.verify().await;
            }
            Event::Rebalance => {
                self.metrics.event("rebalance");
                self.retry_pending().await;
            }
        }
    }

    async fn observed(&self, list: Vec<cri::Container>) {
        let live: BTreeMap<&str, i32> = list.iter().map(|c| (c.id.as_str(), c.state)).collect();
        let mut st = self.state.lock().await;
        let mut unknown = false;
        for c in &list {
            let running = c.state == cri::ContainerState::ContainerRunning as i32
                || c.state == cri::ContainerState::ContainerCreated as i32;
            if running && !st.cache.data().containers.contains_key(&c.id) {
                unknown = true;
            }
        }
        let mut changed = false;
        let ids: Vec<String> = st.cache.data().containers.keys().cloned().collect();
        for id in ids {
            let Some(state) = st.cache.data().containers.get(&id).map(|c| c.state) else {
                continue;
            };
            match live.get(id.as_str()) {
                None => {
                    warn!(container_id = %id, "container vanished from the runtime; releasing");
                    self.metrics.drift("container-vanished");
                    self.release_container(&mut st, &id).await;
                    st.cache.data_mut().containers.remove(&id);
                    changed = true;
                }
                Some(s)
                    if *s == cri::ContainerState::ContainerExited as i32
                        && state != ContainerState::Exited =>
                {
                    info!(container_id = %id, "container exited; releasing its resources");
                    self.metrics.drift("container-exited");
                    self.release_container(&mut st, &id).await;
                    if let Some(c) = st.cache.data_mut().containers.get_mut(&id) {
                        c.state = ContainerState::Exited;
                    }
                    changed = true;
                }
                _ => {}
            }
        }
        if changed {
            self.save(&st);
        }
        drop(st);
        if unknown {
            self.post(Event::Resync("unknown containers observed"));
        }
    }

    async fn retry_pending(&self) {
        let mut st = self.state.lock().await;
        let ids: Vec<String> = st.pending.iter().cloned().collect();
        for id in ids {
            let Some(rec) = st.cache.data().containers.get(&id).cloned() else {
                st.pending.remove(&id);
                continue;
            };
            if rec.assignment.is_none() {
                st.pending.remove(&id);
                continue;
            }
            let r = self
                .call(
                    "UpdateContainerResources",
                    self.upstream.timeout(),
                    self.upstream
                        .runtime()
                        .update_container_resources(update_request(&id, &rec.resources)),
                )
                .await;
            match r {
                Ok(_) => {
                    info!(container_id = %id, "retried update succeeded");
                    st.pending.remove(&id);
                }
                Err(e) => debug!(container_id = %id, error = %e, "retried update failed"),
            }
        }
    }

    /// Re-sync the cache (and the policy) with the runtime, which is the
    /// truth: forget what it no longer has, adopt what it has that we did
    /// not know, re-apply resources that differ.
    pub async fn resync(&self, reason: &str) -> Result<ResyncReport, ResmgrError> {
        let mut st = self.state.lock().await;
        let r = self.resync_locked(&mut st, false, reason).await;
        self.save(&st);
        r
    }

    pub(crate) async fn resync_locked(
        &self,
        st: &mut State,
        restore: bool,
        reason: &str,
    ) -> Result<ResyncReport, ResmgrError> {
        info!(%reason, restore, "re-syncing with the runtime");
        let t = self.upstream.timeout();
        let rt = self.upstream.runtime();
        let pods = self
            .call(
                "ListPodSandbox",
                t,
                rt.clone()
                    .list_pod_sandbox(cri::ListPodSandboxRequest::default()),
            )
            .await?
            .items;
        let ctrs = self
            .call(
                "ListContainers",
                t,
                rt.clone()
                    .list_containers(cri::ListContainersRequest::default()),
            )
            .await?
            .containers;
        let rt_pods: BTreeMap<String, cri::PodSandbox> =
            pods.into_iter().map(|p| (p.id.clone(), p)).collect();
        let rt_ctrs: BTreeMap<String, cri::Container> =
            ctrs.into_iter().map(|c| (c.id.clone(), c)).collect();
        let mut report = ResyncReport::default();

        // Forget what the runtime no longer has.
        let cached_pods: Vec<String> = st.cache.data().pods.keys().cloned().collect();
        for id in cached_pods {
            if !rt_pods.contains_key(&id) {
                warn!(pod_sandbox_id = %id, "pod vanished from the runtime");
                self.metrics.drift("pod-vanished");
                report.pods_vanished.push(id.clone());
                st.cache.data_mut().pods.remove(&id);
            }
        }
        let cached: Vec<ContainerRecord> = st.cache.data().containers.values().cloned().collect();
        for c in cached {
            let gone =
                !rt_ctrs.contains_key(&c.id) || !st.cache.data().pods.contains_key(&c.pod_id);
            let exited = rt_ctrs.get(&c.id).is_some_and(|r| {
                r.state == cri::ContainerState::ContainerExited as i32
                    || r.state == cri::ContainerState::ContainerUnknown as i32
            });
            if gone {
                warn!(container_id = %c.id, "container vanished from the runtime");
                self.metrics.drift("container-vanished");
                report.containers_vanished.push(c.id.clone());
                if !restore {
                    // Release while the pod record still resolves the key.
                    self.release_by_record(st, &c).await;
                }
                st.cache.data_mut().containers.remove(&c.id);
            } else if exited && c.state != ContainerState::Exited {
                self.metrics.drift("container-exited");
                report.containers_exited.push(c.id.clone());
                if !restore {
                    self.release_container(st, &c.id).await;
                }
                if let Some(r) = st.cache.data_mut().containers.get_mut(&c.id) {
                    r.state = ContainerState::Exited;
                    r.assignment = None;
                }
            } else if let Some(r) = rt_ctrs.get(&c.id)
                && r.state == cri::ContainerState::ContainerRunning as i32
                && c.state == ContainerState::Created
                && let Some(rec) = st.cache.data_mut().containers.get_mut(&c.id)
            {
                rec.state = ContainerState::Running;
            }
        }

        if restore {
            self.restore_policy(st).await;
        }

        // Adopt what we did not know.
        for (id, p) in &rt_pods {
            if st.cache.data().pods.contains_key(id) {
                continue;
            }
            let meta = p.metadata.clone().unwrap_or_default();
            self.metrics.drift("pod-adopted");
            report.pods_adopted.push(id.clone());
            st.cache.data_mut().pods.insert(
                id.clone(),
                PodRecord {
                    id: id.clone(),
                    uid: meta.uid,
                    name: meta.name,
                    namespace: meta.namespace,
                    cgroup_parent: String::new(),
                    annotations: p
                        .annotations
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    labels: p
                        .labels
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    state: if p.state == cri::PodSandboxState::SandboxReady as i32 {
                        PodState::Ready
                    } else {
                        PodState::NotReady
                    },
                },
            );
        }
        for (id, c) in &rt_ctrs {
            let live = c.state == cri::ContainerState::ContainerRunning as i32
                || c.state == cri::ContainerState::ContainerCreated as i32;
            if !live || st.cache.data().containers.contains_key(id) {
                continue;
            }
            match self.adopt(st, c).await {
                Ok(()) => {
                    self.metrics.drift("container-adopted");
                    report.containers_adopted.push(id.clone());
                }
                Err(e) => warn!(container_id = %id, error = %e, "could not adopt container"),
            }
        }

        // Resources the runtime reports against what we applied.
        let live: Vec<ContainerRecord> = st
            .cache
            .data()
            .containers
            .values()
            .filter(|c| c.assignment.is_some() && c.state != ContainerState::Exited)
            .cloned()
            .collect();
        for c in live {
            let status = self
                .call(
                    "ContainerStatus",
                    t,
                    rt.clone().container_status(cri::ContainerStatusRequest {
                        container_id: c.id.clone(),
                        verbose: false,
                    }),
                )
                .await;
            let Ok(status) = status else { continue };
            let Some(actual) = status
                .status
                .and_then(|s| s.resources)
                .and_then(|r| r.linux)
            else {
                continue;
            };
            if !same_cpus(&actual.cpuset_cpus, &c.resources.cpuset_cpus) {
                warn!(container_id = %c.id, runtime = %actual.cpuset_cpus, expected = %c.resources.cpuset_cpus,
                    "runtime resources drifted; re-applying");
                self.metrics.drift("runtime-resources");
                let r = self
                    .call(
                        "UpdateContainerResources",
                        t,
                        rt.clone()
                            .update_container_resources(update_request(&c.id, &c.resources)),
                    )
                    .await;
                if r.is_ok() {
                    report.resources_repaired.push(c.id.clone());
                } else {
                    st.pending.insert(c.id.clone());
                }
            }
        }
        Ok(report)
    }

    async fn release_by_record(&self, st: &mut State, c: &ContainerRecord) {
        if c.assignment.is_none() {
            return;
        }
        let Some(key) = st.cache.key_of(&c.id) else {
            // The pod record is gone: find the key in the policy by name.
            let keys: Vec<ContainerKey> = st
                .policy
                .assignments()
                .keys()
                .filter(|k| k.container == c.name)
                .cloned()
                .collect();
            let live_keys: BTreeSet<ContainerKey> = st
                .cache
                .data()
                .containers
                .keys()
                .filter_map(|id| st.cache.key_of(id))
                .collect();
            for k in keys.into_iter().filter(|k| !live_keys.contains(k)) {
                let d = st.policy.release(&k);
                self.apply_decision(st, &d, Some(&c.id)).await;
            }
            return;
        };
        let d = st.policy.release(&key);
        self.apply_decision(st, &d, Some(&c.id)).await;
    }

    /// Rebuild the policy state from the cache (after a restart).
    async fn restore_policy(&self, st: &mut State) {
        let allocated = st.cache.allocated();
        let entries: Vec<(ContainerRequest, Assignment)> = allocated
            .iter()
            .map(|(_, r, a)| (r.clone(), a.clone()))
            .collect();
        match st.policy.restore(entries) {
            Ok(d) => {
                if !d.is_empty() {
                    info!(changed = d.len(), "restored policy moved containers");
                }
                self.apply_decision(st, &d, None).await;
            }
            Err(e) => {
                warn!(error = %e, "persisted assignments do not fit; re-placing every container");
                let _ = st.policy.restore(Vec::new());
                for (id, r, _) in allocated {
                    match st.policy.allocate(&r) {
                        Ok(d) => self.apply_decision(st, &d, None).await,
                        Err(e) => {
                            error!(container_id = %id, error = %e, "container cannot be placed any more");
                            if let Some(c) = st.cache.data_mut().containers.get_mut(&id) {
                                c.assignment = None;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Take over a container the cache did not know: derive its request from
    /// what the runtime reports, place it, and update it.
    async fn adopt(&self, st: &mut State, c: &cri::Container) -> Result<(), ResmgrError> {
        let pod = st
            .cache
            .data()
            .pods
            .get(&c.pod_sandbox_id)
            .cloned()
            .ok_or_else(|| ResmgrError::NotFound {
                kind: "pod sandbox",
                id: c.pod_sandbox_id.clone(),
            })?;
        let name = c.metadata.clone().unwrap_or_default().name;
        let status = self
            .call(
                "ContainerStatus",
                self.upstream.timeout(),
                self.upstream
                    .runtime()
                    .container_status(cri::ContainerStatusRequest {
                        container_id: c.id.clone(),
                        verbose: true,
                    }),
            )
            .await?;
        let cgroup = cgroups_path_from_info(&status.info);
        let kubelet = status
            .status
            .and_then(|s| s.resources)
            .and_then(|r| r.linux)
            .unwrap_or_default();
        let request = derive_request(&pod_facts(&pod), &name, &kubelet)?;
        let decision = st.policy.allocate(&request).map_err(policy_err)?;
        let own = st
            .policy
            .assignments()
            .get(&request.key)
            .cloned()
            .ok_or_else(|| ResmgrError::Policy(format!("{} has no assignment", request.key)))?;
        let resources = resources_for(&kubelet, &own, &st.config.cri);
        let seq = st.cache.next_seq();
        let classes = classes_for(&pod.annotations, &name);
        st.cache.data_mut().containers.insert(
            c.id.clone(),
            ContainerRecord {
                id: c.id.clone(),
                pod_id: pod.id.clone(),
                name,
                request: RequestRecord::from_request(&request),
                assignment: Some(AssignmentRecord::from_assignment(&own)),
                kubelet_resources: ResourcesRecord::from_cri(&kubelet),
                resources: ResourcesRecord::from_cri(&resources),
                state: if c.state == cri::ContainerState::ContainerRunning as i32 {
                    ContainerState::Running
                } else {
                    ContainerState::Created
                },
                cgroups_path: cgroup,
                blockio_class: classes.blockio,
                rdt_class: classes.rdt,
                seq,
            },
        );
        info!(container_id = %c.id, cpus = %own.cpus, "adopted a container the cache did not know");
        let r = self
            .call(
                "UpdateContainerResources",
                self.upstream.timeout(),
                self.upstream
                    .runtime()
                    .update_container_resources(update_request(
                        &c.id,
                        &ResourcesRecord::from_cri(&resources),
                    )),
            )
            .await;
        if r.is_err() {
            st.pending.insert(c.id.clone());
        }
        self.apply_decision(st, &decision, Some(&c.id)).await;
        Ok(())
    }

    /// Apply a new configuration: parameters live, a different policy only
    /// when switching is allowed.
    pub async fn apply_config(&self, cfg: FileConfig) -> Result<(), ResmgrError> {
        let mut st = self.state.lock().await;
        st.blockio.set_classes(cfg.blockio.classes.clone());
        st.rdt.set_classes(cfg.rdt.classes.clone());
        st.config.cri = cfg.cri.clone();
        st.config.blockio = cfg.blockio.clone();
        st.config.rdt = cfg.rdt.clone();
        let running = st.policy.kind();
        let result = if cfg.policy.active != running {
            if self.allow_policy_switch {
                self.switch_policy(&mut st, cfg.policy.active, &cfg.policy.config)
                    .await
            } else {
                self.metrics.event("policy-switch-refused");
                Err(ResmgrError::Config {
                    path: "policy.active".into(),
                    reason: format!(
                        "switching the running policy {} to {} needs the explicit allow-policy-switch flag; keeping {}",
                        running.as_str(),
                        cfg.policy.active.as_str(),
                        running.as_str()
                    ),
                })
            }
        } else if cfg.policy.config != st.config.policy.config {
            match st.policy.reconfigure(&cfg.policy.config) {
                Ok(d) => {
                    info!(changed = d.len(), "policy parameters changed live");
                    self.apply_decision(&mut st, &d, None).await;
                    st.config.policy.config = cfg.policy.config.clone();
                    Ok(())
                }
                Err(e) => Err(policy_err(e)),
            }
        } else {
            Ok(())
        };
        self.save(&st);
        result
    }

    async fn switch_policy(
        &self,
        st: &mut State,
        kind: PolicyKind,
        cfg: &steward_core::cpu::PolicyConfig,
    ) -> Result<(), ResmgrError> {
        let mut next = new_policy(kind, &st.topology, cfg).map_err(policy_err)?;
        let mut placed = BTreeMap::new();
        for (id, r, _) in st.cache.allocated() {
            next.allocate(&r).map_err(|e| {
                ResmgrError::Policy(format!(
                    "switching to {} failed placing {id}: {e}; keeping {}",
                    kind.as_str(),
                    st.policy.kind().as_str()
                ))
            })?;
            placed.insert(r.key.clone(), ());
        }
        let d = Decision::from(
            next.assignments()
                .iter()
                .filter(|(k, _)| placed.contains_key(*k))
                .map(|(k, a)| (k.clone(), a.clone()))
                .collect::<BTreeMap<_, _>>(),
        );
        info!(
            from = st.policy.kind().as_str(),
            to = kind.as_str(),
            "switching policy"
        );
        st.policy = next;
        st.config.policy.active = kind;
        st.config.policy.config = cfg.clone();
        st.cache.data_mut().policy = kind.as_str().to_owned();
        self.apply_decision(st, &d, None).await;
        Ok(())
    }

    /// Read back every running container's cgroups; drift is logged,
    /// counted and repaired by updating the container again.
    pub async fn verify(&self) -> Vec<VerifyReport> {
        let mut st = self.state.lock().await;
        self.verify_locked(&mut st, None).await
    }

    async fn verify_locked(&self, st: &mut State, only: Option<&str>) -> Vec<VerifyReport> {
        let mut out = Vec::new();
        for c in st.cache.data().containers.values() {
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
                let res = self
                    .call(
                        "UpdateContainerResources",
                        self.upstream.timeout(),
                        self.upstream
                            .runtime()
                            .update_container_resources(update_request(&c.id, &c.resources)),
                    )
                    .await;
                r.repaired = res.is_ok();
            }
            out.push(r);
        }
        out
    }

    // ----- inspection -------------------------------------------------------

    /// Hold the pipeline lock until the guard is dropped: intercepted calls
    /// and events wait, relayed calls do not (maintenance, tests).
    pub async fn pause_pipeline(&self) -> PipelineGuard<'_> {
        PipelineGuard {
            _guard: self.state.lock().await,
        }
    }

    /// The metrics this manager reports to.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// A copy of the cache.
    pub async fn snapshot(&self) -> CacheData {
        self.state.lock().await.cache.data().clone()
    }

    /// The policy's current assignments.
    pub async fn assignments(&self) -> BTreeMap<ContainerKey, Assignment> {
        self.state.lock().await.policy.assignments().clone()
    }

    /// The running policy.
    pub async fn policy_kind(&self) -> PolicyKind {
        self.state.lock().await.policy.kind()
    }

    /// What the node publisher shows: the running policy on this topology
    /// with the running parameters.
    pub async fn publication(&self) -> crate::cluster::Publication {
        let st = self.state.lock().await;
        crate::cluster::Publication::new(&st.topology, st.policy.kind(), &st.config.policy.config)
    }

    /// The running configuration.
    pub async fn config(&self) -> FileConfig {
        self.state.lock().await.config.clone()
    }

    /// Recent out-of-band controller reports, oldest first.
    pub fn control_reports(&self) -> Vec<ControlReport> {
        self.reports
            .lock()
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The runtime connection.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// Startup: prune the restored cache against the runtime, restore the
    /// policy from it, adopt unknown containers. With the runtime down, the
    /// policy is restored from the cache alone and a re-sync is queued for
    /// when it answers.
    pub(crate) async fn startup(&self) -> Result<(), ResmgrError> {
        let mut st = self.state.lock().await;
        match self.resync_locked(&mut st, true, "startup").await {
            Ok(r) => info!(report = ?r, "startup re-sync done"),
            Err(e) => {
                warn!(error = %e, "runtime not reachable at startup; restoring from the cache alone");
                self.restore_policy(&mut st).await;
                self.upstream.set_healthy(false);
            }
        }
        let name = st.policy.kind().as_str().to_owned();
        st.cache.data_mut().policy = name;
        self.save(&st);
        Ok(())
    }
}

/// IDs of the cached containers of pod `pod_id`.
fn containers_of_pod(st: &State, pod_id: &str) -> Vec<String> {
    st.cache
        .data()
        .containers
        .values()
        .filter(|c| c.pod_id == pod_id)
        .map(|c| c.id.clone())
        .collect()
}
