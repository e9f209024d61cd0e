//! Container Device Interface spec files: one JSON file per Configuration
//! with one device per Instance served by this node (its device nodes,
//! mounts and environment). Allocate answers name the device as
//! `steward.dev/<configuration>=<namespace>_<instance>`.
//!
//! A Configuration is named by its namespace and name: two Configurations
//! of one name in two namespaces have two spec files
//! (`steward.dev-<namespace>_<configuration>.json`) and distinct device
//! names, so neither overwrites nor shadows the other's devices. Kubernetes
//! names never hold `_` (namespaces are DNS labels, Configurations and
//! Instances DNS subdomains), so `_` separates the two unambiguously, and
//! the results are valid CDI device names (`[A-Za-z0-9_.:-]`, starting and
//! ending with a letter or digit) and plain file names.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::host_paths::HostPathPolicy;
use crate::slot_keeper::ServedInstance;

/// Version of the CDI specification written (0.6.0 is the first with spec
/// annotations).
pub const CDI_VERSION: &str = "0.6.0";

/// Spec annotation naming steward's format of the file: which devices a
/// spec holds and how they are named. Files without it were written by
/// steward 0.1.0, in format 1.
///
/// - format 1: `steward.dev-<configuration>.json`, devices
///   `steward.dev/<configuration>=<instance>` (one file for every
///   Configuration of that name, whatever its namespace);
/// - format 2: `steward.dev-<namespace>_<configuration>.json`, devices
///   `steward.dev/<configuration>=<namespace>_<instance>`.
pub const FORMAT_ANNOTATION: &str = "steward.dev/format";
/// The format written. Bump it when the file name, the kind or the device
/// names change, add a fixture written by the release before
/// (tests/fixtures/cdi) and make the writer replace what the old one left.
pub const FORMAT: &str = "2";

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

pub use crate::cdi_names::{device_name, kind, qualified_name, spec_path};

/// Where format 1 (steward 0.1.0) wrote the spec of every Configuration
/// named `configuration`, whatever its namespace.
fn legacy_spec_path(dir: &Path, configuration: &str) -> PathBuf {
    dir.join(format!("{}-{configuration}.json", steward_api::GROUP))
}

/// Whether `file_name` is a spec file of format 1: `steward.dev-<name>.json`
/// where `<name>` is a Configuration name (no `_`, which every newer name
/// holds).
fn is_legacy_name(file_name: &str) -> bool {
    file_name
        .strip_prefix(steward_api::GROUP)
        .and_then(|r| r.strip_prefix('-'))
        .and_then(|r| r.strip_suffix(".json"))
        .is_some_and(|name| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        })
}

/// Whether the file at `path` is a spec steward wrote in format 1: its kind
/// is steward's and its format annotation is absent (0.1.0) or `1`.
fn is_legacy_spec(path: &Path) -> bool {
    let Ok(text) = std::fs::read(path) else {
        return false;
    };
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&text) else {
        return false;
    };
    let ours = doc["kind"]
        .as_str()
        .is_some_and(|k| k.starts_with(&format!("{}/", steward_api::GROUP)));
    let format = &doc["annotations"][FORMAT_ANNOTATION];
    ours && (format.is_null() || format.as_str() == Some("1"))
}

/// Removes the spec files format 1 left in `dir` (named after the
/// Configuration alone; see [`FORMAT_ANNOTATION`]): their device names are
/// no longer handed out, and a Configuration of that name in another
/// namespace could have overwritten them. Returns the files removed. Run
/// when the agent starts; [`write`] also removes the one of the
/// Configuration it writes.
pub fn remove_legacy(dir: &Path) -> Result<Vec<PathBuf>, CdiError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(CdiError::Io {
                path: dir.to_owned(),
                source,
            });
        }
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let legacy = entry.file_name().to_str().is_some_and(is_legacy_name)
            && entry.file_type().is_ok_and(|t| t.is_file())
            && is_legacy_spec(&path);
        if legacy {
            remove(&path)?;
            removed.push(path);
        }
    }
    removed.sort();
    Ok(removed)
}

/// Removes `path`; gone already is fine.
fn remove(path: &Path) -> Result<(), CdiError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CdiError::Io {
            path: path.to_owned(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// The spec of Configuration `configuration` of `namespace` for
/// `instances` (all of that Configuration). Every host path is checked
/// against `policy` and given resolved; an Instance with a path outside it
/// is left out (with a warning) and the others are kept.
pub fn spec(
    policy: &HostPathPolicy,
    namespace: &str,
    configuration: &str,
    instances: &[&ServedInstance],
    broker: &BTreeMap<String, String>,
) -> Spec {
    let mut devices: Vec<CdiDevice> = instances
        .iter()
        .filter_map(|i| match policy.check_edits(&i.mounts, &i.device_specs) {
            Ok(edits) => Some((i, edits)),
            Err(e) => {
                tracing::warn!(
                    namespace = %i.namespace,
                    instance = %i.name,
                    error = %e,
                    "CDI device left out: host path outside the node's policy"
                );
                None
            }
        })
        .map(|(i, (mounts, device_specs))| CdiDevice {
            name: device_name(namespace, &i.name),
            container_edits: ContainerEdits {
                env: i
                    .env(broker)
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect(),
                device_nodes: device_specs
                    .iter()
                    .map(|d| DeviceNode {
                        path: d.container_path.clone(),
                        host_path: d.host_path.clone(),
                        permissions: d.permissions.clone(),
                    })
                    .collect(),
                mounts: mounts
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
/// torn one) or, with no instances, removes the spec file of Configuration
/// `configuration` of `namespace`. The file format 1 wrote for that
/// Configuration name, if still there, is removed too. Host paths are
/// checked against `policy` (the agent's own) as [`spec`] does.
pub fn write(
    policy: &HostPathPolicy,
    dir: &Path,
    namespace: &str,
    configuration: &str,
    instances: &[&ServedInstance],
    broker: &BTreeMap<String, String>,
) -> Result<(), CdiError> {
    let path = spec_path(dir, namespace, configuration);
    let legacy = legacy_spec_path(dir, configuration);
    if is_legacy_spec(&legacy) {
        remove(&legacy)?;
    }
    if instances.is_empty() {
        return remove(&path);
    }
    std::fs::create_dir_all(dir).map_err(|source| CdiError::Io {
        path: path.clone(),
        source,
    })?;
    let body =
        serde_json::to_vec_pretty(&spec(policy, namespace, configuration, instances, broker))?;
    steward_nodeio::durable::write_file(&path, &body)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// These tests are about names and files: paths pass as written (the
    /// policy's own tests are in `host_paths`; `a_device_outside_the_policy_is_left_out`
    /// checks it is applied here).
    fn write(
        dir: &Path,
        namespace: &str,
        configuration: &str,
        instances: &[&ServedInstance],
        broker: &BTreeMap<String, String>,
    ) -> Result<(), CdiError> {
        super::write(
            &HostPathPolicy::unchecked(),
            dir,
            namespace,
            configuration,
            instances,
            broker,
        )
    }

    /// An Instance mounting the host's `/` and one whose device node is
    /// `/dev/mem` are left out of the spec; the Instance beside them is
    /// kept, with its device node resolved on the node.
    #[test]
    fn a_device_outside_the_policy_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let policy = HostPathPolicy::default();
        let dev = |host: &str| steward_api::InstanceDeviceSpec {
            container_path: "/dev/x".into(),
            host_path: host.into(),
            permissions: "rw".into(),
        };
        let mut good = instance("good");
        good.device_specs = vec![dev("/dev/./null")];
        let mut root = instance("root");
        root.device_specs = vec![dev("/dev/null")];
        root.mounts = vec![steward_api::InstanceMount {
            container_path: "/host".into(),
            host_path: "/".into(),
            read_only: false,
        }];
        let mut mem = instance("mem");
        mem.device_specs = vec![dev("/dev/mem")];
        super::write(
            &policy,
            dir.path(),
            "default",
            "conf",
            &[&root, &good, &mem],
            &BTreeMap::new(),
        )
        .unwrap();
        let doc = read(&spec_path(dir.path(), "default", "conf"));
        let devices = doc["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 1, "{doc}");
        assert_eq!(devices[0]["name"], "default_good");
        assert_eq!(
            devices[0]["containerEdits"]["deviceNodes"][0]["hostPath"],
            "/dev/null"
        );
    }

    fn instance(name: &str) -> ServedInstance {
        instance_in("default", "conf", name)
    }

    fn instance_in(namespace: &str, configuration: &str, name: &str) -> ServedInstance {
        ServedInstance {
            namespace: namespace.into(),
            name: name.into(),
            configuration: configuration.into(),
            resource_name: format!("steward.dev/{name}"),
            capacity: 1,
            shared: false,
            nodes: std::collections::BTreeSet::new(),
            usable: true,
            properties: BTreeMap::new(),
            mounts: Vec::new(),
            device_specs: Vec::new(),
            cdi_name: qualified_name(namespace, configuration, name),
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

    fn read(path: &Path) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/cdi/v0.1.0/steward.dev-serial.json")
    }

    /// A valid CDI device name: letters, digits, `_ . : -`, starting and
    /// ending with a letter or digit.
    fn valid_device_name(n: &str) -> bool {
        let ok = |b: u8| b.is_ascii_alphanumeric() || b"_.:-".contains(&b);
        let bytes = n.as_bytes();
        bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.iter().all(|b| ok(*b))
    }

    /// The attack: a Configuration named like one in another namespace.
    /// Each has its own spec file and its own device names, and writing
    /// (or emptying) one leaves the other's file as it was.
    #[test]
    fn same_named_configurations_in_two_namespaces_keep_their_own_specs() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = instance_in("team-a", "cams", "cams-0b9e77");
        a.device_specs = vec![steward_api::InstanceDeviceSpec {
            container_path: "/dev/video0".into(),
            host_path: "/dev/video0".into(),
            permissions: "rw".into(),
        }];
        // Same Instance name (same device id), another namespace, other edits.
        let mut b = instance_in("team-b", "cams", "cams-0b9e77");
        b.device_specs = vec![steward_api::InstanceDeviceSpec {
            container_path: "/dev/video0".into(),
            host_path: "/dev/mem".into(),
            permissions: "rw".into(),
        }];
        write(dir.path(), "team-a", "cams", &[&a], &BTreeMap::new()).unwrap();
        let a_before = std::fs::read(spec_path(dir.path(), "team-a", "cams")).unwrap();
        write(dir.path(), "team-b", "cams", &[&b], &BTreeMap::new()).unwrap();
        assert_eq!(
            names(dir.path()),
            vec![
                "steward.dev-team-a_cams.json".to_string(),
                "steward.dev-team-b_cams.json".to_string()
            ]
        );
        assert_eq!(
            std::fs::read(spec_path(dir.path(), "team-a", "cams")).unwrap(),
            a_before,
            "team-b's write changed team-a's spec"
        );
        let (da, db) = (
            read(&spec_path(dir.path(), "team-a", "cams")),
            read(&spec_path(dir.path(), "team-b", "cams")),
        );
        assert_eq!(da["devices"][0]["name"], "team-a_cams-0b9e77");
        assert_eq!(db["devices"][0]["name"], "team-b_cams-0b9e77");
        assert_eq!(
            da["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"],
            "/dev/video0"
        );
        // What Allocate names resolves to each namespace's own device.
        for (i, doc) in [(&a, &da), (&b, &db)] {
            let qualified = format!(
                "{}={}",
                doc["kind"].as_str().unwrap(),
                doc["devices"][0]["name"].as_str().unwrap()
            );
            assert_eq!(i.cdi_name, qualified);
            assert_ne!(a.cdi_name, b.cdi_name);
            let device = qualified.split_once('=').unwrap().1;
            assert!(valid_device_name(device), "{device}");
        }
        // team-b's Configuration goes: team-a's spec stays.
        write(dir.path(), "team-b", "cams", &[], &BTreeMap::new()).unwrap();
        assert_eq!(
            names(dir.path()),
            vec!["steward.dev-team-a_cams.json".to_string()]
        );
        assert_eq!(
            std::fs::read(spec_path(dir.path(), "team-a", "cams")).unwrap(),
            a_before
        );
    }

    #[test]
    fn names_are_valid_cdi_device_names() {
        for (ns, inst) in [
            ("default", "cams-0b9e77"),
            ("0ns", "a.b-c"),
            ("kube-system", "serial-77aa01-node-1"),
            ("", "cams-1"),
        ] {
            let n = device_name(ns, inst);
            assert!(valid_device_name(&n), "{n}");
            assert_eq!(
                qualified_name(ns, "cams", inst),
                format!("steward.dev/cams={n}")
            );
        }
    }

    /// The spec 0.1.0 wrote for the same Instances
    /// (tests/fixtures/cdi/v0.1.0), named after the Configuration alone, is
    /// replaced: today's writer writes the namespaced file, with the same
    /// devices' edits under namespaced names, and removes the old file.
    #[test]
    fn the_spec_0_1_0_wrote_is_replaced_by_the_namespaced_one() {
        let old = read(&fixture());
        let mut a = instance_in("default", "serial", "serial-0b9e77");
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
        let b = instance_in("default", "serial", "serial-77aa01");
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(fixture(), dir.path().join("steward.dev-serial.json")).unwrap();
        write(dir.path(), "default", "serial", &[&a, &b], &BTreeMap::new()).unwrap();
        assert_eq!(
            names(dir.path()),
            vec!["steward.dev-default_serial.json".to_string()]
        );
        let mut new = read(&spec_path(dir.path(), "default", "serial"));
        assert_eq!(new["annotations"][FORMAT_ANNOTATION], FORMAT);
        new.as_object_mut().unwrap().remove("annotations");
        // The same edits, under the namespaced names.
        let mut expected = old.clone();
        for d in expected["devices"].as_array_mut().unwrap() {
            let name = format!("default_{}", d["name"].as_str().unwrap());
            d["name"] = name.into();
        }
        assert_eq!(new, expected);
    }

    /// At start the agent removes what format 1 left (any Configuration,
    /// served or not), and nothing else.
    #[test]
    fn remove_legacy_takes_format_1_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::copy(fixture(), d.join("steward.dev-serial.json")).unwrap();
        // Marked format 1 (the release between).
        let mut marked = read(&fixture());
        marked["annotations"] = serde_json::json!({ FORMAT_ANNOTATION: "1" });
        std::fs::write(d.join("steward.dev-cams.json"), marked.to_string()).unwrap();
        // Someone else's kind under a name like ours, today's format,
        // another vendor's file: kept.
        std::fs::write(
            d.join("steward.dev-other.json"),
            r#"{"cdiVersion":"0.6.0","kind":"example.com/other","devices":[]}"#,
        )
        .unwrap();
        let a = instance_in("default", "cams", "cams-1");
        write(d, "team-a", "cams", &[&a], &BTreeMap::new()).unwrap();
        std::fs::write(d.join("vendor.com-gpu.json"), "{}").unwrap();
        assert_eq!(
            names(d),
            vec![
                "steward.dev-other.json".to_string(),
                "steward.dev-serial.json".to_string(),
                "steward.dev-team-a_cams.json".to_string(),
                "vendor.com-gpu.json".to_string()
            ],
            "writing team-a/cams removed the format 1 file of cams"
        );
        let removed = remove_legacy(d).unwrap();
        assert_eq!(removed, vec![d.join("steward.dev-serial.json")]);
        assert_eq!(
            names(d),
            vec![
                "steward.dev-other.json".to_string(),
                "steward.dev-team-a_cams.json".to_string(),
                "vendor.com-gpu.json".to_string()
            ]
        );
        assert!(remove_legacy(&d.join("absent")).unwrap().is_empty());
    }

    #[test]
    fn the_spec_is_replaced_whole_and_no_temporary_remains() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (instance("a"), instance("b"));
        write(dir.path(), "default", "conf", &[&a], &BTreeMap::new()).unwrap();
        write(dir.path(), "default", "conf", &[&a, &b], &BTreeMap::new()).unwrap();
        let path = spec_path(dir.path(), "default", "conf");
        let doc = read(&path);
        assert_eq!(doc["devices"].as_array().unwrap().len(), 2);
        assert_eq!(
            names(dir.path()),
            vec!["steward.dev-default_conf.json".to_string()]
        );
        write(dir.path(), "default", "conf", &[], &BTreeMap::new()).unwrap();
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_and_the_old_content() {
        let dir = tempfile::tempdir().unwrap();
        let a = instance("a");
        // The spec path is taken by a non-empty directory: the rename fails.
        let path = spec_path(dir.path(), "default", "conf");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("old"), b"old").unwrap();
        let err = write(dir.path(), "default", "conf", &[&a], &BTreeMap::new()).unwrap_err();
        assert!(matches!(err, CdiError::Write(_)), "{err}");
        assert_eq!(
            names(dir.path()),
            vec!["steward.dev-default_conf.json".to_string()]
        );
        assert_eq!(std::fs::read(path.join("old")).unwrap(), b"old");
    }
}
