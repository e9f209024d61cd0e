//! Re-sync and adoption: the runtime is the truth. At start and after an
//! outage the cache is compared with `ListPodSandbox`/`ListContainers`;
//! vanished containers are released, unknown ones adopted (placed by the
//! policy and updated), drifted runtime resources re-applied. A full
//! `ListContainers` seen on its way to the kubelet is checked the same way,
//! and updates that failed are retried.

use std::collections::{BTreeMap, BTreeSet};

use steward_core::cpu::{Assignment, ContainerKey, ContainerRequest};
use steward_proto::cri::runtime::v1 as cri;
use tracing::{debug, error, info, warn};

use super::{
    Event, ResourceManager, State, cgroups_path_from_info, claimed_by, pod_facts, policy_err,
    same_cpus,
};
use crate::cache::{
    AssignmentRecord, ContainerRecord, ContainerState, PodRecord, PodState, RequestRecord,
    ResourcesRecord,
};
use crate::control::cri::resources_for;
use crate::error::ResmgrError;
use crate::requests::{classes_for, derive_request};

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

/// What the runtime has: CRI's listings, and for NRI's Synchronize what
/// it reported of each container (CRI asks `ContainerStatus` instead).
#[derive(Debug, Default)]
pub(crate) struct RuntimeListing {
    pub pods: Vec<cri::PodSandbox>,
    pub containers: Vec<cri::Container>,
    pub given: Option<GivenStatus>,
}

/// Per container, the resources the runtime reports and its cgroups path,
/// and the DRA CPU claims its environment names (NRI reports the
/// environment, with the CDI devices' edits; CRI does not); per pod, its
/// cgroup parent.
#[derive(Debug, Default)]
pub(crate) struct GivenStatus {
    pub containers: BTreeMap<String, (Option<cri::LinuxContainerResources>, Option<String>)>,
    /// Container id → claim UIDs, as CreateContainer reads them
    /// (`nri::convert::named_claims`); a container not listed names none.
    pub named_claims: BTreeMap<String, Vec<String>>,
    pub pod_cgroup_parents: BTreeMap<String, String>,
}

impl ResourceManager {
    /// A container's resources and cgroups path, as the runtime reports them.
    async fn runtime_status(
        &self,
        id: &str,
        verbose: bool,
        given: Option<&GivenStatus>,
    ) -> Option<(Option<cri::LinuxContainerResources>, Option<String>)> {
        if let Some(g) = given {
            return g.containers.get(id).cloned();
        }
        let status = self
            .call(
                "ContainerStatus",
                self.upstream.timeout(),
                self.upstream
                    .runtime()
                    .container_status(cri::ContainerStatusRequest {
                        container_id: id.to_owned(),
                        verbose,
                    }),
            )
            .await
            .ok()?;
        let cgroup = cgroups_path_from_info(&status.info);
        Some((
            status
                .status
                .and_then(|s| s.resources)
                .and_then(|r| r.linux),
            cgroup,
        ))
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

    pub(super) async fn observed(&self, list: Vec<cri::Container>) {
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

    pub(super) async fn retry_pending(&self) {
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
            let r = self.push_update(&mut st, &id, &rec.resources).await;
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
        let listing = RuntimeListing {
            pods,
            containers: ctrs,
            given: None,
        };
        self.reconcile(st, restore, listing).await
    }

    /// Re-sync against what the runtime reported: forget what it no longer
    /// has, adopt what it has that we did not know, re-apply resources that
    /// differ (CRI re-sync and NRI Synchronize alike).
    pub(crate) async fn reconcile(
        &self,
        st: &mut State,
        restore: bool,
        listing: RuntimeListing,
    ) -> Result<ResyncReport, ResmgrError> {
        let RuntimeListing {
            pods,
            containers: ctrs,
            given,
        } = listing;
        let given = given.as_ref();
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
                    cgroup_parent: given
                        .and_then(|g| g.pod_cgroup_parents.get(id).cloned())
                        .unwrap_or_default(),
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
            match self.adopt(st, c, given).await {
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
            let Some((Some(actual), _)) = self.runtime_status(&c.id, false, given).await else {
                continue;
            };
            if !same_cpus(&actual.cpuset_cpus, &c.resources.cpuset_cpus) {
                warn!(container_id = %c.id, runtime = %actual.cpuset_cpus, expected = %c.resources.cpuset_cpus,
                    "runtime resources drifted; re-applying");
                self.metrics.drift("runtime-resources");
                let r = self.push_update(st, &c.id, &c.resources).await;
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
    pub(super) async fn restore_policy(&self, st: &mut State) {
        let claims = st
            .cache
            .data()
            .cpu_claims
            .iter()
            .map(|(uid, c)| (uid.clone(), c.cpus.clone()))
            .collect();
        if let Err(e) = st.policy.set_claims(claims) {
            // the claims cannot be honoured on this machine any more (its
            // CPUs or reserved set changed); their containers are placed as
            // any other until kubelet prepares them again
            error!(error = %e, "the prepared CPU claims do not fit; forgetting them");
            st.cache.data_mut().cpu_claims.clear();
        }
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

    /// The DRA CPU claims a container being adopted runs on: those its
    /// environment names (`given`: NRI's Synchronize reports it; CRI's
    /// listing does not, and the CRI proxy's CreateContainer reads no claim
    /// either), believed as at CreateContainer ([`claimed_by`]: only for
    /// the pods a claim is reserved for). A container naming a claim it may
    /// not use already runs and can no longer be refused: it is placed
    /// without the claim, off the claim's CPUs, and the refusal logged,
    /// counted and, in cluster mode, reported on the Pod.
    fn adopted_claims(
        &self,
        st: &State,
        pod: &PodRecord,
        id: &str,
        name: &str,
        given: Option<&GivenStatus>,
    ) -> Vec<String> {
        let named = given
            .and_then(|g| g.named_claims.get(id))
            .cloned()
            .unwrap_or_default();
        if named.is_empty() {
            return named;
        }
        match claimed_by(&st.cache.data().cpu_claims, &pod.uid, named) {
            Ok(claims) => {
                info!(container_id = %id, cpu_claims = ?claims,
                    "a container of CPU claims was created while steward did not decide for it; \
                     moving it to the claims' CPUs");
                claims
            }
            Err(e) => {
                warn!(container_id = %id, pod = %pod.name, namespace = %pod.namespace, error = %e,
                    "a running container names a CPU claim it may not use; placed without it");
                self.metrics.drift("cpu-claim-refused");
                if let Some(sink) = self.pod_events.get() {
                    sink.emit(
                        steward_kube::pod_ref(&pod.namespace, &pod.name, Some(&pod.uid)),
                        kube::runtime::events::EventType::Warning,
                        super::POLICY_DECISION_FAILED,
                        "Synchronize",
                        format!(
                            "container {name:?} runs without the CPU claim it names \
                             (created while the resource manager did not decide for it): {e}"
                        ),
                    );
                }
                Vec::new()
            }
        }
    }

    /// Take over a container the cache did not know: derive its request from
    /// what the runtime reports (and the claims it names, [`Self::adopted_claims`]),
    /// place it, and update it.
    async fn adopt(
        &self,
        st: &mut State,
        c: &cri::Container,
        given: Option<&GivenStatus>,
    ) -> Result<(), ResmgrError> {
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
        let (kubelet, cgroup) = match given {
            Some(g) => g.containers.get(&c.id).cloned().unwrap_or_default(),
            None => {
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
                    .and_then(|r| r.linux);
                (kubelet, cgroup)
            }
        };
        let kubelet = kubelet.unwrap_or_default();
        let mut request = derive_request(&pod_facts(&pod), &name, &kubelet)?;
        request.cpu_claims = self.adopted_claims(st, &pod, &c.id, &name, given);
        let (request, decision) = match st.policy.allocate(&request) {
            Ok(d) => (request, d),
            // It runs already: created while steward did not decide for
            // it (the NRI plugin away, fail-open; or the CRI proxy's cache
            // lost), it can no longer be refused. What it asks does not
            // fit (the error says why): it is confined to the shared pool
            // rather than left on every CPU, over CPUs others hold
            // exclusively.
            Err(e) if request.qos == steward_core::cpu::Qos::Guaranteed => {
                let mut shared = request.clone();
                shared.qos = steward_core::cpu::Qos::Burstable;
                let d = st.policy.allocate(&shared).map_err(policy_err)?;
                warn!(container_id = %c.id, error = %e,
                    "a running container cannot have the CPUs it asks; confined to the shared pool \
                     (it was created while steward did not decide for it: the NRI plugin away, or the \
                     CRI proxy's cache lost)");
                self.metrics.drift("adopted-shared");
                (shared, d)
            }
            Err(e) => return Err(policy_err(e)),
        };
        let own = st
            .policy
            .assignments()
            .get(&request.key)
            .cloned()
            .ok_or_else(|| ResmgrError::NoAssignment {
                key: request.key.to_string(),
            })?;
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
        info!(container_id = %c.id, cpus = %own.cpus, cpu_claims = ?request.cpu_claims,
            "adopted a container the cache did not know");
        let r = self
            .push_update(st, &c.id, &ResourcesRecord::from_cri(&resources))
            .await;
        if r.is_err() {
            st.pending.insert(c.id.clone());
        }
        self.apply_decision(st, &decision, Some(&c.id)).await;
        Ok(())
    }
}
