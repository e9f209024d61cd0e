//! Which ResourceSlices a node writes, and what is in them.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::DRIVER;
use super::attributes::{Attribute, attributes_of};
use super::consumable::{Layout, consumable_device_name, consumable_slots};
use super::health::{DeviceFault, HEALTH_PROPERTY, PlannedTaint, device_taints};
use super::labels::{hashed_label, is_dns_label};
use super::pools::{is_shared, pool_of};
use super::topology::topology_attributes;
use crate::discovery::instances::fnv1a64;
use crate::reservation::slot_id;

/// Most devices per ResourceSlice: the API's limit for a slice in which a
/// device carries taints (64 since 1.35; 128 without), which a slot held
/// through a device plugin ([`super::HELD_TAINT_KEY`]) or a device reporting a
/// fault ([`super::UNHEALTHY_TAINT_KEY`]) does. Always applied, so a taint
/// coming or going never re-chunks a pool.
pub const MAX_DEVICES_PER_SLICE: usize = 64;

/// An Instance as DRA needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraInstance {
    pub name: String,
    /// The Instance's (and its Configuration's) namespace.
    #[serde(default)]
    pub namespace: String,
    pub configuration: String,
    /// Slots `0..capacity`: one device each.
    pub capacity: u32,
    /// The nodes that see the device.
    pub nodes: BTreeSet<String>,
    pub properties: BTreeMap<String, String>,
    /// Slots held through a device plugin (on any node): their devices are
    /// published tainted ([`super::HELD_TAINT_KEY`]).
    #[serde(default)]
    pub held: BTreeSet<u32>,
}

/// Where a pool's devices can be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolScope {
    /// One node (`spec.nodeName`).
    Node(String),
    /// Any of these nodes (`spec.nodeSelector` on `kubernetes.io/hostname`).
    Nodes(BTreeSet<String>),
}

/// One device: a slot, or a whole Instance with consumable capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceDevice {
    /// The DRA device name ([`device_name`], or
    /// [`super::consumable_device_name`]).
    pub name: String,
    /// The Instance and the slot id it is (`<instance>-<n>`; empty for a
    /// consumable device).
    pub instance: String,
    pub slot: String,
    pub attributes: BTreeMap<String, Attribute>,
    /// The slot is held through a device plugin ([`super::HELD_TAINT_KEY`]); for
    /// a consumable device: every slot is.
    pub held: bool,
    /// The taints to publish on it, in key order ([`device_taints`]): held,
    /// and the fault its discovery reports ([`super::HEALTH_PROPERTY`]).
    #[serde(default)]
    pub taints: Vec<PlannedTaint>,
    /// `Some(n)`: one device for the whole Instance that allows multiple
    /// allocations, with `n` slots of capacity
    /// ([`super::SLOTS_CAPACITY`]; [`super::consumable_slots`]).
    #[serde(default)]
    pub slots: Option<u32>,
}

/// One ResourceSlice to write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlicePlan {
    pub pool: String,
    pub scope: PoolScope,
    /// This slice's place in the pool, and how many slices the pool has.
    pub index: usize,
    pub count: usize,
    pub devices: Vec<SliceDevice>,
}

/// The node that writes a shared Instance's pool: the first of its nodes
/// by name (any node computes the same answer; when it goes, the next one
/// takes over).
pub fn writer(instance: &DraInstance) -> Option<&str> {
    instance.nodes.iter().next().map(String::as_str)
}

/// The DRA device name of slot `n` of `instance`: the slot id when it is a
/// DNS label, else a prefix of it with a hash of the Instance name (dots
/// become dashes), still ending in `-<n>`.
pub fn device_name(instance: &str, n: u32) -> String {
    let id = slot_id(instance, n);
    if is_dns_label(&id) {
        return id;
    }
    let hash = fnv1a64(&[instance.as_bytes()]);
    hashed_label(instance, &format!("-{hash:016x}-{n}"))
}

/// The object name of slice `index` of `pool`: the same whichever node
/// writes it (a shared pool changes writer by update, not by a second
/// copy).
pub fn slice_name(pool: &str, index: usize) -> String {
    format!("steward-{:016x}-{index}", fnv1a64(&[pool.as_bytes()]))
}

/// Longest string attribute value the API accepts.
const MAX_VALUE: usize = 64;

/// A name as a string attribute value: itself when it fits in 64 bytes,
/// else a prefix of it with a hash of the whole name (always present, so a
/// selector on it never meets a device without it).
pub fn attribute_value(name: &str) -> String {
    if name.len() <= MAX_VALUE {
        return name.to_owned();
    }
    let tail = format!("-{:016x}", fnv1a64(&[name.as_bytes()]));
    let mut head = String::new();
    for c in name.chars() {
        if head.len() + c.len_utf8() + tail.len() > MAX_VALUE {
            break;
        }
        head.push(c);
    }
    format!("{head}{tail}")
}

/// The CEL selector of the devices of Configuration `name` in `namespace`,
/// as a DeviceClass carries it: the driver, then the `namespace` and
/// `configuration` attributes every steward device has.
pub fn configuration_selector(namespace: &str, name: &str) -> String {
    format!(
        "device.driver == \"{DRIVER}\" && device.attributes[\"{DRIVER}\"].namespace == \"{}\" && device.attributes[\"{DRIVER}\"].configuration == \"{}\"",
        attribute_value(namespace),
        attribute_value(name)
    )
}

/// The CEL selector of the devices of Instance `instance` in `namespace`
/// (the slots of one Instance, on whichever node publishes them).
pub fn instance_selector(namespace: &str, instance: &str) -> String {
    format!(
        "device.driver == \"{DRIVER}\" && device.attributes[\"{DRIVER}\"].namespace == \"{}\" && device.attributes[\"{DRIVER}\"].instance == \"{}\"",
        attribute_value(namespace),
        attribute_value(instance)
    )
}

/// The slot an allocated DRA device names, read back the way [`plan`]
/// published it: `device` must be [`device_name`] of a slot `n < capacity`
/// of one of `instances` (name, capacity, the nodes that see it) and
/// `pool` that Instance's [`pool_of`] on `node`. `None` for anything else
/// (a device of another node, of a pool not published, of another driver).
pub fn slot_for_device<'a>(
    node: &str,
    pool: &str,
    device: &str,
    instances: impl IntoIterator<Item = (&'a str, u32, &'a BTreeSet<String>)>,
) -> Option<String> {
    let (_, index) = device.rsplit_once('-')?;
    let n: u32 = index.parse().ok()?;
    instances.into_iter().find_map(|(name, capacity, nodes)| {
        (n < capacity
            && device_name(name, n) == device
            && pool_of(node, name, nodes).as_deref() == Some(pool))
        .then(|| slot_id(name, n))
    })
}

/// The slices `node` writes for `instances`: its own pool (Instances only
/// it sees) and the pools of the shared Instances it is the [`writer`] of.
/// Also returns what was left out, one line each (property names that
/// cannot be attributes).
pub fn plan(node: &str, instances: &[DraInstance]) -> (Vec<SlicePlan>, Vec<String>) {
    plan_with(node, instances, Layout::PerSlot)
}

/// [`plan`], with the Instances of two or more slots published as
/// `layout` says.
pub fn plan_with(
    node: &str,
    instances: &[DraInstance],
    layout: Layout,
) -> (Vec<SlicePlan>, Vec<String>) {
    let mut pools: BTreeMap<String, (PoolScope, Vec<SliceDevice>)> = BTreeMap::new();
    let mut notes = Vec::new();
    for inst in instances {
        let Some(pool) = pool_of(node, &inst.name, &inst.nodes) else {
            continue;
        };
        let shared = is_shared(&inst.nodes);
        let scope = if !shared {
            PoolScope::Node(node.to_owned())
        } else if writer(inst) == Some(node) {
            PoolScope::Nodes(inst.nodes.clone())
        } else {
            continue;
        };
        let mut fixed = BTreeMap::from([
            ("shared".to_owned(), Attribute::Bool(shared)),
            (
                "configuration".to_owned(),
                Attribute::String(attribute_value(&inst.configuration)),
            ),
            (
                "instance".to_owned(),
                Attribute::String(attribute_value(&inst.name)),
            ),
        ]);
        if !inst.namespace.is_empty() {
            fixed.insert(
                "namespace".to_owned(),
                Attribute::String(attribute_value(&inst.namespace)),
            );
        }
        // Standard topology attributes are steward's own: always kept.
        fixed.extend(topology_attributes(&inst.properties));
        // Health is a taint, not an attribute: an attribute would change
        // with it and could be selected on.
        let fault = DeviceFault::of_properties(&inst.properties);
        let properties: BTreeMap<String, String> = inst
            .properties
            .iter()
            .filter(|(k, _)| k.as_str() != HEALTH_PROPERTY)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let (base, skipped) = attributes_of(fixed, &properties);
        for (k, why) in skipped {
            notes.push(format!(
                "{}: property {k} is not published: {why}",
                inst.name
            ));
        }
        let entry = pools.entry(pool).or_insert_with(|| (scope, Vec::new()));
        if layout.one_device(inst.capacity) {
            // No free slot: the device is tainted instead (a capacity of
            // 0 is not a capacity the API's request policies can meet).
            let free = consumable_slots(inst.capacity, &inst.held);
            entry.1.push(SliceDevice {
                name: consumable_device_name(&inst.name),
                instance: inst.name.clone(),
                slot: String::new(),
                attributes: base,
                held: free == 0,
                taints: device_taints(free == 0, fault.as_ref()),
                slots: Some(if free == 0 { inst.capacity } else { free }),
            });
            continue;
        }
        for n in 0..inst.capacity {
            let mut attributes = base.clone();
            if attributes.len() < super::MAX_ATTRIBUTES {
                attributes.insert("slot".into(), Attribute::Int(i64::from(n)));
            }
            entry.1.push(SliceDevice {
                name: device_name(&inst.name, n),
                instance: inst.name.clone(),
                slot: slot_id(&inst.name, n),
                attributes,
                held: inst.held.contains(&n),
                taints: device_taints(inst.held.contains(&n), fault.as_ref()),
                slots: None,
            });
        }
    }
    let mut out = Vec::new();
    for (pool, (scope, mut devices)) in pools {
        devices.sort_by(|a, b| a.name.cmp(&b.name));
        let chunks: Vec<Vec<SliceDevice>> = devices
            .chunks(MAX_DEVICES_PER_SLICE)
            .map(<[SliceDevice]>::to_vec)
            .collect();
        let count = chunks.len().max(1);
        if chunks.is_empty() {
            continue;
        }
        for (index, devices) in chunks.into_iter().enumerate() {
            out.push(SlicePlan {
                pool: pool.clone(),
                scope: scope.clone(),
                index,
                count,
                devices,
            });
        }
    }
    (out, notes)
}

/// A pool's generation: 1 at first, the same while its slices are the same,
/// one more when they change (consumers ignore slices of older
/// generations).
pub fn next_generation(current: Option<i64>, unchanged: bool) -> i64 {
    match current {
        None => 1,
        Some(g) if unchanged => g,
        Some(g) => g.saturating_add(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(name: &str, capacity: u32, nodes: &[&str]) -> DraInstance {
        DraInstance {
            name: name.into(),
            namespace: "default".into(),
            configuration: "cams".into(),
            capacity,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            properties: BTreeMap::from([("DEVNODE".into(), "/dev/video0".into())]),
            held: BTreeSet::new(),
        }
    }

    #[test]
    fn a_consumable_layout_publishes_one_device_per_instance_of_several_slots() {
        let mut cams = inst("cams", 3, &["n1"]);
        cams.held = BTreeSet::from([1]);
        let mut full = inst("full", 2, &["n1"]);
        full.held = BTreeSet::from([0, 1]);
        let one = inst("one", 1, &["n1"]);
        let (slices, _) = plan_with("n1", &[cams, full, one], Layout::Consumable);
        let devices: Vec<(&str, Option<u32>, bool, bool)> = slices[0]
            .devices
            .iter()
            .map(|d| {
                (
                    d.name.as_str(),
                    d.slots,
                    d.held,
                    d.attributes.contains_key("slot"),
                )
            })
            .collect();
        assert_eq!(
            devices,
            [
                ("cams-slots", Some(2), false, false),
                ("full-slots", Some(2), true, false),
                ("one-0", None, false, true)
            ]
        );
        let (per_slot, _) = plan_with("n1", &[inst("cams", 3, &["n1"])], Layout::PerSlot);
        assert_eq!(per_slot[0].devices.len(), 3);
    }

    #[test]
    fn slots_held_through_a_device_plugin_are_marked_held() {
        let mut cams = inst("cams", 3, &["n1", "n2"]);
        cams.held = BTreeSet::from([0, 2]);
        let (slices, _) = plan("n1", &[cams]);
        let held: Vec<(&str, bool)> = slices[0]
            .devices
            .iter()
            .map(|d| (d.name.as_str(), d.held))
            .collect();
        assert_eq!(
            held,
            [("cams-0", true), ("cams-1", false), ("cams-2", true)]
        );
    }

    #[test]
    fn local_devices_share_the_node_pool_and_a_shared_one_is_written_once() {
        let all = [
            inst("cam-a", 2, &["n1"]),
            inst("cam-b", 1, &["n1"]),
            inst("cam-s", 2, &["n1", "n2", "n3"]),
            inst("cam-c", 1, &["n2"]),
        ];
        let (n1, notes) = plan("n1", &all);
        assert!(notes.is_empty(), "{notes:?}");
        let pools: Vec<(&str, usize)> = n1
            .iter()
            .map(|s| (s.pool.as_str(), s.devices.len()))
            .collect();
        assert_eq!(pools, [("n1", 3), ("shared/cam-s", 2)]);
        assert_eq!(
            n1[1].scope,
            PoolScope::Nodes(["n1", "n2", "n3"].iter().map(|s| s.to_string()).collect())
        );
        let (n2, _) = plan("n2", &all);
        assert_eq!(n2.len(), 1, "n2 writes only its own pool: {n2:?}");
        assert_eq!(n2[0].scope, PoolScope::Node("n2".into()));
        let d = &n1[0].devices[0];
        assert_eq!((d.name.as_str(), d.slot.as_str()), ("cam-a-0", "cam-a-0"));
        assert_eq!(
            d.attributes["DEVNODE"],
            Attribute::String("/dev/video0".into())
        );
        assert_eq!(d.attributes["slot"], Attribute::Int(0));
        assert_eq!(d.attributes["shared"], Attribute::Bool(false));
    }

    #[test]
    fn devices_with_a_known_numa_node_or_pci_root_carry_the_standard_attributes() {
        let mut known = inst("cam-a", 2, &["n1"]);
        known.properties.insert("NUMA_NODE".into(), "1".into());
        known.properties.insert(
            "UDEV_DEVPATH".into(),
            "/devices/pci0000:00/0000:00:14.0/usb1/1-1".into(),
        );
        let mut spans = inst("cam-b", 1, &["n1"]);
        spans.properties.insert("NUMA_NODE".into(), "0,1".into());
        let (slices, _) = plan("n1", &[known, spans]);
        let devices = &slices[0].devices;
        for d in devices.iter().filter(|d| d.instance == "cam-a") {
            assert_eq!(
                d.attributes["resource.kubernetes.io/numaNode"],
                Attribute::Int(1)
            );
            assert_eq!(
                d.attributes["resource.kubernetes.io/pcieRoot"],
                Attribute::String("pci0000:00".into())
            );
        }
        let b = devices.iter().find(|d| d.instance == "cam-b").unwrap();
        assert!(!b.attributes.contains_key("resource.kubernetes.io/numaNode"));
        assert!(!b.attributes.contains_key("resource.kubernetes.io/pcieRoot"));
        // The property itself stays a steward.dev attribute as before.
        assert_eq!(b.attributes["NUMA_NODE"], Attribute::String("0,1".into()));
    }

    #[test]
    fn big_pools_are_split_and_long_names_hashed_into_labels() {
        let (slices, _) = plan("n1", &[inst("many", 300, &["n1"])]);
        let sizes: Vec<(usize, usize, usize)> = slices
            .iter()
            .map(|s| (s.index, s.count, s.devices.len()))
            .collect();
        assert_eq!(
            sizes,
            [(0, 5, 64), (1, 5, 64), (2, 5, 64), (3, 5, 64), (4, 5, 44)]
        );
        let long = format!("cams.example.{}", "x".repeat(80));
        let a = device_name(&long, 7);
        assert!(is_dns_label(&a) && a.ends_with("-7"), "{a}");
        assert_ne!(a, device_name(&format!("{long}y"), 7));
        assert_eq!(device_name("cam", 1), "cam-1");
        assert_eq!(next_generation(None, false), 1);
        assert_eq!(next_generation(Some(4), true), 4);
        assert_eq!(next_generation(Some(4), false), 5);
    }

    #[test]
    fn allocated_devices_read_back_as_the_slots_they_were_published_for() {
        let long = "a".repeat(70);
        let here: BTreeSet<String> = ["node-a".to_owned()].into();
        let both: BTreeSet<String> = ["node-a".to_owned(), "node-b".to_owned()].into();
        let insts = [
            ("cam", 2, &here),
            ("usb.bus", 1, &both),
            (long.as_str(), 1, &here),
        ];
        assert_eq!(
            slot_for_device("node-a", "node-a", "cam-1", insts),
            Some("cam-1".to_owned())
        );
        // Slot out of range, wrong pool, unknown device.
        assert_eq!(slot_for_device("node-a", "node-a", "cam-2", insts), None);
        assert_eq!(slot_for_device("node-a", "node-b", "cam-1", insts), None);
        assert_eq!(slot_for_device("node-a", "node-a", "gpu-0", insts), None);
        let shared = device_name("usb.bus", 0);
        assert_ne!(shared, "usb.bus-0");
        assert_eq!(
            slot_for_device(
                "node-a",
                &pool_of("node-a", "usb.bus", &both).unwrap(),
                &shared,
                insts
            ),
            Some("usb.bus-0".to_owned())
        );
        assert_eq!(slot_for_device("node-a", "node-a", &shared, insts), None);
        let hashed = device_name(&long, 0);
        assert_eq!(
            slot_for_device("node-a", "node-a", &hashed, insts),
            Some(format!("{long}-0"))
        );
    }

    #[test]
    fn prepare_reads_back_exactly_the_pools_the_slices_publish() {
        // A shareable device seen by one node is that node's device; seen
        // by two it is the shared pool's; a node that does not see it
        // publishes nothing of it.
        let mut one = inst("cam", 2, &["n1"]);
        let two = inst("usb", 1, &["n1", "n2"]);
        let other = inst("gpu", 1, &["n2"]);
        for all in [vec![one.clone(), two.clone(), other.clone()], {
            one.nodes.insert("n3".into());
            vec![one.clone(), two.clone(), other.clone()]
        }] {
            let (slices, _) = plan("n1", &all);
            let mut published = 0;
            for s in &slices {
                for d in &s.devices {
                    let instances = all.iter().map(|i| (i.name.as_str(), i.capacity, &i.nodes));
                    assert_eq!(
                        slot_for_device("n1", &s.pool, &d.name, instances).as_deref(),
                        Some(d.slot.as_str()),
                        "{d:?} of pool {}",
                        s.pool
                    );
                    let inst = all.iter().find(|i| i.name == d.instance).unwrap();
                    assert_eq!(
                        pool_of("n1", &inst.name, &inst.nodes).as_deref(),
                        Some(s.pool.as_str())
                    );
                    assert_eq!(
                        d.attributes["shared"],
                        Attribute::Bool(is_shared(&inst.nodes))
                    );
                    published += 1;
                }
            }
            assert_eq!(published, 3, "{slices:?}");
            // And no other pool reads back as a device of n1.
            let instances = all.iter().map(|i| (i.name.as_str(), i.capacity, &i.nodes));
            assert_eq!(slot_for_device("n1", "n2", "gpu-0", instances), None);
        }
        assert_eq!(
            pool_of("n1", "cam", &inst("cam", 1, &["n1"]).nodes).as_deref(),
            Some("n1")
        );
        assert_eq!(
            pool_of("n1", "cam", &inst("cam", 1, &["n1", "n2"]).nodes).as_deref(),
            Some("shared/cam")
        );
        assert_eq!(pool_of("n1", "cam", &inst("cam", 1, &["n2"]).nodes), None);
    }

    #[test]
    fn long_names_are_still_attributes_and_selectors_name_the_same_value() {
        let long = "c".repeat(200);
        let v = attribute_value(&long);
        assert!(v.len() <= 64 && v.starts_with("ccc"), "{v}");
        assert_ne!(attribute_value(&format!("{long}x")), v);
        assert_eq!(attribute_value("cams"), "cams");
        let mut i = inst("cam", 1, &["node-a"]);
        i.configuration = long.clone();
        let (slices, _) = plan("node-a", &[i]);
        let d = &slices[0].devices[0];
        assert_eq!(d.attributes["configuration"], Attribute::String(v.clone()));
        assert_eq!(
            d.attributes["namespace"],
            Attribute::String("default".into())
        );
        let sel = configuration_selector("default", &long);
        assert!(
            sel.ends_with(&format!(".configuration == \"{v}\"")),
            "{sel}"
        );
        assert!(sel.contains(".namespace == \"default\""));
    }
}
