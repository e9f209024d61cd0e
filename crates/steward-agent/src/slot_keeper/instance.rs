//! What a device plugin needs to know about one Instance of this node.

use std::collections::{BTreeMap, BTreeSet};

use steward_api::{Instance, InstanceDeviceSpec, InstanceMount};
use steward_core::slots::InstanceInfo;

use super::names;

/// Device property giving the NUMA node(s) of a device, comma-separated.
/// Devices without it are reported without topology. The same property
/// DRA publishes as `resource.kubernetes.io/numaNode` (when it names one).
pub const NUMA_PROPERTY: &str = steward_core::dra::NUMA_PROPERTY;

/// An Instance served by this node's device plugins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedInstance {
    pub namespace: String,
    pub name: String,
    pub configuration: String,
    /// `steward.dev/<name>`.
    pub resource_name: String,
    pub capacity: u32,
    pub shared: bool,
    /// This node is listed in the Instance's nodes.
    pub usable: bool,
    /// The nodes that see the device (`spec.nodes`): which DRA pool its
    /// slots are published in (`steward_core::dra::pool_of`).
    pub nodes: BTreeSet<String>,
    pub properties: BTreeMap<String, String>,
    pub mounts: Vec<InstanceMount>,
    pub device_specs: Vec<InstanceDeviceSpec>,
    /// The CDI device the container is given:
    /// `steward.dev/<configuration>=<namespace>_<instance>` (derived here,
    /// not read from the Instance's `cdiName`, so Configurations of one name
    /// in two namespaces never share a device name).
    pub cdi_name: String,
    /// NUMA nodes of the device, when known.
    pub numa: Vec<i64>,
}

impl ServedInstance {
    /// The Instance as served by `node`; `None` when its name cannot be a
    /// resource name (logged by the caller).
    pub fn from_instance(instance: &Instance, node: &str) -> Option<Self> {
        let name = instance.metadata.name.clone()?;
        let resource_name = names::resource_name(&name)?;
        let spec = &instance.spec;
        let numa = spec
            .properties
            .get(NUMA_PROPERTY)
            .map(|v| {
                v.split(',')
                    .filter_map(|n| n.trim().parse::<i64>().ok())
                    .filter(|n| *n >= 0)
                    .collect()
            })
            .unwrap_or_default();
        let cdi_name = crate::cdi_names::qualified_name(
            instance.metadata.namespace.as_deref().unwrap_or_default(),
            &spec.configuration_name,
            &name,
        );
        Some(Self {
            namespace: instance.metadata.namespace.clone().unwrap_or_default(),
            name,
            configuration: spec.configuration_name.clone(),
            resource_name,
            capacity: spec.capacity,
            shared: spec.shared,
            usable: spec.nodes.iter().any(|n| n == node),
            nodes: spec.nodes.iter().cloned().collect(),
            properties: spec.properties.clone(),
            mounts: spec.mounts.clone(),
            device_specs: spec.device_specs.clone(),
            cdi_name,
            numa,
        })
    }

    /// The slot ledger's view.
    pub fn info(&self, present: bool) -> InstanceInfo {
        InstanceInfo {
            name: self.name.clone(),
            resource_name: self.resource_name.clone(),
            capacity: self.capacity,
            shared: self.shared,
            present,
            usable: self.usable,
        }
    }

    /// The `(namespace, configuration)` key of the Configuration.
    pub fn config_key(&self) -> (String, String) {
        (self.namespace.clone(), self.configuration.clone())
    }

    /// Environment of a container using this device: the device properties
    /// then the Configuration's broker properties (which win), names
    /// sanitized; empty names are dropped.
    pub fn env(&self, broker: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        for (k, v) in self.properties.iter().chain(broker) {
            let name = names::env_name(k);
            if !name.is_empty() {
                env.insert(name, v.clone());
            }
        }
        env
    }

    /// Whether kubelet must be told again (re-registration): the right to
    /// use the device came back. A capacity change is not one: kubelet takes
    /// added and removed slots from ListAndWatch, and a re-registration
    /// would end the old stream first, which kubelet answers by marking
    /// every slot Unhealthy until the new plugin registers — a pod admitted
    /// in that window failed with UnexpectedAdmissionError (seen under
    /// load in `capacity_edit_resizes_the_instance_and_its_plugin_and_keeps_held_slots`).
    pub fn needs_reregistration(&self, newer: &ServedInstance) -> bool {
        !self.usable && newer.usable
    }
}
