use std::collections::BTreeMap;

use super::*;
use crate::Millis;
use crate::ledger::{Holder, Holding, Holdings, PodRef};

const NODE: &str = "node-a";
const OTHER: &str = "node-b";
const TIMEOUT: u64 = 1_000;
const SETTLE: u64 = 200;

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

fn config() -> SlotConfig {
    SlotConfig {
        pending_timeout_ms: TIMEOUT,
        settle_ms: SETTLE,
    }
}

/// "cam" (shared, 2 slots), "usb" (unshared, 2 slots), "last" (shared, 1
/// slot); API server reachable.
fn ledger() -> SlotAllocator {
    let mut l = SlotAllocator::new(NODE, config());
    for i in [
        inst("cam", 2, true),
        inst("usb", 2, false),
        inst("last", 1, true),
    ] {
        l.instance_upserted(i);
    }
    assert!(l.cluster_reachability(true).is_empty());
    l
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn pod(uid: &str, name: &str, phase: PodPhase) -> PodInfo {
    PodInfo {
        uid: uid.to_owned(),
        namespace: "default".to_owned(),
        name: name.to_owned(),
        node: NODE.to_owned(),
        phase,
        deleted: false,
    }
}

fn deleted(uid: &str, name: &str) -> PodInfo {
    PodInfo {
        deleted: true,
        ..pod(uid, name, PodPhase::Running)
    }
}

/// Pod resources of `name`: each container with its slots (resource name
/// derived from the slot's instance).
fn pr(name: &str, containers: &[(&str, &[&str])]) -> PodResources {
    PodResources {
        namespace: "default".to_owned(),
        name: name.to_owned(),
        containers: containers
            .iter()
            .map(|(container, slots)| ContainerResources {
                name: (*container).to_owned(),
                devices: slots
                    .iter()
                    .map(|slot| ContainerDevices {
                        resource_name: format!(
                            "steward.dev/{}",
                            parse_slot_id(slot).map(|(i, _)| i).unwrap_or("none")
                        ),
                        device_ids: vec![(*slot).to_owned()],
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn allocate_ok(l: &mut SlotAllocator, slots: &[&str], at: u64) -> AllocatePlan {
    let plan = l.allocate(&ids(slots), Millis(at)).unwrap();
    l.commit(plan.id, Millis(at)).unwrap();
    plan
}

/// Allocate, pod running, pod resources: `slots` held by `uid`/`name`.
fn bind(l: &mut SlotAllocator, uid: &str, name: &str, slots: &[&str], at: u64) {
    allocate_ok(l, slots, at);
    l.pod_observed(&pod(uid, name, PodPhase::Running));
    l.podresources_got(&pr(name, &[("main", slots)]), Millis(at + 1));
    for slot in slots {
        assert_eq!(holder_uid(l, slot).as_deref(), Some(uid));
    }
}

fn holder_uid(l: &SlotAllocator, slot: &str) -> Option<String> {
    l.claim(slot)
        .and_then(|c| c.holding.holder)
        .map(|h| h.pod.uid)
}

fn touches(effects: &[Effect], slot: &str) -> bool {
    effects.iter().any(|e| match e {
        Effect::WriteClaim { claim, .. } => claim.slot() == slot,
        Effect::DeleteClaim { slot: s, .. } => s == slot,
        Effect::HealthChanged { .. } => false,
    })
}

fn deletes(effects: &[Effect]) -> Vec<(String, Target)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::DeleteClaim { slot, target, .. } => Some((slot.clone(), *target)),
            _ => None,
        })
        .collect()
}

fn health(l: &SlotAllocator, slot: &str) -> Health {
    l.health_of(slot).unwrap()
}

/// A store applying writes and epoch-conditional deletes, as adapters must.
#[derive(Default)]
struct Store(BTreeMap<String, Claim>);

impl Store {
    fn write(&mut self, claim: &Claim) {
        let newer = self
            .0
            .get(claim.slot())
            .is_none_or(|kept| kept.epoch <= claim.epoch);
        if newer {
            self.0.insert(claim.slot().to_owned(), claim.clone());
        }
    }

    fn apply(&mut self, effects: &[Effect]) {
        for effect in effects {
            match effect {
                Effect::WriteClaim { claim, target } if target.local() => self.write(claim),
                Effect::DeleteClaim {
                    slot,
                    epoch,
                    target,
                } if target.local() && self.0.get(slot).is_some_and(|c| c.epoch <= *epoch) => {
                    self.0.remove(slot);
                }
                _ => {}
            }
        }
    }
}

// ----- the three allocate/delete orderings -----------------------------------

#[test]
fn ordering_allocate_after_delete_completed_claims_the_free_slot() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["last-0"], 10);
    let effects = l.pod_observed(&deleted("uid-a", "a"));
    assert_eq!(deletes(&effects), vec![("last-0".to_owned(), Target::Both)]);
    assert!(l.claim("last-0").is_none());

    let plan = l.allocate(&ids(&["last-0"]), Millis(20)).unwrap();
    assert_eq!(plan.target, Target::Both);
    assert_eq!(plan.writes.len(), 1);
    assert_eq!(plan.writes[0].holding.holder, None);
    assert_eq!(plan.writes[0].awaiting, Some(Millis(20)));
    assert_eq!(plan.writes[0].node, NODE);
    l.commit(plan.id, Millis(20)).unwrap();

    l.pod_observed(&pod("uid-b", "b", PodPhase::Pending));
    l.podresources_got(&pr("b", &[("main", &["last-0"])]), Millis(21));
    assert_eq!(holder_uid(&l, "last-0").as_deref(), Some("uid-b"));
    assert_eq!(l.claim("last-0").unwrap().awaiting, None);
}

#[test]
fn ordering_allocate_while_delete_is_being_processed_survives_the_late_delete() {
    let mut l = ledger();
    let mut store = Store::default();
    let plan = l.allocate(&ids(&["last-0"]), Millis(10)).unwrap();
    for w in &plan.writes {
        store.write(w);
    }
    l.commit(plan.id, Millis(10)).unwrap();
    l.pod_observed(&pod("uid-a", "a", PodPhase::Running));
    store.apply(&l.podresources_got(&pr("a", &[("main", &["last-0"])]), Millis(11)));

    // The delete is applied in the ledger; its DeleteClaim is still on its
    // way to the store when Allocate for the next pod arrives.
    let in_flight = l.pod_observed(&deleted("uid-a", "a"));
    assert_eq!(deletes(&in_flight).len(), 1);
    let plan = l.allocate(&ids(&["last-0"]), Millis(12)).unwrap();
    for w in &plan.writes {
        store.write(w);
    }
    l.commit(plan.id, Millis(12)).unwrap();
    let new_epoch = plan.writes[0].epoch;

    // The late delete lands: the newer claim survives.
    store.apply(&in_flight);
    let kept = store.0.get("last-0").unwrap();
    assert_eq!(kept.epoch, new_epoch);
    assert_eq!(kept.awaiting, Some(Millis(12)));
    assert_eq!(l.claim("last-0").unwrap(), *kept);
}

#[test]
fn ordering_allocate_before_delete_admits_next_pod_on_last_slot_akri_849() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["last-0"], 10);
    // kubelet considers A gone and offers the last slot to B before the
    // Deleted event of A reaches the agent.
    let plan = l.allocate(&ids(&["last-0"]), Millis(30));
    let plan = plan.expect("B must be admitted, never UnexpectedAdmissionError");
    l.commit(plan.id, Millis(30)).unwrap();
    assert_eq!(l.claim("last-0").unwrap().awaiting, Some(Millis(30)));

    l.pod_observed(&pod("uid-b", "b", PodPhase::Pending));
    l.podresources_listed(&[pr("b", &[("main", &["last-0"])])], Millis(31));
    assert_eq!(holder_uid(&l, "last-0").as_deref(), Some("uid-b"));

    // A's Deleted event must not free the slot now held by B.
    let effects = l.pod_observed(&deleted("uid-a", "a"));
    assert!(!touches(&effects, "last-0"), "{effects:?}");
    assert_eq!(holder_uid(&l, "last-0").as_deref(), Some("uid-b"));
    assert_eq!(health(&l, "last-0"), Health::Healthy);

    // B's own end frees it.
    let effects = l.pod_observed(&pod("uid-b", "b", PodPhase::Succeeded));
    assert_eq!(deletes(&effects), vec![("last-0".to_owned(), Target::Both)]);
}

#[test]
fn ordering_allocate_before_delete_with_deleted_event_before_podresources() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["last-0"], 10);
    allocate_ok(&mut l, &["last-0"], 30);
    // A's Deleted arrives before B shows up in pod resources: the slot was
    // handed out again after A was bound, so it stays claimed, pending.
    let effects = l.pod_observed(&deleted("uid-a", "a"));
    assert!(deletes(&effects).is_empty(), "{effects:?}");
    let claim = l.claim("last-0").unwrap();
    assert_eq!(claim.holding.holder, None);
    assert_eq!(claim.awaiting, Some(Millis(30)));
    assert_eq!(claim.holding.since, Millis(30));
    assert!(l.slots_of("uid-a").is_empty());

    // B appears in pod resources before its watch event; binds when it does.
    l.podresources_listed(&[pr("b", &[("main", &["last-0"])])], Millis(35));
    assert_eq!(holder_uid(&l, "last-0"), None);
    l.pod_observed(&pod("uid-b", "b", PodPhase::Running));
    assert_eq!(holder_uid(&l, "last-0").as_deref(), Some("uid-b"));
    assert!(l.tick(Millis(30 + 10 * TIMEOUT)).is_empty());
    assert_eq!(holder_uid(&l, "last-0").as_deref(), Some("uid-b"));
}

// ----- reuse --------------------------------------------------------------

#[test]
fn init_and_main_container_allocating_the_same_slot_both_succeed_akri_843() {
    let mut l = ledger();
    allocate_ok(&mut l, &["cam-0"], 10); // init container
    allocate_ok(&mut l, &["cam-0"], 11); // main container, same device
    assert_eq!(l.claims().len(), 1);
    l.pod_observed(&pod("uid-x", "x", PodPhase::Running));
    l.podresources_got(
        &pr("x", &[("main", &["cam-0"]), ("init", &["cam-0"])]),
        Millis(12),
    );
    let claim = l.claim("cam-0").unwrap();
    let holder = claim.holding.holder.unwrap();
    assert_eq!(holder.pod.uid, "uid-x");
    // Order-independent choice of container: the smallest name.
    assert_eq!(holder.container.as_deref(), Some("init"));
    assert_eq!(claim.awaiting, None);
}

#[test]
fn kubelet_retry_of_an_answered_allocate_succeeds_and_keeps_one_claim() {
    let mut l = ledger();
    let first = allocate_ok(&mut l, &["usb-0", "usb-1"], 10);
    let second = allocate_ok(&mut l, &["usb-1", "usb-0", "usb-0"], 11);
    assert_eq!(second.writes.len(), 2, "duplicates are removed");
    assert!(second.writes[0].epoch > first.writes[1].epoch);
    assert_eq!(l.claims().len(), 2);
}

// ----- reclaim ------------------------------------------------------------

#[test]
fn terminated_pod_releases_its_slots_at_once_then_deleted_is_a_no_op() {
    for phase in [PodPhase::Succeeded, PodPhase::Failed] {
        let mut l = ledger();
        bind(&mut l, "uid-a", "a", &["cam-0", "cam-1"], 10);
        let effects = l.pod_observed(&pod("uid-a", "a", phase));
        assert_eq!(
            deletes(&effects),
            vec![
                ("cam-0".to_owned(), Target::Both),
                ("cam-1".to_owned(), Target::Both)
            ]
        );
        assert!(l.claims().is_empty());
        assert_eq!(health(&l, "cam-0"), Health::Healthy);
        assert!(l.pod_observed(&deleted("uid-a", "a")).is_empty());
    }
}

#[test]
fn deleted_pod_releases_its_slots_at_once_without_a_terminal_phase() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["usb-1"], 10);
    let effects = l.pod_observed(&deleted("uid-a", "a"));
    assert_eq!(deletes(&effects), vec![("usb-1".to_owned(), Target::Both)]);
    assert!(l.claim("usb-1").is_none());
    // A still-running pod (Pending/Running/Unknown) keeps its slots.
    bind(&mut l, "uid-c", "c", &["usb-0"], 20);
    for phase in [PodPhase::Pending, PodPhase::Running, PodPhase::Unknown] {
        assert!(l.pod_observed(&pod("uid-c", "c", phase)).is_empty());
    }
    assert_eq!(holder_uid(&l, "usb-0").as_deref(), Some("uid-c"));
}

#[test]
fn reclaim_does_not_wait_for_other_pods_that_are_not_ready() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["cam-0"], 10);
    // Many other pods in every not-ready state, claims never attributed.
    allocate_ok(&mut l, &["usb-0"], 11);
    for i in 0..20 {
        let phase = [PodPhase::Pending, PodPhase::Unknown][i % 2];
        l.pod_observed(&pod(&format!("uid-o{i}"), &format!("o{i}"), phase));
    }
    l.podresources_listed(&[pr("ghost", &[("main", &["usb-1"])])], Millis(12));
    let effects = l.pod_observed(&deleted("uid-a", "a"));
    assert_eq!(deletes(&effects), vec![("cam-0".to_owned(), Target::Both)]);
    assert!(l.claim("cam-0").is_none());
}

#[test]
fn pending_claim_is_released_after_the_configured_timeout() {
    for timeout in [TIMEOUT, 5 * TIMEOUT] {
        let mut l = SlotAllocator::new(
            NODE,
            SlotConfig {
                pending_timeout_ms: timeout,
                settle_ms: SETTLE,
            },
        );
        l.instance_upserted(inst("usb", 2, false));
        l.cluster_reachability(true);
        allocate_ok(&mut l, &["usb-0"], 100);
        assert!(l.tick(Millis(100 + timeout - 1)).is_empty());
        assert!(l.claim("usb-0").is_some());
        let effects = l.tick(Millis(100 + timeout));
        assert_eq!(deletes(&effects), vec![("usb-0".to_owned(), Target::Both)]);
        assert!(l.claim("usb-0").is_none());
        assert_eq!(health(&l, "usb-0"), Health::Healthy);
    }
}

#[test]
fn awaiting_claim_with_a_live_holder_is_kept_when_the_window_ends() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["cam-0"], 10);
    allocate_ok(&mut l, &["cam-0"], 20); // same pod again, never re-listed
    let effects = l.tick(Millis(20 + TIMEOUT));
    assert!(deletes(&effects).is_empty());
    let claim = l.claim("cam-0").unwrap();
    assert_eq!(claim.awaiting, None);
    assert_eq!(claim.holding.holder.unwrap().pod.uid, "uid-a");
    // And A's end now frees it at once.
    let effects = l.pod_observed(&pod("uid-a", "a", PodPhase::Failed));
    assert_eq!(deletes(&effects).len(), 1);
}

// ----- refusals -----------------------------------------------------------

#[test]
fn unknown_device_ids_are_refused_and_nothing_changes() {
    let mut l = ledger();
    let before = l.clone();
    for bad in ["nope-0", "cam-2", "cam-01", "cam-+1", "cam", "-0", ""] {
        assert_eq!(
            l.allocate(&ids(&[bad]), Millis(5)),
            Err(AllocateError::UnknownDevice { id: bad.to_owned() })
        );
    }
    let err = l
        .allocate(&ids(&["cam-0", "nope-0"]), Millis(5))
        .unwrap_err();
    assert!(
        err.to_string().contains("unknown device \"nope-0\""),
        "{err}"
    );
    assert_eq!(l.allocate(&[], Millis(5)), Err(AllocateError::NoDevices));
    assert_eq!(l, before);
}

#[test]
fn slot_held_by_another_node_is_unhealthy_and_refused() {
    let mut l = ledger();
    let theirs = Claim {
        node: OTHER.to_owned(),
        epoch: 3,
        holding: Holding::pending("cam-1", Millis(1)),
        awaiting: None,
    };
    let effects = l.cluster_claim_observed(&theirs);
    assert_eq!(
        effects,
        vec![Effect::HealthChanged {
            instance: "cam".into()
        }]
    );
    assert_eq!(health(&l, "cam-1"), Health::Unhealthy);
    assert_eq!(health(&l, "cam-0"), Health::Healthy);
    let before = l.clone();
    let err = l
        .allocate(&ids(&["cam-0", "cam-1"]), Millis(5))
        .unwrap_err();
    assert_eq!(
        err,
        AllocateError::HeldByOtherNode {
            id: "cam-1".into(),
            node: OTHER.into()
        }
    );
    assert!(err.to_string().contains("held by node \"node-b\""));
    assert_eq!(l, before);
    // Our own echo changes nothing; the removal makes it Healthy again.
    let mine = Claim {
        node: NODE.into(),
        ..theirs.clone()
    };
    assert!(l.cluster_claim_observed(&mine).is_empty());
    assert!(l.cluster_claim_removed("cam-1", NODE).is_empty());
    assert_eq!(l.cluster_claim_removed("cam-1", OTHER).len(), 1);
    assert_eq!(health(&l, "cam-1"), Health::Healthy);
}

#[test]
fn own_record_deleted_while_held_is_written_again() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["usb-0"], 10);
    // The garbage collector took the record with its Instance (the device
    // went offline): the hold stays, so the record is written again.
    let fx = l.cluster_claim_removed("usb-0", NODE);
    assert!(
        matches!(
            fx.as_slice(),
            [Effect::WriteClaim { claim, target: Target::Cluster }] if claim.slot() == "usb-0" && claim.node == NODE
        ),
        "{fx:?}"
    );
    // The echo of a release writes nothing.
    assert!(l.cluster_claim_removed("usb-1", NODE).is_empty());
}

#[test]
fn gone_device_is_unhealthy_refused_and_keeps_existing_holders() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["usb-0"], 10);
    let mut gone = inst("usb", 2, false);
    gone.present = false;
    assert_eq!(
        l.instance_upserted(gone.clone()),
        vec![Effect::HealthChanged {
            instance: "usb".into()
        }]
    );
    assert!(l.instance_upserted(gone).is_empty(), "no change, no effect");
    assert!(l.health("usb").iter().all(|(_, h)| *h == Health::Unhealthy));
    assert_eq!(
        l.allocate(&ids(&["usb-1"]), Millis(20)),
        Err(AllocateError::DeviceGone {
            id: "usb-1".into(),
            instance: "usb".into()
        })
    );
    assert_eq!(holder_uid(&l, "usb-0").as_deref(), Some("uid-a"));
    let mut unusable = inst("usb", 2, false);
    unusable.usable = false;
    l.instance_upserted(unusable);
    assert_eq!(health(&l, "usb-1"), Health::Unhealthy);
}

// ----- cluster unreachable ------------------------------------------------

#[test]
fn shared_device_fails_closed_while_the_cluster_is_unreachable() {
    let mut l = ledger();
    assert!(l.cluster_reachability(false).is_empty());
    let before = l.clone();
    let err = l.allocate(&ids(&["cam-0"]), Millis(5)).unwrap_err();
    assert_eq!(
        err,
        AllocateError::ClusterUnreachable {
            id: "cam-0".into(),
            instance: "cam".into()
        }
    );
    assert!(err.to_string().contains("fail closed"));
    // Mixed with an unshared slot: still all or nothing.
    assert!(l.allocate(&ids(&["usb-0", "cam-0"]), Millis(5)).is_err());
    assert_eq!(l, before);
}

#[test]
fn shared_slot_already_held_in_the_cluster_can_be_reallocated_offline() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["cam-0"], 10);
    l.cluster_reachability(false);
    let plan = allocate_ok(&mut l, &["cam-0"], 20);
    assert_eq!(plan.target, Target::Local);
    assert_eq!(l.unsynced(), ids(&["cam-0"]));
    // The next fresh shared slot still fails closed.
    assert!(matches!(
        l.allocate(&ids(&["cam-1"]), Millis(21)),
        Err(AllocateError::ClusterUnreachable { .. })
    ));
    let effects = l.cluster_reachability(true);
    assert!(matches!(
        &effects[..],
        [Effect::WriteClaim { claim, target: Target::Cluster }] if claim.slot() == "cam-0"
    ));
}

#[test]
fn local_device_allocates_offline_and_its_claim_is_synced_on_reconnect() {
    let mut l = ledger();
    l.cluster_reachability(false);
    let plan = l.allocate(&ids(&["usb-0"]), Millis(10)).unwrap();
    assert_eq!(plan.target, Target::Local);
    l.commit(plan.id, Millis(10)).unwrap();
    assert_eq!(l.unsynced(), ids(&["usb-0"]));
    // Binding while offline stays local too.
    l.pod_observed(&pod("uid-a", "a", PodPhase::Running));
    let effects = l.podresources_got(&pr("a", &[("main", &["usb-0"])]), Millis(11));
    assert!(matches!(
        &effects[..],
        [Effect::WriteClaim {
            target: Target::Local,
            ..
        }]
    ));
    // Nothing is written to the cluster before it is back.
    assert!(l.tick(Millis(12)).is_empty());
    let effects = l.cluster_reachability(true);
    let [Effect::WriteClaim { claim, target }] = &effects[..] else {
        panic!("expected one queued write, got {effects:?}");
    };
    assert_eq!(*target, Target::Cluster);
    assert_eq!(claim.holding.holder.as_ref().unwrap().pod.uid, "uid-a");
    assert!(l.unsynced().is_empty());
    assert!(l.cluster_reachability(true).is_empty(), "synced once");
}

#[test]
fn release_while_offline_is_synced_on_reconnect() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["cam-1"], 10);
    l.cluster_reachability(false);
    let effects = l.pod_observed(&deleted("uid-a", "a"));
    assert_eq!(deletes(&effects), vec![("cam-1".to_owned(), Target::Local)]);
    let effects = l.cluster_reachability(true);
    assert_eq!(
        deletes(&effects),
        vec![("cam-1".to_owned(), Target::Cluster)]
    );
}

#[test]
fn failed_cluster_write_is_retried_on_the_next_tick() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["usb-0"], 10);
    l.cluster_write_failed("usb-0");
    let effects = l.tick(Millis(12));
    assert!(matches!(
        &effects[..],
        [Effect::WriteClaim { claim, target: Target::Cluster }] if claim.slot() == "usb-0"
    ));
    assert!(l.tick(Millis(13)).is_empty());
}

// ----- plan completion ----------------------------------------------------

#[test]
fn lost_claim_race_rolls_the_plan_back_and_marks_the_slot_held_elsewhere() {
    let mut l = ledger();
    let plan = l.allocate(&ids(&["cam-0", "cam-1"]), Millis(10)).unwrap();
    let effects = l.claim_conflict(plan.id, "cam-1", OTHER).unwrap();
    assert_eq!(
        deletes(&effects),
        vec![
            ("cam-0".to_owned(), Target::Both),
            ("cam-1".to_owned(), Target::Local)
        ]
    );
    assert!(effects.contains(&Effect::HealthChanged {
        instance: "cam".into()
    }));
    assert!(l.claims().is_empty());
    assert_eq!(health(&l, "cam-1"), Health::Unhealthy);
    assert_eq!(l.held_elsewhere("cam-1"), Some(OTHER));
    assert_eq!(
        l.commit(plan.id, Millis(20)),
        Err(PlanError::UnknownPlan(plan.id))
    );
}

#[test]
fn aborted_reallocation_restores_the_previous_holder() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["cam-0"], 10);
    let plan = l.allocate(&ids(&["cam-0"]), Millis(20)).unwrap();
    let effects = l.abort(plan.id).unwrap();
    let [Effect::WriteClaim { claim, target }] = &effects[..] else {
        panic!("expected a restoring write, got {effects:?}");
    };
    assert_eq!(*target, Target::Both);
    assert_eq!(claim.awaiting, None);
    assert_eq!(claim.holding.holder.as_ref().unwrap().pod.uid, "uid-a");
    assert_eq!(l.claim("cam-0").unwrap(), *claim);
    assert!(l.abort(plan.id).is_err());
}

#[test]
fn outstanding_plan_blocks_a_second_allocate_and_expires() {
    let mut l = ledger();
    let plan = l.allocate(&ids(&["usb-0"]), Millis(10)).unwrap();
    assert_eq!(l.outstanding_plans(), vec![plan.id]);
    assert_eq!(
        l.allocate(&ids(&["usb-0"]), Millis(11)),
        Err(AllocateError::ClaimInFlight { id: "usb-0".into() })
    );
    assert!(l.tick(Millis(10 + TIMEOUT - 1)).is_empty());
    let effects = l.tick(Millis(10 + TIMEOUT));
    assert_eq!(deletes(&effects), vec![("usb-0".to_owned(), Target::Both)]);
    let err = l.commit(plan.id, Millis(10 + TIMEOUT)).unwrap_err();
    assert!(err.to_string().contains("not outstanding"), "{err}");
}

// ----- pod resources ------------------------------------------------------

#[test]
fn podresources_naming_an_unwatched_pod_binds_when_the_pod_appears() {
    let mut l = ledger();
    allocate_ok(&mut l, &["usb-0"], 10);
    assert!(
        l.podresources_got(&pr("late", &[("c", &["usb-0"])]), Millis(11))
            .is_empty()
    );
    let effects = l.pod_observed(&pod("uid-late", "late", PodPhase::Running));
    assert_eq!(effects.len(), 1);
    let holder = l.claim("usb-0").unwrap().holding.holder.unwrap();
    assert_eq!(
        holder,
        Holder::new(PodRef::new("uid-late", "default", "late"), Some("c".into()))
    );
    assert_eq!(l.holders()[0].since, Millis(11));
}

#[test]
fn podresources_of_a_dead_pod_or_older_snapshot_never_rebinds() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["cam-0"], 10);
    // An older snapshot naming another live pod is ignored.
    l.pod_observed(&pod("uid-b", "b", PodPhase::Running));
    assert!(
        l.podresources_got(&pr("b", &[("main", &["cam-0"])]), Millis(5))
            .is_empty()
    );
    assert_eq!(holder_uid(&l, "cam-0").as_deref(), Some("uid-a"));
    // A terminated pod listed by kubelet is never bound.
    l.pod_observed(&pod("uid-d", "d", PodPhase::Failed));
    assert!(
        l.podresources_got(&pr("d", &[("main", &["cam-1"])]), Millis(50))
            .is_empty()
    );
    assert!(l.claim("cam-1").is_none());
}

#[test]
fn podresources_of_other_resources_are_ignored_and_in_use_slots_adopted() {
    let mut l = ledger();
    l.pod_observed(&pod("uid-a", "a", PodPhase::Running));
    let mut foreign = pr("a", &[("main", &["usb-1"])]);
    foreign.containers[0].devices[0].resource_name = "vendor.example/gpu".into();
    assert!(l.podresources_got(&foreign, Millis(5)).is_empty());
    assert!(l.claims().is_empty());
    // kubelet has usb-1 in use by a live pod with no claim here: adopted.
    let effects = l.podresources_got(&pr("a", &[("main", &["usb-1"])]), Millis(6));
    assert!(matches!(
        &effects[..],
        [Effect::WriteClaim { claim, target: Target::Both }]
            if claim.holding.is_held_by("uid-a") && claim.awaiting.is_none()
    ));
    assert_eq!(l.held_by("uid-a").len(), 1);
}

#[test]
fn pods_missing_from_a_relist_are_treated_as_deleted() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["usb-0"], 10);
    bind(&mut l, "uid-b", "b", &["usb-1"], 20);
    let effects = l.pods_listed(&[pod("uid-b", "b", PodPhase::Running)]);
    assert_eq!(deletes(&effects), vec![("usb-0".to_owned(), Target::Both)]);
    assert_eq!(holder_uid(&l, "usb-1").as_deref(), Some("uid-b"));
    // Pods of other nodes are ignored.
    let mut elsewhere = deleted("uid-b", "b");
    elsewhere.node = OTHER.into();
    assert!(l.pod_observed(&elsewhere).is_empty());
}

// ----- cluster lists ------------------------------------------------------

#[test]
fn cluster_list_repairs_own_records_and_replaces_other_nodes_view() {
    let mut l = ledger();
    bind(&mut l, "uid-a", "a", &["usb-0"], 10);
    let stale_own = Claim {
        node: NODE.into(),
        epoch: 1,
        holding: Holding::pending("usb-1", Millis(1)),
        awaiting: None,
    };
    let theirs = Claim {
        node: OTHER.into(),
        epoch: 9,
        holding: Holding::pending("cam-0", Millis(1)),
        awaiting: None,
    };
    let effects = l.cluster_claims_listed(&[stale_own, theirs]);
    assert!(effects.iter().any(|e| matches!(e,
        Effect::WriteClaim { claim, target: Target::Cluster } if claim.slot() == "usb-0")));
    assert!(deletes(&effects).contains(&("usb-1".to_owned(), Target::Cluster)));
    assert!(effects.contains(&Effect::HealthChanged {
        instance: "cam".into()
    }));
    assert_eq!(health(&l, "cam-0"), Health::Unhealthy);
    // A list without it makes it Healthy again.
    l.cluster_claims_listed(&[]);
    assert_eq!(health(&l, "cam-0"), Health::Healthy);
}

// ----- queries ------------------------------------------------------------

#[test]
fn health_lists_every_slot_in_index_order() {
    let mut l = ledger();
    l.instance_upserted(inst("many", 11, false));
    let h = l.health("many");
    assert_eq!(h.len(), 11);
    assert_eq!(h[10].0, "many-10");
    assert_eq!(h[2].0, "many-2");
    assert!(l.health("unknown").is_empty());
    assert_eq!(
        l.instance_removed("many"),
        vec![Effect::HealthChanged {
            instance: "many".into()
        }]
    );
    assert!(l.health("many").is_empty());
    assert_eq!(l.health_of("many-0"), None);
}

#[test]
fn preferred_allocation_prefers_must_include_then_free_low_slots() {
    let mut l = ledger();
    l.instance_upserted(inst("big", 4, false));
    bind(&mut l, "uid-a", "a", &["big-0"], 10);
    let avail = ids(&["big-3", "big-0", "big-2", "big-1", "weird"]);
    assert_eq!(
        l.preferred_allocation(&avail, &ids(&["big-3"]), 3),
        ids(&["big-3", "big-1", "big-2"])
    );
    // The held slot (offered for reuse) comes after free ones; unknown last.
    assert_eq!(
        l.preferred_allocation(&avail, &[], 5),
        ids(&["big-1", "big-2", "big-3", "big-0", "weird"])
    );
    let mut shuffled = avail.clone();
    shuffled.reverse();
    assert_eq!(
        l.preferred_allocation(&shuffled, &[], 2),
        l.preferred_allocation(&avail, &[], 2)
    );
}

// ----- restart recovery ---------------------------------------------------

fn held_claim(slot: &str, uid: &str, name: &str, epoch: u64) -> Claim {
    Claim {
        node: NODE.into(),
        epoch,
        holding: Holding::held(
            slot,
            Holder::new(PodRef::new(uid, "default", name), Some("main".into())),
            Millis(10),
        ),
        awaiting: None,
    }
}

fn pending_claim(slot: &str, epoch: u64, at: u64) -> Claim {
    Claim {
        node: NODE.into(),
        epoch,
        holding: Holding::pending(slot, Millis(at)),
        awaiting: Some(Millis(at)),
    }
}

fn input() -> RecoveryInput {
    RecoveryInput {
        instances: vec![
            inst("cam", 2, true),
            inst("usb", 2, false),
            inst("last", 1, true),
        ],
        now: Millis(1_000_000),
        cluster: Some(Vec::new()),
        ..RecoveryInput::default()
    }
}

#[test]
fn recover_keeps_slots_of_running_pods_with_no_writes_when_stores_agree() {
    let mut inp = input();
    inp.local = vec![held_claim("cam-0", "uid-a", "a", 4)];
    inp.cluster = Some(vec![held_claim("cam-0", "uid-a", "a", 4)]);
    inp.pods = vec![pod("uid-a", "a", PodPhase::Running)];
    let (l, effects) = SlotAllocator::recover(NODE, config(), inp);
    assert!(effects.is_empty(), "{effects:?}");
    assert_eq!(holder_uid(&l, "cam-0").as_deref(), Some("uid-a"));
    assert!(l.cluster_reachable());
    // Epochs continue above every record seen.
    let mut l = l;
    let plan = l.allocate(&ids(&["cam-1"]), Millis(1_000_001)).unwrap();
    assert_eq!(plan.writes[0].epoch, 5);
}

#[test]
fn recover_frees_slots_of_pods_gone_meanwhile() {
    let mut inp = input();
    inp.local = vec![
        held_claim("cam-0", "uid-gone", "gone", 4),
        held_claim("usb-0", "uid-done", "done", 5),
        held_claim("usb-1", "uid-a", "a", 6),
    ];
    inp.cluster = Some(vec![held_claim("cam-0", "uid-gone", "gone", 4)]);
    inp.pods = vec![
        pod("uid-done", "done", PodPhase::Succeeded),
        pod("uid-a", "a", PodPhase::Running),
    ];
    let (l, effects) = SlotAllocator::recover(NODE, config(), inp);
    assert_eq!(
        deletes(&effects),
        vec![
            ("cam-0".to_owned(), Target::Both),
            ("usb-0".to_owned(), Target::Local)
        ]
    );
    assert!(l.claim("cam-0").is_none() && l.claim("usb-0").is_none());
    // usb-1 is kept; missing in the cluster, so written there.
    assert!(effects.iter().any(|e| matches!(e,
        Effect::WriteClaim { claim, target: Target::Cluster } if claim.slot() == "usb-1")));
}

#[test]
fn recover_from_cluster_claims_when_the_local_ledger_is_lost() {
    let mut inp = input();
    inp.cluster = Some(vec![
        held_claim("cam-1", "uid-a", "a", 7),
        Claim {
            node: OTHER.into(),
            ..held_claim("cam-0", "uid-z", "z", 2)
        },
    ]);
    inp.pods = vec![pod("uid-a", "a", PodPhase::Running)];
    let (l, effects) = SlotAllocator::recover(NODE, config(), inp);
    assert_eq!(holder_uid(&l, "cam-1").as_deref(), Some("uid-a"));
    assert!(matches!(
        &effects[..],
        [Effect::WriteClaim { claim, target: Target::Local }] if claim.slot() == "cam-1" && claim.epoch == 8
    ));
    assert_eq!(l.health_of("cam-0"), Some(Health::Unhealthy));
    assert!(l.claim("cam-0").is_none());
}

#[test]
fn recover_from_podresources_alone_adopts_running_pods() {
    let mut inp = input();
    inp.pods = vec![
        pod("uid-a", "a", PodPhase::Running),
        pod("uid-b", "b", PodPhase::Failed),
    ];
    inp.podresources = vec![
        pr("a", &[("main", &["usb-1"])]),
        pr("b", &[("main", &["usb-0"])]),
    ];
    let (l, effects) = SlotAllocator::recover(NODE, config(), inp);
    assert_eq!(l.slots_of("uid-a"), ids(&["usb-1"]));
    assert!(l.claim("usb-0").is_none(), "terminated pods are not bound");
    assert!(matches!(
        &effects[..],
        [Effect::WriteClaim { claim, target: Target::Both }] if claim.slot() == "usb-1"
    ));
}

#[test]
fn recover_drops_an_unanswered_shared_claim_after_kill_between_writes() {
    // kill -9 after the local write, before the cluster write: Allocate was
    // never answered.
    let mut inp = input();
    inp.local = vec![pending_claim("cam-0", 3, 500)];
    let (l, effects) = SlotAllocator::recover(NODE, config(), inp);
    assert!(l.claims().is_empty());
    assert_eq!(deletes(&effects), vec![("cam-0".to_owned(), Target::Local)]);
}

#[test]
fn recover_keeps_pending_claims_for_a_fresh_window_then_expires_them() {
    let mut inp = input();
    let now = inp.now;
    inp.local = vec![pending_claim("usb-0", 3, 500)];
    inp.cluster = Some(vec![pending_claim("cam-0", 2, 400)]);
    let (mut l, effects) = SlotAllocator::recover(NODE, config(), inp);
    assert_eq!(l.claims().len(), 2);
    assert!(l.claims().iter().all(|c| c.awaiting == Some(now)));
    assert_eq!(effects.len(), 2, "{effects:?}");
    assert!(l.tick(Millis(now.0 + TIMEOUT - 1)).is_empty());
    let effects = l.tick(Millis(now.0 + TIMEOUT));
    assert_eq!(deletes(&effects).len(), 2);
}

#[test]
fn recover_keeps_a_reallocated_slot_of_a_gone_pod_pending_akri_849() {
    // Killed after B's Allocate was answered, before B was attributed;
    // A is gone now, B is running and kubelet lists it.
    let mut reallocated = held_claim("last-0", "uid-a", "a", 5);
    reallocated.awaiting = Some(Millis(900));
    let mut inp = input();
    inp.local = vec![reallocated.clone()];
    inp.cluster = Some(vec![reallocated]);
    inp.pods = vec![pod("uid-b", "b", PodPhase::Running)];
    let (l, _) = SlotAllocator::recover(NODE, config(), inp.clone());
    assert_eq!(holder_uid(&l, "last-0"), None);
    assert!(l.claim("last-0").is_some(), "kept pending, not freed");
    inp.podresources = vec![pr("b", &[("main", &["last-0"])])];
    let (l, _) = SlotAllocator::recover(NODE, config(), inp);
    assert_eq!(holder_uid(&l, "last-0").as_deref(), Some("uid-b"));
}

#[test]
fn recover_with_cluster_unreachable_trusts_the_local_ledger_and_syncs_later() {
    let mut inp = input();
    inp.cluster = None;
    inp.local = vec![
        held_claim("cam-0", "uid-a", "a", 4),
        held_claim("usb-0", "uid-gone", "gone", 5),
    ];
    inp.pods = vec![pod("uid-a", "a", PodPhase::Running)];
    let (mut l, effects) = SlotAllocator::recover(NODE, config(), inp);
    assert!(!l.cluster_reachable());
    assert_eq!(deletes(&effects), vec![("usb-0".to_owned(), Target::Local)]);
    assert_eq!(holder_uid(&l, "cam-0").as_deref(), Some("uid-a"));
    assert_eq!(l.unsynced(), ids(&["cam-0", "usb-0"]));
    let effects = l.cluster_reachability(true);
    assert!(effects.iter().any(|e| matches!(e,
        Effect::WriteClaim { claim, target: Target::Cluster } if claim.slot() == "cam-0")));
    assert!(deletes(&effects).contains(&("usb-0".to_owned(), Target::Cluster)));
}

#[test]
fn recover_keeps_awaiting_of_a_reallocated_slot_whose_old_holder_still_runs() {
    // Killed after B's Allocate on A's slot was answered; A's phase is still
    // Running in the API and kubelet does not list B yet.
    let mut reallocated = held_claim("last-0", "uid-a", "a", 5);
    reallocated.awaiting = Some(Millis(900));
    let mut inp = input();
    let now = inp.now;
    inp.local = vec![reallocated.clone()];
    inp.cluster = Some(vec![reallocated]);
    inp.pods = vec![pod("uid-a", "a", PodPhase::Running)];
    let (mut l, _) = SlotAllocator::recover(NODE, config(), inp);
    assert_eq!(l.claim("last-0").unwrap().awaiting, Some(now));
    // A ends: the slot may be B's, so it is not freed.
    let effects = l.pod_observed(&deleted("uid-a", "a"));
    assert!(deletes(&effects).is_empty(), "{effects:?}");
    assert!(l.claim("last-0").is_some());
}

#[test]
fn recover_offline_shared_claim_is_not_reallocated_until_the_cluster_confirms_it() {
    // The local record may be one whose cluster write never happened.
    let mut inp = input();
    inp.cluster = None;
    inp.local = vec![held_claim("cam-0", "uid-a", "a", 4)];
    inp.pods = vec![pod("uid-a", "a", PodPhase::Running)];
    let (mut l, _) = SlotAllocator::recover(NODE, config(), inp);
    assert!(matches!(
        l.allocate(&ids(&["cam-0"]), Millis(1_000_001)),
        Err(AllocateError::ClusterUnreachable { .. })
    ));
    // The cluster lists it as ours: re-allocating offline is fine again.
    l.cluster_claims_listed(&[held_claim("cam-0", "uid-a", "a", 4)]);
    l.cluster_reachability(false);
    let plan = l.allocate(&ids(&["cam-0"]), Millis(1_000_002)).unwrap();
    assert_eq!(plan.target, Target::Local);
}

// ----- settle: pending claims whose pod is already gone ---------------------

#[test]
fn pod_deleted_before_attribution_is_released_by_the_first_list_after_settle() {
    let mut l = ledger();
    allocate_ok(&mut l, &["last-0"], 100);
    // The pod is admitted and deleted before any snapshot attributed the
    // slot to it: its events name no slot.
    assert!(!touches(
        &l.pod_observed(&pod("uid-a", "a", PodPhase::Pending)),
        "last-0"
    ));
    assert!(!touches(&l.pod_observed(&deleted("uid-a", "a")), "last-0"));
    assert_eq!(l.claim("last-0").unwrap().awaiting, Some(Millis(100)));

    // Lists before the settle time do not release (kubelet may not have
    // recorded the pod's devices yet).
    for at in [100, 101, 100 + SETTLE / 2, 100 + SETTLE - 1] {
        let effects = l.podresources_listed(&[], Millis(at));
        assert!(effects.is_empty(), "list at {at}: {effects:?}");
        assert!(l.claim("last-0").is_some(), "released by a list at {at}");
    }
    // The first list at or after settle does, in both stores, long before
    // the pending timeout.
    let effects = l.podresources_listed(&[pr("x", &[("main", &["usb-1"])])], Millis(100 + SETTLE));
    assert_eq!(deletes(&effects), vec![("last-0".to_owned(), Target::Both)]);
    assert_eq!(l.claim("last-0"), None);
    assert_eq!(health(&l, "last-0"), Health::Healthy);
    // The slot allocates again at once.
    allocate_ok(&mut l, &["last-0"], 100 + SETTLE + 1);
}

#[test]
fn settle_counts_from_the_answer_not_from_the_allocate() {
    let mut l = ledger();
    let plan = l.allocate(&ids(&["cam-0"]), Millis(100)).unwrap();
    assert_eq!(l.next_settle(Millis(0)), None, "outstanding plan");
    // A slow cluster write: the plan is outstanding past the settle time.
    assert!(
        l.podresources_listed(&[], Millis(100 + 2 * SETTLE))
            .is_empty()
    );
    assert!(l.claim("cam-0").is_some());
    let answered = 100 + 3 * SETTLE;
    l.commit(plan.id, Millis(answered)).unwrap();
    assert_eq!(
        l.next_settle(Millis(answered)),
        Some(Millis(answered + SETTLE))
    );
    assert!(
        l.podresources_listed(&[], Millis(answered + SETTLE - 1))
            .is_empty()
    );
    assert!(l.claim("cam-0").is_some());
    let effects = l.podresources_listed(&[], Millis(answered + SETTLE));
    assert_eq!(deletes(&effects), vec![("cam-0".to_owned(), Target::Both)]);
    assert_eq!(l.next_settle(Millis(0)), None);
}

#[test]
fn list_mentioning_the_slot_keeps_the_pending_claim() {
    let mut l = ledger();
    allocate_ok(&mut l, &["last-0", "usb-0", "usb-1", "cam-0"], 100);
    l.pod_observed(&pod("uid-t", "t", PodPhase::Running));
    l.pod_observed(&pod("uid-t", "t", PodPhase::Failed));
    let late = Millis(100 + 3 * SETTLE);
    let mut other_resource = pr("o", &[("main", &["cam-0"])]);
    other_resource.containers[0].devices[0].resource_name = "vendor.example/cam".into();
    let effects = l.podresources_listed(
        &[
            // A pod the watch has not delivered (maybe the pod it went to).
            pr("b", &[("main", &["last-0"])]),
            // A pod the watch saw terminate: may be a new pod of that name.
            pr("t", &[("main", &["usb-0"])]),
            other_resource,
        ],
        late,
    );
    // Only usb-1, mentioned nowhere, is released.
    assert_eq!(deletes(&effects), vec![("usb-1".to_owned(), Target::Both)]);
    for slot in ["last-0", "usb-0", "cam-0"] {
        let claim = l.claim(slot).unwrap();
        assert_eq!(claim.holding.holder, None, "{slot}");
        assert_eq!(claim.awaiting, Some(Millis(100)), "{slot}");
    }
    // b is delivered: its entry binds last-0, which no list releases now.
    l.pod_observed(&pod("uid-b", "b", PodPhase::Running));
    assert_eq!(holder_uid(&l, "last-0").as_deref(), Some("uid-b"));
    assert!(!touches(
        &l.podresources_listed(&[], Millis(late.0 + 1)),
        "last-0"
    ));
    assert_eq!(holder_uid(&l, "last-0").as_deref(), Some("uid-b"));
}

#[test]
fn settle_releases_only_by_full_lists_and_never_a_holder() {
    let mut l = ledger();
    // usb-0: bound to a, then allocated again (kubelet retry); awaiting
    // with a live holder.
    bind(&mut l, "uid-a", "a", &["usb-0"], 10);
    allocate_ok(&mut l, &["usb-0"], 20);
    // usb-1: pending, its pod never seen.
    allocate_ok(&mut l, &["usb-1"], 20);
    let late = 20 + 2 * SETTLE;
    // A Get of some pod proves nothing about the others.
    assert!(l.podresources_got(&pr("z", &[]), Millis(late)).is_empty());
    assert!(l.claim("usb-1").is_some());
    // A full list not mentioning either: the pending one goes, the held
    // one stays with its holder.
    let effects = l.podresources_listed(&[], Millis(late));
    assert_eq!(deletes(&effects), vec![("usb-1".to_owned(), Target::Both)]);
    assert_eq!(holder_uid(&l, "usb-0").as_deref(), Some("uid-a"));
    // a ends while its slot awaits: the claim becomes pending, and the
    // next list (settle long passed) releases it.
    let effects = l.pod_observed(&deleted("uid-a", "a"));
    assert!(deletes(&effects).is_empty());
    assert_eq!(
        l.next_settle(Millis(late)),
        None,
        "settle time already passed"
    );
    let effects = l.podresources_listed(&[], Millis(late + 1));
    assert_eq!(deletes(&effects), vec![("usb-0".to_owned(), Target::Both)]);
    assert!(l.claims().is_empty());
}

#[test]
fn recovered_pending_claim_settles_from_the_recovery_time() {
    let mut inp = input();
    let now = inp.now;
    inp.local = vec![pending_claim("usb-0", 3, 500)];
    let (mut l, _) = SlotAllocator::recover(NODE, config(), inp);
    assert_eq!(l.next_settle(now), Some(Millis(now.0 + SETTLE)));
    assert!(
        l.podresources_listed(&[], Millis(now.0 + SETTLE - 1))
            .is_empty()
    );
    assert!(l.claim("usb-0").is_some());
    let effects = l.podresources_listed(&[], Millis(now.0 + SETTLE));
    assert_eq!(deletes(&effects), vec![("usb-0".to_owned(), Target::Both)]);
}

// ----- reservations made at scheduling time ---------------------------------

#[test]
fn a_slot_reserved_for_another_node_is_unhealthy_and_refused_here() {
    let mut l = SlotAllocator::new("n1", SlotConfig::default());
    l.cluster_reachability(true);
    l.instance_upserted(inst("cam", 2, true));
    let reserved: BTreeMap<String, String> = [
        ("cam-0".to_owned(), "n2".to_owned()),
        ("cam-1".to_owned(), "n1".to_owned()),
    ]
    .into();
    let effects = l.reservations_listed(&reserved);
    assert!(
        effects.contains(&Effect::HealthChanged {
            instance: "cam".into()
        }),
        "{effects:?}"
    );
    // Reserved for a pod going to n2: kubelet here must not hand it out.
    assert_eq!(
        l.health("cam"),
        vec![
            ("cam-0".to_owned(), Health::Unhealthy),
            ("cam-1".to_owned(), Health::Healthy)
        ]
    );
    assert_eq!(
        l.allocate(&["cam-0".to_owned()], Millis(1)),
        Err(AllocateError::ReservedForOtherNode {
            id: "cam-0".into(),
            node: "n2".into()
        })
    );
    // Reserved for a pod coming here: granted.
    assert!(l.allocate(&["cam-1".to_owned()], Millis(1)).is_ok());
    // Released (consumed elsewhere, canceled, expired): healthy again.
    let effects = l.reservations_listed(&BTreeMap::new());
    assert!(!effects.is_empty());
    assert_eq!(l.health("cam")[0], ("cam-0".to_owned(), Health::Healthy));
}
