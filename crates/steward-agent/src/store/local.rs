//! Instances in the node's embedded store (standalone mode). One agent owns
//! the file, so there are no concurrent writers; ops still re-read the stored
//! object and write only on change.

use std::collections::BTreeSet;

use steward_api::{Instance, InstanceSpec, instance_view};
use steward_core::discovery::ConfigKey;
use steward_core::discovery::instances::{InstanceOp, InstanceView};

use super::{InstanceStore, OpContext, without};
use crate::error::StoreError;
use crate::node_store::NodeStore;

/// Instances kept in redb.
#[derive(Clone, Debug)]
pub struct LocalInstanceStore {
    store: NodeStore,
}

impl LocalInstanceStore {
    pub fn new(store: NodeStore) -> Self {
        Self { store }
    }

    /// Every stored Instance as a custom resource object.
    pub fn instances(&self) -> Result<Vec<Instance>, StoreError> {
        Ok(self.store.instances()?)
    }

    fn find(&self, namespace: &str, name: &str) -> Result<Option<Instance>, StoreError> {
        Ok(self.store.instances()?.into_iter().find(|i| {
            i.metadata.namespace.as_deref() == Some(namespace)
                && i.metadata.name.as_deref() == Some(name)
        }))
    }

    fn views(&self, filter: impl Fn(&Instance) -> bool) -> Result<Vec<InstanceView>, StoreError> {
        let mut out = Vec::new();
        for i in self.store.instances()?.iter().filter(|i| filter(i)) {
            out.push(instance_view(i)?);
        }
        Ok(out)
    }
}

impl InstanceStore for LocalInstanceStore {
    async fn list(&self, config: &ConfigKey) -> Result<Vec<InstanceView>, StoreError> {
        self.views(|i| {
            i.metadata.namespace.as_deref() == Some(config.namespace.as_str())
                && i.spec.configuration_name == config.name
        })
    }

    async fn list_all(&self) -> Result<Vec<InstanceView>, StoreError> {
        self.views(|_| true)
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
                let owner = cx.owner.ok_or_else(|| StoreError::Conflict {
                    name: name.clone(),
                    detail: "create without an owning Configuration".into(),
                })?;
                if self.find(ns, name)?.is_some() {
                    return Err(StoreError::Conflict {
                        name: name.clone(),
                        detail: "already exists".into(),
                    });
                }
                let config_name = owner.metadata.name.clone().unwrap_or_default();
                let spec = InstanceSpec::from_device(
                    &config_name,
                    name,
                    device,
                    *shared,
                    &BTreeSet::from([node.clone()]),
                    *capacity,
                );
                let mut inst = Instance::new(name, spec);
                inst.metadata.namespace = Some(ns.to_owned());
                self.store.put_instance(&inst)?;
                Ok(true)
            }
            InstanceOp::AddNode { name, node } => {
                let Some(mut inst) = self.find(ns, name)? else {
                    return Err(StoreError::Conflict {
                        name: name.clone(),
                        detail: "vanished".into(),
                    });
                };
                if inst.spec.nodes.contains(node) {
                    return Ok(false);
                }
                let mut nodes: BTreeSet<String> = inst.spec.nodes.iter().cloned().collect();
                nodes.insert(node.clone());
                inst.spec.set_nodes(&nodes);
                self.store.put_instance(&inst)?;
                Ok(true)
            }
            InstanceOp::RemoveNode { name, node } => {
                let Some(mut inst) = self.find(ns, name)? else {
                    return Ok(false);
                };
                if !inst.spec.nodes.contains(node) {
                    return Ok(false);
                }
                let nodes = without(&inst.spec.nodes.iter().cloned().collect(), node);
                if nodes.is_empty() {
                    self.store.remove_instance(ns, name)?;
                } else {
                    inst.spec.set_nodes(&nodes);
                    self.store.put_instance(&inst)?;
                }
                Ok(true)
            }
            InstanceOp::UpdateDevice { name, device } => {
                let Some(mut inst) = self.find(ns, name)? else {
                    return Err(StoreError::Conflict {
                        name: name.clone(),
                        detail: "vanished".into(),
                    });
                };
                if inst.spec.device() == *device {
                    return Ok(false);
                }
                inst.spec.set_device(device);
                self.store.put_instance(&inst)?;
                Ok(true)
            }
            InstanceOp::SetCapacity { name, capacity } => {
                let Some(mut inst) = self.find(ns, name)? else {
                    return Err(StoreError::Conflict {
                        name: name.clone(),
                        detail: "vanished".into(),
                    });
                };
                if inst.spec.capacity == *capacity {
                    return Ok(false);
                }
                inst.spec.capacity = *capacity;
                self.store.put_instance(&inst)?;
                Ok(true)
            }
            InstanceOp::Delete { name } => {
                if self.find(ns, name)?.is_none() {
                    return Ok(false);
                }
                self.store.remove_instance(ns, name)?;
                Ok(true)
            }
        }
    }
}
