//! Where each Instance lives, for the claims of its slots: the namespace a
//! `SlotClaim` is created in, the uid that owns it and the nodes whose
//! labels it carries ([`InstanceRef`]), kept per Instance name for the
//! claim stores of a node ([`InstanceDirectory`]).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::ListParams;
use steward_api::{API_VERSION, Instance};

use super::{ClaimError, Count, Counters, api_error};

/// Where an Instance lives: what a claim object needs to be created next to
/// it and owned by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InstanceRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The nodes that see it: a claim carries their node labels, so that
    /// their agents' selected watches show it.
    pub nodes: Vec<String>,
}

impl InstanceRef {
    /// The reference of a stored Instance (`None` without namespace, name or
    /// uid, i.e. an object that was never persisted).
    pub fn of(instance: &Instance) -> Option<Self> {
        let m = &instance.metadata;
        Some(Self {
            namespace: m.namespace.clone()?,
            name: m.name.clone()?,
            uid: m.uid.clone()?,
            nodes: instance.spec.nodes.clone(),
        })
    }

    pub(super) fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: API_VERSION.to_owned(),
            kind: "Instance".to_owned(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            ..OwnerReference::default()
        }
    }
}

/// Instance name → [`InstanceRef`], shared by the claim stores of a node.
///
/// The agent keeps it current from its Instance watch ([`insert`] on apply,
/// [`remove`] on delete): a stale uid would give new claims an owner that no
/// longer exists, and the garbage collector would remove them. Names not in
/// the directory are looked up in the cluster (all namespaces) on first use
/// and remembered.
///
/// [`insert`]: InstanceDirectory::insert
/// [`remove`]: InstanceDirectory::remove
#[derive(Debug, Clone, Default)]
pub struct InstanceDirectory {
    entries: Arc<RwLock<HashMap<String, InstanceRef>>>,
}

impl InstanceDirectory {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add or replace the entry of `r.name`.
    pub fn insert(&self, r: InstanceRef) {
        self.entries
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(r.name.clone(), r);
    }

    /// Forget the Instance `name`.
    pub fn remove(&self, name: &str) {
        self.entries
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }

    /// The entry of `name`, if known.
    pub fn get(&self, name: &str) -> Option<InstanceRef> {
        self.entries
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// The entry of `name`, looked up in the cluster when not known.
    /// `Ok(None)`: no such Instance; an error if the name is ambiguous
    /// (Instances of that name in several namespaces).
    pub async fn resolve(
        &self,
        client: &kube::Client,
        name: &str,
        counters: &Counters,
    ) -> Result<Option<InstanceRef>, ClaimError> {
        if let Some(r) = self.get(name) {
            return Ok(Some(r));
        }
        counters.add(Count::Read);
        let found = Api::<Instance>::all(client.clone())
            .list(&ListParams::default().fields(&format!("metadata.name={name}")))
            .await
            .map_err(|e| api_error("list instances named", name, e))?;
        let refs: Vec<InstanceRef> = found.items.iter().filter_map(InstanceRef::of).collect();
        match refs.as_slice() {
            [] => Ok(None),
            [one] => {
                self.insert(one.clone());
                Ok(Some(one.clone()))
            }
            many => Err(ClaimError::Failed(format!(
                "Instance name {name} is ambiguous: it exists in namespaces {}",
                many.iter()
                    .map(|r| r.namespace.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }
}
