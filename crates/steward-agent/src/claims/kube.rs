//! Claims in the cluster as `SlotClaim` objects (`steward.dev/v1alpha1`).
//!
//! # Write protocol
//!
//! One object per slot, named after the slot (`<instance>-<n>`) in the
//! Instance's namespace. The name is the lock: two nodes racing for a slot
//! both `create`, the API server admits exactly one, the other gets 409
//! AlreadyExists, reads the object and answers
//! [`ClaimWrite::HeldByOtherNode`].
//!
//! * **write** — create; on AlreadyExists read the record: another node's →
//!   `HeldByOtherNode`; this node's with a higher epoch → kept, `Written`
//!   (the newer record stands); identical → `Written` without a request;
//!   else replace it under its `resourceVersion` (409 Conflict → re-read,
//!   retry, at most `max_attempts` requests). The store remembers the last
//!   record it wrote per slot, so a bind or re-write is a single replace
//!   under the remembered `resourceVersion` and a fresh allocation a single
//!   create.
//! * **delete** — read (or remember) the record; only this node's record
//!   with an epoch at most the one given is deleted, with `uid` and
//!   `resourceVersion` preconditions (409 → re-read, retry).
//! * **list** — every `SlotClaim` of the cluster.
//!
//! 5xx, 429 and transport failures are [`ClaimError::Unreachable`].
//!
//! # Garbage collection
//!
//! Kubernetes' garbage collector deletes an object once *all* its
//! ownerReferences point to absent objects, and an ownerReference can only
//! name an owner in the same namespace (a namespaced owner elsewhere counts
//! as absent, so the object would be collected at once). The store therefore
//! gives each claim exactly one owner:
//!
//! * the **Pod**, when the claim names a holder, is not awaiting
//!   attribution, and the pod is in the claim's (the Instance's) namespace:
//!   deleting the pod frees the slot even while the agent is down. kubelet
//!   has released the device by the time the pod object is gone. A claim
//!   that outlives its Instance this way is right: the pod still uses the
//!   device until it is deleted.
//! * the **Instance** otherwise: a pending claim (no pod yet), an awaiting
//!   claim (its pod may be stale: a pod-owned record would be collected when
//!   the *previous* pod goes, while the slot is being handed to the next
//!   one), and a claim whose pod runs in another namespace. Deleting the
//!   Instance frees these; a pod in another namespace is reclaimed by the
//!   agent's pod watch (the slot ledger frees the slot on the pod's Deleted
//!   or terminal event and on the pod list after a restart).
//!
//! Kubernetes' collector deletes with a `uid` precondition only, so a
//! replace racing with the collection of the previous (pod-owned) version
//! can be lost, and an Instance deleted while a slot of it is held (its
//! device offline; a prepared DRA claim keeps the hold) takes the
//! Instance-owned record with it. [`watch_claims`] reports every deletion,
//! this node's too: the slot ledger writes its own record again when it
//! still holds the slot (`SlotAllocator::cluster_claim_removed`); while the
//! Instance is absent that write fails and is retried on each tick, so the
//! record is back once the Instance is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use steward_api::{SlotClaim, SlotClaimSpec, add_node_labels, missing_node_labels};
use steward_core::slots::{Claim, parse_slot_id};
use steward_kube::{Change, SharedWatch};

use crate::selection::Selection;

pub use super::instances::{InstanceDirectory, InstanceRef};
use super::{
    ClaimError, ClaimStore, ClaimStoreStats, ClaimWrite, Count, Counters, DEFAULT_MAX_ATTEMPTS,
    api_error,
};

/// A record this store wrote or read, with its namespace.
#[derive(Debug, Clone)]
struct Known {
    namespace: String,
    object: SlotClaim,
}

struct Inner {
    client: kube::Client,
    directory: InstanceDirectory,
    max_attempts: u32,
    /// Last record of this store's node per slot (by slot id).
    known: Mutex<HashMap<String, Known>>,
    counters: Counters,
}

/// Claims as `SlotClaim` objects (see the module docs). Clones share state;
/// use one store per node.
#[derive(Clone)]
pub struct KubeClaimStore {
    inner: Arc<Inner>,
    /// The claims its lists read (all, or this node's by label).
    selection: Selection,
}

impl std::fmt::Debug for KubeClaimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClaimStore")
            .field("max_attempts", &self.inner.max_attempts)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl KubeClaimStore {
    /// A store writing through `client`, finding Instances in `directory`.
    pub fn new(client: kube::Client, directory: InstanceDirectory) -> Self {
        Self::with_max_attempts(client, directory, DEFAULT_MAX_ATTEMPTS)
    }

    /// Like [`new`](Self::new) with a bound on the requests of one write or
    /// delete that meet conflicts (at least 1).
    pub fn with_max_attempts(
        client: kube::Client,
        directory: InstanceDirectory,
        max_attempts: u32,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                directory,
                max_attempts: max_attempts.max(1),
                known: Mutex::new(HashMap::new()),
                counters: Counters::default(),
            }),
            selection: Selection::all(),
        }
    }

    /// Lists only the claims `selection` selects.
    pub fn with_selection(mut self, selection: Selection) -> Self {
        self.selection = selection;
        self
    }

    /// The directory this store resolves Instances with.
    pub fn directory(&self) -> &InstanceDirectory {
        &self.inner.directory
    }

    /// Requests issued and conflicts met so far.
    pub fn stats(&self) -> ClaimStoreStats {
        self.inner.counters.snapshot()
    }

    fn count(&self, what: Count) {
        self.inner.counters.add(what);
    }

    fn api(&self, namespace: &str) -> Api<SlotClaim> {
        Api::namespaced(self.inner.client.clone(), namespace)
    }

    fn remembered(&self, slot: &str, node: &str) -> Option<Known> {
        self.inner
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(slot)
            .filter(|k| k.object.spec.node == node)
            .cloned()
    }

    fn remember(&self, namespace: &str, object: SlotClaim) {
        let Some(slot) = object.metadata.name.clone() else {
            return;
        };
        self.inner
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                slot,
                Known {
                    namespace: namespace.to_owned(),
                    object,
                },
            );
    }

    fn forget(&self, slot: &str) {
        self.inner
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(slot);
    }

    async fn read(
        &self,
        api: &Api<SlotClaim>,
        name: &str,
    ) -> Result<Option<SlotClaim>, ClaimError> {
        self.count(Count::Read);
        api.get_opt(name)
            .await
            .map_err(|e| api_error("get slot claim", name, e))
    }

    async fn resolve(&self, instance: &str) -> Result<Option<InstanceRef>, ClaimError> {
        self.inner
            .directory
            .resolve(&self.inner.client, instance, &self.inner.counters)
            .await
    }

    async fn write_claim(&self, claim: &Claim) -> Result<ClaimWrite, ClaimError> {
        let spec = SlotClaimSpec::from_claim(claim)
            .map_err(|e| ClaimError::Failed(format!("writing claim: {e}")))?;
        let name = claim.slot().to_owned();
        let inst = self.resolve(&spec.instance).await?.ok_or_else(|| {
            ClaimError::NoInstance(format!(
                "claim {name}: no Instance named {} in the cluster",
                spec.instance
            ))
        })?;
        let api = self.api(&inst.namespace);
        let owners = owner_references(&inst, claim);
        let mut current = self
            .remembered(&name, &claim.node)
            .filter(|k| k.namespace == inst.namespace)
            .map(|k| k.object);
        let mut fresh = current.is_none();
        for _ in 0..self.inner.max_attempts {
            let Some(existing) = current.take() else {
                let mut object = SlotClaim {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(inst.namespace.clone()),
                        owner_references: Some(owners.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: spec.clone(),
                };
                add_node_labels(&mut object.metadata, &inst.nodes);
                self.count(Count::Create);
                match api.create(&PostParams::default(), &object).await {
                    Ok(created) => {
                        tracing::debug!(slot = %name, node = %claim.node, epoch = claim.epoch, "slot claim created");
                        self.remember(&inst.namespace, created);
                        return Ok(ClaimWrite::Written);
                    }
                    Err(kube::Error::Api(s)) if s.is_already_exists() => {
                        self.count(Count::AlreadyExists);
                        current = self.read(&api, &name).await?;
                        fresh = true;
                        continue;
                    }
                    Err(e) => return Err(api_error("create slot claim", &name, e)),
                }
            };
            if existing.spec.node != claim.node {
                self.forget(&name);
                tracing::debug!(slot = %name, node = %claim.node, holder = %existing.spec.node, "slot held by another node");
                return Ok(ClaimWrite::HeldByOtherNode {
                    node: existing.spec.node,
                });
            }
            if existing.spec.epoch > claim.epoch {
                // A newer record of this node stands.
                self.remember(&inst.namespace, existing);
                return Ok(ClaimWrite::Written);
            }
            if existing.metadata.deletion_timestamp.is_some() {
                self.forget(&name);
                return Err(ClaimError::Failed(format!(
                    "claim {name} is being deleted; write it again once it is gone"
                )));
            }
            if existing.spec == spec
                && existing.metadata.owner_references.as_deref() == Some(owners.as_slice())
                && missing_node_labels(&existing.metadata, &inst.nodes).is_empty()
                && fresh
            {
                self.remember(&inst.namespace, existing);
                return Ok(ClaimWrite::Written);
            }
            let mut next = existing;
            next.spec = spec.clone();
            next.metadata.owner_references = Some(owners.clone());
            add_node_labels(&mut next.metadata, &inst.nodes);
            next.metadata.managed_fields = None;
            self.count(Count::Replace);
            match api.replace(&name, &PostParams::default(), &next).await {
                Ok(replaced) => {
                    tracing::debug!(slot = %name, node = %claim.node, epoch = claim.epoch, "slot claim replaced");
                    self.remember(&inst.namespace, replaced);
                    return Ok(ClaimWrite::Written);
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => {
                    self.forget(&name);
                    fresh = true;
                }
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    self.count(Count::Conflict);
                    self.forget(&name);
                    current = self.read(&api, &name).await?;
                    fresh = true;
                }
                Err(e) => {
                    self.forget(&name);
                    return Err(api_error("replace slot claim", &name, e));
                }
            }
        }
        Err(ClaimError::Failed(format!(
            "claim {name}: gave up after {} conflicting attempts",
            self.inner.max_attempts
        )))
    }

    /// The namespace and current record of `node`'s claim on `slot`, if any.
    async fn locate(
        &self,
        slot: &str,
        node: &str,
    ) -> Result<Option<(Api<SlotClaim>, Option<SlotClaim>)>, ClaimError> {
        if let Some(k) = self.remembered(slot, node) {
            return Ok(Some((self.api(&k.namespace), Some(k.object))));
        }
        let instance = parse_slot_id(slot).map(|(i, _)| i);
        if let Some(inst) = match instance {
            Some(i) => self.resolve(i).await?,
            None => None,
        } {
            let api = self.api(&inst.namespace);
            let current = self.read(&api, slot).await?;
            return Ok(Some((api, current)));
        }
        // The Instance is gone (a pod-owned claim outlives it): find the
        // record by name in every namespace.
        self.count(Count::Read);
        let found = Api::<SlotClaim>::all(self.inner.client.clone())
            .list(&ListParams::default().fields(&format!("metadata.name={slot}")))
            .await
            .map_err(|e| api_error("list slot claims named", slot, e))?;
        Ok(found
            .items
            .into_iter()
            .find(|c| c.spec.node == node)
            .and_then(|c| {
                let ns = c.metadata.namespace.clone()?;
                Some((self.api(&ns), Some(c)))
            }))
    }

    async fn delete_claim(&self, slot: &str, node: &str, epoch: u64) -> Result<(), ClaimError> {
        let Some((api, mut current)) = self.locate(slot, node).await? else {
            self.forget(slot);
            return Ok(());
        };
        for _ in 0..self.inner.max_attempts {
            let Some(existing) = current.take() else {
                self.forget(slot);
                return Ok(());
            };
            if existing.spec.node != node {
                self.forget(slot);
                return Ok(());
            }
            if existing.spec.epoch > epoch {
                return Ok(());
            }
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: existing.metadata.resource_version.clone(),
                    uid: existing.metadata.uid.clone(),
                }),
                ..DeleteParams::default()
            };
            self.count(Count::Delete);
            match api.delete(slot, &dp).await {
                Ok(_) => {
                    tracing::debug!(slot, node, epoch, "slot claim deleted");
                    self.forget(slot);
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => {
                    self.forget(slot);
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    self.count(Count::Conflict);
                    self.forget(slot);
                    current = self.read(&api, slot).await?;
                }
                Err(e) => {
                    self.forget(slot);
                    return Err(api_error("delete slot claim", slot, e));
                }
            }
        }
        Err(ClaimError::Failed(format!(
            "deleting claim {slot}: gave up after {} conflicting attempts",
            self.inner.max_attempts
        )))
    }

    async fn list_claims(&self) -> Result<Vec<Claim>, ClaimError> {
        self.count(Count::Read);
        let list = Api::<SlotClaim>::all(self.inner.client.clone())
            .list(&self.selection.list())
            .await
            .map_err(|e| api_error("list slot claims", "*", e))?;
        Ok(list.items.iter().filter_map(claim_of).collect())
    }
}

/// The single owner of a claim object (see the module docs).
fn owner_references(inst: &InstanceRef, claim: &Claim) -> Vec<OwnerReference> {
    match &claim.holding.holder {
        Some(h)
            if claim.awaiting.is_none()
                && h.pod.namespace == inst.namespace
                && !h.pod.uid.is_empty()
                && !h.pod.name.is_empty() =>
        {
            vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Pod".to_owned(),
                name: h.pod.name.clone(),
                uid: h.pod.uid.clone(),
                ..OwnerReference::default()
            }]
        }
        _ => vec![inst.owner_reference()],
    }
}

fn claim_of(obj: &SlotClaim) -> Option<Claim> {
    match obj.to_claim() {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(error = %e, namespace = ?obj.metadata.namespace, "ignoring malformed SlotClaim");
            None
        }
    }
}

impl ClaimStore for KubeClaimStore {
    async fn write(&self, claim: &Claim) -> Result<ClaimWrite, ClaimError> {
        self.write_claim(claim).await
    }

    async fn delete(&self, slot: &str, node: &str, epoch: u64) -> Result<(), ClaimError> {
        self.delete_claim(slot, node, epoch).await
    }

    async fn list(&self) -> Result<Vec<Claim>, ClaimError> {
        self.list_claims().await
    }
}

/// What [`watch_claims`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimEvent {
    /// A claim was created or changed (feed
    /// `SlotAllocator::cluster_claim_observed`).
    Applied(Claim),
    /// A claim disappeared (feed `SlotAllocator::cluster_claim_removed`).
    Deleted { slot: String, node: String },
    /// The watch (re)started and listed every claim: this is the complete
    /// set, claims not in it are gone (feed
    /// `SlotAllocator::cluster_claims_listed`). The first event of the stream
    /// once the API server answers.
    Relisted(Vec<Claim>),
    /// The watch failed; it is retried with backoff and continues with a
    /// [`ClaimEvent::Relisted`]. (A shared watch logs its failures itself:
    /// [`watch_claims`] does not send this.)
    Interrupted(String),
}

/// The claims of the agent's shared SlotClaim watch (every node's, or
/// those of the Instances this node sees), as a stream that never ends (a
/// subscription: relisted from the watch's store if it falls behind).
/// Malformed objects are skipped with a warning.
pub fn watch_claims(
    claims: SharedWatch<SlotClaim>,
) -> impl Stream<Item = ClaimEvent> + Send + 'static {
    claims.subscribe().filter_map(|change| {
        futures::future::ready(match change {
            Change::Relisted(listed) => Some(ClaimEvent::Relisted(
                listed.iter().filter_map(claim_of).collect(),
            )),
            Change::Applied(obj) => claim_of(&obj).map(ClaimEvent::Applied),
            Change::Deleted(obj) => Some(ClaimEvent::Deleted {
                slot: obj.spec.slot_id(),
                node: obj.spec.node,
            }),
            Change::Interrupted(e) => {
                tracing::warn!(error = %e, "slot claim watch interrupted");
                Some(ClaimEvent::Interrupted(e.to_string()))
            }
        })
    })
}
