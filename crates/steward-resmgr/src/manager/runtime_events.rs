//! The resource manager driven by a runtime's own events (NRI) rather than
//! intercepted CRI calls: the runtime tells us what it is about to do or
//! did, and the updates of other containers a decision changed are
//! answered with the call (or sent later), never sent as CRI calls of our
//! own. The decisions are the CRI pipeline's ([`super::placement`],
//! [`super::resync`]); only the way updates reach the runtime differs.

use kube::runtime::events::EventType;
use steward_proto::cri::runtime::v1 as cri;
use tracing::{debug, info, warn};

use super::placement::PodEnd;
use super::refusals::{CONTAINER_REFUSED, is_policy_refusal};
use super::removed_pods::RemovedPods;
use super::resync::{ResyncReport, RuntimeListing};
use super::{POLICY_DECISION_FAILED, ResourceManager, same_cpus};
use crate::cache::{ContainerState, PodRecord, ResourcesRecord};
use crate::error::ResmgrError;
use crate::requests::validate_annotations;

/// Updates for running containers: container id and its resources.
pub type Updates = Vec<(String, ResourcesRecord)>;

/// An exclusive container the runtime runs with other CPUs than assigned:
/// it was created while the plugin was not connected or answered too late
/// (the runtime then creates it unadjusted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailOpen {
    /// Container id.
    pub container_id: String,
    /// The CPUs the runtime reported.
    pub runtime_cpus: String,
    /// The CPUs assigned.
    pub assigned_cpus: String,
}

/// What a Synchronize found and the updates that answer it.
#[derive(Debug, Default)]
pub struct Synchronized {
    /// The re-sync's report.
    pub report: ResyncReport,
    /// Exclusive containers found unpinned (re-pinned by `updates`).
    pub fail_open: Vec<FailOpen>,
    /// Updates to apply.
    pub updates: Updates,
}

impl ResourceManager {
    /// From now on updates are collected, not sent over CRI (NRI).
    pub(crate) async fn collect_updates(&self) {
        self.state.lock().await.outbox.get_or_insert_with(Vec::new);
    }

    /// Where updates the event pipeline collects are sent (NRI: the
    /// plugin's `UpdateContainers`). A second call is ignored.
    pub fn send_updates_to(&self, tx: tokio::sync::mpsc::UnboundedSender<Updates>) {
        let _ = self.update_sink.set(tx);
    }

    pub(super) async fn flush_outbox(&self) {
        let Some(tx) = self.update_sink.get() else {
            return;
        };
        let batch = self.take_updates_locked(&mut *self.state.lock().await);
        if !batch.is_empty() {
            let _ = tx.send(batch);
        }
    }

    fn take_updates_locked(&self, st: &mut super::State) -> Updates {
        st.outbox.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Start without a runtime to ask: the policy restored from the cache
    /// alone (the runtime's Synchronize reconciles).
    pub(crate) async fn startup_from_cache(&self) {
        let mut st = self.state.lock().await;
        self.restore_policy(&mut st).await;
        let name = st.policy.kind().as_str().to_owned();
        st.cache.data_mut().policy = name;
        // Synchronize checks every container against what the runtime has.
        let _ = self.take_updates_locked(&mut st);
        self.save(&st);
    }

    /// A pod sandbox was created.
    pub async fn pod_created(&self, pod: PodRecord) -> Result<(), ResmgrError> {
        let annotations: std::collections::HashMap<String, String> = pod
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        validate_annotations(&annotations)?;
        let mut st = self.state.lock().await;
        st.cache.data_mut().pods.insert(pod.id.clone(), pod);
        self.save(&st);
        Ok(())
    }

    /// A container is about to be created with `id`: the policy decides;
    /// answers the resources it must be created with and the updates of
    /// other containers. A policy refusal is also reported on the Pod.
    pub async fn container_creating(
        &self,
        pod: PodRecord,
        id: &str,
        name: String,
        kubelet: cri::LinuxContainerResources,
    ) -> Result<(cri::LinuxContainerResources, Updates), ResmgrError> {
        self.container_creating_on_claims(pod, id, name, kubelet, Vec::new())
            .await
    }

    /// [`Self::container_creating`] for a container whose environment names
    /// DRA CPU claims (`named_claims`, UIDs): it runs on their CPUs when
    /// each is prepared here for its pod, and is refused otherwise.
    pub async fn container_creating_on_claims(
        &self,
        pod: PodRecord,
        id: &str,
        name: String,
        kubelet: cri::LinuxContainerResources,
        named_claims: Vec<String>,
    ) -> Result<(cri::LinuxContainerResources, Updates), ResmgrError> {
        let (ns, pod_name, uid) = (pod.namespace.clone(), pod.name.clone(), pod.uid.clone());
        let container = name.clone();
        let mut st = self.state.lock().await;
        let pod_id = pod.id.clone();
        let placed = match self
            .place(&mut st, &pod_id, Some(pod), name, kubelet, named_claims)
            .await
        {
            Ok(p) => p,
            Err(e) => {
                let updates = self.take_updates_locked(&mut st);
                drop(st);
                if is_policy_refusal(&e) {
                    self.metrics.event(CONTAINER_REFUSED);
                }
                if let Some(sink) = self.pod_events.get()
                    && is_policy_refusal(&e)
                {
                    sink.emit(
                        steward_kube::pod_ref(&ns, &pod_name, Some(&uid)),
                        EventType::Warning,
                        POLICY_DECISION_FAILED,
                        "CreateContainer",
                        format!("container {container:?} refused by the resource manager: {e}"),
                    );
                }
                if !updates.is_empty()
                    && let Some(tx) = self.update_sink.get()
                {
                    let _ = tx.send(updates);
                }
                return Err(e);
            }
        };
        let resources = placed.resources.clone();
        self.commit_placed(&mut st, placed, id).await;
        let updates = self.take_updates_locked(&mut st);
        self.save(&st);
        Ok((resources, updates))
    }

    /// A container started; `cgroups_path` as the runtime reports it.
    pub async fn container_started(&self, id: &str, cgroups_path: Option<String>) -> Updates {
        let mut st = self.state.lock().await;
        let Some(c) = st.cache.data_mut().containers.get_mut(id) else {
            return Vec::new();
        };
        c.state = ContainerState::Running;
        if cgroups_path.is_some() {
            c.cgroups_path = cgroups_path;
        }
        self.out_of_band(&st, id);
        self.verify_locked(&mut st, Some(id)).await;
        let updates = self.take_updates_locked(&mut st);
        self.save(&st);
        updates
    }

    /// The kubelet updates a container to `linux`: a container of ours is
    /// re-placed if its request changed (as through the CRI proxy) and
    /// keeps CPUs and memory nodes of ours; answers its resources (`None`:
    /// not ours) and the updates of the others. Refused like a creation.
    pub async fn container_updating(
        &self,
        id: &str,
        linux: cri::LinuxContainerResources,
    ) -> Result<(Option<cri::LinuxContainerResources>, Updates), ResmgrError> {
        let mut st = self.state.lock().await;
        let Some(plan) = self.replace_plan(&mut st, id, linux).await? else {
            return Ok((None, Vec::new()));
        };
        let resources = plan.resources.clone();
        self.commit_replace(&mut st, plan).await;
        let updates = self.take_updates_locked(&mut st);
        self.save(&st);
        Ok((Some(resources), updates))
    }

    /// A container stopped: its resources are released.
    pub async fn container_stopped(&self, id: &str) -> Updates {
        let mut st = self.state.lock().await;
        self.container_stopped_locked(&mut st, id).await;
        let updates = self.take_updates_locked(&mut st);
        self.save(&st);
        updates
    }

    /// A container of pod `pod_id` (as the event names it; else the
    /// cached record's) was removed. A pod left with no container is
    /// forgotten too: containerd (2.1.9 read) announces neither the stop
    /// nor the removal of a pod sandbox that predates its own restart (its
    /// NRI state after a restart knows containers only), so such a pod
    /// would stay cached until the next Synchronize. One still alive comes
    /// back with its next CreateContainer (which carries the pod) or at the
    /// next Synchronize.
    pub async fn container_removed(&self, id: &str, pod_id: Option<&str>) -> Updates {
        let mut st = self.state.lock().await;
        let pod_id = pod_id
            .map(str::to_owned)
            .or_else(|| st.cache.data().containers.get(id).map(|c| c.pod_id.clone()));
        self.container_removed_locked(&mut st, id).await;
        if let Some(pod_id) = pod_id
            && !st
                .cache
                .data()
                .containers
                .values()
                .any(|c| c.pod_id == pod_id)
            && st.cache.data_mut().pods.remove(&pod_id).is_some()
        {
            debug!(pod_sandbox_id = %pod_id, "pod has no container left; forgotten");
        }
        let updates = self.take_updates_locked(&mut st);
        self.save(&st);
        updates
    }

    /// A pod sandbox stopped.
    pub async fn pod_stopped(&self, id: &str) -> Updates {
        let mut st = self.state.lock().await;
        self.pod_ended_locked(&mut st, id, PodEnd::Stopped).await;
        let updates = self.take_updates_locked(&mut st);
        self.save(&st);
        updates
    }

    /// A pod sandbox was removed; a later Synchronize that still lists it
    /// does not bring it back (see [`RemovedPods`]).
    pub async fn pod_removed(&self, id: &str) -> Updates {
        let mut st = self.state.lock().await;
        st.removed_pods.insert(id);
        self.pod_ended_locked(&mut st, id, PodEnd::Removed).await;
        let updates = self.take_updates_locked(&mut st);
        self.save(&st);
        updates
    }

    /// Everything the runtime has (NRI Synchronize, after every connect):
    /// reconcile the cache and the policy with it; exclusive containers the
    /// runtime runs on other CPUs than assigned were created unadjusted
    /// (fail-open): they are re-pinned by the answered updates and reported.
    pub(crate) async fn synchronize(
        &self,
        mut listing: RuntimeListing,
    ) -> Result<Synchronized, ResmgrError> {
        let mut st = self.state.lock().await;
        without_removed_pods(&mut listing, &st.removed_pods);
        without_unknown_empty_pods(&mut listing, &st.cache.data().pods);
        let mut fail_open = Vec::new();
        if let Some(given) = &listing.given {
            for (id, (res, _)) in &given.containers {
                let Some(c) = st.cache.data().containers.get(id) else {
                    continue;
                };
                let Some(a) = c.assignment.as_ref().filter(|a| a.exclusive) else {
                    continue;
                };
                let runtime_cpus = res
                    .as_ref()
                    .map(|r| r.cpuset_cpus.clone())
                    .unwrap_or_default();
                if !same_cpus(&runtime_cpus, &c.resources.cpuset_cpus) {
                    fail_open.push(FailOpen {
                        container_id: id.clone(),
                        runtime_cpus,
                        assigned_cpus: a.cpus.clone(),
                    });
                }
            }
        }
        let report = self.reconcile(&mut st, false, listing).await?;
        let updates = self.take_updates_locked(&mut st);
        self.save(&st);
        let pods = st.cache.data().pods.clone();
        let containers = st.cache.data().containers.clone();
        drop(st);
        for f in &fail_open {
            warn!(container_id = %f.container_id, runtime = %f.runtime_cpus, assigned = %f.assigned_cpus,
                "an exclusive container runs without its CPUs (created while the NRI plugin was not \
                 connected or answered too late); re-pinning it through UpdateContainers");
            self.metrics.drift("fail-open");
            if let Some(sink) = self.pod_events.get()
                && let Some(c) = containers.get(&f.container_id)
                && let Some(p) = pods.get(&c.pod_id)
            {
                sink.emit(
                    steward_kube::pod_ref(&p.namespace, &p.name, Some(&p.uid)),
                    EventType::Warning,
                    "ExclusiveCpusRepinned",
                    "Synchronize",
                    format!(
                        "container {:?} ran on {} instead of its exclusive CPUs {} \
                         (created while the resource manager's NRI plugin was not connected \
                         or answered too late); re-pinned",
                        c.name,
                        ran_on(&f.runtime_cpus),
                        f.assigned_cpus
                    ),
                );
            }
        }
        if !report.is_clean() {
            info!(report = ?report, updates = updates.len(), "synchronized with the runtime");
        }
        Ok(Synchronized {
            report,
            fail_open,
            updates,
        })
    }
}

/// Drops from `listing` the pods the runtime already said it removed, and
/// their containers: listed by a snapshot taken before the runtime dropped
/// them from its stores, they are on their way out.
fn without_removed_pods(listing: &mut RuntimeListing, removed: &RemovedPods) {
    let before = listing.pods.len();
    listing.pods.retain(|p| !removed.contains(&p.id));
    if listing.pods.len() == before {
        return;
    }
    info!(
        pods = before - listing.pods.len(),
        "Synchronize lists pods already removed; ignoring them"
    );
    let mut dropped = Vec::new();
    listing.containers.retain(|c| {
        let keep = !removed.contains(&c.pod_sandbox_id);
        if !keep {
            dropped.push(c.id.clone());
        }
        keep
    });
    if let Some(given) = listing.given.as_mut() {
        for id in &dropped {
            given.containers.remove(id);
            given.named_claims.remove(id);
        }
        given
            .pod_cgroup_parents
            .retain(|id, _| !removed.contains(id));
    }
}

/// Drops from `listing` the pods the cache does not know that have no
/// container at all: nothing to place, and one may be a pod whose removal
/// was announced before this plugin joined (containerd sends
/// RemovePodSandbox, after removing the containers, before it drops the
/// sandbox), which no event would ever take out of the cache again. A live
/// one comes in with its first CreateContainer, which carries the pod.
fn without_unknown_empty_pods(
    listing: &mut RuntimeListing,
    cached: &std::collections::BTreeMap<String, PodRecord>,
) {
    let with_containers: std::collections::BTreeSet<&str> = listing
        .containers
        .iter()
        .map(|c| c.pod_sandbox_id.as_str())
        .collect();
    let before = listing.pods.len();
    listing
        .pods
        .retain(|p| cached.contains_key(&p.id) || with_containers.contains(p.id.as_str()));
    if listing.pods.len() != before {
        debug!(
            pods = before - listing.pods.len(),
            "Synchronize lists pods without containers the cache does not know; not adopted"
        );
    }
}

/// The CPUs a container ran on, as an Event says it: a container the
/// runtime created unadjusted has no cpuset of its own (every CPU).
fn ran_on(runtime_cpus: &str) -> String {
    if runtime_cpus.trim().is_empty() {
        "every CPU (no cpuset)".to_owned()
    } else {
        format!("CPUs {runtime_cpus}")
    }
}

#[cfg(test)]
mod tests;
