//! Conversions between the custom resources and the pure core's discovery
//! types. Everything here is a function of its inputs: no I/O.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use steward_core::discovery::{
    ConfigKey, Device, DeviceSpec, Mount, instances::InstanceView, validate::DevicePolicy,
};

use crate::{
    Configuration, ConfigurationSpec, Instance, InstanceDeviceSpec, InstanceMount, InstanceSpec,
    cdi_name,
};

/// Why a resource could not be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConversionError {
    #[error("{kind} has no metadata.{field}")]
    MissingMetadata {
        kind: &'static str,
        field: &'static str,
    },
}

fn missing(kind: &'static str, field: &'static str) -> ConversionError {
    ConversionError::MissingMetadata { kind, field }
}

/// The core's key for a Configuration (namespace and name).
pub fn config_key(config: &Configuration) -> Result<ConfigKey, ConversionError> {
    let namespace = config
        .metadata
        .namespace
        .clone()
        .ok_or_else(|| missing("Configuration", "namespace"))?;
    let name = config
        .metadata
        .name
        .clone()
        .ok_or_else(|| missing("Configuration", "name"))?;
    Ok(ConfigKey::new(namespace, name))
}

impl ConfigurationSpec {
    /// The validation policy devices reported for this Configuration must pass.
    pub fn device_policy(&self) -> DevicePolicy {
        DevicePolicy {
            max_devices: usize::try_from(self.max_devices).unwrap_or(usize::MAX),
            allowed_host_paths: self.allowed_host_paths.clone(),
        }
    }
}

/// An ownerReference making `config` the controller of an Instance, so deleting
/// the Configuration garbage-collects its Instances.
pub fn owner_reference(config: &Configuration) -> Result<OwnerReference, ConversionError> {
    config
        .controller_owner_ref(&())
        .ok_or_else(|| missing("Configuration", "uid"))
}

impl From<&InstanceMount> for Mount {
    fn from(m: &InstanceMount) -> Self {
        Mount {
            container_path: m.container_path.clone(),
            host_path: m.host_path.clone(),
            read_only: m.read_only,
        }
    }
}

impl From<&Mount> for InstanceMount {
    fn from(m: &Mount) -> Self {
        InstanceMount {
            container_path: m.container_path.clone(),
            host_path: m.host_path.clone(),
            read_only: m.read_only,
        }
    }
}

impl From<&InstanceDeviceSpec> for DeviceSpec {
    fn from(d: &InstanceDeviceSpec) -> Self {
        DeviceSpec {
            container_path: d.container_path.clone(),
            host_path: d.host_path.clone(),
            permissions: d.permissions.clone(),
        }
    }
}

impl From<&DeviceSpec> for InstanceDeviceSpec {
    fn from(d: &DeviceSpec) -> Self {
        InstanceDeviceSpec {
            container_path: d.container_path.clone(),
            host_path: d.host_path.clone(),
            permissions: d.permissions.clone(),
        }
    }
}

impl InstanceSpec {
    /// The spec of Instance `instance` of Configuration `configuration` for `device`.
    pub fn from_device(
        configuration: &str,
        instance: &str,
        device: &Device,
        shared: bool,
        nodes: &BTreeSet<String>,
        capacity: u32,
    ) -> Self {
        InstanceSpec {
            configuration_name: configuration.to_owned(),
            device_id: device.id.clone(),
            shared,
            nodes: nodes.iter().cloned().collect(),
            capacity,
            properties: device.properties.clone(),
            mounts: device.mounts.iter().map(InstanceMount::from).collect(),
            device_specs: device
                .device_specs
                .iter()
                .map(InstanceDeviceSpec::from)
                .collect(),
            cdi_name: cdi_name(configuration, instance),
        }
    }

    /// The device as the core sees it.
    pub fn device(&self) -> Device {
        Device {
            id: self.device_id.clone(),
            properties: self.properties.clone(),
            mounts: self.mounts.iter().map(Mount::from).collect(),
            device_specs: self.device_specs.iter().map(DeviceSpec::from).collect(),
        }
    }

    /// Replace the device data, keeping nodes, capacity and identity.
    pub fn set_device(&mut self, device: &Device) {
        self.device_id = device.id.clone();
        self.properties = device.properties.clone();
        self.mounts = device.mounts.iter().map(InstanceMount::from).collect();
        self.device_specs = device
            .device_specs
            .iter()
            .map(InstanceDeviceSpec::from)
            .collect();
    }

    /// Set `nodes` from a set (sorted, no duplicates).
    pub fn set_nodes(&mut self, nodes: &BTreeSet<String>) {
        self.nodes = nodes.iter().cloned().collect();
    }
}

/// A new Instance owned by `config` (which must carry its uid), with
/// `capacity` slots (the capacity the core planned it with).
pub fn new_instance(
    config: &Configuration,
    name: &str,
    device: &Device,
    shared: bool,
    nodes: &BTreeSet<String>,
    capacity: u32,
) -> Result<Instance, ConversionError> {
    let key = config_key(config)?;
    let owner = owner_reference(config)?;
    let spec = InstanceSpec::from_device(&key.name, name, device, shared, nodes, capacity);
    let mut metadata = ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(key.namespace),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    };
    crate::set_node_labels(&mut metadata, nodes);
    Ok(Instance {
        metadata,
        spec,
        status: None,
    })
}

/// The core's view of a stored Instance.
pub fn instance_view(instance: &Instance) -> Result<InstanceView, ConversionError> {
    let namespace = instance
        .metadata
        .namespace
        .clone()
        .ok_or_else(|| missing("Instance", "namespace"))?;
    let name = instance
        .metadata
        .name
        .clone()
        .ok_or_else(|| missing("Instance", "name"))?;
    Ok(InstanceView {
        name,
        configuration: ConfigKey::new(namespace, instance.spec.configuration_name.clone()),
        device_id: instance.spec.device_id.clone(),
        shared: instance.spec.shared,
        nodes: instance.spec.nodes.iter().cloned().collect(),
        device: instance.spec.device(),
        capacity: instance.spec.capacity,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{API_VERSION, ConfigurationSpec};

    fn device() -> Device {
        Device {
            id: "cam-1".into(),
            properties: BTreeMap::from([("URL".to_string(), "rtsp://x".to_string())]),
            mounts: vec![Mount {
                container_path: "/data".into(),
                host_path: "/dev/shm/x".into(),
                read_only: true,
            }],
            device_specs: vec![DeviceSpec {
                container_path: "/dev/video0".into(),
                host_path: "/dev/video0".into(),
                permissions: "rw".into(),
            }],
        }
    }

    fn configuration() -> Configuration {
        let mut c = Configuration::new("cams", ConfigurationSpec::new("debug-echo", "x"));
        c.metadata.namespace = Some("ns1".into());
        c.metadata.uid = Some("uid-1".into());
        c.spec.capacity = 3;
        c
    }

    #[test]
    fn instance_round_trips_to_the_core_view() {
        let nodes = BTreeSet::from(["b".to_string(), "a".to_string()]);
        let config = configuration();
        let capacity = config.spec.capacity;
        let inst = new_instance(
            &config,
            "cams-0123456789",
            &device(),
            true,
            &nodes,
            capacity,
        )
        .unwrap();
        assert_eq!(inst.spec.nodes, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(inst.spec.capacity, 3);
        assert_eq!(inst.spec.cdi_name, "steward.dev/cams=cams-0123456789");
        let owner = &inst.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.uid, "uid-1");
        assert_eq!(owner.kind, "Configuration");
        assert_eq!(owner.api_version, API_VERSION);
        assert_eq!(owner.controller, Some(true));
        let view = instance_view(&inst).unwrap();
        assert_eq!(view.configuration, ConfigKey::new("ns1", "cams"));
        assert_eq!(view.device, device());
        assert_eq!(view.nodes, nodes);
        assert!(view.shared);
    }

    #[test]
    fn missing_uid_or_namespace_is_an_error() {
        let mut c = configuration();
        c.metadata.uid = None;
        assert_eq!(
            owner_reference(&c).unwrap_err(),
            missing("Configuration", "uid")
        );
        c.metadata.namespace = None;
        assert_eq!(
            config_key(&c).unwrap_err(),
            missing("Configuration", "namespace")
        );
    }

    #[test]
    fn policy_follows_the_spec() {
        let mut spec = ConfigurationSpec::new("udev", "");
        spec.max_devices = 7;
        spec.allowed_host_paths = vec!["/dev/bus/".into()];
        let p = spec.device_policy();
        assert_eq!(p.max_devices, 7);
        assert_eq!(p.allowed_host_paths, vec!["/dev/bus/".to_string()]);
    }
}
