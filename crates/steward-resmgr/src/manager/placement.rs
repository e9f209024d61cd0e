//! Placement, transport-neutral: the policy's decision for a container
//! about to be created ([`ResourceManager::place`]), recording it under the
//! id the runtime gave ([`ResourceManager::commit_placed`]) or undoing it,
//! and what a stopped or removed pod or container releases. The CRI proxy's
//! pipeline and the NRI plugin both go through these.

use steward_core::cpu::{ContainerRequest, Decision};
use steward_proto::cri::runtime::v1 as cri;
use tracing::debug;

use super::{ResourceManager, State, pod_facts, policy_err};
use crate::cache::{
    AssignmentRecord, ContainerRecord, ContainerState, PodRecord, PodState, RequestRecord,
    ResourcesRecord,
};
use crate::control::cri::resources_for;
use crate::error::ResmgrError;
use crate::requests::{
    ANNOTATION_ABOVE_SPEC, classes_for, derive, derive_request, log_overreach,
    validate_own_annotations, validate_resources,
};

/// Reason of the Warning Event on a Pod whose resource-manager annotation
/// asked more than its spec (the spec's value was used).
pub const ANNOTATION_ABOVE_SPEC_REASON: &str = "AnnotationAboveSpec";

/// A container the policy placed, not yet recorded (see
/// [`ResourceManager::place`]).
pub(crate) struct Placed {
    pub(crate) pod: PodRecord,
    name: String,
    pub(crate) request: ContainerRequest,
    classes: crate::requests::Classes,
    prior_request: Option<ContainerRequest>,
    decision: Decision,
    /// The container's own assignment.
    pub(crate) own: steward_core::cpu::Assignment,
    kubelet: cri::LinuxContainerResources,
    /// What the container should be created with.
    pub(crate) resources: cri::LinuxContainerResources,
}

/// How a pod sandbox ended (`StopPodSandbox` or `RemovePodSandbox`, or
/// their NRI events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PodEnd {
    /// Stopped: its containers exited, their resources released.
    Stopped,
    /// Removed: the pod and its containers are gone.
    Removed,
}

impl PodEnd {
    /// The CRI call that ends a pod this way.
    pub(crate) fn call(self) -> &'static str {
        match self {
            Self::Stopped => "StopPodSandbox",
            Self::Removed => "RemovePodSandbox",
        }
    }
}

/// A container of ours re-placed for new resources (the kubelet's update),
/// not yet recorded (see [`ResourceManager::replace_plan`]).
pub(crate) struct Replaced {
    id: String,
    new_request: ContainerRequest,
    old_request: ContainerRequest,
    changed: bool,
    decision: Decision,
    own: steward_core::cpu::Assignment,
    linux: cri::LinuxContainerResources,
    /// What the container should now run with.
    pub(crate) resources: cri::LinuxContainerResources,
}

impl ResourceManager {
    /// The kubelet updates container `id` to `linux`: re-place it if its
    /// request changed, keep its cpuset ours. `None`: not a container we
    /// hold an assignment for (the update is the kubelet's alone).
    pub(crate) async fn replace_plan(
        &self,
        st: &mut State,
        id: &str,
        linux: cri::LinuxContainerResources,
    ) -> Result<Option<Replaced>, ResmgrError> {
        validate_resources(&linux)?;
        let known = st.cache.data().containers.get(id).cloned();
        let Some(rec) = known.filter(|c| c.assignment.is_some()) else {
            return Ok(None);
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
        let own = st.policy.assignments().get(&key).cloned().ok_or_else(|| {
            ResmgrError::NoAssignment {
                key: key.to_string(),
            }
        })?;
        let resources = resources_for(&linux, &own, &st.config.cri);
        Ok(Some(Replaced {
            id: id.to_owned(),
            new_request,
            old_request,
            changed,
            decision,
            own,
            linux,
            resources,
        }))
    }

    /// Undo a [`Self::replace_plan`] the runtime did not follow.
    pub(crate) async fn undo_replace(&self, st: &mut State, r: Replaced) {
        if r.changed {
            self.rollback(st, &r.new_request.key, Some(&r.old_request))
                .await;
        }
    }

    /// Record a re-placed container and push the decision to the others.
    pub(crate) async fn commit_replace(&self, st: &mut State, r: Replaced) {
        if let Some(c) = st.cache.data_mut().containers.get_mut(&r.id) {
            c.request = RequestRecord::from_request(&r.new_request);
            c.kubelet_resources = ResourcesRecord::from_cri(&r.linux);
            c.resources = ResourcesRecord::from_cri(&r.resources);
            c.assignment = Some(AssignmentRecord::from_assignment(&r.own));
        }
        self.apply_decision(st, &r.decision, Some(&r.id)).await;
    }

    /// The policy's decision for a container about to be created: validate,
    /// derive its request, allocate. `pod` is the sandbox config sent with
    /// the call, else the cached pod is used. Nothing is recorded in the
    /// cache until [`Self::commit_placed`]; [`Self::unplace`] undoes it.
    pub(crate) async fn place(
        &self,
        st: &mut State,
        pod_id: &str,
        pod: Option<PodRecord>,
        name: String,
        kubelet: cri::LinuxContainerResources,
        named_claims: Vec<String>,
    ) -> Result<Placed, ResmgrError> {
        validate_resources(&kubelet)?;
        if let Some(p) = &pod {
            validate_own_annotations(&p.annotations)?;
        }
        let pod =
            match pod {
                Some(p) => p,
                None => st.cache.data().pods.get(pod_id).cloned().ok_or_else(|| {
                    ResmgrError::NotFound {
                        kind: "pod sandbox",
                        id: pod_id.to_owned(),
                    }
                })?,
            };
        let facts = pod_facts(&pod);
        let derived = derive(&facts, &name, &kubelet)?;
        log_overreach(&facts, &name, &derived.overreach);
        if !derived.overreach.is_empty()
            && let Some(sink) = self.pod_events.get()
        {
            let what: Vec<String> = derived.overreach.iter().map(|o| o.to_string()).collect();
            sink.emit(
                steward_kube::pod_ref(&pod.namespace, &pod.name, Some(&pod.uid)),
                kube::runtime::events::EventType::Warning,
                ANNOTATION_ABOVE_SPEC_REASON,
                "CreateContainer",
                format!(
                    "container {name:?}: {ANNOTATION_ABOVE_SPEC}: {}",
                    what.join("; ")
                ),
            );
        }
        let mut request = derived.request;
        request.cpu_claims =
            super::claimed_by(&st.cache.data().cpu_claims, &pod.uid, named_claims)?;
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
            self.rollback(st, &key, prior_request.as_ref()).await;
            return Err(ResmgrError::NoAssignment {
                key: key.to_string(),
            });
        };
        let resources = resources_for(&kubelet, &own, &st.config.cri);
        debug!(%key, cpus = %own.cpus, mems = %own.mems, pool = %own.pool, "creating container");
        Ok(Placed {
            pod,
            name,
            request,
            classes,
            prior_request,
            decision,
            own,
            kubelet,
            resources,
        })
    }

    /// Undo a [`Self::place`] the runtime did not follow.
    pub(crate) async fn unplace(&self, st: &mut State, placed: Placed) {
        self.rollback(st, &placed.request.key, placed.prior_request.as_ref())
            .await;
    }

    /// Record a placed container under the id the runtime gave it and push
    /// the decision to the other containers it changed.
    pub(crate) async fn commit_placed(&self, st: &mut State, placed: Placed, id: &str) {
        let Placed {
            pod,
            name,
            request,
            classes,
            decision,
            own,
            kubelet,
            resources,
            ..
        } = placed;
        // An earlier attempt of the same container hands the key over.
        for old in st.cache.ids_for_key(&request.key) {
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
            id.to_owned(),
            ContainerRecord {
                id: id.to_owned(),
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
        self.apply_decision(st, &decision, Some(id)).await;
    }

    /// A pod sandbox ended: its containers are released and kept as exited
    /// with the pod not ready ([`PodEnd::Stopped`]), or forgotten with it
    /// ([`PodEnd::Removed`]).
    pub(crate) async fn pod_ended_locked(&self, st: &mut State, id: &str, end: PodEnd) {
        for cid in containers_of_pod(st, id) {
            match end {
                PodEnd::Stopped => self.container_stopped_locked(st, &cid).await,
                PodEnd::Removed => self.container_removed_locked(st, &cid).await,
            }
        }
        let pods = &mut st.cache.data_mut().pods;
        match end {
            PodEnd::Stopped => {
                if let Some(p) = pods.get_mut(id) {
                    p.state = PodState::NotReady;
                }
            }
            PodEnd::Removed => {
                pods.remove(id);
            }
        }
    }

    /// A container stopped: release its resources.
    pub(crate) async fn container_stopped_locked(&self, st: &mut State, id: &str) {
        self.release_container(st, id).await;
        if let Some(c) = st.cache.data_mut().containers.get_mut(id) {
            c.state = ContainerState::Exited;
        }
    }

    /// A container was removed: forget it.
    pub(crate) async fn container_removed_locked(&self, st: &mut State, id: &str) {
        self.release_container(st, id).await;
        st.cache.data_mut().containers.remove(id);
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
