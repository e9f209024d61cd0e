//! Validation of what a discovery handler reports, before anything of it is
//! stored or exposed to workloads.
//!
//! A handler is not trusted: its report may hold devices without an id, the
//! same id twice, property names that cannot become environment variables,
//! host paths that escape the directories the operator allows, or simply too
//! many devices. [`validate`] keeps the good devices and says why each other
//! one was rejected; the output and the rejections together account for
//! every input device exactly once.
//!
//! Checks, in this order, each device stopping at the first failure:
//! 1. the id is not empty ([`RejectReason::EmptyId`]);
//! 2. the id was not seen earlier in the report ([`RejectReason::DuplicateId`]):
//!    the first copy with an id is the one judged, every later copy is
//!    rejected, even if the first copy fails a later check;
//! 3. every property name is an environment variable name
//!    ([`RejectReason::InvalidPropertyName`], first bad name in name order);
//! 4. every host path of mounts and device specs, once normalized, lies
//!    under an allowed prefix ([`RejectReason::HostPathNotAllowed`], first bad
//!    path in report order: mounts first, then device specs).
//!
//! Then, if more than `max_devices` devices passed, the first `max_devices`
//! in id order are kept and the rest rejected ([`RejectReason::OverLimit`]).
//! Accepted devices are returned in id order with their host paths
//! normalized (see [`normalize_host_path`]).

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::Device;

/// What a report may contain.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DevicePolicy {
    /// Most devices accepted from one report.
    pub max_devices: usize,
    /// Host path prefixes that mounts and device specs may use. Prefixes
    /// match whole path components: `/dev` allows `/dev` and `/dev/video0`
    /// but not `/devices`. Prefixes that are not absolute or contain `..`
    /// match nothing.
    pub allowed_host_paths: Vec<String>,
}

impl DevicePolicy {
    pub const DEFAULT_MAX_DEVICES: usize = 1024;
}

impl Default for DevicePolicy {
    /// At most 1024 devices, host paths only under `/dev`.
    fn default() -> Self {
        Self {
            max_devices: Self::DEFAULT_MAX_DEVICES,
            allowed_host_paths: vec!["/dev".to_owned()],
        }
    }
}

/// Why a device was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Error)]
#[serde(rename_all = "camelCase")]
pub enum RejectReason {
    #[error("device id is empty")]
    EmptyId,
    #[error("device id appears more than once in the report")]
    DuplicateId,
    #[error("property name {0:?} is not a valid environment variable name")]
    InvalidPropertyName(String),
    #[error("host path {0:?} is not under an allowed prefix")]
    HostPathNotAllowed(String),
    #[error("report exceeds the limit of {limit} devices")]
    OverLimit { limit: usize },
}

/// One rejected device.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Error)]
#[serde(rename_all = "camelCase")]
#[error("device {device_id:?} rejected: {reason}")]
pub struct Rejection {
    pub device_id: String,
    pub reason: RejectReason,
}

/// Split a report into accepted devices (id order, host paths normalized)
/// and rejections. See the module documentation for the rules.
pub fn validate(devices: Vec<Device>, policy: &DevicePolicy) -> (Vec<Device>, Vec<Rejection>) {
    let allowed: Vec<Vec<&str>> = policy
        .allowed_host_paths
        .iter()
        .filter_map(|p| components(p))
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    let mut accepted = Vec::new();
    let mut rejected = Vec::new();
    for mut device in devices {
        let verdict = if device.id.is_empty() {
            Err(RejectReason::EmptyId)
        } else if !seen.insert(device.id.clone()) {
            Err(RejectReason::DuplicateId)
        } else if let Some(bad) = device.properties.keys().find(|k| !is_env_var_name(k)) {
            Err(RejectReason::InvalidPropertyName(bad.clone()))
        } else {
            normalize_device_paths(&mut device, &allowed)
        };
        match verdict {
            Ok(()) => accepted.push(device),
            Err(reason) => rejected.push(Rejection {
                device_id: device.id,
                reason,
            }),
        }
    }
    accepted.sort_by(|a, b| a.id.cmp(&b.id));
    if accepted.len() > policy.max_devices {
        let limit = policy.max_devices;
        for device in accepted.split_off(limit) {
            rejected.push(Rejection {
                device_id: device.id,
                reason: RejectReason::OverLimit { limit },
            });
        }
    }
    (accepted, rejected)
}

/// Whether `s` can be used as an environment variable name: a C identifier,
/// `[A-Za-z_][A-Za-z0-9_]*`. Stricter than what some runtimes accept, but
/// portable to every shell and runtime.
pub fn is_env_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The normal form of an absolute host path: repeated `/` and `.`
/// components removed, no trailing `/` (except for `/` itself). `None` if
/// the path is not absolute, contains a NUL byte or a `..` component.
pub fn normalize_host_path(path: &str) -> Option<String> {
    let parts = components(path)?;
    Some(format!("/{}", parts.join("/")))
}

/// Whether `path`, normalized, lies under one of `allowed` (whole
/// components). Returns the normalized path if so.
pub fn allowed_host_path(path: &str, allowed: &[String]) -> Option<String> {
    let prefixes: Vec<Vec<&str>> = allowed.iter().filter_map(|p| components(p)).collect();
    let parts = components(path)?;
    under_any(&parts, &prefixes).then(|| format!("/{}", parts.join("/")))
}

fn components(path: &str) -> Option<Vec<&str>> {
    if !path.starts_with('/') || path.contains('\0') {
        return None;
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            other => parts.push(other),
        }
    }
    Some(parts)
}

fn under_any(parts: &[&str], prefixes: &[Vec<&str>]) -> bool {
    prefixes.iter().any(|p| parts.starts_with(p))
}

/// Normalize every host path of `device` in place, or refuse the device
/// naming the first offending path as reported.
fn normalize_device_paths(device: &mut Device, allowed: &[Vec<&str>]) -> Result<(), RejectReason> {
    let paths = device
        .mounts
        .iter_mut()
        .map(|m| &mut m.host_path)
        .chain(device.device_specs.iter_mut().map(|s| &mut s.host_path));
    let mut normalized = Vec::new();
    for path in paths {
        let value = match components(path) {
            Some(parts) if under_any(&parts, allowed) => format!("/{}", parts.join("/")),
            _ => return Err(RejectReason::HostPathNotAllowed(path.clone())),
        };
        normalized.push((path, value));
    }
    for (slot, value) in normalized {
        *slot = value;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
