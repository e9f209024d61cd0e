//! Discovery vocabulary: what a discovery handler (DH) reports, and the
//! identities the agent derives from it.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub mod instances;
pub mod registry;
pub mod validate;

/// Identity of a Configuration: the namespaced name of the custom resource
/// that asks for devices of one discovery handler. Displays as `ns/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ConfigKey {
    pub namespace: String,
    pub name: String,
}

impl ConfigKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ConfigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A host path mounted into containers that use a device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub container_path: String,
    pub host_path: String,
    #[serde(default)]
    pub read_only: bool,
}

/// A host device node exposed to containers that use a device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSpec {
    pub container_path: String,
    pub host_path: String,
    /// Cgroup permissions, any of `r`, `w`, `m`.
    #[serde(default)]
    pub permissions: String,
}

/// One leaf device as reported by a discovery handler.
///
/// `Ord` compares `id` first, then the remaining fields; it is what makes
/// conflict resolution in [`instances::merge`] independent of report order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Identifier unique within the handler's report (e.g. a devnode path or URL).
    pub id: String,
    /// Properties passed to workloads as environment variables.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub device_specs: Vec<DeviceSpec>,
}

/// How a discovery handler is reached.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Endpoint {
    /// Compiled into the agent; no transport.
    Embedded,
    /// A unix domain socket path.
    Uds(String),
    /// A network address (`http://host:port`).
    Network(String),
}

/// Identity of one registered discovery handler: several may share a name
/// (e.g. two udev handlers on different sockets) and are all used.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HandlerKey {
    pub name: String,
    pub endpoint: Endpoint,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Embedded => f.write_str("embedded"),
            Endpoint::Uds(path) => write!(f, "unix:{path}"),
            Endpoint::Network(addr) => f.write_str(addr),
        }
    }
}

impl fmt::Display for HandlerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.endpoint)
    }
}
