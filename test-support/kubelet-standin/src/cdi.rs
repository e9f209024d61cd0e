//! CDI (Container Device Interface) resolution for runtimes that do not
//! apply CDI devices themselves (containerd 1.6 ignores
//! `ContainerConfig.CDI_devices`): reads the JSON spec files of the CDI
//! spec directories and turns fully qualified device IDs
//! (`vendor/class=name`) into the container edits a CDI-capable runtime
//! would apply, which [`ContainerEdits::apply_to`] writes into a CRI
//! `ContainerConfig`.
//!
//! Follows the CDI library's rules for the parts used here: a spec's `kind`
//! is `vendor/class`, its devices are `kind=name`; directories later in the
//! list take priority over earlier ones, while two specs of one directory
//! defining the same device make that device unresolvable; for each
//! requested device, the `containerEdits` of its spec (once per spec) come
//! first, then the device's own. Environment entries replace variables of
//! the same name. A device node's `hostPath` defaults to its `path`, its
//! permissions to `rwm`; a mount with the `ro` option is read-only.
//!
//! [`pass_devices`] is what the stand-in does with the CDI device IDs of an
//! Allocate answer or a DRA prepare: hand them to a runtime that applies
//! CDI itself (containerd 2.x) in `ContainerConfig.CDI_devices`, as kubelet
//! does, and resolve and apply them itself only for one that does not
//! (containerd 1.6).
//!
//! Not handled: YAML spec files (skipped, and named when a device is not
//! found), hooks, `additionalGids`, `intelRdt`, `netDevices` and device
//! node type/major/minor (listed in [`ContainerEdits::unsupported`]; CRI
//! cannot carry them), spec annotations.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use steward_proto::cri::runtime::v1 as cri;

/// Why CDI devices could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// Reading a directory or file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A spec file is not valid CDI JSON.
    #[error("CDI spec {path}: {message}")]
    Spec { path: PathBuf, message: String },
    /// A device ID is not `vendor/class=name`.
    #[error("invalid CDI device ID {0:?}: expected vendor/class=name")]
    InvalidId(String),
    /// No spec defines the device.
    #[error(
        "unresolvable CDI device {id}: no spec defines it (known: {known:?}; YAML specs skipped: {skipped:?})"
    )]
    Unknown {
        id: String,
        known: Vec<String>,
        skipped: Vec<PathBuf>,
    },
    /// Two specs of one directory define the device.
    #[error("unresolvable CDI device {id}: defined by both {first} and {second}")]
    Conflict {
        id: String,
        first: PathBuf,
        second: PathBuf,
    },
}

/// A device node to create in the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host (`path` when absent).
    #[serde(default)]
    pub host_path: Option<String>,
    /// cgroup permissions (`rwm` when absent).
    #[serde(default)]
    pub permissions: Option<String>,
}

/// A bind mount.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default)]
    pub options: Vec<String>,
}

/// Merged container edits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerEdits {
    /// `KEY=VALUE` entries, in order.
    pub env: Vec<String>,
    pub device_nodes: Vec<DeviceNode>,
    pub mounts: Vec<Mount>,
    /// Edits present in the specs that CRI cannot express (e.g. `hooks`).
    pub unsupported: BTreeSet<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEdits {
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    device_nodes: Vec<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    mounts: Vec<Mount>,
    #[serde(flatten)]
    rest: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDevice {
    name: String,
    #[serde(default)]
    container_edits: RawEdits,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpec {
    cdi_version: String,
    kind: String,
    #[serde(default)]
    devices: Vec<RawDevice>,
    #[serde(default)]
    container_edits: RawEdits,
}

impl RawEdits {
    fn convert(self) -> Result<ContainerEdits, String> {
        let mut unsupported: BTreeSet<String> = self
            .rest
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, _)| k.clone())
            .collect();
        let mut device_nodes = Vec::new();
        for raw in self.device_nodes {
            for k in ["type", "major", "minor", "fileMode", "uid", "gid"] {
                if raw.contains_key(k) {
                    unsupported.insert(format!("deviceNodes.{k}"));
                }
            }
            let node: DeviceNode = serde_json::from_value(serde_json::Value::Object(raw))
                .map_err(|e| format!("deviceNodes: {e}"))?;
            if node.path.is_empty() {
                return Err("deviceNodes: a device node needs a path".to_string());
            }
            device_nodes.push(node);
        }
        Ok(ContainerEdits {
            env: self.env,
            device_nodes,
            mounts: self.mounts,
            unsupported,
        })
    }
}

impl ContainerEdits {
    fn append(&mut self, other: &ContainerEdits) {
        self.env.extend(other.env.iter().cloned());
        self.device_nodes.extend(other.device_nodes.iter().cloned());
        self.mounts.extend(other.mounts.iter().cloned());
        self.unsupported.extend(other.unsupported.iter().cloned());
    }

    /// Writes the edits into a CRI container config: environment (replacing
    /// variables of the same name), devices and mounts.
    pub fn apply_to(&self, config: &mut cri::ContainerConfig) {
        for entry in &self.env {
            let (key, value) = entry.split_once('=').unwrap_or((entry.as_str(), ""));
            let kv = cri::KeyValue {
                key: key.to_string(),
                value: value.as_bytes().to_vec(),
            };
            match config.envs.iter_mut().find(|e| e.key == key) {
                Some(existing) => *existing = kv,
                None => config.envs.push(kv),
            }
        }
        for d in &self.device_nodes {
            config.devices.push(cri::Device {
                container_path: d.path.clone(),
                host_path: d.host_path.clone().unwrap_or_else(|| d.path.clone()),
                permissions: d.permissions.clone().unwrap_or_else(|| "rwm".to_string()),
            });
        }
        for m in &self.mounts {
            config.mounts.push(cri::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                readonly: m.options.iter().any(|o| o == "ro"),
                ..Default::default()
            });
        }
    }
}

fn valid_kind(kind: &str) -> bool {
    let Some((vendor, class)) = kind.split_once('/') else {
        return false;
    };
    let ok = |s: &str, extra: &[char]| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
    };
    ok(vendor, &['.', '-', '_']) && ok(class, &['-', '_'])
}

fn valid_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'))
}

/// Splits `vendor/class=name`.
pub fn parse_device_id(id: &str) -> Result<(String, String), CdiError> {
    match id.split_once('=') {
        Some((kind, name)) if valid_kind(kind) && valid_name(name) => {
            Ok((kind.to_string(), name.to_string()))
        }
        _ => Err(CdiError::InvalidId(id.to_string())),
    }
}

struct Loaded {
    path: PathBuf,
    edits: ContainerEdits,
}

enum Entry {
    Device {
        spec: usize,
        dir: usize,
        edits: ContainerEdits,
    },
    Conflict {
        dir: usize,
        first: PathBuf,
        second: PathBuf,
    },
}

/// The specs of a set of CDI directories.
pub struct CdiSpecs {
    specs: Vec<Loaded>,
    devices: BTreeMap<String, Entry>,
    skipped: Vec<PathBuf>,
}

fn load_spec(path: &Path) -> Result<(String, RawSpec), CdiError> {
    let spec_err = |message: String| CdiError::Spec {
        path: path.to_path_buf(),
        message,
    };
    let bytes = std::fs::read(path).map_err(|source| CdiError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let raw: RawSpec = serde_json::from_slice(&bytes).map_err(|e| spec_err(e.to_string()))?;
    if raw.cdi_version.is_empty() {
        return Err(spec_err("cdiVersion is missing".to_string()));
    }
    if !valid_kind(&raw.kind) {
        return Err(spec_err(format!(
            "invalid kind {:?}, expected vendor/class",
            raw.kind
        )));
    }
    if let Some(d) = raw.devices.iter().find(|d| !valid_name(&d.name)) {
        return Err(spec_err(format!("invalid device name {:?}", d.name)));
    }
    Ok((raw.kind.clone(), raw))
}

impl CdiSpecs {
    /// Loads every `*.json` spec of `dirs` (missing directories are empty).
    pub fn load<P: AsRef<Path>>(dirs: &[P]) -> Result<CdiSpecs, CdiError> {
        let mut out = CdiSpecs {
            specs: Vec::new(),
            devices: BTreeMap::new(),
            skipped: Vec::new(),
        };
        for (dir_index, dir) in dirs.iter().enumerate() {
            let dir = dir.as_ref();
            let entries = match std::fs::read_dir(dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(CdiError::Io {
                        path: dir.to_path_buf(),
                        source,
                    });
                }
            };
            let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            files.sort();
            for path in files {
                match path.extension().and_then(|e| e.to_str()) {
                    Some("json") => {}
                    Some("yaml" | "yml") => {
                        out.skipped.push(path);
                        continue;
                    }
                    _ => continue,
                }
                let (kind, raw) = load_spec(&path)?;
                let spec_index = out.specs.len();
                let edits = raw
                    .container_edits
                    .convert()
                    .map_err(|message| CdiError::Spec {
                        path: path.clone(),
                        message,
                    })?;
                out.specs.push(Loaded {
                    path: path.clone(),
                    edits,
                });
                for d in raw.devices {
                    let id = format!("{kind}={}", d.name);
                    let edits = d
                        .container_edits
                        .convert()
                        .map_err(|message| CdiError::Spec {
                            path: path.clone(),
                            message: format!("device {}: {message}", d.name),
                        })?;
                    // Same directory: a conflict; a later directory: an override.
                    let entry = match out.devices.remove(&id) {
                        Some(Entry::Device { spec, dir, .. }) if dir == dir_index => {
                            Entry::Conflict {
                                dir,
                                first: out.specs[spec].path.clone(),
                                second: path.clone(),
                            }
                        }
                        Some(conflict @ Entry::Conflict { dir, .. }) if dir == dir_index => {
                            conflict
                        }
                        _ => Entry::Device {
                            spec: spec_index,
                            dir: dir_index,
                            edits,
                        },
                    };
                    out.devices.insert(id, entry);
                }
            }
        }
        Ok(out)
    }

    /// Fully qualified IDs of every device the specs define.
    pub fn device_ids(&self) -> Vec<String> {
        self.devices.keys().cloned().collect()
    }

    /// The merged edits for `ids`, in order.
    pub fn resolve<S: AsRef<str>>(&self, ids: &[S]) -> Result<ContainerEdits, CdiError> {
        let mut out = ContainerEdits::default();
        let mut specs_applied = BTreeSet::new();
        for id in ids {
            let id = id.as_ref();
            parse_device_id(id)?;
            match self.devices.get(id) {
                Some(Entry::Device { spec, edits, .. }) => {
                    if specs_applied.insert(*spec) {
                        out.append(&self.specs[*spec].edits);
                    }
                    out.append(edits);
                }
                Some(Entry::Conflict { first, second, .. }) => {
                    return Err(CdiError::Conflict {
                        id: id.to_string(),
                        first: first.clone(),
                        second: second.clone(),
                    });
                }
                None => {
                    return Err(CdiError::Unknown {
                        id: id.to_string(),
                        known: self.device_ids(),
                        skipped: self.skipped.clone(),
                    });
                }
            }
        }
        Ok(out)
    }
}

/// Loads the specs of `dirs` and resolves `ids` (see [`CdiSpecs`]).
pub fn resolve<P: AsRef<Path>, S: AsRef<str>>(
    dirs: &[P],
    ids: &[S],
) -> Result<ContainerEdits, CdiError> {
    CdiSpecs::load(dirs)?.resolve(ids)
}

/// Who applies the CDI devices of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injection {
    /// The runtime (containerd 2.x): the IDs go into
    /// `ContainerConfig.CDI_devices`, as kubelet passes them.
    Runtime,
    /// The stand-in (containerd 1.6, which ignores `CDI_devices`): the IDs
    /// are resolved from `dirs` and applied as plain CRI edits.
    StandIn,
}

/// Hands the CDI devices `ids` to a container config the way `injection`
/// says; with [`Injection::StandIn`], answers the edits it applied.
pub fn pass_devices<P: AsRef<Path>, S: AsRef<str>>(
    config: &mut cri::ContainerConfig,
    ids: &[S],
    dirs: &[P],
    injection: Injection,
) -> Result<Option<ContainerEdits>, CdiError> {
    match injection {
        Injection::Runtime => {
            for id in ids {
                parse_device_id(id.as_ref())?;
                config.cdi_devices.push(cri::CdiDevice {
                    name: id.as_ref().to_string(),
                });
            }
            Ok(None)
        }
        Injection::StandIn => {
            let edits = resolve(dirs, ids)?;
            edits.apply_to(config);
            Ok(Some(edits))
        }
    }
}
