//! Dynamic Resource Allocation: what steward publishes about the devices
//! its discovery handlers find, as `resource.k8s.io/v1` ResourceSlices of
//! the driver [`DRIVER`]. Pure: the adapter writes what this computes.
//!
//! **One ledger.** A DRA device *is* a device-plugin slot: slot `n` of
//! Instance `i` is the device named [`device_name`]`(i, n)` (the slot id
//! itself when it is a DNS label), so a device handed out on one path is
//! held in the same slot ledger the other path checks.
//!
//! **Pools.** [`pool_of`] decides, for the slices, prepare and the health
//! stream alike. Devices only this node sees are one pool named after the
//! node (`nodeName` slices), whatever their handler calls them. An Instance
//! seen by several nodes is a pool of its own whose slices select those
//! nodes (`nodeSelector` on the field `metadata.name`), so a device seen by
//! three nodes is one device, not three; exactly one of its nodes writes it
//! ([`writer`]).
//!
//! **Slices.** At most [`MAX_DEVICES_PER_SLICE`] devices per slice, every
//! slice of a pool carrying the pool's generation and slice count; the
//! generation moves when the pool's content does ([`next_generation`]).
//!
//! **Consumable capacity.** Where the cluster has `DRAConsumableCapacity`
//! and the agent is told to, an Instance of two or more slots is one device
//! that allows multiple allocations, its free slots a capacity
//! ([`Layout::Consumable`]); prepare picks the slots.
//!
//! **Health and taints.** A slot held through a device plugin is tainted
//! [`HELD_TAINT_KEY`] (`NoSchedule`); a device whose discovery reports a
//! fault ([`HEALTH_PROPERTY`]) is tainted [`UNHEALTHY_TAINT_KEY`] —
//! `NoSchedule` when fatal, `None` when transient — and untainted when the
//! property says healthy again ([`device_taints`]).
//!
//! **Topology.** Devices whose discovery reports a NUMA node or a PCI
//! devpath carry the standard `resource.kubernetes.io/numaNode` and
//! `resource.kubernetes.io/pcieRoot` ([`topology_attributes`]).

mod attributes;
mod consumable;
mod health;
mod labels;
mod pools;
#[cfg(test)]
mod proptests;
mod slices;
mod topology;

pub use attributes::{Attribute, MAX_ATTRIBUTES, attributes_of, typed};
pub use consumable::{
    Layout, SLOTS_CAPACITY, consumable_device_name, consumable_slots, instance_for_device,
};
pub use health::{
    DeviceFault, FaultKind, HEALTH_PROPERTY, HELD_TAINT_KEY, HELD_TAINT_VALUE, PlannedTaint,
    TaintEffect, UNHEALTHY_TAINT_KEY, device_taints, is_label_value,
};
pub use pools::{is_shared, pool_of};
pub use slices::{
    DraInstance, MAX_DEVICES_PER_SLICE, PoolScope, SliceDevice, SlicePlan, attribute_value,
    configuration_selector, device_name, instance_selector, next_generation, plan, plan_with,
    slice_name, slot_for_device, writer,
};
pub use topology::{
    DEVPATH_PROPERTY, NUMA_NODE_ATTRIBUTE, NUMA_PROPERTY, PCIE_ROOT_ATTRIBUTE, numa_node,
    pcie_root, topology_attributes,
};

/// The label on every DeviceClass steward owns; classes without it are
/// never written or deleted by steward.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "steward";
/// The label selector of the DeviceClasses steward owns.
pub const OWNED_SELECTOR: &str = "app.kubernetes.io/managed-by=steward";

/// Label naming the node that wrote a ResourceSlice, on the slices of both
/// of steward's drivers (`steward.dev` by the agent, `cpu.steward.dev` by
/// the resource manager), so one rule reads a node's slices by writer.
pub const WRITER_LABEL: &str = "steward.dev/writer";

/// The value of [`WRITER_LABEL`] for `node`: the node name when it is a
/// label value (at most 63 characters of `[A-Za-z0-9-_.]`), else its first
/// 63 characters without trailing `-` or `.` (node names are DNS
/// subdomains; a long one is kept unique by the slice names, which do not
/// depend on it).
pub fn writer_label(node: &str) -> String {
    let ok = node.len() <= 63
        && node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        node.to_owned()
    } else {
        node.chars()
            .take(63)
            .collect::<String>()
            .trim_end_matches(['-', '.'])
            .to_owned()
    }
}

/// The driver name of every device steward publishes.
pub const DRIVER: &str = "steward.dev";
