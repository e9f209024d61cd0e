//! One CDI spec file per prepared claim: kind `cpu.steward.dev/claim`, one
//! device named by the claim's UID whose only edit is the environment
//! variable naming the claim (`steward_core::cpu::devices::claim_env`).
//! The runtime adds it to each container the claim is given to, and the
//! resource manager finds the claim there when the container is created.
//!
//! Written atomically (temporary file, fsync, rename), mode 0644: the
//! runtime reads it, nothing in it is secret.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use steward_core::cpu::devices::{CPU_DRIVER, claim_env};

/// Version of the CDI specification written.
pub const CDI_VERSION: &str = "0.6.0";
/// The CDI class of the claims' devices (the kind is `<driver>/claim`).
pub const CLASS: &str = "claim";
/// Mode of a spec file.
const MODE: u32 = 0o644;

/// Errors writing or removing a spec file.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("encoding the CDI spec of claim {uid}: {source}")]
    Encode {
        uid: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Write(#[from] steward_nodeio::NodeIoError),
    #[error("creating the CDI directory {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("removing CDI spec {path}: {source}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Spec {
    cdi_version: &'static str,
    kind: String,
    devices: Vec<Device>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Device {
    name: String,
    container_edits: Edits,
}

#[derive(Debug, Serialize, PartialEq)]
struct Edits {
    env: Vec<String>,
}

/// `cpu.steward.dev/claim`.
pub fn kind() -> String {
    format!("{CPU_DRIVER}/{CLASS}")
}

/// The fully qualified CDI device of claim `uid`:
/// `cpu.steward.dev/claim=<uid>`.
pub fn device_id(uid: &str) -> String {
    format!("{}={uid}", kind())
}

/// The spec file of claim `uid` in `dir`: `cpu.steward.dev-<uid>.json`.
/// `uid` must be a checked UID (`super::claim::valid_uid`).
pub fn spec_path(dir: &Path, uid: &str) -> PathBuf {
    dir.join(format!("{CPU_DRIVER}-{uid}.json"))
}

/// The spec's JSON for claim `uid`.
pub fn spec_json(uid: &str) -> Result<Vec<u8>, CdiError> {
    let (name, value) = claim_env(uid);
    let spec = Spec {
        cdi_version: CDI_VERSION,
        kind: kind(),
        devices: vec![Device {
            name: uid.to_owned(),
            container_edits: Edits {
                env: vec![format!("{name}={value}")],
            },
        }],
    };
    serde_json::to_vec_pretty(&spec).map_err(|source| CdiError::Encode {
        uid: uid.to_owned(),
        source,
    })
}

/// Writes the spec of claim `uid` into `dir` (created if missing).
pub fn write(dir: &Path, uid: &str) -> Result<PathBuf, CdiError> {
    let bytes = spec_json(uid)?;
    std::fs::create_dir_all(dir).map_err(|source| CdiError::Dir {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = spec_path(dir, uid);
    steward_nodeio::durable::write_file_with(&path, |f| {
        f.set_permissions(std::fs::Permissions::from_mode(MODE))?;
        std::io::Write::write_all(f, &bytes)
    })?;
    Ok(path)
}

/// Removes the spec of claim `uid` from `dir`; none there is no error.
pub fn remove(dir: &Path, uid: &str) -> Result<(), CdiError> {
    let path = spec_path(dir, uid);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CdiError::Remove { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_names_the_claim_in_the_environment_and_is_world_readable() {
        let dir = tempfile::tempdir().unwrap();
        let uid = "0b9e2c6a-1f7e-4a43-9d55-2f8d0c7a1e11";
        let path = write(dir.path(), uid).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["kind"], "cpu.steward.dev/claim");
        assert_eq!(v["devices"][0]["name"], uid);
        let (name, value) = claim_env(uid);
        assert_eq!(
            v["devices"][0]["containerEdits"]["env"][0],
            format!("{name}={value}")
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        assert_eq!(device_id(uid), format!("cpu.steward.dev/claim={uid}"));
        remove(dir.path(), uid).unwrap();
        assert!(!path.exists());
        remove(dir.path(), uid).unwrap();
    }
}
