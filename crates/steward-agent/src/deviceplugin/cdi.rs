//! Container Device Interface spec files: one JSON file per Configuration
//! with one device per Instance served by this node (its device nodes,
//! mounts and environment). Allocate answers name the device as
//! `steward.dev/<configuration>=<instance>`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::slot_keeper::ServedInstance;

/// Version of the CDI specification written (0.6.0 is the first with spec
/// annotations).
pub const CDI_VERSION: &str = "0.6.0";

/// Spec annotation naming steward's format of the file: which devices a
/// spec holds and how they are named (`steward.dev/<configuration>=
/// <instance>`, one device per Instance, one file per Configuration).
/// Files without it were written by steward 0.1.0, in format 1.
pub const FORMAT_ANNOTATION: &str = "steward.dev/format";
/// The format written. Bump it when the file name, the kind or the device
/// names change, add a fixture written by the release before
/// (tests/fixtures/cdi) and make the writer replace what the old one left.
pub const FORMAT: &str = "1";

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub annotations: BTreeMap<String, String>,
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
    #[error(transparent)]
    Write(#[from] steward_nodeio::NodeIoError),
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
        annotations: BTreeMap::from([(FORMAT_ANNOTATION.to_owned(), FORMAT.to_owned())]),
        devices,
    }
}

/// Writes durably (temp file, fsync, rename, fsync of the directory: a
/// runtime reading the directory sees the old spec or the new one, never a
/// torn one) or, with no instances, removes the spec file of `configuration`.
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
    steward_nodeio::durable::write_file(&path, &body)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(name: &str) -> ServedInstance {
        ServedInstance {
            namespace: "default".into(),
            name: name.into(),
            configuration: "conf".into(),
            resource_name: format!("steward.dev/{name}"),
            capacity: 1,
            shared: false,
            nodes: std::collections::BTreeSet::new(),
            usable: true,
            properties: BTreeMap::new(),
            mounts: Vec::new(),
            device_specs: Vec::new(),
            cdi_name: format!("steward.dev/conf={name}"),
            numa: Vec::new(),
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// The spec 0.1.0 wrote for the same Instances
    /// (tests/fixtures/cdi/v0.1.0): today's writer keeps its file name,
    /// kind and every device's name and edits (a container created from
    /// the old file resolves the same devices), adding only the format.
    #[test]
    fn the_spec_0_1_0_wrote_is_rewritten_with_the_same_devices_and_a_format() {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/cdi/v0.1.0/steward.dev-serial.json");
        let old: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&fixture).unwrap()).unwrap();
        let mut a = instance("serial-0b9e77");
        a.configuration = "serial".into();
        a.device_specs = vec![steward_api::InstanceDeviceSpec {
            container_path: "/dev/ttyUSB0".into(),
            host_path: "/dev/ttyUSB0".into(),
            permissions: "rw".into(),
        }];
        a.mounts = vec![steward_api::InstanceMount {
            container_path: "/etc/serial".into(),
            host_path: "/etc/steward/serial".into(),
            read_only: true,
        }];
        a.properties = BTreeMap::from([("SERIAL_PORT".to_string(), "/dev/ttyUSB0".to_string())]);
        let b = instance("serial-77aa01");
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(&fixture, spec_path(dir.path(), "serial")).unwrap();
        write(dir.path(), "serial", &[&a, &b], &BTreeMap::new()).unwrap();
        let mut new: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(spec_path(dir.path(), "serial")).unwrap(),
        )
        .unwrap();
        assert_eq!(new["annotations"][FORMAT_ANNOTATION], FORMAT);
        new.as_object_mut().unwrap().remove("annotations");
        assert_eq!(new, old);
        assert_eq!(
            names(dir.path()),
            vec!["steward.dev-serial.json".to_string()]
        );
    }

    #[test]
    fn the_spec_is_replaced_whole_and_no_temporary_remains() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (instance("a"), instance("b"));
        write(dir.path(), "conf", &[&a], &BTreeMap::new()).unwrap();
        write(dir.path(), "conf", &[&a, &b], &BTreeMap::new()).unwrap();
        let path = spec_path(dir.path(), "conf");
        let text = std::fs::read_to_string(&path).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["devices"].as_array().unwrap().len(), 2);
        assert_eq!(names(dir.path()), vec!["steward.dev-conf.json".to_string()]);
        write(dir.path(), "conf", &[], &BTreeMap::new()).unwrap();
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_and_the_old_content() {
        let dir = tempfile::tempdir().unwrap();
        let a = instance("a");
        // The spec path is taken by a non-empty directory: the rename fails.
        let path = spec_path(dir.path(), "conf");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("old"), b"old").unwrap();
        let err = write(dir.path(), "conf", &[&a], &BTreeMap::new()).unwrap_err();
        assert!(matches!(err, CdiError::Write(_)), "{err}");
        assert_eq!(names(dir.path()), vec!["steward.dev-conf.json".to_string()]);
        assert_eq!(std::fs::read(path.join("old")).unwrap(), b"old");
    }
}
