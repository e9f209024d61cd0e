//! DRA ResourceClaims as holders of slots, beside device-plugin pods.

use super::*;
use crate::Millis;
use crate::ledger::{ClaimHold, ClaimRef, Holder, PodRef};
use std::collections::BTreeSet;

const NODE: &str = "node-a";

fn inst(name: &str, capacity: u32, shared: bool) -> InstanceInfo {
    InstanceInfo {
        name: name.to_owned(),
        resource_name: format!("steward.dev/{name}"),
        capacity,
        shared,
        present: true,
        usable: true,
    }
}

/// "cam" (shared, 2 slots), "usb" (unshared, 2 slots); API reachable.
fn ledger() -> SlotAllocator {
    let mut l = SlotAllocator::new(NODE, SlotConfig::default());
    l.instance_upserted(inst("cam", 2, true));
    l.instance_upserted(inst("usb", 2, false));
    assert!(l.cluster_reachability(true).is_empty());
    l
}

fn hold(uid: &str) -> ClaimHold {
    let mut h = ClaimHold::of(ClaimRef::new(uid, "default", format!("claim-{uid}")));
    h.users = vec![Holder::new(
        PodRef::new("pod-uid", "default", "web"),
        Some("main".into()),
    )];
    h
}

fn slots(uid: &str, list: &[&str]) -> Vec<(String, ClaimHold)> {
    list.iter().map(|s| ((*s).to_owned(), hold(uid))).collect()
}

/// Prepares and commits; returns the plan's writes.
fn prepared(l: &mut SlotAllocator, uid: &str, list: &[&str], at: u64) -> Vec<Claim> {
    let plan = l.prepare(&slots(uid, list), Millis(at)).unwrap();
    l.commit(plan.id, Millis(at)).unwrap();
    plan.writes
}

#[test]
fn a_prepared_slot_is_refused_to_the_device_plugin_and_reported_unhealthy() {
    let mut l = ledger();
    let writes = prepared(&mut l, "c1", &["usb-0"], 10);
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].holding.claim, Some(Box::new(hold("c1"))));
    assert_eq!(writes[0].holding.holder, None);
    assert_eq!(l.health_of("usb-0"), Some(Health::Unhealthy));
    assert_eq!(l.health_of("usb-1"), Some(Health::Healthy));
    assert_eq!(
        l.allocate(&["usb-0".to_owned()], Millis(11)),
        Err(AllocateError::HeldByClaim {
            id: "usb-0".into(),
            claim: "default/claim-c1".into()
        })
    );
    assert!(l.is_prepared("usb-0", "c1"));
}

#[test]
fn a_slot_in_use_through_the_device_plugin_is_refused_to_a_claim() {
    let mut l = ledger();
    let plan = l.allocate(&["usb-1".to_owned()], Millis(5)).unwrap();
    l.commit(plan.id, Millis(5)).unwrap();
    let err = l.prepare(&slots("c1", &["usb-0", "usb-1"]), Millis(6));
    assert!(
        matches!(err, Err(AllocateError::InUseByDevicePlugin { ref id, .. }) if id == "usb-1"),
        "{err:?}"
    );
    // All or nothing: usb-0 was not taken either.
    assert!(l.prepared_for("c1").is_empty());
    assert_eq!(l.health_of("usb-0"), Some(Health::Healthy));
}

#[test]
fn prepare_is_idempotent_and_refuses_another_claim() {
    let mut l = ledger();
    prepared(&mut l, "c1", &["cam-0"], 10);
    let again = prepared(&mut l, "c1", &["cam-0"], 20);
    assert_eq!(again.len(), 1);
    assert!(l.is_prepared("cam-0", "c1"));
    assert!(matches!(
        l.prepare(&slots("c2", &["cam-0"]), Millis(30)),
        Err(AllocateError::HeldByClaim { .. })
    ));
}

#[test]
fn a_repeat_of_the_same_prepare_is_recognised_and_changes_nothing() {
    let mut l = ledger();
    assert!(!l.is_prepared_as(&slots("c1", &["usb-0", "cam-1"])));
    prepared(&mut l, "c1", &["usb-0", "cam-1"], 10);
    assert!(l.is_prepared_as(&slots("c1", &["usb-0", "cam-1"])));
    assert!(l.is_prepared_as(&slots("c1", &["cam-1", "usb-0", "cam-1"])));
    // Not the same: another slot set, another claim, other users.
    assert!(!l.is_prepared_as(&slots("c1", &["usb-0"])));
    assert!(!l.is_prepared_as(&slots("c1", &["usb-0", "cam-1", "usb-1"])));
    assert!(!l.is_prepared_as(&slots("c2", &["usb-0", "cam-1"])));
    let mut other = slots("c1", &["usb-0", "cam-1"]);
    other[0].1.users.clear();
    assert!(!l.is_prepared_as(&other));
    assert!(!l.is_prepared_as(&[]));
}

#[test]
fn a_claim_finds_the_slot_it_holds_under_the_device_it_was_allocated() {
    let mut l = ledger();
    let mut list = slots("c1", &["cam-1"]);
    list[0].1.pool = "node-a".into();
    list[0].1.device = "cam-1".into();
    let plan = l.prepare(&list, Millis(10)).unwrap();
    let held_as = |l: &SlotAllocator, uid: &str, pool: &str, device: &str, share: &str| {
        let mut h = hold(uid);
        h.pool = pool.into();
        h.device = device.into();
        h.share_id = share.into();
        l.held_as(&h)
    };
    let none: Vec<String> = Vec::new();
    assert_eq!(
        held_as(&l, "c1", "node-a", "cam-1", ""),
        none,
        "not durable yet"
    );
    l.commit(plan.id, Millis(10)).unwrap();
    assert_eq!(held_as(&l, "c1", "node-a", "cam-1", ""), ["cam-1"]);
    assert_eq!(held_as(&l, "c1", "shared/cam", "cam-1", ""), none);
    assert_eq!(held_as(&l, "c2", "node-a", "cam-1", ""), none);
    assert_eq!(
        held_as(&l, "c1", "node-a", "cam-1", "s1"),
        none,
        "another share"
    );
}

#[test]
fn unprepare_frees_exactly_the_claims_slots_and_unknown_claims_change_nothing() {
    let mut l = ledger();
    prepared(&mut l, "c1", &["usb-0", "cam-1"], 10);
    prepared(&mut l, "c2", &["usb-1"], 11);
    assert!(l.unprepare("never-prepared").is_empty());
    let fx = l.unprepare("c1");
    let deleted: Vec<&str> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::DeleteClaim { slot, .. } => Some(slot.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, ["cam-1", "usb-0"]);
    assert!(fx.contains(&Effect::HealthChanged {
        instance: "cam".into()
    }));
    assert!(l.is_prepared("usb-1", "c2"));
    assert_eq!(l.health_of("usb-0"), Some(Health::Healthy));
    // Twice is a no-op.
    assert!(l.unprepare("c1").is_empty());
}

#[test]
fn a_conflict_in_the_cluster_rolls_a_fresh_prepare_back() {
    let mut l = ledger();
    let plan = l.prepare(&slots("c1", &["cam-0"]), Millis(10)).unwrap();
    let fx = l.claim_conflict(plan.id, "cam-0", "node-b").unwrap();
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::DeleteClaim { slot, .. } if slot == "cam-0"))
    );
    assert!(l.prepared_for("c1").is_empty());
    assert_eq!(l.held_elsewhere("cam-0"), Some("node-b"));
}

#[test]
fn pod_events_and_pod_resources_never_take_a_prepared_slot() {
    let mut l = ledger();
    prepared(&mut l, "c1", &["usb-0"], 10);
    // kubelet's device manager still lists an earlier pod on the slot.
    let fx = l.podresources_listed(
        &[PodResources {
            namespace: "default".into(),
            name: "old".into(),
            containers: vec![ContainerResources {
                name: "main".into(),
                devices: vec![ContainerDevices {
                    resource_name: "steward.dev/usb".into(),
                    device_ids: vec!["usb-0".into()],
                }],
            }],
        }],
        Millis(5_000),
    );
    assert!(fx.is_empty(), "{fx:?}");
    l.pod_observed(&PodInfo {
        uid: "pod-uid".into(),
        namespace: "default".into(),
        name: "web".into(),
        node: NODE.into(),
        phase: PodPhase::Succeeded,
        deleted: false,
    });
    assert!(l.tick(Millis(10_000_000)).is_empty());
    assert!(l.is_prepared("usb-0", "c1"));
}

#[test]
fn recovery_keeps_prepared_slots_whatever_their_pods_do() {
    let mut l = ledger();
    let writes = prepared(&mut l, "c1", &["usb-0", "cam-0"], 10);
    let input = RecoveryInput {
        instances: vec![inst("cam", 2, true), inst("usb", 2, false)],
        local: writes.clone(),
        cluster: Some(writes),
        podresources: Vec::new(),
        pods: Vec::new(),
        now: Millis(99_999_999),
    };
    let (l, fx) = SlotAllocator::recover(NODE, SlotConfig::default(), input);
    assert!(fx.is_empty(), "{fx:?}");
    assert!(l.is_prepared("usb-0", "c1"));
    assert!(l.is_prepared("cam-0", "c1"));
    assert_eq!(l.health_of("cam-0"), Some(Health::Unhealthy));
}

#[test]
fn recovery_drops_a_shared_prepare_the_reachable_cluster_never_got() {
    let mut l = ledger();
    let plan = l.prepare(&slots("c1", &["cam-0"]), Millis(10)).unwrap();
    // Killed after the local write: kubelet never had an answer.
    let input = RecoveryInput {
        instances: vec![inst("cam", 2, true)],
        local: plan.writes,
        cluster: Some(Vec::new()),
        now: Millis(20),
        ..RecoveryInput::default()
    };
    let (l, fx) = SlotAllocator::recover(NODE, SlotConfig::default(), input);
    assert!(l.prepared_for("c1").is_empty());
    assert!(fx.iter().any(
        |e| matches!(e, Effect::DeleteClaim { slot, target: Target::Local, .. } if slot == "cam-0")
    ));
}

#[test]
fn shared_slots_fail_closed_offline_for_claims_too() {
    let mut l = ledger();
    l.cluster_reachability(false);
    assert!(matches!(
        l.prepare(&slots("c1", &["cam-0"]), Millis(1)),
        Err(AllocateError::ClusterUnreachable { .. })
    ));
    let plan = l.prepare(&slots("c1", &["usb-0"]), Millis(1)).unwrap();
    assert_eq!(plan.target, Target::Local);
}

#[test]
fn a_consumable_device_gets_free_slots_and_a_repeat_gets_the_same_ones() {
    let mut l = ledger();
    // usb-0 is held through the device plugin.
    let plan = l.allocate(&["usb-0".to_owned()], Millis(1)).unwrap();
    l.commit(plan.id, Millis(1)).unwrap();
    let share = |uid: &str, share: &str| {
        let mut h = hold(uid);
        h.pool = NODE.into();
        h.device = "usb-slots".into();
        h.share_id = share.into();
        h
    };
    let none = BTreeSet::new();
    let a = share("c1", "s1");
    assert_eq!(l.consumable_pick("usb", 2, &a, 2, &none), Err(1));
    let picked = l.consumable_pick("usb", 2, &a, 1, &none).unwrap();
    assert_eq!(picked, ["usb-1"]);
    let holds: Vec<(String, ClaimHold)> = picked.iter().map(|s| (s.clone(), a.clone())).collect();
    let plan = l.prepare(&holds, Millis(2)).unwrap();
    l.commit(plan.id, Millis(2)).unwrap();
    // The same share again: the same slot; another share of the same
    // claim, or another claim: nothing left.
    assert_eq!(
        l.consumable_pick("usb", 2, &a, 1, &none).unwrap(),
        ["usb-1"]
    );
    assert_eq!(
        l.consumable_pick("usb", 2, &share("c1", "s2"), 1, &none),
        Err(0)
    );
    assert_eq!(
        l.consumable_pick("usb", 2, &share("c2", "s3"), 1, &none),
        Err(0)
    );
    // Slots taken by another device of the same prepare are skipped.
    let _ = l.unprepare("c1");
    let taken = BTreeSet::from(["usb-1".to_owned()]);
    assert_eq!(l.consumable_pick("usb", 2, &a, 1, &taken), Err(0));
}
