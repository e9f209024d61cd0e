//! Instances: one per discovered device (per node for unshared devices),
//! their names, and the minimal writes that bring the stored instances in
//! line with what a node currently discovers.
//!
//! # Ownership rules
//!
//! * An unshared device yields one instance per node; its name includes the
//!   node, so nodes never touch each other's unshared instances.
//! * A shared device (visible from several nodes, e.g. an IP camera) yields
//!   one instance per Configuration; `nodes` lists the nodes that see it.
//!   Each node adds or removes only itself. The device data is written only
//!   by the lowest node in `nodes` (byte order of node names), so two nodes
//!   with slightly different views never overwrite each other in turn.
//! * Removing the last node of an instance deletes it instead.
//! * [`plan`] writes only on change: planning again after applying a plan
//!   yields nothing.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{ConfigKey, Device};

/// Longest instance name produced: a DNS-1123 label (63), which also fits
/// the name part of an extended resource name and a label value.
pub const MAX_NAME_LEN: usize = 63;
/// Hex digits of the hash suffix of an instance name (40 bits).
pub const HASH_HEX_DIGITS: usize = 10;

/// A stored instance as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceView {
    pub name: String,
    pub configuration: ConfigKey,
    pub device_id: String,
    pub shared: bool,
    /// Nodes that currently see the device.
    pub nodes: BTreeSet<String>,
    /// Properties, mounts and specs as stored.
    pub device: Device,
    /// Slots the device is shared into (the Configuration's `capacity`).
    pub capacity: u32,
}

/// One write to the instance store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum InstanceOp {
    Create {
        name: String,
        device: Device,
        shared: bool,
        node: String,
        capacity: u32,
    },
    AddNode {
        name: String,
        node: String,
    },
    RemoveNode {
        name: String,
        node: String,
    },
    UpdateDevice {
        name: String,
        device: Device,
    },
    /// The Configuration's `capacity` changed: resize the Instance. Slots
    /// held by pods above a smaller capacity stay held until their pods end
    /// (the slot ledger keeps claims whatever the capacity).
    SetCapacity {
        name: String,
        capacity: u32,
    },
    Delete {
        name: String,
    },
}

impl InstanceOp {
    /// The name of the instance the op writes.
    pub fn name(&self) -> &str {
        match self {
            InstanceOp::Create { name, .. }
            | InstanceOp::AddNode { name, .. }
            | InstanceOp::RemoveNode { name, .. }
            | InstanceOp::UpdateDevice { name, .. }
            | InstanceOp::SetCapacity { name, .. }
            | InstanceOp::Delete { name } => name,
        }
    }
}

/// 64-bit FNV-1a: tiny, stable across platforms and releases.
pub(crate) fn fnv1a64(chunks: &[&[u8]]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for chunk in chunks {
        for &byte in *chunk {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(PRIME);
        }
    }
    hash
}

/// The name of the instance for a device: `<config-name>-<10 hex>`.
///
/// The hash covers the Configuration (namespace and name), the device id,
/// whether the device is shared and, for unshared devices only, the node.
/// Fields are length-prefixed so no two inputs encode alike. The prefix is
/// the Configuration name lowercased, with every run of characters outside
/// `[a-z0-9]` turned into one `-`, trimmed so that the whole name has at
/// most [`MAX_NAME_LEN`] characters (`instance` if nothing is left). The
/// result is a DNS-1123 subdomain (and label), the same for the same input
/// on every platform and release.
pub fn instance_name(config: &ConfigKey, device_id: &str, shared: bool, node: &str) -> String {
    let ns_len = (config.namespace.len() as u64).to_le_bytes();
    let name_len = (config.name.len() as u64).to_le_bytes();
    let id_len = (device_id.len() as u64).to_le_bytes();
    let node_len = (node.len() as u64).to_le_bytes();
    let hash = if shared {
        fnv1a64(&[
            &ns_len,
            config.namespace.as_bytes(),
            &name_len,
            config.name.as_bytes(),
            &id_len,
            device_id.as_bytes(),
            b"S",
        ])
    } else {
        fnv1a64(&[
            &ns_len,
            config.namespace.as_bytes(),
            &name_len,
            config.name.as_bytes(),
            &id_len,
            device_id.as_bytes(),
            b"U",
            &node_len,
            node.as_bytes(),
        ])
    };
    // Fold the upper bits in, keep 40 bits.
    let short = (hash ^ (hash >> 40)) & 0xff_ffff_ffff;
    let mut prefix = sanitize(&config.name, MAX_NAME_LEN - 1 - HASH_HEX_DIGITS);
    if prefix.is_empty() {
        prefix.push_str("instance");
    }
    format!("{prefix}-{short:010x}")
}

/// Lowercase `[a-z0-9]` runs joined by single `-`, at most `max` chars,
/// starting and ending with an alphanumeric.
fn sanitize(s: &str, max: usize) -> String {
    let mut out = String::new();
    let mut dash = false;
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            if dash && !out.is_empty() {
                out.push('-');
            }
            dash = false;
            out.push(c);
        } else {
            dash = true;
        }
        if out.len() >= max {
            break;
        }
    }
    out.truncate(max);
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// Whether `s` is a DNS-1123 subdomain: at most 253 characters, dot
/// separated labels of `[a-z0-9-]` that start and end alphanumeric.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            let bytes = label.as_bytes();
            match (bytes.first(), bytes.last()) {
                (Some(first), Some(last)) => {
                    first.is_ascii_alphanumeric()
                        && last.is_ascii_alphanumeric()
                        && bytes
                            .iter()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
                }
                _ => false,
            }
        })
}

/// Union of several handlers' reports for one Configuration, by device id,
/// in id order. When reports disagree about a device, the smallest version
/// (by [`Device`]'s `Ord`) wins, so the result does not depend on the order
/// of the reports nor of the devices within them.
pub fn merge(reports: &[Vec<Device>]) -> Vec<Device> {
    dedup(reports.iter().flatten())
        .into_values()
        .cloned()
        .collect()
}

fn dedup<'a>(devices: impl Iterator<Item = &'a Device>) -> BTreeMap<&'a str, &'a Device> {
    let mut by_id: BTreeMap<&str, &Device> = BTreeMap::new();
    for device in devices {
        by_id
            .entry(device.id.as_str())
            .and_modify(|kept| {
                if device < *kept {
                    *kept = device;
                }
            })
            .or_insert(device);
    }
    by_id
}

/// The writes that make the stored instances of `config` match what `node`
/// discovers now.
///
/// `discovered` should be validated (unique ids); duplicates are resolved as
/// in [`merge`]. `existing` may hold instances of every Configuration and
/// node: only instances of `config` are considered, and of those only the
/// shared ones listing `node` and the unshared ones named for `node`.
/// Ops come in instance-name order; for one name, `AddNode` precedes
/// `UpdateDevice`, which precedes `SetCapacity`.
///
/// `capacity` is the Configuration's: new Instances get it, and the node
/// that owns an existing wanted Instance (the only node of an unshared one,
/// the least-named node of a shared one, as for device updates) resizes it
/// when it differs, so a capacity edit reaches every Instance with one
/// writer each.
pub fn plan(
    node: &str,
    config: &ConfigKey,
    shared: bool,
    capacity: u32,
    discovered: &[Device],
    existing: &[InstanceView],
) -> Vec<InstanceOp> {
    let wanted: BTreeMap<String, &Device> = dedup(discovered.iter())
        .into_values()
        .map(|d| (instance_name(config, &d.id, shared, node), d))
        .collect();
    let mine: BTreeMap<&str, &InstanceView> = existing
        .iter()
        .filter(|e| e.configuration == *config)
        .map(|e| (e.name.as_str(), e))
        .collect();
    let mut ops = Vec::new();
    for (name, device) in &wanted {
        let Some(current) = mine.get(name.as_str()) else {
            ops.push(InstanceOp::Create {
                name: name.clone(),
                device: (*device).clone(),
                shared,
                node: node.to_owned(),
                capacity,
            });
            continue;
        };
        if !current.nodes.contains(node) {
            ops.push(InstanceOp::AddNode {
                name: name.clone(),
                node: node.to_owned(),
            });
        }
        let owner = if shared {
            current
                .nodes
                .iter()
                .map(String::as_str)
                .chain(std::iter::once(node))
                .min()
                .unwrap_or(node)
        } else {
            node
        };
        if owner == node && current.device != **device {
            ops.push(InstanceOp::UpdateDevice {
                name: name.clone(),
                device: (*device).clone(),
            });
        }
        if owner == node && current.capacity != capacity {
            ops.push(InstanceOp::SetCapacity {
                name: name.clone(),
                capacity,
            });
        }
    }
    for (name, current) in &mine {
        if wanted.contains_key(*name) {
            continue;
        }
        if current.shared {
            if !current.nodes.contains(node) {
                continue;
            }
            ops.push(leave(current, node));
        } else if current.name == instance_name(config, &current.device_id, false, node) {
            ops.push(InstanceOp::Delete {
                name: current.name.clone(),
            });
        }
    }
    // Stable: keeps AddNode, UpdateDevice, SetCapacity in that order per name.
    ops.sort_by(|a, b| a.name().cmp(b.name()));
    ops
}

/// `RemoveNode`, or `Delete` when `node` is the only node left.
fn leave(instance: &InstanceView, node: &str) -> InstanceOp {
    if instance.nodes.iter().all(|n| n == node) {
        InstanceOp::Delete {
            name: instance.name.clone(),
        }
    } else {
        InstanceOp::RemoveNode {
            name: instance.name.clone(),
            node: node.to_owned(),
        }
    }
}

/// The writes that remove a departed node from every instance (any
/// Configuration), deleting instances left without a node. Name order.
pub fn plan_node_gone(node: &str, existing: &[InstanceView]) -> Vec<InstanceOp> {
    let mut ops: Vec<InstanceOp> = existing
        .iter()
        .filter(|e| e.nodes.contains(node))
        .map(|e| leave(e, node))
        .collect();
    ops.sort_by(|a, b| a.name().cmp(b.name()));
    ops.dedup();
    ops
}

/// Apply ops to an in-memory list of instances, as a store would.
///
/// `config` is the Configuration the ops were planned for; only `Create`
/// needs it (ops from [`plan_node_gone`] never create). Ops address
/// instances by name. `Create` of an existing name adds the node and
/// replaces the device; `RemoveNode` of the last node deletes the instance;
/// ops on unknown names are ignored.
pub fn apply(existing: &mut Vec<InstanceView>, config: &ConfigKey, ops: &[InstanceOp]) {
    for op in ops {
        match op {
            InstanceOp::Create {
                name,
                device,
                shared,
                node,
                capacity,
            } => match existing.iter_mut().find(|e| e.name == *name) {
                Some(e) => {
                    e.nodes.insert(node.clone());
                    e.device = device.clone();
                    e.device_id = device.id.clone();
                    e.shared = *shared;
                    e.capacity = *capacity;
                }
                None => existing.push(InstanceView {
                    name: name.clone(),
                    configuration: config.clone(),
                    device_id: device.id.clone(),
                    shared: *shared,
                    nodes: BTreeSet::from([node.clone()]),
                    device: device.clone(),
                    capacity: *capacity,
                }),
            },
            InstanceOp::AddNode { name, node } => {
                if let Some(e) = existing.iter_mut().find(|e| e.name == *name) {
                    e.nodes.insert(node.clone());
                }
            }
            InstanceOp::RemoveNode { name, node } => {
                if let Some(e) = existing.iter_mut().find(|e| e.name == *name) {
                    e.nodes.remove(node);
                }
                existing.retain(|e| e.name != *name || !e.nodes.is_empty());
            }
            InstanceOp::UpdateDevice { name, device } => {
                if let Some(e) = existing.iter_mut().find(|e| e.name == *name) {
                    e.device = device.clone();
                }
            }
            InstanceOp::SetCapacity { name, capacity } => {
                if let Some(e) = existing.iter_mut().find(|e| e.name == *name) {
                    e.capacity = *capacity;
                }
            }
            InstanceOp::Delete { name } => existing.retain(|e| e.name != *name),
        }
    }
}

#[cfg(test)]
mod tests;
