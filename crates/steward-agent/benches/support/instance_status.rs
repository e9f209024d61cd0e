//! The measured alternative: claims as usage entries in the Instance's
//! `status.slots`, written with read-modify-write under the Instance's
//! `resourceVersion` (409 Conflict → re-read, retry).
//!
//! Not used by the agent; kept so the benches compare the two write models
//! through the same [`ClaimStore`] trait. Every claim of every node is a
//! write to one object per device, so writers of different slots of one
//! shared device conflict with each other, and every write is delivered to
//! every watcher of Instances. Server-side apply (per-node field ownership
//! of the entries) would avoid the read-modify-write, but the API server
//! stand-in does not implement it, so it is not measured.
//!
//! `status.slots` entries carry no epoch and no awaiting mark: they read
//! back as `0` / `None`, a write never refuses an older epoch, and a delete
//! removes this node's entry whatever the epoch (the slot ledger tolerates
//! this per its contract, but a late delete can remove a newer entry).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, PostParams};
use steward_api::{Instance, InstanceStatus, PodRef, Slot};
use steward_core::Millis;
use steward_core::ledger::{Holder, Holding};
use steward_core::slots::{Claim, parse_slot_id};

use steward_agent::claims::{
    ClaimError, ClaimStore, ClaimStoreStats, ClaimWrite, Count, Counters, DEFAULT_MAX_ATTEMPTS,
    InstanceDirectory, api_error,
};

struct Inner {
    client: kube::Client,
    directory: InstanceDirectory,
    max_attempts: u32,
    /// Last Instance read or written, by name.
    known: Mutex<HashMap<String, Instance>>,
    counters: Counters,
}

/// Claims as `Instance.status.slots` entries (see the module docs).
#[derive(Clone)]
pub struct InstanceStatusClaimStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for InstanceStatusClaimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceStatusClaimStore")
            .field("max_attempts", &self.inner.max_attempts)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

enum Edit {
    /// Nothing to write; the answer is final.
    Done(ClaimWrite),
    /// Write this status.
    Write,
}

impl InstanceStatusClaimStore {
    pub fn new(client: kube::Client, directory: InstanceDirectory) -> Self {
        Self::with_max_attempts(client, directory, DEFAULT_MAX_ATTEMPTS)
    }

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
        }
    }

    /// Requests issued and conflicts met so far.
    pub fn stats(&self) -> ClaimStoreStats {
        self.inner.counters.snapshot()
    }

    fn remembered(&self, name: &str) -> Option<Instance> {
        self.inner
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    fn remember(&self, inst: Instance) {
        if let Some(name) = inst.metadata.name.clone() {
            self.inner
                .known
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name, inst);
        }
    }

    fn forget(&self, name: &str) {
        self.inner
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }

    async fn read(&self, api: &Api<Instance>, name: &str) -> Result<Option<Instance>, ClaimError> {
        self.inner.counters.add(Count::Read);
        api.get_opt(name)
            .await
            .map_err(|e| api_error("get instance", name, e))
    }

    /// Read-modify-write of the Instance holding `slot`'s entry. `Ok(None)`:
    /// the Instance does not exist.
    async fn modify(
        &self,
        slot: &str,
        edit: impl Fn(&mut Vec<Slot>) -> Edit,
    ) -> Result<Option<ClaimWrite>, ClaimError> {
        let (instance, _) = parse_slot_id(slot)
            .ok_or_else(|| ClaimError::Failed(format!("{slot:?} is not a slot id")))?;
        let Some(inst) = self
            .inner
            .directory
            .resolve(&self.inner.client, instance, &self.inner.counters)
            .await?
        else {
            return Ok(None);
        };
        let api: Api<Instance> = Api::namespaced(self.inner.client.clone(), &inst.namespace);
        // A remembered copy may be stale: it is only used to attempt a write
        // (a stale one is refused with 409); answers without a write come
        // from a fresh read.
        let (mut current, mut fresh) = match self.remembered(instance) {
            Some(i) => (Some(i), false),
            None => (self.read(&api, instance).await?, true),
        };
        for _ in 0..self.inner.max_attempts {
            let Some(mut obj) = current.take() else {
                self.forget(instance);
                return Ok(None);
            };
            let status = obj.status.get_or_insert_with(InstanceStatus::default);
            match edit(&mut status.slots) {
                Edit::Done(answer) if fresh => {
                    self.remember(obj);
                    return Ok(Some(answer));
                }
                Edit::Done(_) => {
                    current = self.read(&api, instance).await?;
                    fresh = true;
                    continue;
                }
                Edit::Write => {}
            }
            status.slots.sort_by(|a, b| a.id.cmp(&b.id));
            obj.metadata.managed_fields = None;
            self.inner.counters.add(Count::Replace);
            match api
                .replace_status(instance, &PostParams::default(), &obj)
                .await
            {
                Ok(written) => {
                    self.remember(written);
                    return Ok(Some(ClaimWrite::Written));
                }
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    self.inner.counters.add(Count::Conflict);
                    current = self.read(&api, instance).await?;
                    fresh = true;
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => current = None,
                Err(e) => {
                    self.forget(instance);
                    return Err(api_error("replace instance status", instance, e));
                }
            }
        }
        Err(ClaimError::Failed(format!(
            "Instance {instance}: gave up after {} conflicting attempts",
            self.inner.max_attempts
        )))
    }
}

fn entry_of(claim: &Claim) -> Slot {
    let holder = claim.holding.holder.as_ref();
    Slot {
        id: claim.slot().to_owned(),
        node: Some(claim.node.clone()),
        pod: holder.map(|h| PodRef {
            namespace: h.pod.namespace.clone(),
            name: h.pod.name.clone(),
            uid: h.pod.uid.clone(),
        }),
        container: holder.and_then(|h| h.container.clone()),
        since: i64::try_from(claim.holding.since.0)
            .ok()
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
            .map(Time),
    }
}

fn claim_of(slot: &Slot) -> Option<Claim> {
    let node = slot.node.clone()?;
    let holder = slot.pod.as_ref().map(|p| {
        Holder::new(
            steward_core::ledger::PodRef::new(&p.uid, &p.namespace, &p.name),
            slot.container.clone(),
        )
    });
    let since = slot
        .since
        .as_ref()
        .and_then(|t| u64::try_from(t.0.as_millisecond()).ok())
        .unwrap_or(0);
    Some(Claim {
        node,
        epoch: 0,
        holding: Holding {
            resource: slot.id.clone(),
            holder,
            since: Millis(since),
            reservation: None,
            claim: None,
        },
        awaiting: None,
    })
}

impl ClaimStore for InstanceStatusClaimStore {
    async fn write(&self, claim: &Claim) -> Result<ClaimWrite, ClaimError> {
        let entry = entry_of(claim);
        self.modify(claim.slot(), |slots| {
            match slots.iter_mut().find(|s| s.id == entry.id) {
                Some(s) if s.node.as_ref().is_some_and(|n| *n != claim.node) => {
                    Edit::Done(ClaimWrite::HeldByOtherNode {
                        node: s.node.clone().unwrap_or_default(),
                    })
                }
                Some(s) if *s == entry => Edit::Done(ClaimWrite::Written),
                Some(s) => {
                    *s = entry.clone();
                    Edit::Write
                }
                None => {
                    slots.push(entry.clone());
                    Edit::Write
                }
            }
        })
        .await?
        .ok_or_else(|| ClaimError::Failed(format!("claim {}: no such Instance", claim.slot())))
    }

    async fn delete(&self, slot: &str, node: &str, _epoch: u64) -> Result<(), ClaimError> {
        // `Ok(None)`: the Instance, and with it every entry, is gone.
        self.modify(slot, |slots| {
            let before = slots.len();
            slots.retain(|s| !(s.id == slot && s.node.as_deref() == Some(node)));
            if slots.len() == before {
                Edit::Done(ClaimWrite::Written)
            } else {
                Edit::Write
            }
        })
        .await
        .map(|_| ())
    }

    async fn list(&self) -> Result<Vec<Claim>, ClaimError> {
        self.inner.counters.add(Count::Read);
        let list = Api::<Instance>::all(self.inner.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| api_error("list instances", "*", e))?;
        Ok(list
            .items
            .iter()
            .flat_map(|i| i.status.iter().flat_map(|s| s.slots.iter()))
            .filter_map(claim_of)
            .collect())
    }
}
