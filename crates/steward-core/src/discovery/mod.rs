//! Discovery vocabulary: what a discovery handler (DH) reports, and the
//! identities the agent derives from it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
