//! The DRA manager's claim info cache entries and their checkpoint,
//! `<root>/dra_manager_state`, in kubelet's shape:
//! `{"Data":"<json>","Checksum":<crc32>}` where `Data` is the JSON text of
//! `{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","Entries":[…]}`
//! and the checksum is CRC-32 (IEEE) of that text, as kubelet computes it.
//! Entries carry `ClaimUID`, `ClaimName`, `Namespace`, `PodUIDs` (a set
//! written as `{"uid":{}}`) and `DriverState` (driver → `Devices`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::checkpoint::write_atomic;
use crate::error::Error;

/// File name of the DRA checkpoint in the root directory.
pub const DRA_CHECKPOINT_FILE: &str = "dra_manager_state";
const KIND: &str = "DRACheckpoint";
const API_VERSION: &str = "checkpoint.dra.kubelet.k8s.io/v1";

fn null_as_default<'de, D, T>(de: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(de)?.unwrap_or_default())
}

/// One device a driver prepared for a claim (from `NodePrepareResources`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    #[serde(rename = "PoolName")]
    pub pool_name: String,
    #[serde(rename = "DeviceName")]
    pub device_name: String,
    #[serde(rename = "ShareID", default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    #[serde(rename = "RequestNames", default, deserialize_with = "null_as_default")]
    pub request_names: Vec<String>,
    #[serde(rename = "CDIDeviceIDs", default, deserialize_with = "null_as_default")]
    pub cdi_device_ids: Vec<String>,
}

/// What one driver prepared for a claim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverState {
    #[serde(rename = "Devices", default, deserialize_with = "null_as_default")]
    pub devices: Vec<PreparedDevice>,
}

#[derive(Serialize, Deserialize)]
struct Empty {}

fn set_as_map<S: Serializer>(set: &BTreeSet<String>, s: S) -> Result<S::Ok, S::Error> {
    let map: BTreeMap<&String, Empty> = set.iter().map(|k| (k, Empty {})).collect();
    map.serialize(s)
}

fn map_as_set<'de, D: Deserializer<'de>>(de: D) -> Result<BTreeSet<String>, D::Error> {
    let map: Option<BTreeMap<String, serde::de::IgnoredAny>> = Option::deserialize(de)?;
    Ok(map.unwrap_or_default().into_keys().collect())
}

/// Claim infos by (namespace, claim name).
pub(crate) type ClaimInfos = BTreeMap<(String, String), ClaimInfo>;

/// kubelet's claim info: a ResourceClaim prepared (or being prepared) on
/// this node, the pods using it, and what each driver prepared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimInfo {
    #[serde(rename = "ClaimUID")]
    pub uid: String,
    #[serde(rename = "ClaimName")]
    pub name: String,
    #[serde(rename = "Namespace")]
    pub namespace: String,
    /// Pods on this node that reference the claim.
    #[serde(
        rename = "PodUIDs",
        serialize_with = "set_as_map",
        deserialize_with = "map_as_set",
        default
    )]
    pub pod_uids: BTreeSet<String>,
    /// Every driver with allocation results in the claim, even without devices.
    #[serde(rename = "DriverState", default, deserialize_with = "null_as_default")]
    pub drivers: BTreeMap<String, DriverState>,
    /// Whether NodePrepareResources succeeded. Not checkpointed: like
    /// kubelet, a restored entry counts as not prepared.
    #[serde(skip)]
    pub prepared: bool,
}

impl ClaimInfo {
    /// CDI device IDs for a container using the claim (`request`: only the
    /// devices of that request or its subrequests; devices without request
    /// names always count).
    pub fn cdi_devices(&self, request: Option<&str>) -> Vec<String> {
        let wanted = |d: &PreparedDevice| match request {
            None | Some("") => true,
            Some(r) => {
                d.request_names.is_empty()
                    || d.request_names
                        .iter()
                        .any(|n| n == r || n.strip_prefix(r).is_some_and(|t| t.starts_with('/')))
            }
        };
        self.drivers
            .values()
            .flat_map(|s| &s.devices)
            .filter(|d| wanted(d))
            .flat_map(|d| d.cdi_device_ids.iter().cloned())
            .collect()
    }
}

/// CRC-32 (IEEE 802.3, reflected), what Go's `crc32.ChecksumIEEE` computes.
pub(crate) fn crc32_ieee(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[derive(Serialize, Deserialize)]
struct CheckpointFile {
    #[serde(rename = "Data")]
    data: String,
    #[serde(rename = "Checksum")]
    checksum: u32,
}

#[derive(Serialize, Deserialize)]
struct CheckpointData {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: String,
    #[serde(rename = "Entries", default, deserialize_with = "null_as_default")]
    entries: Vec<ClaimInfo>,
}

/// Writes the claim infos (atomically, like the device checkpoint).
pub(crate) fn write<'a>(
    path: &Path,
    claims: impl IntoIterator<Item = &'a ClaimInfo>,
) -> Result<(), Error> {
    let data = CheckpointData {
        kind: KIND.to_string(),
        api_version: API_VERSION.to_string(),
        entries: claims.into_iter().cloned().collect(),
    };
    let text = serde_json::to_string(&data).map_err(Error::CheckpointEncode)?;
    let file = CheckpointFile {
        checksum: crc32_ieee(text.as_bytes()),
        data: text,
    };
    let bytes = serde_json::to_vec(&file).map_err(Error::CheckpointEncode)?;
    write_atomic(path, &bytes)
}

/// Reads the claim infos; `Ok(None)` when there is no checkpoint yet.
pub(crate) fn read(path: &Path) -> Result<Option<Vec<ClaimInfo>>, Error> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let corrupt = |m: String| Error::CheckpointCorrupt(format!("{}: {m}", path.display()));
    let file: CheckpointFile =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    let sum = crc32_ieee(file.data.as_bytes());
    if sum != file.checksum {
        return Err(corrupt(format!(
            "checksum mismatch: file says {}, data hashes to {sum}",
            file.checksum
        )));
    }
    let data: CheckpointData =
        serde_json::from_str(&file.data).map_err(|e| corrupt(e.to_string()))?;
    if data.kind != KIND || data.api_version != API_VERSION {
        return Err(corrupt(format!(
            "unexpected kind {:?} / apiVersion {:?}",
            data.kind, data.api_version
        )));
    }
    Ok(Some(data.entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_ieee_check_value() {
        assert_eq!(crc32_ieee(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32_ieee(b""), 0);
    }

    #[test]
    fn reads_kubelets_own_checkpoint() {
        // Written by kubelet (pkg/kubelet/cm/dra/state test data shape).
        let data = r#"{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","Entries":[{"ClaimUID":"067798be","ClaimName":"example","Namespace":"default","PodUIDs":{"139cdb46":{}},"DriverState":{"test-driver.cdi.k8s.io":{"Devices":[{"PoolName":"worker-1","DeviceName":"dev-1","RequestNames":["test request"],"CDIDeviceIDs":["example.com/example=cdi-example"]}]}}}]}"#;
        let file = serde_json::json!({"Data": data, "Checksum": crc32_ieee(data.as_bytes())});
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DRA_CHECKPOINT_FILE);
        std::fs::write(&path, file.to_string()).unwrap();
        let entries = read(&path).unwrap().unwrap();
        assert_eq!(entries.len(), 1);
        let e = &entries[0];
        assert_eq!(e.pod_uids, ["139cdb46".to_string()].into());
        let dev = &e.drivers["test-driver.cdi.k8s.io"].devices[0];
        assert_eq!(dev.cdi_device_ids, ["example.com/example=cdi-example"]);
        assert!(!e.prepared);

        // Round trip through our writer, then detect tampering.
        write(&path, &entries).unwrap();
        assert_eq!(read(&path).unwrap().unwrap(), entries);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(r#"\"PodUIDs\":{\"139cdb46\":{}}"#), "{text}");
        std::fs::write(&path, text.replace("dev-1", "dev-2")).unwrap();
        assert!(matches!(read(&path), Err(Error::CheckpointCorrupt(_))));
    }

    #[test]
    fn cdi_devices_by_request() {
        let dev = |req: &[&str], id: &str| PreparedDevice {
            request_names: req.iter().map(|s| s.to_string()).collect(),
            cdi_device_ids: vec![id.to_string()],
            ..Default::default()
        };
        let info = ClaimInfo {
            drivers: [(
                "d".to_string(),
                DriverState {
                    devices: vec![dev(&["a"], "x=1"), dev(&["b/sub"], "x=2"), dev(&[], "x=3")],
                },
            )]
            .into(),
            ..Default::default()
        };
        assert_eq!(info.cdi_devices(None), ["x=1", "x=2", "x=3"]);
        assert_eq!(info.cdi_devices(Some("a")), ["x=1", "x=3"]);
        assert_eq!(info.cdi_devices(Some("b")), ["x=2", "x=3"]);
    }
}
