use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn device(id: &str, v: &str) -> Device {
    Device {
        id: id.to_owned(),
        properties: BTreeMap::from([("V".to_owned(), v.to_owned())]),
        mounts: Vec::new(),
        device_specs: Vec::new(),
    }
}

/// The capacity most tests plan with.
const CAP: u32 = 1;

fn cfg(name: &str) -> ConfigKey {
    ConfigKey::new("ns", name)
}

/// Plan for `node` and apply the result to `store`.
fn run(
    store: &mut Vec<InstanceView>,
    node: &str,
    config: &ConfigKey,
    shared: bool,
    found: &[Device],
) {
    let ops = plan(node, config, shared, CAP, found, store);
    apply(store, config, &ops);
}

fn names(ops: &[InstanceOp]) -> Vec<&str> {
    ops.iter().map(InstanceOp::name).collect()
}

#[test]
fn names_are_stable_and_well_formed() {
    let c = cfg("usb-camera");
    let a = instance_name(&c, "/dev/video0", false, "node-a");
    assert_eq!(a, instance_name(&c, "/dev/video0", false, "node-a"));
    assert!(a.starts_with("usb-camera-"));
    assert_eq!(a.len(), "usb-camera-".len() + HASH_HEX_DIGITS);
    assert!(is_dns1123_subdomain(&a));
    // Unshared names depend on the node, shared names do not.
    assert_ne!(a, instance_name(&c, "/dev/video0", false, "node-b"));
    assert_eq!(
        instance_name(&c, "cam", true, "node-a"),
        instance_name(&c, "cam", true, "node-b")
    );
    assert_ne!(
        instance_name(&c, "cam", true, "node-a"),
        instance_name(&c, "cam", false, "node-a")
    );
    // Namespace matters.
    assert_ne!(
        instance_name(&ConfigKey::new("other", "usb-camera"), "cam", true, ""),
        instance_name(&c, "cam", true, "")
    );
}

#[test]
fn names_are_fixed_across_releases() {
    // Changing the hash would orphan every stored instance: pin it.
    assert_eq!(
        instance_name(&cfg("usb-camera"), "/dev/video0", false, "node-a"),
        "usb-camera-".to_owned() + &pinned_hex()
    );
}

/// The expected suffix, computed from the published algorithm by hand.
fn pinned_hex() -> String {
    let mut bytes = Vec::new();
    for field in ["ns", "usb-camera", "/dev/video0"] {
        bytes.extend_from_slice(&(field.len() as u64).to_le_bytes());
        bytes.extend_from_slice(field.as_bytes());
    }
    bytes.push(b'U');
    bytes.extend_from_slice(&6u64.to_le_bytes());
    bytes.extend_from_slice(b"node-a");
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    format!("{:010x}", (h ^ (h >> 40)) & 0xff_ffff_ffff)
}

#[test]
fn odd_configuration_names_are_sanitized() {
    let n = instance_name(&cfg("My.Camera__Config!!"), "x", true, "");
    assert!(n.starts_with("my-camera-config-"), "{n}");
    let n = instance_name(&cfg("..."), "x", true, "");
    assert!(n.starts_with("instance-"), "{n}");
    let long = "a".repeat(300);
    let n = instance_name(&cfg(&long), "x", true, "");
    assert_eq!(n.len(), MAX_NAME_LEN);
    assert!(is_dns1123_subdomain(&n));
    let n = instance_name(&cfg(&format!("{}-b", "a".repeat(51))), "x", true, "");
    assert!(is_dns1123_subdomain(&n), "{n}");
}

#[test]
fn dns1123_checker() {
    assert!(is_dns1123_subdomain("a"));
    assert!(is_dns1123_subdomain("a-b.c0"));
    assert!(!is_dns1123_subdomain(""));
    assert!(!is_dns1123_subdomain("-a"));
    assert!(!is_dns1123_subdomain("a-"));
    assert!(!is_dns1123_subdomain("a..b"));
    assert!(!is_dns1123_subdomain("A"));
    assert!(!is_dns1123_subdomain(&"a".repeat(254)));
}

#[test]
fn merge_unions_by_id_with_order_independent_winner() {
    let r1 = vec![device("b", "2"), device("a", "9")];
    let r2 = vec![device("a", "1"), device("c", "3")];
    let merged = merge(&[r1.clone(), r2.clone()]);
    assert_eq!(
        merged,
        vec![device("a", "1"), device("b", "2"), device("c", "3")]
    );
    assert_eq!(merge(&[r2, r1]), merged);
    assert!(merge(&[]).is_empty());
}

#[test]
fn first_report_creates_then_nothing() {
    let c = cfg("cam");
    let found = vec![device("d1", "x"), device("d2", "y")];
    let ops = plan("n1", &c, false, CAP, &found, &[]);
    assert_eq!(ops.len(), 2);
    assert!(
        ops.iter()
            .all(|op| matches!(op, InstanceOp::Create { node, shared: false, .. } if node == "n1"))
    );
    let mut store = Vec::new();
    apply(&mut store, &c, &ops);
    assert_eq!(store.len(), 2);
    assert!(plan("n1", &c, false, CAP, &found, &store).is_empty());
}

#[test]
fn changed_device_is_updated_and_vanished_device_deleted() {
    let c = cfg("cam");
    let mut store = Vec::new();
    apply(
        &mut store,
        &c,
        &plan(
            "n1",
            &c,
            false,
            CAP,
            &[device("d1", "x"), device("d2", "y")],
            &[],
        ),
    );
    let ops = plan("n1", &c, false, CAP, &[device("d1", "changed")], &store);
    let d1 = instance_name(&c, "d1", false, "n1");
    let d2 = instance_name(&c, "d2", false, "n1");
    let mut expected = vec![
        InstanceOp::UpdateDevice {
            name: d1,
            device: device("d1", "changed"),
        },
        InstanceOp::Delete { name: d2 },
    ];
    expected.sort_by(|a, b| a.name().cmp(b.name()));
    assert_eq!(ops, expected);
}

#[test]
fn shared_device_joins_and_leaves() {
    let c = cfg("ipcam");
    let cam = device("rtsp://cam", "n1-view");
    let name = instance_name(&c, &cam.id, true, "");
    let mut store = Vec::new();
    run(&mut store, "n1", &c, true, std::slice::from_ref(&cam));
    let ops = plan(
        "n2",
        &c,
        true,
        CAP,
        &[device("rtsp://cam", "n2-view")],
        &store,
    );
    // n2 is not the lowest node: it joins but does not rewrite the data.
    assert_eq!(
        ops,
        vec![InstanceOp::AddNode {
            name: name.clone(),
            node: "n2".to_owned()
        }]
    );
    apply(&mut store, &c, &ops);
    assert_eq!(
        store[0].nodes,
        BTreeSet::from(["n1".to_owned(), "n2".to_owned()])
    );
    assert_eq!(store[0].device, cam);
    // n1 loses sight: it leaves; n2 (now lowest) takes over the data.
    let ops = plan("n1", &c, true, CAP, &[], &store);
    assert_eq!(
        ops,
        vec![InstanceOp::RemoveNode {
            name: name.clone(),
            node: "n1".to_owned()
        }]
    );
    apply(&mut store, &c, &ops);
    let ops = plan(
        "n2",
        &c,
        true,
        CAP,
        &[device("rtsp://cam", "n2-view")],
        &store,
    );
    assert_eq!(
        ops,
        vec![InstanceOp::UpdateDevice {
            name: name.clone(),
            device: device("rtsp://cam", "n2-view")
        }]
    );
    apply(&mut store, &c, &ops);
    // Last node leaving deletes.
    let ops = plan("n2", &c, true, CAP, &[], &store);
    assert_eq!(ops, vec![InstanceOp::Delete { name }]);
    apply(&mut store, &c, &ops);
    assert!(store.is_empty());
}

#[test]
fn lower_node_joining_takes_over_the_data() {
    let c = cfg("ipcam");
    let mut store = Vec::new();
    run(&mut store, "n5", &c, true, &[device("cam", "five")]);
    let ops = plan("n1", &c, true, CAP, &[device("cam", "one")], &store);
    let name = instance_name(&c, "cam", true, "");
    assert_eq!(
        ops,
        vec![
            InstanceOp::AddNode {
                name: name.clone(),
                node: "n1".to_owned()
            },
            InstanceOp::UpdateDevice {
                name,
                device: device("cam", "one")
            },
        ]
    );
    apply(&mut store, &c, &ops);
    // Neither node rewrites any more: no ping-pong.
    assert!(plan("n5", &c, true, CAP, &[device("cam", "five")], &store).is_empty());
    assert!(plan("n1", &c, true, CAP, &[device("cam", "one")], &store).is_empty());
}

#[test]
fn other_configurations_and_nodes_are_untouched() {
    let (c1, c2) = (cfg("c1"), cfg("c2"));
    let mut store = Vec::new();
    run(&mut store, "n2", &c1, false, &[device("d", "x")]);
    run(&mut store, "n1", &c2, false, &[device("d", "x")]);
    // n1 sees nothing for c1: n2's unshared instance of c1 stays, and so
    // does n1's own instance of c2.
    assert!(plan("n1", &c1, false, CAP, &[], &store).is_empty());
    // Even a corrupted unshared instance of n2 that lists n1 is left alone.
    store[0].nodes.insert("n1".to_owned());
    assert!(plan("n1", &c1, false, CAP, &[], &store).is_empty());
}

#[test]
fn switching_sharing_replaces_instances() {
    let c = cfg("cam");
    let mut store = Vec::new();
    run(&mut store, "n1", &c, false, &[device("d", "x")]);
    let unshared = instance_name(&c, "d", false, "n1");
    let shared = instance_name(&c, "d", true, "n1");
    let ops = plan("n1", &c, true, CAP, &[device("d", "x")], &store);
    assert_eq!(ops.len(), 2);
    assert!(ops.contains(&InstanceOp::Delete { name: unshared }));
    assert!(
        ops.iter().any(
            |op| matches!(op, InstanceOp::Create { name, shared: true, .. } if *name == shared)
        )
    );
}

#[test]
fn node_gone_removes_it_everywhere() {
    let (c1, c2) = (cfg("c1"), cfg("c2"));
    let mut store = Vec::new();
    run(&mut store, "n1", &c1, true, &[device("s", "x")]);
    run(&mut store, "n2", &c1, true, &[device("s", "x")]);
    run(&mut store, "n1", &c2, false, &[device("u", "x")]);
    run(&mut store, "n2", &c2, false, &[device("u", "x")]);
    let ops = plan_node_gone("n1", &store);
    let shared = instance_name(&c1, "s", true, "");
    let own = instance_name(&c2, "u", false, "n1");
    let mut expected = vec![
        InstanceOp::RemoveNode {
            name: shared,
            node: "n1".to_owned(),
        },
        InstanceOp::Delete { name: own },
    ];
    expected.sort_by(|a, b| a.name().cmp(b.name()));
    assert_eq!(ops, expected);
    apply(&mut store, &c1, &ops);
    assert_eq!(store.len(), 2);
    assert!(store.iter().all(|e| !e.nodes.contains("n1")));
    assert!(plan_node_gone("n1", &store).is_empty());
    assert_eq!(names(&plan_node_gone("n9", &store)), Vec::<&str>::new());
}

#[test]
fn capacity_edit_resizes_each_instance_once_by_its_owner() {
    let (c, ip) = (cfg("cam"), cfg("ipcam"));
    let mut store = Vec::new();
    run(&mut store, "n1", &c, false, &[device("d1", "x")]);
    run(&mut store, "n2", &ip, true, &[device("cam", "two")]);
    run(&mut store, "n1", &ip, true, &[device("cam", "one")]);
    assert_eq!(store.len(), 2);
    assert!(store.iter().all(|e| e.capacity == CAP));

    // The unshared one: its node resizes it.
    let ops = plan("n1", &c, false, 3, &[device("d1", "x")], &store);
    assert_eq!(
        ops,
        vec![InstanceOp::SetCapacity {
            name: instance_name(&c, "d1", false, "n1"),
            capacity: 3
        }]
    );
    apply(&mut store, &c, &ops);
    // The shared one: only its owner (the least node name) writes.
    assert!(plan("n2", &ip, true, 3, &[device("cam", "two")], &store).is_empty());
    let ops = plan("n1", &ip, true, 3, &[device("cam", "one")], &store);
    assert_eq!(
        ops,
        vec![InstanceOp::SetCapacity {
            name: instance_name(&ip, "cam", true, ""),
            capacity: 3
        }]
    );
    apply(&mut store, &ip, &ops);
    assert!(store.iter().all(|e| e.capacity == 3));
    // New instances get the current capacity.
    let ops = plan(
        "n1",
        &c,
        false,
        3,
        &[device("d1", "x"), device("d9", "y")],
        &store,
    );
    assert!(matches!(&ops[..], [InstanceOp::Create { capacity: 3, .. }]));
}

#[test]
fn duplicate_discovered_ids_are_resolved_like_merge() {
    let c = cfg("cam");
    let found = vec![device("d", "b"), device("d", "a")];
    let ops = plan("n1", &c, false, CAP, &found, &[]);
    assert_eq!(ops.len(), 1);
    assert!(matches!(&ops[0], InstanceOp::Create { device: d, .. } if *d == device("d", "a")));
}

// ---------------------------------------------------------------------------
// Property tests.

const NODES: [&str; 4] = ["n1", "n2", "n3", "n4"];
const IDS: [&str; 5] = ["a", "b", "c", "/dev/video0", "rtsp://10.0.0.1/x"];

fn arb_report() -> impl Strategy<Value = Vec<Device>> {
    prop::collection::btree_map(0..IDS.len(), 0u8..3, 0..IDS.len()).prop_map(|m| {
        m.into_iter()
            .map(|(i, v)| device(IDS[i], &v.to_string()))
            .collect()
    })
}

/// One step of a random world: a node reports for a Configuration whose
/// capacity may have been edited since.
type Step = (usize, usize, bool, u32, Vec<Device>);

fn arb_report_step() -> impl Strategy<Value = Step> {
    (
        0..NODES.len(),
        0..2usize,
        any::<bool>(),
        1u32..4,
        arb_report(),
    )
}

fn world(steps: &[Step]) -> Vec<InstanceView> {
    let mut store = Vec::new();
    for (n, c, shared, capacity, found) in steps {
        let config = cfg(&format!("c{c}"));
        let ops = plan(NODES[*n], &config, *shared, *capacity, found, &store);
        apply(&mut store, &config, &ops);
    }
    store
}

/// The unshared instances `node` must not touch.
fn foreign_unshared(store: &[InstanceView], node: &str) -> BTreeSet<String> {
    store
        .iter()
        .filter(|e| {
            !e.shared && e.name != instance_name(&e.configuration, &e.device_id, false, node)
        })
        .map(|e| e.name.clone())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn planning_after_applying_is_a_no_op(
        history in prop::collection::vec(arb_report_step(), 0..12),
        last in arb_report_step(),
        tamper in prop::collection::vec((any::<prop::sample::Index>(), 0usize..NODES.len(), 0u8..3), 0..3),
    ) {
        let mut store = world(&history);
        // Corrupt the store a little: stray nodes and stale device data.
        for (i, n, v) in &tamper {
            if !store.is_empty() {
                let k = i.index(store.len());
                store[k].nodes.insert(NODES[*n].to_owned());
                store[k].device.properties.insert("V".to_owned(), format!("t{v}"));
            }
        }
        let (n, c, shared, capacity, found) = last;
        let (node, config) = (NODES[n], cfg(&format!("c{c}")));
        let before = store.clone();
        let ops = plan(node, &config, shared, capacity, &found, &store);
        // Unshared instances of other nodes are never touched.
        let foreign = foreign_unshared(&before, node);
        for op in &ops {
            prop_assert!(!foreign.contains(op.name()), "{:?} touches a foreign instance", op);
        }
        // Instances of other Configurations neither.
        for op in &ops {
            prop_assert!(
                before.iter().all(|e| e.name != op.name() || e.configuration == config),
                "{:?} touches another Configuration", op
            );
        }
        apply(&mut store, &config, &ops);
        prop_assert_eq!(plan(node, &config, shared, capacity, &found, &store), Vec::new());
        // The node now lists exactly what it discovered.
        let expected: BTreeSet<String> = found
            .iter()
            .map(|d| instance_name(&config, &d.id, shared, node))
            .collect();
        let listed: BTreeSet<String> = store
            .iter()
            .filter(|e| e.configuration == config && e.shared == shared && e.nodes.contains(node))
            .filter(|e| shared || e.name == instance_name(&config, &e.device_id, false, node))
            .map(|e| e.name.clone())
            .collect();
        prop_assert_eq!(listed, expected);
        // No instance is ever left without a node.
        prop_assert!(store.iter().all(|e| !e.nodes.is_empty()));
    }

    #[test]
    fn shared_instances_converge_to_the_nodes_that_see_them(
        noise in prop::collection::vec((0..NODES.len(), arb_report()), 0..10),
        finals in prop::collection::vec(arb_report(), NODES.len()),
        order in Just((0..NODES.len()).collect::<Vec<_>>()).prop_shuffle(),
        gone in prop::option::of(0..NODES.len()),
    ) {
        let config = cfg("ipcam");
        let mut store = Vec::new();
        // The noise is planned under an older capacity (the Configuration
        // was edited since).
        for (n, found) in &noise {
            let ops = plan(NODES[*n], &config, true, CAP + 2, found, &store);
            apply(&mut store, &config, &ops);
        }
        // One node may leave the cluster instead of reporting.
        let reporting: Vec<usize> = order.iter().copied().filter(|n| Some(*n) != gone).collect();
        if let Some(g) = gone {
            let ops = plan_node_gone(NODES[g], &store);
            apply(&mut store, &config, &ops);
        }
        let round = |store: &mut Vec<InstanceView>| {
            let mut writes = 0;
            for &n in &reporting {
                let ops = plan(NODES[n], &config, true, CAP, &finals[n], store);
                writes += ops.len();
                apply(store, &config, &ops);
            }
            writes
        };
        round(&mut store);
        // After one round every instance lists exactly the nodes seeing it.
        let mut seen_by: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for &n in &reporting {
            for d in &finals[n] {
                seen_by.entry(d.id.as_str()).or_default().insert(NODES[n].to_owned());
            }
        }
        let actual: BTreeMap<&str, BTreeSet<String>> = store
            .iter()
            .map(|e| (e.device_id.as_str(), e.nodes.clone()))
            .collect();
        prop_assert_eq!(store.len(), actual.len(), "one instance per device");
        prop_assert_eq!(&actual, &seen_by);
        // After a second round the data is the lowest node's view, and a
        // third round writes nothing (no ping-pong).
        round(&mut store);
        for e in &store {
            let owner = e.nodes.iter().next().cloned().unwrap_or_default();
            let n = NODES.iter().position(|x| *x == owner).unwrap_or(usize::MAX);
            let view = finals.get(n).and_then(|f| f.iter().find(|d| d.id == e.device_id));
            prop_assert_eq!(Some(&e.device), view);
            prop_assert_eq!(e.capacity, CAP, "{} kept an old capacity", e.name);
        }
        prop_assert_eq!(round(&mut store), 0);
    }

    #[test]
    fn names_are_valid_and_stable(
        namespace in ".{0,20}",
        name in ".{0,300}",
        device_id in ".{0,100}",
        shared in any::<bool>(),
        node in ".{0,40}",
    ) {
        let config = ConfigKey::new(namespace, name);
        let n = instance_name(&config, &device_id, shared, &node);
        prop_assert!(is_dns1123_subdomain(&n), "{n}");
        prop_assert!(n.len() <= 253 && n.len() <= MAX_NAME_LEN);
        prop_assert_eq!(&n, &instance_name(&config.clone(), &device_id.clone(), shared, &node.clone()));
        if shared {
            prop_assert_eq!(&n, &instance_name(&config, &device_id, true, "another-node"));
        }
    }

    #[test]
    fn unshared_names_do_not_collide(
        pairs in prop::collection::btree_set(("[a-z0-9/:._-]{1,24}", "[a-z0-9-]{1,12}"), 1..64),
        config_name in "[a-z][a-z0-9-]{0,20}",
    ) {
        let config = cfg(&config_name);
        let names: BTreeSet<String> = pairs
            .iter()
            .map(|(id, node)| instance_name(&config, id, false, node))
            .collect();
        prop_assert_eq!(names.len(), pairs.len());
        let ids: BTreeSet<&String> = pairs.iter().map(|(id, _)| id).collect();
        let shared: BTreeSet<String> = ids
            .iter()
            .map(|id| instance_name(&config, id, true, ""))
            .collect();
        prop_assert_eq!(shared.len(), ids.len());
        prop_assert!(shared.is_disjoint(&names));
    }

    #[test]
    fn merge_ignores_report_order(
        reports in prop::collection::vec(arb_report(), 0..4),
        perm in Just((0..4usize).collect::<Vec<_>>()).prop_shuffle(),
    ) {
        let merged = merge(&reports);
        let shuffled: Vec<Vec<Device>> = perm
            .iter()
            .filter_map(|&i| reports.get(i).cloned())
            .map(|mut r| { r.reverse(); r })
            .collect();
        prop_assert_eq!(&merge(&shuffled), &merged);
        let all_ids: BTreeSet<&str> = reports.iter().flatten().map(|d| d.id.as_str()).collect();
        let merged_ids: Vec<&str> = merged.iter().map(|d| d.id.as_str()).collect();
        prop_assert_eq!(merged_ids, all_ids.into_iter().collect::<Vec<_>>());
        for d in &merged {
            prop_assert!(reports.iter().flatten().all(|o| o.id != d.id || *d <= *o));
        }
    }
}
