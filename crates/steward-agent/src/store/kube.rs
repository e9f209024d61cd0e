//! Instances as `steward.dev/v1alpha1` custom resources.
//!
//! Every write is a read-modify-write guarded by `resourceVersion`
//! (optimistic concurrency); a 409 or a vanished/appeared object becomes
//! [`StoreError::Conflict`] and the caller plans again.

use std::collections::BTreeSet;

use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use steward_api::{Instance, instance_view, new_instance, set_node_labels};
use steward_core::discovery::ConfigKey;
use steward_core::discovery::instances::{InstanceOp, InstanceView};

use super::{InstanceStore, OpContext, without};
use crate::error::StoreError;

/// Instances in the Kubernetes API.
#[derive(Clone)]
pub struct KubeInstanceStore {
    client: kube::Client,
    events: Option<crate::events::EventSink>,
}

impl KubeInstanceStore {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            events: None,
        }
    }

    /// Emit a `Discovered` Event on each Instance this store creates.
    pub fn with_events(mut self, events: crate::events::EventSink) -> Self {
        self.events = Some(events);
        self
    }

    fn api(&self, namespace: &str) -> Api<Instance> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

fn api_err(op: &'static str, name: &str, e: kube::Error) -> StoreError {
    if let kube::Error::Api(status) = &e
        && (status.is_conflict() || status.is_already_exists())
    {
        return StoreError::Conflict {
            name: name.to_owned(),
            detail: format!("{op}: {}", status.message),
        };
    }
    StoreError::Api {
        op,
        name: name.to_owned(),
        source: Box::new(e),
    }
}

fn conflict(name: &str, detail: &str) -> StoreError {
    StoreError::Conflict {
        name: name.to_owned(),
        detail: detail.to_owned(),
    }
}

fn views(items: Vec<Instance>, filter: impl Fn(&Instance) -> bool) -> Vec<InstanceView> {
    items
        .iter()
        .filter(|i| filter(i))
        .filter_map(|i| match instance_view(i) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring malformed Instance");
                None
            }
        })
        .collect()
}

impl KubeInstanceStore {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<Instance>, StoreError> {
        self.api(namespace)
            .get_opt(name)
            .await
            .map_err(|e| api_err("get", name, e))
    }

    async fn replace(
        &self,
        namespace: &str,
        name: &str,
        inst: &Instance,
    ) -> Result<bool, StoreError> {
        // The node labels follow spec.nodes on every write (and an
        // Instance written before they existed gets them).
        let mut inst = inst.clone();
        set_node_labels(&mut inst.metadata, &inst.spec.nodes.clone());
        self.api(namespace)
            .replace(name, &PostParams::default(), &inst)
            .await
            .map_err(|e| api_err("replace", name, e))?;
        Ok(true)
    }

    async fn delete(
        &self,
        namespace: &str,
        name: &str,
        inst: &Instance,
    ) -> Result<bool, StoreError> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: inst.metadata.resource_version.clone(),
                uid: inst.metadata.uid.clone(),
            }),
            ..DeleteParams::default()
        };
        match self.api(namespace).delete(name, &dp).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(false),
            Err(e) => Err(api_err("delete", name, e)),
        }
    }
}

impl InstanceStore for KubeInstanceStore {
    async fn list(&self, config: &ConfigKey) -> Result<Vec<InstanceView>, StoreError> {
        let list = self
            .api(&config.namespace)
            .list(&ListParams::default())
            .await
            .map_err(|e| api_err("list", &config.to_string(), e))?;
        Ok(views(list.items, |i| {
            i.spec.configuration_name == config.name
        }))
    }

    async fn list_all(&self) -> Result<Vec<InstanceView>, StoreError> {
        let list = Api::<Instance>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| api_err("list", "*", e))?;
        Ok(views(list.items, |_| true))
    }

    async fn apply(&self, cx: OpContext<'_>, op: &InstanceOp) -> Result<bool, StoreError> {
        let ns = cx.namespace;
        match op {
            InstanceOp::Create {
                name,
                device,
                shared,
                node,
                capacity,
            } => {
                let owner = cx
                    .owner
                    .ok_or_else(|| conflict(name, "create without an owning Configuration"))?;
                let inst = new_instance(
                    owner,
                    name,
                    device,
                    *shared,
                    &BTreeSet::from([node.clone()]),
                    *capacity,
                )?;
                self.api(ns)
                    .create(&PostParams::default(), &inst)
                    .await
                    .map_err(|e| api_err("create", name, e))?;
                if let Some(ev) = &self.events {
                    ev.instance_normal(
                        ns,
                        name,
                        "Discovered",
                        format!(
                            "device found by Configuration {} on node {node} ({capacity} slots)",
                            inst.spec.configuration_name
                        ),
                    );
                }
                Ok(true)
            }
            InstanceOp::AddNode { name, node } => {
                let mut inst = self
                    .get(ns, name)
                    .await?
                    .ok_or_else(|| conflict(name, "vanished before a node could be added"))?;
                if inst.spec.nodes.contains(node) {
                    return Ok(false);
                }
                let mut nodes: BTreeSet<String> = inst.spec.nodes.iter().cloned().collect();
                nodes.insert(node.clone());
                inst.spec.set_nodes(&nodes);
                self.replace(ns, name, &inst).await
            }
            InstanceOp::RemoveNode { name, node } => {
                let Some(mut inst) = self.get(ns, name).await? else {
                    return Ok(false);
                };
                if !inst.spec.nodes.contains(node) {
                    return Ok(false);
                }
                let nodes = without(&inst.spec.nodes.iter().cloned().collect(), node);
                let done = if nodes.is_empty() {
                    self.delete(ns, name, &inst).await?
                } else {
                    inst.spec.set_nodes(&nodes);
                    self.replace(ns, name, &inst).await?
                };
                if done && let Some(ev) = &self.events {
                    let rest = if nodes.is_empty() {
                        "no node sees it any more; the Instance is removed".to_owned()
                    } else {
                        format!(
                            "still seen by {}",
                            nodes.iter().cloned().collect::<Vec<_>>().join(", ")
                        )
                    };
                    ev.instance_warning(
                        ns,
                        name,
                        "DeviceLost",
                        format!("node {node} no longer sees the device; {rest}"),
                    );
                }
                Ok(done)
            }
            InstanceOp::UpdateDevice { name, device } => {
                let mut inst = self
                    .get(ns, name)
                    .await?
                    .ok_or_else(|| conflict(name, "vanished before its device could be updated"))?;
                if inst.spec.device() == *device {
                    return Ok(false);
                }
                inst.spec.set_device(device);
                self.replace(ns, name, &inst).await
            }
            InstanceOp::SetCapacity { name, capacity } => {
                let mut inst = self
                    .get(ns, name)
                    .await?
                    .ok_or_else(|| conflict(name, "vanished before it could be resized"))?;
                if inst.spec.capacity == *capacity {
                    return Ok(false);
                }
                inst.spec.capacity = *capacity;
                self.replace(ns, name, &inst).await
            }
            InstanceOp::Delete { name } => {
                let Some(inst) = self.get(ns, name).await? else {
                    return Ok(false);
                };
                if inst.spec.nodes.iter().any(|n| n != cx.node) {
                    return Err(conflict(name, "another node joined before the delete"));
                }
                let done = self.delete(ns, name, &inst).await?;
                if done && let Some(ev) = &self.events {
                    ev.instance_warning(
                        ns,
                        name,
                        "DeviceLost",
                        format!(
                            "node {} no longer sees the device; no node does, the Instance is removed",
                            cx.node
                        ),
                    );
                }
                Ok(done)
            }
        }
    }
}
