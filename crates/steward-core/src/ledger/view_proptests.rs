//! Properties of the node view under arbitrary reports from every source.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::PodRef;
use super::assignment::{PodAssignments, Source};
use super::view::{Action, NodeView, PodEvent, fold};
use crate::cpu::CpuSet;

const UIDS: [&str; 5] = ["a", "b", "c", "d", "e"];
const NAMES: [&str; 2] = ["steward.dev/cam", "vendor.com/gpu"];

#[derive(Debug, Clone)]
enum Op {
    Upsert(Source, PodAssignments),
    Remove(Source, usize),
    Replace(Source, Vec<PodAssignments>),
    Gone(usize),
    StewardNames(bool),
}

fn source() -> impl Strategy<Value = Source> {
    prop_oneof![
        Just(Source::Kubelet),
        Just(Source::Cri),
        Just(Source::Slots)
    ]
}

fn pod() -> impl Strategy<Value = PodAssignments> {
    (
        0..UIDS.len(),
        proptest::collection::vec(
            (
                prop_oneof![Just("main"), Just("init"), Just("side")],
                proptest::collection::btree_set((0..NAMES.len(), 0..4usize), 0..3),
                proptest::collection::btree_set(0u32..8, 0..3),
                any::<bool>(),
            ),
            0..3,
        ),
    )
        .prop_map(|(u, containers)| {
            let mut p = PodAssignments::new(PodRef::new(UIDS[u], "ns", format!("pod-{}", UIDS[u])));
            for (name, devices, cpus, exclusive) in containers {
                let c = p.container_mut(name);
                for (r, d) in devices {
                    c.add_devices(NAMES[r], [format!("d{d}")], &BTreeSet::new());
                }
                c.cpus = CpuSet::from_iter(cpus);
                c.exclusive_cpus = exclusive && !c.cpus.is_empty();
            }
            p
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (source(), pod()).prop_map(|(s, p)| Op::Upsert(s, p)),
        2 => (source(), 0..UIDS.len()).prop_map(|(s, u)| Op::Remove(s, u)),
        2 => (source(), proptest::collection::vec(pod(), 0..4)).prop_map(|(s, ps)| Op::Replace(s, ps)),
        1 => (0..UIDS.len()).prop_map(Op::Gone),
        1 => any::<bool>().prop_map(Op::StewardNames),
    ]
}

fn apply(view: &mut NodeView, op: &Op) -> Vec<PodEvent> {
    match op {
        Op::Upsert(s, p) => view.upsert(*s, p.clone()),
        Op::Remove(s, u) => view.remove(*s, UIDS[*u]),
        Op::Replace(s, ps) => view.replace(*s, ps.clone()),
        Op::Gone(u) => view.pod_gone(UIDS[*u]),
        Op::StewardNames(on) => view.set_steward_resources(if *on {
            BTreeSet::from([NAMES[0].to_string()])
        } else {
            BTreeSet::new()
        }),
    }
}

fn snapshot(view: &NodeView) -> BTreeMap<String, PodAssignments> {
    view.list()
        .map(|p| (p.uid().to_string(), p.clone()))
        .collect()
}

/// No device and no exclusive CPU held by two pods.
fn check_invariants(state: &BTreeMap<String, PodAssignments>) -> Result<(), String> {
    let mut devices: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut cpus: BTreeMap<u32, Vec<(String, bool)>> = BTreeMap::new();
    for (uid, p) in state {
        for c in p.containers.values() {
            for d in &c.devices {
                for id in &d.device_ids {
                    if let Some(other) =
                        devices.insert((d.resource_name.clone(), id.clone()), uid.clone())
                        && other != *uid
                    {
                        return Err(format!(
                            "{}/{id} held by {other} and {uid}",
                            d.resource_name
                        ));
                    }
                }
            }
            for cpu in c.cpus.iter() {
                cpus.entry(cpu)
                    .or_default()
                    .push((uid.clone(), c.exclusive_cpus));
            }
        }
    }
    for (cpu, holders) in cpus {
        let pods: BTreeSet<&String> = holders.iter().map(|(u, _)| u).collect();
        if pods.len() > 1 && holders.iter().any(|(_, ex)| *ex) {
            return Err(format!("cpu {cpu} exclusive but held by {pods:?}"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Every event keeps the invariants; folding the events after any
    /// point onto the list at that point gives every later list; sequence
    /// numbers step by one; the view is always settled.
    #[test]
    fn events_fold_onto_any_list_and_keep_invariants(ops in proptest::collection::vec(op(), 1..40)) {
        let mut view = NodeView::new();
        let mut lists = vec![snapshot(&view)];
        let mut clients: Vec<BTreeMap<String, PodAssignments>> = vec![BTreeMap::new()];
        let mut last_seq = 0;
        for op in &ops {
            let events = apply(&mut view, op);
            for e in &events {
                prop_assert_eq!(e.seq, last_seq + 1);
                last_seq = e.seq;
                for client in &mut clients {
                    fold(client, e);
                }
                if let Some(first) = clients.first() {
                    prop_assert_eq!(check_invariants(first), Ok(()), "after {:?}", e);
                }
            }
            prop_assert!(view.is_settled(), "not settled after {:?}", op);
            let now = snapshot(&view);
            for client in &clients {
                prop_assert_eq!(client, &now);
            }
            prop_assert_eq!(check_invariants(&now), Ok(()));
            lists.push(now.clone());
            clients.push(now);
        }
        prop_assert_eq!(lists.len(), ops.len() + 1);
    }

    /// Every event names a real change: the pod's state after it differs
    /// from its state before it, and a report repeated at once changes
    /// nothing.
    #[test]
    fn no_event_without_a_change(ops in proptest::collection::vec(op(), 1..30)) {
        let mut view = NodeView::new();
        let mut client: BTreeMap<String, PodAssignments> = BTreeMap::new();
        for op in &ops {
            for e in apply(&mut view, op) {
                let before = client.get(e.pod.uid()).cloned();
                match e.action {
                    Action::Added => prop_assert!(before.is_none()),
                    Action::Updated => prop_assert!(before.is_some() && before.as_ref() != Some(&e.pod)),
                    Action::Deleted => prop_assert!(before.is_some()),
                }
                fold(&mut client, &e);
            }
            if matches!(op, Op::Remove(..) | Op::Gone(..) | Op::StewardNames(..)) {
                prop_assert!(apply(&mut view, op).is_empty(), "repeating {:?} changed the view", op);
            }
        }
    }
}

fn holding(uid: &str, device: &str) -> PodAssignments {
    let mut p = PodAssignments::new(PodRef::new(uid, "ns", uid));
    p.container_mut("main")
        .add_devices("steward.dev/cam", [device], &BTreeSet::new());
    p
}

fn actions(events: &[PodEvent]) -> Vec<(Action, String)> {
    events
        .iter()
        .map(|e| (e.action, e.pod.uid().to_string()))
        .collect()
}

#[test]
fn the_keps_d1_example_deletes_a_before_adding_b() {
    let mut view = NodeView::new();
    view.upsert(Source::Slots, holding("a", "d1"));
    // One report: A gone, B holding D1 (B sorts first, A must still go first).
    let mut b = holding("0b", "d1");
    b.pod.name = "b".into();
    let events = view.replace(Source::Slots, vec![b]);
    assert_eq!(
        actions(&events),
        vec![(Action::Deleted, "a".into()), (Action::Added, "0b".into())]
    );
}

#[test]
fn a_newer_claim_shows_the_older_holder_without_the_device_first() {
    let mut view = NodeView::new();
    view.upsert(Source::Kubelet, holding("a", "d1"));
    let events = view.upsert(Source::Slots, holding("b", "d1"));
    assert_eq!(
        actions(&events),
        vec![(Action::Updated, "a".into()), (Action::Added, "b".into())]
    );
    assert!(events[0].pod.containers["main"].devices.is_empty());
    // The lagging source reporting A again with D1 takes it back the same way.
    let events = view.upsert(Source::Kubelet, {
        let mut a = holding("a", "d1");
        a.container_mut("side");
        a
    });
    assert_eq!(
        actions(&events),
        vec![(Action::Updated, "b".into()), (Action::Updated, "a".into())]
    );
}

#[test]
fn a_swap_is_shown_through_a_state_holding_only_what_is_kept() {
    let mut view = NodeView::new();
    view.replace(Source::Slots, vec![holding("a", "d1"), holding("b", "d2")]);
    let events = view.replace(Source::Slots, vec![holding("a", "d2"), holding("b", "d1")]);
    assert_eq!(events.len(), 3, "{events:?}");
    let mut state: BTreeMap<String, PodAssignments> = BTreeMap::new();
    state.insert("a".into(), holding("a", "d1"));
    state.insert("b".into(), holding("b", "d2"));
    for e in &events {
        fold(&mut state, e);
        assert_eq!(check_invariants(&state), Ok(()));
    }
}

#[test]
fn a_deleted_pod_is_not_brought_back_by_a_lagging_source() {
    let mut view = NodeView::new();
    view.upsert(Source::Kubelet, holding("a", "d1"));
    let events = view.pod_gone("a");
    assert_eq!(actions(&events), vec![(Action::Deleted, "a".into())]);
    assert!(view.upsert(Source::Kubelet, holding("a", "d1")).is_empty());
    assert!(
        view.replace(Source::Kubelet, vec![holding("a", "d1")])
            .is_empty()
    );
    assert!(view.get("ns", "a").is_none());
}

#[test]
fn exclusive_cpus_wait_for_the_shared_pool_to_shrink() {
    let mut shared = PodAssignments::new(PodRef::new("s", "ns", "s"));
    shared.container_mut("c").cpus = CpuSet::from_iter(0..4);
    let mut view = NodeView::new();
    view.upsert(Source::Cri, shared.clone());
    let mut pinned = PodAssignments::new(PodRef::new("p", "ns", "p"));
    pinned.container_mut("c").cpus = CpuSet::from_iter([3]);
    pinned.container_mut("c").exclusive_cpus = true;
    shared.container_mut("c").cpus = CpuSet::from_iter(0..3);
    let events = view.replace(Source::Cri, vec![pinned, shared]);
    assert_eq!(
        actions(&events),
        vec![(Action::Updated, "s".into()), (Action::Added, "p".into())]
    );
}
