//! Properties of the reservation ledger under arbitrary interleavings of
//! scheduler requests, decisions, claims, cancels, bindings, expiry and
//! Instance changes.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;
use crate::Millis;

const INSTANCES: [&str; 3] = ["cam", "mic", "gpu"];
const NODES: [&str; 3] = ["n1", "n2", "n3"];
const PODS: [&str; 6] = ["p0", "p1", "p2", "p3", "p4", "p5"];
const TTL: u64 = 1_000;

#[derive(Debug, Clone)]
enum Op {
    SetInstance(usize, u32, BTreeSet<usize>),
    RemoveInstance(usize),
    /// Pod `.0` asks for slots `.1` and `.2` exclusive CPUs on nodes `.3`.
    Request(usize, BTreeMap<usize, u32>, u32, Vec<usize>),
    /// Node `.0`'s resource manager publishes free CPUs per NUMA node
    /// (`None`: it stopped) and the pods holding CPUs (bit mask).
    NodeCpus(usize, Option<(u32, u32)>, u8),
    Decide(usize),
    /// A node grants pod `.1` a slot: the node honours reservations, so it
    /// takes a slot free for that pod (`.2` picks which).
    Claim(usize, usize, usize),
    Release(usize, u32),
    Cancel(usize),
    Bound(usize, usize),
    Forget(usize),
    Tick(u64),
    /// A successor controller reads back pod `.0`'s last decision.
    Restore(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let nodes = proptest::collection::btree_set(0..NODES.len(), 0..=3);
    // Weighted so reservations live long enough to meet each other:
    // requests and decisions often, destructive events less often.
    prop_oneof![
        2 => (0..INSTANCES.len(), 0u32..4, nodes).prop_map(|(i, c, n)| Op::SetInstance(i, c, n)),
        1 => (0..INSTANCES.len()).prop_map(Op::RemoveInstance),
        6 => (
            0..PODS.len(),
            proptest::collection::btree_map(0..INSTANCES.len(), 1u32..3, 0..3),
            prop_oneof![2 => Just(0u32), 1 => 1u32..5],
            proptest::collection::vec(0..NODES.len(), 1..4)
        )
            .prop_map(|(p, r, cpus, c)| Op::Request(p, r, cpus, c)),
        2 => (0..NODES.len(), proptest::option::weighted(0.9, (0u32..6, 0u32..6)), any::<u8>())
            .prop_map(|(n, f, h)| Op::NodeCpus(n, f, h)),
        6 => (0..PODS.len()).prop_map(Op::Decide),
        3 => (0..INSTANCES.len(), 0..PODS.len(), 0usize..4).prop_map(|(i, p, k)| Op::Claim(i, p, k)),
        2 => (0..INSTANCES.len(), 0u32..4).prop_map(|(i, n)| Op::Release(i, n)),
        1 => (0..PODS.len()).prop_map(Op::Cancel),
        1 => (0..PODS.len(), 0..NODES.len()).prop_map(|(p, n)| Op::Bound(p, n)),
        1 => (0..PODS.len()).prop_map(Op::Forget),
        1 => (0u64..600).prop_map(Op::Tick),
        2 => (0..PODS.len()).prop_map(Op::Restore),
        // Rarely: an empty request or no candidates (refused, nothing changes).
        1 => (0..PODS.len()).prop_map(|p| Op::Request(p, BTreeMap::new(), 0, vec![0])),
        1 => (0..PODS.len()).prop_map(|p| Op::Request(p, BTreeMap::from([(0, 1)]), 0, Vec::new())),
    ]
}

fn pod(i: usize) -> PodRef {
    PodRef {
        namespace: "default".into(),
        name: PODS[i].into(),
        uid: PODS[i].into(),
    }
}

/// Every slot has at most one holder; reserved slots exist, are seen by
/// the reserved node and match the request; only `Reserved` holds; no NUMA
/// node has more CPUs reserved than its node says are free, counting only
/// pods not yet holding theirs.
fn check(
    l: &ReservationDecider,
    claims: &BTreeMap<String, String>,
    cpus: &BTreeMap<usize, NodeCpus>,
) -> Result<(), TestCaseError> {
    prop_assert!(
        l.index_is_true(),
        "the kept index differs from one rebuilt from scratch"
    );
    let mut held: BTreeMap<String, String> = claims.clone();
    let mut numa_held: BTreeMap<(String, u32), u32> = BTreeMap::new();
    for r in l.reservations() {
        if !r.holds() {
            prop_assert!(r.slots.is_empty(), "{r:?} holds slots while {:?}", r.phase);
            prop_assert!(r.numa.is_none(), "{r:?} holds CPUs while {:?}", r.phase);
            continue;
        }
        prop_assert_eq!(
            r.cpus > 0,
            r.numa.is_some(),
            "CPUs wanted but not held: {:?}",
            r
        );
        if let (Some(k), Some(node)) = (r.numa, &r.node) {
            let i = NODES.iter().position(|n| n == node).unwrap_or(0);
            let c = cpus.get(&i).ok_or_else(|| {
                TestCaseError::fail(format!("CPUs held on {node} that publishes none"))
            })?;
            if !c.holders.contains(&r.pod.uid) {
                *numa_held.entry((node.clone(), k)).or_default() += r.cpus;
            }
        }
        let node = r
            .node
            .clone()
            .ok_or_else(|| TestCaseError::fail("Reserved without a node"))?;
        let mut per: BTreeMap<String, u32> = BTreeMap::new();
        for s in &r.slots {
            let (inst, n) = s
                .rsplit_once('-')
                .ok_or_else(|| TestCaseError::fail("bad slot id"))?;
            let n: u32 = n
                .parse()
                .map_err(|_| TestCaseError::fail("bad slot number"))?;
            let cap = l
                .instance(inst)
                .ok_or_else(|| TestCaseError::fail(format!("{s} of a missing instance")))?;
            prop_assert!(n < cap.capacity, "{s} beyond capacity {}", cap.capacity);
            prop_assert!(cap.nodes.contains(&node), "{s} not seen by {node}");
            *per.entry(inst.to_owned()).or_default() += 1;
            if let Some(other) = held.insert(s.clone(), r.pod.uid.clone()) {
                prop_assert_eq!(
                    &other,
                    &r.pod.uid,
                    "slot {} held by {} and {}",
                    s,
                    other,
                    r.pod.uid
                );
            }
        }
        prop_assert_eq!(&per, &r.request, "reserved slots do not match the request");
    }
    for ((node, k), n) in numa_held {
        let i = NODES.iter().position(|x| *x == node).unwrap_or(0);
        let free = cpus
            .get(&i)
            .and_then(|c| c.free.get(&k))
            .copied()
            .unwrap_or(0);
        prop_assert!(
            n <= free,
            "{n} CPUs reserved on {node} NUMA {k} with {free} free"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn no_slot_is_ever_held_twice_and_nothing_is_stuck(ops in proptest::collection::vec(op(), 1..60)) {
        let mut l = ReservationDecider::new(TTL);
        // The cluster's claims as the nodes made them (mirrors the ledger's).
        let mut claims: BTreeMap<String, String> = BTreeMap::new();
        let mut now = Millis(0);
        // Decisions as a controller would have written them (possibly
        // stale by the time a successor reads them back).
        let mut saved: BTreeMap<usize, crate::reservation::Reservation> = BTreeMap::new();
        // What each node's resource manager last published.
        let mut cpus: BTreeMap<usize, NodeCpus> = BTreeMap::new();
        for op in ops {
            match op {
                Op::SetInstance(i, capacity, nodes) => {
                    let nodes = nodes.into_iter().map(|n| NODES[n].to_owned()).collect();
                    l.set_instance(INSTANCES[i], InstanceCapacity { capacity, nodes });
                }
                Op::RemoveInstance(i) => {
                    l.remove_instance(INSTANCES[i]);
                }
                Op::NodeCpus(n, free, holders) => {
                    let published = free.map(|(a, b)| NodeCpus {
                        free: BTreeMap::from([(0, a), (1, b)]),
                        holders: (0..PODS.len()).filter(|p| holders & (1 << p) != 0).map(|p| PODS[p].to_owned()).collect(),
                    });
                    match &published {
                        Some(c) => cpus.insert(n, c.clone()),
                        None => cpus.remove(&n),
                    };
                    l.set_node_cpus(NODES[n], published);
                }
                Op::Request(p, req, want, cands) => {
                    let req: SlotRequest = req.into_iter().map(|(i, n)| (INSTANCES[i].to_owned(), n)).collect();
                    let cands: Vec<String> = cands.into_iter().map(|n| NODES[n].to_owned()).collect();
                    let before = l.reservation(PODS[p]).cloned();
                    if l.request_with_cpus(pod(p), req, want, cands, now).is_err() {
                        prop_assert_eq!(before, l.reservation(PODS[p]).cloned(), "a refused request changed the ledger");
                    }
                }
                Op::Decide(p) => {
                    let before = l.reservation(PODS[p]).cloned();
                    let _ = l.decide(PODS[p], now);
                    let after = l.reservation(PODS[p]).cloned();
                    if let Some(a) = &after {
                        saved.insert(p, a.clone());
                    }
                    if let (Some(b), Some(a)) = (before, after) {
                        if b.phase == Phase::Requested {
                            prop_assert!(matches!(a.phase, Phase::Reserved | Phase::Rejected));
                            if a.phase == Phase::Rejected {
                                // Rejected only when no candidate fits.
                                for n in &a.candidates {
                                    let fits = l.fit(&a.request, n, &a.pod.uid).is_ok() && l.fit_cpus(n, &a.pod.uid, a.cpus).is_ok();
                                    prop_assert!(!fits, "{n} fits yet rejected");
                                }
                            }
                        } else {
                            prop_assert_eq!(b, a, "deciding a decided reservation changed it");
                        }
                    }
                }
                Op::Claim(i, p, k) => {
                    let free = l.free_slots(INSTANCES[i], PODS[p]);
                    if let Some(n) = free.get(k % free.len().max(1)) {
                        let slot = slot_id(INSTANCES[i], *n);
                        if !claims.contains_key(&slot) {
                            claims.insert(slot.clone(), PODS[p].to_owned());
                            l.claim_observed(&slot, PODS[p]);
                        }
                    }
                }
                Op::Release(i, n) => {
                    let slot = slot_id(INSTANCES[i], n);
                    claims.remove(&slot);
                    l.claim_released(&slot);
                }
                Op::Cancel(p) => {
                    l.cancel(PODS[p], "unreserve");
                    prop_assert!(l.reservation(PODS[p]).is_none_or(|r| !r.holds()));
                }
                Op::Bound(p, n) => {
                    l.bound(PODS[p], NODES[n]);
                    prop_assert!(l.reservation(PODS[p]).is_none_or(|r| !r.holds() || r.node.as_deref() == Some(NODES[n])));
                }
                Op::Forget(p) => {
                    l.forget(PODS[p]);
                    prop_assert!(l.reservation(PODS[p]).is_none());
                }
                Op::Restore(p) => {
                    if let Some(r) = saved.get(&p).cloned() {
                        l.restore(r.clone());
                        let now_r = l.reservation(PODS[p]).cloned();
                        prop_assert!(now_r.is_some());
                        if let Some(n) = now_r {
                            prop_assert!(n.phase == r.phase || (r.phase == Phase::Reserved && n.phase == Phase::Requested));
                            if n.phase == Phase::Reserved {
                                prop_assert_eq!(&n.slots, &r.slots, "a restored reservation moved");
                                prop_assert_eq!(n.numa, r.numa, "restored CPUs moved");
                            }
                        }
                    }
                }
                Op::Tick(dt) => {
                    now = Millis(now.0 + dt);
                    l.expire(now);
                    // Nothing holds past its time to live.
                    for r in l.reservations() {
                        if r.holds() {
                            prop_assert!(now.since(r.decided_at.unwrap_or(now)) < TTL);
                        }
                    }
                }
            }
            check(&l, &claims, &cpus)?;
        }
    }
}

#[test]
fn a_shared_instance_is_counted_once_across_its_nodes() {
    let mut l = ReservationDecider::new(TTL);
    let nodes: BTreeSet<String> = NODES.iter().map(|n| n.to_string()).collect();
    l.set_instance("cam", InstanceCapacity { capacity: 2, nodes });
    // Three nodes each advertise 2 slots; only 2 pods can be reserved.
    let req: SlotRequest = [("cam".to_owned(), 1)].into();
    for (p, node) in [(0, "n1"), (1, "n2"), (2, "n3")] {
        l.request(pod(p), req.clone(), vec![node.into()], Millis(0))
            .unwrap();
        l.decide(PODS[p], Millis(0)).unwrap();
    }
    let phases: Vec<Phase> = (0..3)
        .map(|p| l.reservation(PODS[p]).unwrap().phase)
        .collect();
    assert_eq!(phases, [Phase::Reserved, Phase::Reserved, Phase::Rejected]);
    let reason = l.reservation(PODS[2]).unwrap().reason.clone().unwrap();
    assert!(
        reason.contains("n3: cam: 0 of 2 slots free, 1 wanted"),
        "{reason}"
    );

    // p0 runs: its claim consumes the reservation; p1 is unreserved; p2's
    // retry now fits.
    assert_eq!(
        l.claim_observed("cam-0", PODS[0]),
        vec![Change::Consumed {
            uid: PODS[0].into()
        }]
    );
    l.cancel(PODS[1], "unreserve");
    l.request(pod(2), req, vec!["n3".into()], Millis(5))
        .unwrap();
    l.decide(PODS[2], Millis(5)).unwrap();
    let r = l.reservation(PODS[2]).unwrap();
    assert_eq!(r.phase, Phase::Reserved);
    assert_eq!(r.slots, BTreeSet::from(["cam-1".to_owned()]));
    // Not consumed in time: released.
    assert_eq!(l.expire(Millis(5 + TTL)).len(), 1);
    assert_eq!(l.holder("cam-1"), None);
}

#[test]
fn exclusive_cpus_are_counted_per_numa_node_until_the_pod_holds_them() {
    let mut l = ReservationDecider::new(TTL);
    let published = |holders: &[usize]| NodeCpus {
        free: BTreeMap::from([(0, 4), (1, 2)]),
        holders: holders.iter().map(|p| PODS[*p].to_owned()).collect(),
    };
    l.set_node_cpus("n1", Some(published(&[])));
    // 3 CPUs fit NUMA 0 only; 2 fit NUMA 1 (the tighter); a second 3 fits nowhere.
    for (p, want) in [(0, 3), (1, 2), (2, 3)] {
        l.request_with_cpus(
            pod(p),
            SlotRequest::new(),
            want,
            vec!["n1".into()],
            Millis(0),
        )
        .unwrap();
        l.decide(PODS[p], Millis(0)).unwrap();
    }
    let numa = |p: usize| l.reservation(PODS[p]).and_then(|r| r.numa);
    assert_eq!((numa(0), numa(1)), (Some(0), Some(1)));
    let r2 = l.reservation(PODS[2]).unwrap();
    assert_eq!(r2.phase, Phase::Rejected);
    assert!(
        r2.reason
            .as_deref()
            .unwrap_or("")
            .contains("n1: 3 exclusive CPUs wanted on one NUMA node, at most 1 free on any"),
        "{:?}",
        r2.reason
    );
    // A node without a resource manager cannot hold CPUs.
    assert!(matches!(
        l.fit_cpus("n2", PODS[3], 1),
        Err(Misfit::NoCpus { .. })
    ));
    // p0 starts: the node takes its 3 CPUs off NUMA 0 and names it; the
    // reservation is consumed, and nothing is counted twice.
    let mut running = published(&[0]);
    running.free.insert(0, 1);
    assert_eq!(
        l.set_node_cpus("n1", Some(running)),
        vec![Change::Consumed {
            uid: PODS[0].into()
        }]
    );
    assert_eq!(l.fit_cpus("n1", PODS[3], 1), Ok(Some(0)));
    // NUMA 1 shrinks under p1 (a CPU went offline): p1 is canceled.
    let mut shrunk = published(&[0]);
    shrunk.free = BTreeMap::from([(0, 1), (1, 1)]);
    let changes = l.set_node_cpus("n1", Some(shrunk));
    assert_eq!(
        changes,
        vec![Change::Phase {
            uid: PODS[1].into(),
            phase: Phase::Canceled
        }]
    );
}
