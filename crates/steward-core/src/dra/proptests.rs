//! Properties of the slice plan over arbitrary Instances and nodes.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

const NODES: [&str; 4] = ["n1", "n2", "n3", "node-with-a-longer-name.example"];

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9-]{0,12}[a-z0-9]",
        "[a-z]{1,8}(\\.[a-z]{1,8}){1,3}",
        "[a-z]{60,90}",
    ]
}

fn instance() -> impl Strategy<Value = DraInstance> {
    (
        name(),
        0u32..200,
        proptest::collection::btree_set(0..NODES.len(), 0..=4),
        proptest::collection::btree_map("[A-Za-z_.][A-Za-z0-9_.]{0,40}", "[ -~]{0,80}", 0..40),
    )
        .prop_map(|(name, capacity, nodes, properties)| DraInstance {
            name,
            namespace: "default".into(),
            configuration: "cfg".into(),
            capacity,
            nodes: nodes.into_iter().map(|n| NODES[n].to_owned()).collect(),
            properties,
            held: BTreeSet::new(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn every_slot_is_published_once_by_one_node_within_the_api_limits(
        instances in proptest::collection::btree_map(name(), instance(), 0..6)
    ) {
        // Instance names are unique.
        let instances: Vec<DraInstance> = instances
            .into_iter()
            .map(|(n, mut i)| { i.name = n; i })
            .collect();
        let mut seen: BTreeMap<String, (&str, String)> = BTreeMap::new();
        let mut names: BTreeMap<String, String> = BTreeMap::new();
        for node in NODES {
            let (slices, _) = plan(node, &instances);
            let mut pools: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
            for s in &slices {
                prop_assert!(!s.devices.is_empty() && s.devices.len() <= MAX_DEVICES_PER_SLICE);
                prop_assert!(s.pool.len() <= 253);
                prop_assert!(pools.entry(s.pool.as_str()).or_default().insert(s.index));
                for d in &s.devices {
                    prop_assert!(d.attributes.len() <= MAX_ATTRIBUTES);
                    prop_assert!(d.name.len() <= 63 && !d.name.contains('.'), "{}", d.name);
                    prop_assert!(seen.insert(d.slot.clone(), (node, s.pool.clone())).is_none(),
                        "{} published twice", d.slot);
                    if let Some(other) = names.insert(d.name.clone(), d.slot.clone()) {
                        prop_assert_eq!(&other, &d.slot, "two slots share device name {}", d.name);
                    }
                    let inst = instances.iter().find(|i| i.name == d.instance)
                        .ok_or_else(|| TestCaseError::fail("a device of no Instance"))?;
                    prop_assert!(inst.nodes.contains(node), "{node} publishes {} it does not see", d.slot);
                    match &s.scope {
                        PoolScope::Node(n) => prop_assert!(n == node && inst.nodes.len() == 1),
                        PoolScope::Nodes(ns) => prop_assert!(ns == &inst.nodes && writer(inst) == Some(node)),
                    }
                }
            }
            // Every slice of a pool knows the pool's slice count.
            for s in &slices {
                prop_assert_eq!(s.count, pools[s.pool.as_str()].len());
            }
        }
        let expected: usize = instances.iter().filter(|i| !i.nodes.is_empty()).map(|i| i.capacity as usize).sum();
        prop_assert_eq!(seen.len(), expected, "a slot of a seen Instance is missing");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// With the consumable layout, every seen Instance is published once,
    /// by one node: as one device per slot when it has one slot, else as
    /// one device whose capacity is its slots not held through a device
    /// plugin (its full capacity, tainted, when none is free), named so no
    /// slot's device name meets it, and read back as that Instance.
    #[test]
    fn the_consumable_layout_publishes_each_slot_once_as_a_slot_or_as_capacity(
        instances in proptest::collection::btree_map(name(), (instance(), proptest::collection::btree_set(0u32..220, 0..10)), 0..6)
    ) {
        let instances: Vec<DraInstance> = instances
            .into_iter()
            .map(|(n, (mut i, held))| { i.name = n; i.held = held; i })
            .collect();
        let mut published: BTreeMap<String, u32> = BTreeMap::new();
        let mut names = BTreeSet::new();
        for node in NODES {
            let (slices, _) = plan_with(node, &instances, Layout::Consumable);
            for s in &slices {
                prop_assert!(s.devices.len() <= MAX_DEVICES_PER_SLICE);
                for d in &s.devices {
                    prop_assert!(d.name.len() <= 63 && !d.name.contains('.'), "{}", d.name);
                    prop_assert!(names.insert(d.name.clone()), "{} published twice", d.name);
                    let inst = instances.iter().find(|i| i.name == d.instance)
                        .ok_or_else(|| TestCaseError::fail("a device of no Instance"))?;
                    let free = consumable_slots(inst.capacity, &inst.held);
                    match d.slots {
                        Some(n) => {
                            prop_assert!(inst.capacity >= 2);
                            prop_assert_eq!(d.held, free == 0);
                            prop_assert_eq!(n, if free == 0 { inst.capacity } else { free });
                            prop_assert!(!d.attributes.contains_key("slot"));
                            let seen = instances.iter().map(|i| (i.name.as_str(), i.capacity, &i.nodes));
                            prop_assert_eq!(
                                instance_for_device(node, &s.pool, &d.name, seen),
                                Some((inst.name.as_str(), inst.capacity)));
                            *published.entry(d.instance.clone()).or_default() += inst.capacity;
                        }
                        None => {
                            prop_assert_eq!(inst.capacity, 1);
                            *published.entry(d.instance.clone()).or_default() += 1;
                        }
                    }
                }
            }
        }
        for i in &instances {
            let want = if i.nodes.is_empty() { 0 } else { i.capacity };
            prop_assert_eq!(published.get(&i.name).copied().unwrap_or(0), want, "{}", i.name);
        }
    }
}

fn numa_value() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(prop_oneof![
        (0i64..4).prop_map(|n| n.to_string()),
        proptest::collection::vec(-2i64..1030, 1..4)
            .prop_map(|v| { v.iter().map(i64::to_string).collect::<Vec<_>>().join(",") }),
        "[ -~]{0,8}",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn the_numa_node_is_published_exactly_when_discovery_names_one_valid_node(
        numa in numa_value(),
        devpath in proptest::option::of(prop_oneof![
            "/devices/pci[0-9a-f]{4}:[0-9a-f]{2}/[0-9a-z:.]{1,12}",
            "/devices/[a-z]{1,8}/[a-z0-9]{1,8}",
        ]),
        filler in proptest::collection::btree_map("P[A-Z0-9_]{0,10}", "[a-z]{0,4}", 0..40),
    ) {
        let mut properties = filler;
        if let Some(v) = &numa {
            properties.insert(NUMA_PROPERTY.to_owned(), v.clone());
        }
        if let Some(p) = &devpath {
            properties.insert(DEVPATH_PROPERTY.to_owned(), p.clone());
        }
        let inst = DraInstance {
            name: "dev".into(),
            namespace: "default".into(),
            configuration: "cfg".into(),
            capacity: 2,
            nodes: ["n1".to_owned()].into(),
            properties: properties.clone(),
            held: BTreeSet::new(),
        };
        // What a node's list says: every part one id in 0..1024, one distinct.
        let expected = numa.as_deref().and_then(|v| {
            let ids: Option<BTreeSet<i64>> = v.split(',').map(|p| p.trim().parse::<i64>().ok()
                .filter(|n| (0..1024).contains(n))).collect();
            ids.filter(|s| s.len() == 1).and_then(|s| s.first().copied())
        });
        let root = devpath.as_deref()
            .filter(|p| p.starts_with("/devices/pci"))
            .and_then(|p| p.split('/').nth(2).map(str::to_owned));
        let want_numa = expected.map(Attribute::Int);
        let want_root = root.map(Attribute::String);
        let (slices, _) = plan("n1", &[inst]);
        for s in &slices {
            for d in &s.devices {
                prop_assert!(d.attributes.len() <= MAX_ATTRIBUTES);
                prop_assert_eq!(
                    d.attributes.get(NUMA_NODE_ATTRIBUTE),
                    want_numa.as_ref());
                prop_assert_eq!(
                    d.attributes.get(PCIE_ROOT_ATTRIBUTE),
                    want_root.as_ref());
            }
        }
    }
}

fn health_value() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(prop_oneof![
        Just(String::new()),
        Just("healthy".to_owned()),
        "(fatal|FATAL|transient|Transient)(:| )?[ -~]{0,120}",
        "[ -~\u{e9}\u{4e16}]{0,80}",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Whatever a handler says of a device's health, in either layout:
    /// every device of the Instance carries exactly the taint its fault
    /// asks for (key, label value, effect by kind) plus the held taint
    /// when held, no attribute names the health property, and clearing the
    /// property gives exactly the plan of a device never faulted (so
    /// recovery untaints without anything else moving).
    #[test]
    fn a_reported_fault_is_exactly_one_taint_and_recovery_removes_it(
        health in health_value(),
        capacity in 1u32..150,
        held in proptest::collection::btree_set(0u32..150, 0..6),
        consumable in any::<bool>(),
    ) {
        let layout = if consumable { Layout::Consumable } else { Layout::PerSlot };
        let mut inst = DraInstance {
            name: "dev".into(),
            namespace: "default".into(),
            configuration: "cfg".into(),
            capacity,
            nodes: ["n1".to_owned()].into(),
            properties: BTreeMap::from([("DEVNODE".to_owned(), "/dev/x".to_owned())]),
            held,
        };
        let never = plan_with("n1", std::slice::from_ref(&inst), layout);
        if let Some(v) = &health {
            inst.properties.insert(HEALTH_PROPERTY.to_owned(), v.clone());
        }
        let fault = health.as_deref().and_then(DeviceFault::parse);
        let (slices, _) = plan_with("n1", std::slice::from_ref(&inst), layout);
        for s in &slices {
            prop_assert!(s.devices.len() <= MAX_DEVICES_PER_SLICE);
            for d in &s.devices {
                prop_assert!(!d.attributes.contains_key(HEALTH_PROPERTY));
                let keys: Vec<&str> = d.taints.iter().map(|t| t.key.as_str()).collect();
                let mut want = Vec::new();
                if d.held { want.push(HELD_TAINT_KEY); }
                if fault.is_some() { want.push(UNHEALTHY_TAINT_KEY); }
                prop_assert_eq!(keys, want);
                for t in &d.taints {
                    prop_assert!(is_label_value(&t.value) && !t.value.is_empty(), "{:?}", t.value);
                    let effect = if t.key == UNHEALTHY_TAINT_KEY {
                        fault.as_ref().map_or(TaintEffect::NoSchedule, |f| f.kind.effect())
                    } else {
                        TaintEffect::NoSchedule
                    };
                    prop_assert_eq!(t.effect, effect);
                }
            }
        }
        if let Some(f) = &fault {
            prop_assert_eq!(f.kind.effect() == TaintEffect::NoSchedule, f.kind == FaultKind::Fatal);
            prop_assert!(f.message().chars().count() <= 1024);
        }
        inst.properties.insert(HEALTH_PROPERTY.to_owned(), "healthy".to_owned());
        prop_assert_eq!(plan_with("n1", std::slice::from_ref(&inst), layout), never.clone());
        inst.properties.remove(HEALTH_PROPERTY);
        prop_assert_eq!(plan_with("n1", std::slice::from_ref(&inst), layout), never);
    }
}
