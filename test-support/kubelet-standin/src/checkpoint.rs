//! The device manager checkpoint: which devices every container of every pod
//! holds, and which devices each resource last advertised.
//!
//! The JSON shape follows kubelet's `kubelet_internal_checkpoint` (v2):
//! `{"Data":{"PodDeviceEntries":[...],"RegisteredDevices":{...}},"Checksum":N}`
//! with `DeviceIDs` keyed by NUMA node (`-1` = no topology) and `AllocResp`
//! holding the protobuf-encoded `ContainerAllocateResponse` as base64. The
//! checksum is FNV-1a (32 bit) over the serialized `Data`; it is checked on
//! load but is not bit-compatible with kubelet's own checksum.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use prost::Message;
use serde::{Deserialize, Deserializer, Serialize};
use steward_proto::deviceplugin::v1beta1::ContainerAllocateResponse;

use crate::error::Error;

/// NUMA node key used for devices that report no topology.
pub const NO_TOPOLOGY: i64 = -1;

/// Device IDs grouped by NUMA node.
pub type DevicesPerNuma = BTreeMap<i64, Vec<String>>;

/// One container's allocation of one resource.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodDevicesEntry {
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    #[serde(rename = "ContainerName")]
    pub container_name: String,
    #[serde(rename = "ResourceName")]
    pub resource_name: String,
    #[serde(rename = "DeviceIDs")]
    pub device_ids: DevicesPerNuma,
    /// base64 of the protobuf encoded `ContainerAllocateResponse`.
    #[serde(rename = "AllocResp", default)]
    pub alloc_resp: Option<String>,
}

/// Checkpointed device manager state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointData {
    #[serde(
        rename = "PodDeviceEntries",
        default,
        deserialize_with = "null_as_default"
    )]
    pub pod_device_entries: Vec<PodDevicesEntry>,
    #[serde(
        rename = "RegisteredDevices",
        default,
        deserialize_with = "null_as_default"
    )]
    pub registered_devices: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct CheckpointFile {
    #[serde(rename = "Data")]
    data: CheckpointData,
    #[serde(rename = "Checksum")]
    checksum: u64,
}

fn null_as_default<'de, D, T>(de: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(de)?.unwrap_or_default())
}

fn checksum(data: &CheckpointData) -> Result<u64, Error> {
    let bytes = serde_json::to_vec(data).map_err(Error::CheckpointEncode)?;
    let mut hash: u32 = 0x811c_9dc5;
    for b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    Ok(u64::from(hash))
}

/// Writes the checkpoint atomically: temporary file, fsync, rename, fsync of
/// the directory.
pub fn write(path: &Path, data: &CheckpointData) -> Result<(), Error> {
    let file = CheckpointFile {
        checksum: checksum(data)?,
        data: data.clone(),
    };
    let bytes = serde_json::to_vec(&file).map_err(Error::CheckpointEncode)?;
    write_atomic(path, &bytes)
}

/// Reads the checkpoint; `Ok(None)` when there is none yet.
pub fn read(path: &Path) -> Result<Option<CheckpointData>, Error> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let file: CheckpointFile =
        serde_json::from_slice(&bytes).map_err(|e| Error::CheckpointCorrupt(e.to_string()))?;
    let expected = checksum(&file.data)?;
    if expected != file.checksum {
        return Err(Error::CheckpointCorrupt(format!(
            "checksum mismatch: file says {}, content hashes to {expected}",
            file.checksum
        )));
    }
    Ok(Some(file.data))
}

/// Writes `bytes` to `path` through a temporary sibling file.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::io(path, std::io::Error::other("path has no parent directory")))?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        f.write_all(bytes).map_err(|e| Error::io(&tmp, e))?;
        f.sync_all().map_err(|e| Error::io(&tmp, e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    if let Ok(d) = std::fs::File::open(dir) {
        // Best effort: persist the rename itself.
        let _ = d.sync_all();
    }
    Ok(())
}

/// Encodes an allocate response the way kubelet stores it (`[]byte` in JSON).
pub fn encode_alloc_resp(resp: &ContainerAllocateResponse) -> String {
    base64_encode(&resp.encode_to_vec())
}

/// Decodes an allocate response stored by [`encode_alloc_resp`].
pub fn decode_alloc_resp(text: &str) -> Result<ContainerAllocateResponse, Error> {
    let bytes = base64_decode(text)
        .ok_or_else(|| Error::CheckpointCorrupt("AllocResp is not valid base64".to_string()))?;
    ContainerAllocateResponse::decode(bytes.as_slice())
        .map_err(|e| Error::CheckpointCorrupt(format!("AllocResp is not a protobuf message: {e}")))
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (what Go's encoding/json uses for `[]byte`).
fn base64_encode(input: &[u8]) -> String {
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let sextet = |shift: u32| char::from(ALPHABET[((n >> shift) & 63) as usize]);
        out.push(sextet(18));
        out.push(sextet(12));
        out.push(if chunk.len() > 1 { sextet(6) } else { '=' });
        out.push(if chunk.len() > 2 { sextet(0) } else { '=' });
    }
    out
}

fn base64_decode(input: &str) -> Option<Vec<u8>> {
    let bytes = input.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let value = |c: u8| -> Option<u32> { ALPHABET.iter().position(|&a| a == c).map(|p| p as u32) };
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let last = i + 1 == bytes.len() / 4;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n: u32 = 0;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | value(c)?;
        }
        n <<= 6 * pad as u32;
        out.push((n >> 16) as u8);
        if pad < 2 {
            out.push((n >> 8) as u8);
        }
        if pad < 1 {
            out.push(n as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trip_and_known_vectors() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        for len in 0..40u8 {
            let data: Vec<u8> = (0..len).map(|i| i.wrapping_mul(37)).collect();
            assert_eq!(base64_decode(&base64_encode(&data)), Some(data));
        }
        assert_eq!(base64_decode("Zg="), None);
        assert_eq!(base64_decode("Z==="), None);
    }

    #[test]
    fn write_read_and_detect_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet_internal_checkpoint");
        assert_eq!(read(&path).unwrap(), None);
        let resp = ContainerAllocateResponse {
            envs: [("A".to_string(), "1".to_string())].into_iter().collect(),
            ..Default::default()
        };
        let data = CheckpointData {
            pod_device_entries: vec![PodDevicesEntry {
                pod_uid: "uid-1".into(),
                container_name: "main".into(),
                resource_name: "example.com/dev".into(),
                device_ids: [(NO_TOPOLOGY, vec!["d1".to_string()])]
                    .into_iter()
                    .collect(),
                alloc_resp: Some(encode_alloc_resp(&resp)),
            }],
            registered_devices: [("example.com/dev".to_string(), vec!["d1".to_string()])]
                .into_iter()
                .collect(),
        };
        write(&path, &data).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"PodDeviceEntries\""), "{text}");
        assert!(text.contains("\"-1\":[\"d1\"]"), "{text}");
        let back = read(&path).unwrap().unwrap();
        assert_eq!(back, data);
        let alloc =
            decode_alloc_resp(back.pod_device_entries[0].alloc_resp.as_deref().unwrap()).unwrap();
        assert_eq!(alloc, resp);

        std::fs::write(&path, text.replace("d1", "d2")).unwrap();
        assert!(matches!(read(&path), Err(Error::CheckpointCorrupt(_))));
    }

    #[test]
    fn go_null_collections_are_accepted() {
        let data = CheckpointData {
            pod_device_entries: vec![],
            registered_devices: BTreeMap::new(),
        };
        let sum = checksum(&data).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp");
        // Go writes nil slices/maps as null; the checksum is over our own
        // canonical form, so compute it for the empty data.
        std::fs::write(
            &path,
            format!(r#"{{"Data":{{"PodDeviceEntries":null,"RegisteredDevices":null}},"Checksum":{sum}}}"#),
        )
        .unwrap();
        assert_eq!(read(&path).unwrap(), Some(data));
    }
}
