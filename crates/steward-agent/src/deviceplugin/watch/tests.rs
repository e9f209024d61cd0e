//! The served set folded change by change equals a full recompute, and so
//! does a replica that hears only the changes sent.

use super::*;

fn instance(namespace: &str, name: &str, nodes: &[&str], capacity: u32) -> Instance {
    let spec = serde_json::from_value(serde_json::json!({
        "configurationName": "conf",
        "deviceId": name,
        "nodes": nodes,
        "capacity": capacity,
        "cdiName": format!("steward.dev/conf={name}"),
    }))
    .unwrap();
    let mut inst = Instance::new(name, spec);
    inst.metadata.namespace = Some(namespace.to_owned());
    inst
}

/// A small deterministic generator (no extra dependency): the same seed
/// gives the same sequence.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

#[test]
fn folding_changes_gives_what_a_full_recompute_gives() {
    // Two namespaces share names on purpose: the served set is keyed by
    // name alone.
    let namespaces = ["a", "b"];
    let names = ["cam", "mic", "gpu", "x.y"];
    let node_sets: [&[&str]; 4] = [&["n1"], &["n2"], &["n1", "n2"], &[]];
    for seed in 0..200 {
        let mut rng = Lcg(seed);
        let mut index = ServedIndex::new("n1".to_owned());
        let mut replica: BTreeMap<String, ServedInstance> = BTreeMap::new();
        let mut live: BTreeMap<(String, String), Instance> = BTreeMap::new();
        for step in 0..40 {
            let ns = namespaces[rng.next(2) as usize];
            let name = names[rng.next(4) as usize];
            let inst = instance(
                ns,
                name,
                node_sets[rng.next(4) as usize],
                1 + rng.next(3) as u32,
            );
            let change = match rng.next(10) {
                0 => Change::Relisted(live.values().cloned().collect()),
                1..=3 => match live.remove(&(ns.to_owned(), name.to_owned())) {
                    Some(old) => Change::Deleted(old),
                    None => continue,
                },
                _ => {
                    live.insert((ns.to_owned(), name.to_owned()), inst.clone());
                    Change::Applied(inst)
                }
            };
            let before = index.served.clone();
            let sent = index.apply(change, None);
            let want = served_on(index.all.as_map(), "n1");
            assert_eq!(index.served, want, "seed {seed}, step {step}");
            let changed = sent.complete || !sent.entries.is_empty();
            assert_eq!(changed, before != index.served, "seed {seed}, step {step}");
            // Every entry sent is a real change.
            if !sent.complete {
                for (n, now) in &sent.entries {
                    assert_ne!(before.get(n), now.as_ref(), "seed {seed}, step {step}");
                }
            }
            apply_to(&mut replica, sent);
            assert_eq!(replica, want, "seed {seed}, step {step}");
        }
    }
}

/// What the manager does with the changes it hears.
fn apply_to(replica: &mut BTreeMap<String, ServedInstance>, changes: ServedChanges) {
    if changes.complete {
        replica.clear();
    }
    for (name, now) in changes.entries {
        match now {
            Some(s) => replica.insert(name, s),
            None => replica.remove(&name),
        };
    }
}

#[test]
fn merged_changes_equal_the_changes_applied_in_turn() {
    let served = |name: &str, cap: u32| {
        ServedInstance::from_instance(&instance("a", name, &["n1"], cap), "n1").unwrap()
    };
    let start: BTreeMap<String, ServedInstance> = [("cam", 1), ("mic", 1)]
        .map(|(n, c)| (n.to_owned(), served(n, c)))
        .into();
    let steps = [
        ServedChanges {
            complete: false,
            entries: [
                ("cam".to_owned(), None),
                ("gpu".to_owned(), Some(served("gpu", 2))),
            ]
            .into(),
        },
        ServedChanges::complete([("mic".to_owned(), served("mic", 3))].into()),
        ServedChanges {
            complete: false,
            entries: [("cam".to_owned(), Some(served("cam", 2)))].into(),
        },
    ];
    for cut in 0..=steps.len() {
        let mut in_turn = start.clone();
        let mut merged = ServedChanges::default();
        for (i, step) in steps.iter().enumerate() {
            let copy = ServedChanges {
                complete: step.complete,
                entries: step.entries.clone(),
            };
            apply_to(&mut in_turn, copy);
            let copy = ServedChanges {
                complete: step.complete,
                entries: step.entries.clone(),
            };
            if i < cut {
                merged.merge(copy);
            }
        }
        let mut folded = start.clone();
        apply_to(&mut folded, merged);
        for step in &steps[cut..] {
            apply_to(
                &mut folded,
                ServedChanges {
                    complete: step.complete,
                    entries: step.entries.clone(),
                },
            );
        }
        assert_eq!(folded, in_turn, "cut after {cut}");
    }
}
