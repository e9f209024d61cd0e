//! A block I/O class: the configuration's weight and per-device throttles,
//! and what applying one did.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Throttles for one block device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockIoDevice {
    /// `major:minor` of the device.
    pub device: String,
    /// Read bytes per second.
    #[serde(default)]
    pub read_bps: Option<u64>,
    /// Write bytes per second.
    #[serde(default)]
    pub write_bps: Option<u64>,
    /// Read operations per second.
    #[serde(default)]
    pub read_iops: Option<u64>,
    /// Write operations per second.
    #[serde(default)]
    pub write_iops: Option<u64>,
}

/// A block I/O class: a proportional weight and per-device throttles.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockIoClass {
    /// Proportional weight on the cgroup v1 scale, 1..=1000 (v2 `io.weight`
    /// gets [`v2_io_weight`] of it).
    #[serde(default)]
    pub weight: Option<u32>,
    /// Per-device throttles.
    #[serde(default)]
    pub devices: Vec<BlockIoDevice>,
}

/// A block I/O class the configuration cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockIoClassError {
    /// A weight outside the cgroup v1 range.
    #[error("class {class}: weight {weight} outside 1..=1000")]
    Weight { class: String, weight: u32 },
    /// A device that is not `major:minor`.
    #[error("class {class}: device {device:?} is not major:minor")]
    Device { class: String, device: String },
}

impl BlockIoClass {
    /// Check ranges and device numbers.
    pub fn validate(&self, name: &str) -> Result<(), BlockIoClassError> {
        if let Some(w) = self.weight
            && !(1..=1000).contains(&w)
        {
            return Err(BlockIoClassError::Weight {
                class: name.to_owned(),
                weight: w,
            });
        }
        for d in &self.devices {
            parse_major_minor(&d.device).ok_or_else(|| BlockIoClassError::Device {
                class: name.to_owned(),
                device: d.device.clone(),
            })?;
        }
        Ok(())
    }
}

/// A cgroup v1 block I/O weight (10..=1000) on the v2 `io.weight` scale
/// (1..=10000), as runc and youki convert it: `1 + (w - 10) * 9999 / 990`,
/// so 10 → 1, 500 → 4950, 1000 → 10000. Weights below the v1 minimum of 10
/// map to 1.
pub fn v2_io_weight(v1: u32) -> u64 {
    let w = u64::from(v1.clamp(10, 1000));
    1 + (w - 10) * 9999 / 990
}

fn parse_major_minor(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// What a block I/O application did: files written and parts skipped
/// because this host lacks them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockIoOutcome {
    /// Files written, with the value.
    pub written: Vec<(PathBuf, String)>,
    /// Settings not applied and why.
    pub skipped: Vec<String>,
}
