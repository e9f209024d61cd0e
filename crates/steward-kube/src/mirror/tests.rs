use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use proptest::prelude::*;

use super::*;

fn cm(ns: &str, name: &str, value: u8) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            namespace: (!ns.is_empty()).then(|| ns.to_owned()),
            name: Some(name.to_owned()),
            uid: Some(format!("uid-{ns}-{name}-{value}")),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("v".to_owned(), value.to_string())])),
        ..ConfigMap::default()
    }
}

fn value(c: &ConfigMap) -> u8 {
    c.data
        .as_ref()
        .and_then(|d| d.get("v"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::new(ns, name)
}

#[test]
fn changes_build_the_picture_and_say_what_changed() {
    let mut m = Mirror::<ConfigMap>::new();
    assert!(!m.listed());
    let d = m
        .apply(Change::Applied(cm("a", "x", 1)))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.applied, [key("a", "x")]);
    assert!(!d.relisted && d.removed.is_empty());
    assert!(!m.listed(), "a change before any list is not a list");

    let d = m
        .apply(Change::Relisted(vec![cm("a", "y", 2), cm("", "z", 3)]))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(d.relisted && m.listed());
    assert_eq!(d.applied, [key("", "z"), key("a", "y")]);
    // What the list lacks was deleted while the watch was down.
    assert_eq!(d.removed.len(), 1);
    assert_eq!(d.removed[0].0, key("a", "x"));
    assert_eq!(value(&d.removed[0].1), 1);
    assert_eq!(m.len(), 2);

    let d = m
        .apply(Change::Deleted(cm("a", "y", 9)))
        .unwrap_or_else(|e| panic!("{e}"));
    // The value removed is the one kept, not the deleted object's.
    assert_eq!(
        d.removed.iter().map(|(_, v)| value(v)).collect::<Vec<_>>(),
        [2]
    );
    assert!(m.get(&key("a", "y")).is_none());

    // Deleting what is not there changes nothing.
    let d = m
        .apply(Change::Deleted(cm("a", "y", 9)))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(d.is_empty());

    assert!(
        m.apply(Change::Interrupted(watcher::Error::NoResourceVersion))
            .is_err()
    );
    assert_eq!(m.keys().cloned().collect::<Vec<_>>(), [key("", "z")]);
    assert_eq!(key("", "z").to_string(), "z");
    assert_eq!(key("a", "y").to_string(), "a/y");
}

#[test]
fn a_projection_keeps_what_it_keeps_and_drops_what_it_refuses() {
    // Only odd values, kept as the number.
    let mut m = Mirror::projected(|c: ConfigMap| {
        let v = value(&c);
        (v % 2 == 1).then_some(v)
    });
    let _ = m.apply(Change::Applied(cm("a", "x", 1)));
    assert_eq!(m.get(&key("a", "x")), Some(&1));
    // No longer qualifies: removed, and reported so.
    let d = m
        .apply(Change::Applied(cm("a", "x", 2)))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.removed, [(key("a", "x"), 1)]);
    assert!(d.applied.is_empty());
    assert!(m.is_empty());
    let d = m
        .apply(Change::Relisted(vec![cm("a", "x", 4), cm("a", "y", 5)]))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.applied, [key("a", "y")]);
    assert_eq!(m.values().copied().collect::<Vec<_>>(), [5]);
}

#[test]
fn any_key_can_identify_objects() {
    let mut m = Mirror::keyed(|c: &ConfigMap| c.metadata.uid.clone(), |c| Some(value(&c)));
    let _ = m.apply(Change::Applied(cm("a", "x", 1)));
    // Same name, new uid: another object.
    let _ = m.apply(Change::Applied(cm("a", "x", 2)));
    assert_eq!(m.len(), 2);
    // No key: not kept.
    let mut keyless = cm("a", "w", 3);
    keyless.metadata.uid = None;
    let d = m
        .apply(Change::Applied(keyless))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(d.is_empty());
    assert_eq!(m.remove("uid-a-x-1"), Some(1));
    assert!(m.contains("uid-a-x-2"));
    assert_eq!(m.get("uid-a-x-2"), Some(&2));
    assert_eq!(m.as_map().len(), 1);
}

/// A change as generated (a [`Change`] is not `Clone`: its error is not).
#[derive(Debug, Clone)]
enum Step {
    Relisted(Vec<ConfigMap>),
    Applied(ConfigMap),
    Deleted(ConfigMap),
    Interrupted,
}

impl Step {
    fn change(self) -> Change<ConfigMap> {
        match self {
            Step::Relisted(all) => Change::Relisted(all),
            Step::Applied(c) => Change::Applied(c),
            Step::Deleted(c) => Change::Deleted(c),
            Step::Interrupted => Change::Interrupted(watcher::Error::NoResourceVersion),
        }
    }
}

/// A change over a small space of names, so sequences collide often.
fn step() -> impl Strategy<Value = Step> {
    let object = (
        prop::sample::select(vec!["", "a", "b"]),
        prop::sample::select(vec!["x", "y", "z"]),
        0u8..4,
    )
        .prop_map(|(ns, name, v)| cm(ns, name, v));
    prop_oneof![
        3 => object.clone().prop_map(Step::Applied),
        2 => object.clone().prop_map(Step::Deleted),
        1 => prop::collection::vec(object, 0..6).prop_map(Step::Relisted),
        1 => Just(Step::Interrupted),
    ]
}

proptest! {
    /// A mirror fed any sequence of changes holds the fold of them (with
    /// its projection applied), and each delta is the difference between
    /// the pictures before and after.
    #[test]
    fn a_mirror_is_the_fold_of_its_changes(steps in prop::collection::vec(step(), 0..40)) {
        // Keeps values below 3 only: a projection that refuses some.
        let mut m = Mirror::projected(|c: ConfigMap| {
            let v = value(&c);
            (v < 3).then_some(v)
        });
        let mut model: BTreeMap<ObjectKey, u8> = BTreeMap::new();
        let mut listed = false;
        for step in steps {
            let change = step.change();
            let before = model.clone();
            let relist = matches!(change, Change::Relisted(_));
            match &change {
                Change::Relisted(all) => {
                    model.clear();
                    for c in all {
                        model.insert(ObjectKey::of(c), value(c));
                    }
                    model.retain(|_, v| *v < 3);
                    listed = true;
                }
                Change::Applied(c) => {
                    if value(c) < 3 {
                        model.insert(ObjectKey::of(c), value(c));
                    } else {
                        model.remove(&ObjectKey::of(c));
                    }
                }
                Change::Deleted(c) => {
                    model.remove(&ObjectKey::of(c));
                }
                Change::Interrupted(_) => {}
            }
            let interrupted = matches!(change, Change::Interrupted(_));
            let got = m.apply(change);
            prop_assert_eq!(got.is_err(), interrupted);
            let mirrored: BTreeMap<ObjectKey, u8> =
                m.iter().map(|(k, v)| (k.clone(), *v)).collect();
            prop_assert_eq!(&mirrored, &model);
            prop_assert_eq!(m.listed(), listed);
            let Ok(delta) = got else { continue };
            prop_assert_eq!(delta.relisted, relist);
            // Removed: exactly what was there and is not any more, with
            // the value it had.
            let gone: Vec<(ObjectKey, u8)> = before
                .iter()
                .filter(|(k, _)| !model.contains_key(*k))
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            prop_assert_eq!(&delta.removed, &gone);
            // Applied: every key now held that the change stored.
            let applied: BTreeSet<&ObjectKey> = delta.applied.iter().collect();
            prop_assert!(applied.iter().all(|k| model.contains_key(*k)));
            if relist {
                prop_assert_eq!(applied.len(), model.len());
            }
            // Anything new or different was reported applied.
            for (k, v) in &model {
                if before.get(k) != Some(v) {
                    prop_assert!(applied.contains(k));
                }
            }
        }
    }
}
