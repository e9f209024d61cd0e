//! A shared Instance as one device with consumable capacity (KEP-5075,
//! `DRAConsumableCapacity`): instead of one device per slot, an Instance of
//! two or more slots is published as one device that allows multiple
//! allocations and has a capacity [`SLOTS_CAPACITY`] of its free slots.
//! The scheduler counts what each allocation consumes (`consumedCapacity`,
//! one slot unless the claim asks for more); the node picks which slots at
//! prepare time, from the same slot ledger the device plugins use.
//!
//! A device's capacity cannot be tainted slot by slot, so slots held
//! through a device plugin are taken off the published capacity
//! ([`consumable_slots`]); the scheduler then fits fewer allocations on
//! the device. A device with no slot left keeps its full capacity and is
//! tainted held instead.

use std::collections::BTreeSet;

use super::labels::{hashed_label, is_dns_label};
use super::pools::pool_of;
use crate::discovery::instances::fnv1a64;

/// The capacity name (in the driver's domain) of a consumable device: its
/// slots.
pub const SLOTS_CAPACITY: &str = "slots";

/// How an Instance's slots are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// One device per slot (every cluster since 1.34).
    #[default]
    PerSlot,
    /// One device with consumable capacity per Instance of two or more
    /// slots (an Instance of one slot stays one device per slot: the two
    /// are the same).
    Consumable,
}

impl Layout {
    /// Whether an Instance of `capacity` slots is published as one
    /// consumable device.
    pub fn one_device(self, capacity: u32) -> bool {
        self == Layout::Consumable && capacity >= 2
    }
}

const SUFFIX: &str = "-slots";

/// The DRA device name of `instance` as one consumable device:
/// `<instance>-slots` when that is a DNS label, else a prefix of it with a
/// hash of the Instance name. It never ends in `-<digits>`, so it is never
/// a per-slot device name ([`super::device_name`]).
pub fn consumable_device_name(instance: &str) -> String {
    let plain = format!("{instance}{SUFFIX}");
    if is_dns_label(&plain) {
        return plain;
    }
    let hash = fnv1a64(&[instance.as_bytes()]);
    hashed_label(instance, &format!("-{hash:016x}{SUFFIX}"))
}

/// The slots a consumable device publishes: its capacity less the slots
/// held through a device plugin.
pub fn consumable_slots(capacity: u32, held: &BTreeSet<u32>) -> u32 {
    let held = held.range(..capacity).count();
    capacity.saturating_sub(u32::try_from(held).unwrap_or(u32::MAX))
}

/// The Instance an allocated consumable device names, read back the way
/// the slices published it: `device` must be [`consumable_device_name`] of
/// one of `instances` (name, capacity, the nodes that see it) of two or
/// more slots, and `pool` that Instance's pool on `node`.
pub fn instance_for_device<'a>(
    node: &str,
    pool: &str,
    device: &str,
    instances: impl IntoIterator<Item = (&'a str, u32, &'a BTreeSet<String>)>,
) -> Option<(&'a str, u32)> {
    if !device.ends_with(SUFFIX) {
        return None;
    }
    instances.into_iter().find_map(|(name, capacity, nodes)| {
        (capacity >= 2
            && consumable_device_name(name) == device
            && pool_of(node, name, nodes).as_deref() == Some(pool))
        .then_some((name, capacity))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::device_name;

    #[test]
    fn names_are_labels_and_never_per_slot_names() {
        assert_eq!(consumable_device_name("cam"), "cam-slots");
        let long = format!("usb.bus.{}", "x".repeat(80));
        let n = consumable_device_name(&long);
        assert!(n.len() <= 63 && n.ends_with("-slots"), "{n}");
        assert_ne!(n, consumable_device_name(&format!("{long}y")));
        assert_ne!(consumable_device_name("usb.bus"), "usb.bus-slots");
        // `cam-slots` of Instance `cam` is no slot of any Instance.
        for (i, s) in [("cam", 0), ("cam-slots", 0)] {
            assert_ne!(device_name(i, s), consumable_device_name("cam"));
        }
    }

    #[test]
    fn held_slots_leave_the_capacity_and_devices_read_back() {
        assert_eq!(consumable_slots(3, &BTreeSet::from([0, 2])), 1);
        assert_eq!(consumable_slots(3, &BTreeSet::from([5])), 3);
        assert_eq!(consumable_slots(2, &BTreeSet::from([0, 1])), 0);
        let here: BTreeSet<String> = ["n1".to_owned()].into();
        let both: BTreeSet<String> = ["n1".to_owned(), "n2".to_owned()].into();
        let insts = [("cam", 3, &here), ("one", 1, &here), ("s", 2, &both)];
        assert_eq!(
            instance_for_device("n1", "n1", "cam-slots", insts),
            Some(("cam", 3))
        );
        assert_eq!(instance_for_device("n1", "n1", "one-slots", insts), None);
        assert_eq!(instance_for_device("n1", "n2", "cam-slots", insts), None);
        assert_eq!(
            instance_for_device("n2", "shared/s", "s-slots", insts),
            Some(("s", 2))
        );
        assert_eq!(instance_for_device("n1", "n1", "cam-1", insts), None);
    }
}
