//! Container Device Interface spec files: one JSON file per Configuration
//! with one device per Instance served by this node (its device nodes,
//! mounts and environment). Allocate answers name the device as
//! `steward.dev/<configuration>=<instance>`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::instance::ServedInstance;

/// Version of the CDI specification written.
pub const CDI_VERSION: &str = "0.6.0";

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<CdiDevice>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Serialize, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<CdiMount>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
    pub host_path: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub permissions: String,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CdiMount {
    pub host_path: String,
    pub container_path: String,
    pub options: Vec<String>,
}

/// Errors writing a spec file.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("writing CDI spec {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("encoding CDI spec: {0}")]
    Encode(#[from] serde_json::Error),
}

/// The CDI kind of a Configuration: `steward.dev/<configuration>`.
pub fn kind(configuration: &str) -> String {
    format!("{}/{configuration}", steward_api::GROUP)
}

/// Spec file of a Configuration inside `dir`.
pub fn spec_path(dir: &Path, configuration: &str) -> PathBuf {
    dir.join(format!("{}-{configuration}.json", steward_api::GROUP))
}

/// The spec of `configuration` for `instances` (all of that Configuration).
pub fn spec(
    configuration: &str,
    instances: &[&ServedInstance],
    broker: &BTreeMap<String, String>,
) -> Spec {
    let mut devices: Vec<CdiDevice> = instances
        .iter()
        .map(|i| CdiDevice {
            name: i.name.clone(),
            container_edits: ContainerEdits {
                env: i
                    .env(broker)
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect(),
                device_nodes: i
                    .device_specs
                    .iter()
                    .map(|d| DeviceNode {
                        path: d.container_path.clone(),
                        host_path: d.host_path.clone(),
                        permissions: d.permissions.clone(),
                    })
                    .collect(),
                mounts: i
                    .mounts
                    .iter()
                    .map(|m| CdiMount {
                        host_path: m.host_path.clone(),
                        container_path: m.container_path.clone(),
                        options: if m.read_only {
                            vec!["ro".into(), "bind".into()]
                        } else {
                            vec!["rw".into(), "bind".into()]
                        },
                    })
                    .collect(),
            },
        })
        .collect();
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    Spec {
        cdi_version: CDI_VERSION.into(),
        kind: kind(configuration),
        devices,
    }
}

/// Writes (temp file, fsync, rename) or, with no instances, removes the
/// spec file of `configuration`.
pub fn write(
    dir: &Path,
    configuration: &str,
    instances: &[&ServedInstance],
    broker: &BTreeMap<String, String>,
) -> Result<(), CdiError> {
    let path = spec_path(dir, configuration);
    let io = |source| CdiError::Io {
        path: path.clone(),
        source,
    };
    if instances.is_empty() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
            _ => Ok(()),
        };
    }
    std::fs::create_dir_all(dir).map_err(io)?;
    let body = serde_json::to_vec_pretty(&spec(configuration, instances, broker))?;
    let tmp = dir.join(format!(".{}-{configuration}.json.tmp", steward_api::GROUP));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&body).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(())
}
