//! The standard topology attributes of a device, from what discovery knows
//! of it: `resource.kubernetes.io/numaNode` and
//! `resource.kubernetes.io/pcieRoot`. A claim aligns devices of different
//! drivers with `matchAttribute` on them. Nothing is guessed: a device whose
//! NUMA node or PCIe root discovery does not report gets neither.
//!
//! The names are upstream's: kubernetes/kubernetes
//! `staging/src/k8s.io/dynamic-resource-allocation/deviceattribute`
//! (`StandardDeviceAttributePrefix` = `resource.kubernetes.io/`,
//! `StandardDeviceAttributeNUMANode` = prefix + `numaNode`,
//! `StandardDeviceAttributePCIeRoot` = prefix + `pcieRoot`). There the
//! scalar form of `numaNode` (an int: the device's NUMA node) needs no
//! feature gate, a device without NUMA affinity publishes no `numaNode`,
//! and `pcieRoot` is the first component under `/sys/devices` of the PCI
//! device's path, `pci<domain>:<bus>`.

use std::collections::{BTreeMap, BTreeSet};

use super::attributes::Attribute;

/// The standard NUMA node attribute (an int).
pub const NUMA_NODE_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";
/// The standard PCIe root complex attribute (a string `pci<domain>:<bus>`).
pub const PCIE_ROOT_ATTRIBUTE: &str = "resource.kubernetes.io/pcieRoot";
/// Device property giving the NUMA node(s) of a device, comma-separated
/// (what the device plugin reports to kubelet as topology, too).
pub const NUMA_PROPERTY: &str = "NUMA_NODE";
/// Device property giving the sysfs devpath of a udev device
/// (`/devices/pci0000:00/0000:00:14.0/usb1/1-1`).
pub const DEVPATH_PROPERTY: &str = "UDEV_DEVPATH";
/// NUMA node ids are below this (Linux's `MAX_NUMNODES` at its largest).
const MAX_NUMA_NODES: i64 = 1024;

/// The one NUMA node of a device: [`NUMA_PROPERTY`] naming exactly one
/// node (repeats allowed). `None` when it is absent, names several nodes
/// (which one is the device's own is not known), or any part is not a node
/// id in `0..1024` (`-1` is the kernel's "no NUMA affinity").
pub fn numa_node(properties: &BTreeMap<String, String>) -> Option<i64> {
    let value = properties.get(NUMA_PROPERTY)?;
    let mut nodes = BTreeSet::new();
    for part in value.split(',') {
        let n: i64 = part.trim().parse().ok()?;
        if !(0..MAX_NUMA_NODES).contains(&n) {
            return None;
        }
        nodes.insert(n);
    }
    match (nodes.len(), nodes.first()) {
        (1, Some(n)) => Some(*n),
        _ => None,
    }
}

/// `pci<domain>:<bus>`: at least four hex digits of domain, two of bus,
/// lower case as sysfs writes them.
fn is_pci_root(s: &str) -> bool {
    let hex = |p: &str| {
        p.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let Some(rest) = s.strip_prefix("pci") else {
        return false;
    };
    let Some((domain, bus)) = rest.split_once(':') else {
        return false;
    };
    domain.len() >= 4 && hex(domain) && bus.len() == 2 && hex(bus)
}

/// The PCIe root complex a device sits under: the first component of its
/// devpath ([`DEVPATH_PROPERTY`]) when that is a PCI root and the device
/// is below it. `None` for anything else (a virtual or platform device, no
/// devpath).
pub fn pcie_root(properties: &BTreeMap<String, String>) -> Option<String> {
    let path = properties
        .get(DEVPATH_PROPERTY)?
        .strip_prefix("/devices/")?;
    let (root, below) = path.split_once('/')?;
    (is_pci_root(root) && !below.is_empty()).then(|| root.to_owned())
}

/// The standard topology attributes of a device with `properties`: the
/// ones discovery knows, none otherwise.
pub fn topology_attributes(properties: &BTreeMap<String, String>) -> BTreeMap<String, Attribute> {
    let mut out = BTreeMap::new();
    if let Some(n) = numa_node(properties) {
        out.insert(NUMA_NODE_ATTRIBUTE.to_owned(), Attribute::Int(n));
    }
    if let Some(root) = pcie_root(properties) {
        out.insert(PCIE_ROOT_ATTRIBUTE.to_owned(), Attribute::String(root));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_numa_node_is_published_only_when_discovery_names_exactly_one() {
        let numa = |v: &str| numa_node(&props(&[(NUMA_PROPERTY, v)]));
        assert_eq!(numa("1"), Some(1));
        assert_eq!(numa(" 3 "), Some(3));
        assert_eq!(numa("2,2"), Some(2));
        assert_eq!(numa("0,1"), None, "two nodes: which is the device's?");
        assert_eq!(numa("-1"), None, "no NUMA affinity");
        assert_eq!(numa("1024"), None);
        assert_eq!(numa("x"), None);
        assert_eq!(numa("1,x"), None);
        assert_eq!(numa(""), None);
        assert_eq!(numa_node(&BTreeMap::new()), None);
    }

    #[test]
    fn a_pcie_root_is_the_pci_root_a_devpath_starts_under() {
        let root = |v: &str| pcie_root(&props(&[(DEVPATH_PROPERTY, v)]));
        assert_eq!(
            root("/devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0/video4linux/video0"),
            Some("pci0000:00".into())
        );
        assert_eq!(
            root("/devices/pci10000:e0/10000:e0:06.0/nvme/nvme0"),
            Some("pci10000:e0".into())
        );
        assert_eq!(root("/devices/pci0000:00"), None, "the root itself");
        assert_eq!(root("/devices/pci0000:00/"), None);
        assert_eq!(root("/devices/virtual/mem/null"), None);
        assert_eq!(root("/devices/platform/serial8250/tty/ttyS0"), None);
        assert_eq!(
            root("/devices/pciABCD:00/x"),
            None,
            "sysfs writes lower case"
        );
        assert_eq!(root("/devices/pci000:00/x"), None);
        assert_eq!(root("/sys/devices/pci0000:00/x"), None);
        assert_eq!(pcie_root(&BTreeMap::new()), None);
    }

    #[test]
    fn attributes_carry_the_upstream_names_and_types() {
        let both = topology_attributes(&props(&[
            (NUMA_PROPERTY, "1"),
            (
                DEVPATH_PROPERTY,
                "/devices/pci0000:40/0000:40:01.0/0000:41:00.0",
            ),
        ]));
        assert_eq!(
            both,
            BTreeMap::from([
                (
                    "resource.kubernetes.io/numaNode".to_owned(),
                    Attribute::Int(1)
                ),
                (
                    "resource.kubernetes.io/pcieRoot".to_owned(),
                    Attribute::String("pci0000:40".into())
                ),
            ])
        );
        assert!(topology_attributes(&props(&[(NUMA_PROPERTY, "0,1")])).is_empty());
    }
}
