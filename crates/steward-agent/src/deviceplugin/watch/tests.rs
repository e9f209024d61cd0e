//! The served set folded change by change equals a full recompute.

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
        let mut all = Mirror::keyed(|i: &Instance| key_of(&i.metadata), Some);
        let mut served = BTreeMap::new();
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
            let before = served.clone();
            let changed = apply_instance_change(&mut all, &mut served, change, "n1", None);
            let want = served_on(all.as_map(), "n1");
            assert_eq!(served, want, "seed {seed}, step {step}");
            assert_eq!(changed, before != served, "seed {seed}, step {step}");
        }
    }
}
