//! The resource manager: one lock over the cache and the policy, taken by
//! the request pipeline ([`pipeline`]: intercepted CRI calls) and the event
//! pipeline (re-sync and adoption in [`resync`], cgroup read-back in
//! [`verify`], configuration in [`reconfigure`], retries). Calls that are
//! relayed untouched never touch that lock.

mod cpu_claims;
mod pipeline;
mod placement;
mod runtime_events;
#[cfg(test)]
mod testing;

pub(crate) use resync::{GivenStatus, RuntimeListing};
pub use runtime_events::{FailOpen, Synchronized, Updates};
mod reconfigure;
mod refusals;
mod removed_pods;

pub use placement::ANNOTATION_ABOVE_SPEC_REASON;
pub use refusals::POLICY_DECISION_FAILED;
mod resync;
mod verify;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use steward_core::cpu::{
    Assignment, ContainerKey, CpuSet, Decision, Policy, PolicyError, PolicyKind, Topology,
};
use steward_proto::cri::runtime::v1 as cri;
use tokio::sync::{Mutex, mpsc};
use tracing::{debug, error, info, warn};

use crate::cache::{AssignmentRecord, Cache, CacheData, PodRecord, ResourcesRecord};
use crate::cgroups::{Cgroups, normalize_cgroups_path};
use crate::config::FileConfig;
use crate::control::blockio::BlockIoController;
use crate::control::cri::{resources_for, update_request};
use crate::control::rdt::RdtController;
use crate::error::ResmgrError;
use crate::metrics::Metrics;
use crate::relay::Upstream;
use crate::requests::PodFacts;

pub(crate) use cpu_claims::claimed_by;
pub use cpu_claims::{CpuClaim, CpuDevices};
pub use resync::ResyncReport;
pub use verify::VerifyReport;

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

pub(crate) struct State {
    cache: Cache,
    policy: Box<dyn Policy>,
    topology: Topology,
    config: FileConfig,
    blockio: BlockIoController,
    rdt: RdtController,
    /// Containers whose last update failed, to retry.
    pending: BTreeSet<String>,
    /// Exclusive CPUs held for reserved pods (given to every new policy).
    holds: crate::reservations::Holds,
    /// NRI transport: updates of running containers are collected here
    /// (answered with the runtime's call, or sent by `UpdateContainers`)
    /// instead of being sent as CRI `UpdateContainerResources`.
    outbox: Option<Vec<(String, ResourcesRecord)>>,
    /// NRI transport: pods the runtime removed, never to be adopted again.
    removed_pods: removed_pods::RemovedPods,
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
    /// The node view this manager publishes its assignments to, if any
    /// (the pod resources server's hub).
    view: std::sync::OnceLock<Arc<steward_podresources::Hub>>,
    /// Where Events on Pods go (cluster mode only).
    pod_events: std::sync::OnceLock<steward_kube::EventSink>,
    /// Woken after every save of the cache (assignments may have changed).
    saved: tokio::sync::Notify,
    /// NRI transport: where updates the event pipeline collected go (sent
    /// by the plugin with `UpdateContainers`).
    update_sink: std::sync::OnceLock<mpsc::UnboundedSender<Vec<(String, ResourcesRecord)>>>,
}

fn policy_err(e: PolicyError) -> ResmgrError {
    match e {
        PolicyError::UnknownAnnotation { .. }
        | PolicyError::BadAnnotation { .. }
        | PolicyError::BadRequest { .. } => ResmgrError::InvalidRequest(e.to_string()),
        other => ResmgrError::Policy {
            source: Box::new(other),
        },
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
                holds: crate::reservations::Holds::new(),
                outbox: None,
                removed_pods: removed_pods::RemovedPods::default(),
            }),
            upstream,
            events,
            metrics,
            cgroups,
            allow_policy_switch,
            reports: std::sync::Mutex::new(VecDeque::new()),
            view: std::sync::OnceLock::new(),
            pod_events: std::sync::OnceLock::new(),
            saved: tokio::sync::Notify::new(),
            update_sink: std::sync::OnceLock::new(),
        }
    }

    /// Returns after the next save of the cache (or at once when one
    /// happened since the last call returned): assignments may have
    /// changed.
    pub async fn saved(&self) {
        self.saved.notified().await;
    }

    /// Publishes every assignment to `hub` (as the `Cri` source of the node
    /// view) from now on: now, and after every change of the cache. What the
    /// topology makes allocatable is published once. A second call is
    /// ignored.
    pub async fn publish_to(&self, hub: Arc<steward_podresources::Hub>) {
        let st = self.state.lock().await;
        if self.view.set(hub.clone()).is_err() {
            return;
        }
        hub.replace_allocatable(
            steward_core::ledger::Source::Cri,
            crate::assignments::allocatable(&st.topology),
        );
        hub.replace(
            steward_core::ledger::Source::Cri,
            crate::assignments::pods(st.cache.data()),
        );
    }

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
                    source: None,
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
        // Under the state lock, so the view sees changes in the cache's order.
        if let Some(hub) = self.view.get() {
            hub.replace(
                steward_core::ledger::Source::Cri,
                crate::assignments::pods(st.cache.data()),
            );
        }
        if let Err(e) = st.cache.save() {
            // The in-memory cache is still right; the next save retries.
            error!(error = %e, "persisting the cache failed");
            self.metrics.event("cache-save-failed");
        }
        self.saved.notify_one();
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
                if let Err(e) = self.push_update(st, &id, &resources).await {
                    warn!(container_id = %id, error = %e, "updating container failed; will retry");
                    self.metrics.update_failed();
                    st.pending.insert(id.clone());
                } else {
                    st.pending.remove(&id);
                }
            }
        }
    }

    /// Tell the runtime a running container's new resources: a CRI
    /// `UpdateContainerResources` (the proxy), or, under the NRI transport,
    /// an entry in the outbox (a later entry for the same container
    /// replaces an earlier one).
    async fn push_update(
        &self,
        st: &mut State,
        id: &str,
        resources: &ResourcesRecord,
    ) -> Result<(), ResmgrError> {
        if let Some(out) = st.outbox.as_mut() {
            out.retain(|(i, _)| i != id);
            out.push((id.to_owned(), resources.clone()));
            return Ok(());
        }
        self.call(
            "UpdateContainerResources",
            self.upstream.timeout(),
            self.upstream
                .runtime()
                .update_container_resources(update_request(id, resources)),
        )
        .await
        .map(|_| ())
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
        self.flush_outbox().await;
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
    pub async fn publication(&self) -> crate::node_publisher::Publication {
        let st = self.state.lock().await;
        crate::node_publisher::Publication::new(
            &st.topology,
            st.policy.kind(),
            &st.config.policy.config,
            st.policy.assignments(),
        )
    }

    /// The exclusive CPUs held for reserved pods, as last set.
    pub async fn holds(&self) -> crate::reservations::Holds {
        self.state.lock().await.holds.clone()
    }

    /// Exclusive CPUs held on this node for reserved pods not yet here
    /// (their reservations, [`crate::reservations`]): no other pod's exclusive
    /// placement takes them from now on (placements already made stay).
    pub async fn set_holds(&self, holds: crate::reservations::Holds) {
        let mut st = self.state.lock().await;
        if st.holds != holds {
            st.policy.set_holds(holds.clone());
            st.holds = holds;
        }
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
}
