//! Tests every policy must pass: property tests of the allocation invariants, and CPUs held for reservations.

use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::cpu::testing::*;
use crate::cpu::*;

// ------------------------------------------------------------- properties

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        pod: u8,
        qos: u8,
        milli: u64,
        ns: u8,
        ann: u8,
    },
    Release {
        pod: u8,
    },
    /// Claims prepared: bit 0 `c1`, bit 1 `c2` ([`prop_claims`]).
    SetClaims {
        mask: u8,
    },
    /// A container of pod `pod` on claim `c1` or `c2`.
    AllocClaimed {
        pod: u8,
        second: bool,
    },
}

/// The two claims the property tests prepare: CPUs of NUMA node 0 and of
/// socket 1.
fn prop_claims(mask: u8) -> BTreeMap<String, CpuSet> {
    let mut out = BTreeMap::new();
    if mask & 1 != 0 {
        out.insert("c1".to_owned(), set("2,3"));
    }
    if mask & 2 != 0 {
        out.insert("c2".to_owned(), set("20-21"));
    }
    out
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..24, 0u8..3, 0u64..5000, 0u8..8, 0u8..8).prop_map(|(pod, qos, milli, ns, ann)| Op::Alloc { pod, qos, milli, ns, ann }),
        1 => (0u8..24).prop_map(|pod| Op::Release { pod }),
        1 => (0u8..4).prop_map(|mask| Op::SetClaims { mask }),
        1 => (0u8..24, any::<bool>()).prop_map(|(pod, second)| Op::AllocClaimed { pod, second }),
    ]
}

fn op_request(pod: u8, qos: u8, milli: u64, ns: u8, ann: u8) -> ContainerRequest {
    let qos = [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort][qos as usize];
    let milli = match qos {
        Qos::BestEffort => 0,
        // Guaranteed: mostly whole CPUs
        Qos::Guaranteed if !milli.is_multiple_of(3) => (milli / 1000 + 1) * 1000,
        _ => milli,
    };
    let mut r = req(&format!("p{pod}"), qos, milli);
    if ns == 0 {
        r.pod_namespace = "kube-system".into();
    }
    match ann {
        0 => {
            r.annotations
                .insert(ANN_PREFER_ISOLATED.into(), "true".into());
        }
        1 => {
            r.annotations
                .insert(ANN_PREFER_SHARED.into(), "true".into());
        }
        2 => {
            r.annotations.insert(ANN_BALLOON.into(), "small".into());
        }
        3 => {
            r.annotations
                .insert(ANN_MEMORY_TIER.into(), "dram,pmem".into());
        }
        4 => {
            // malformed: must be refused without change
            r.annotations
                .insert(ANN_PREFER_SHARED.into(), "maybe".into());
        }
        _ => {}
    }
    r
}

fn prop_topology() -> Topology {
    Topology::synthetic(&SyntheticSpec {
        sockets: 2,
        nodes_per_die: 2,
        cores_per_node: 3,
        threads_per_core: 2,
        memory_only_nodes: 1,
        isolated: set("5,17"),
        ..SyntheticSpec::default()
    })
    .unwrap()
}

fn prop_config() -> PolicyConfig {
    PolicyConfig {
        reserved_cpus: set("0,12"),
        balloons: vec![btype("small", 1, 3, 3)],
        ..PolicyConfig::default()
    }
}

/// A decision names exactly the containers whose assignment differs
/// between `before` and `after` (plus `asked`), each with its assignment
/// in `after`, each once.
fn check_exact(
    d: &Decision,
    before: &BTreeMap<ContainerKey, Assignment>,
    after: &BTreeMap<ContainerKey, Assignment>,
    asked: Option<&ContainerKey>,
) -> Result<(), TestCaseError> {
    let expanded = d.expand();
    let want: BTreeMap<ContainerKey, Assignment> = after
        .iter()
        .filter(|(k, a)| before.get(*k) != Some(*a) || Some(*k) == asked)
        .map(|(k, a)| (k.clone(), a.clone()))
        .collect();
    prop_assert_eq!(&expanded, &want, "decision is not exactly the change");
    prop_assert_eq!(d.len(), want.len(), "a container listed twice");
    prop_assert_eq!(d.is_empty(), want.is_empty());
    for (k, a) in &want {
        prop_assert_eq!(d.get(k), Some(a));
    }
    for (k, a) in &d.containers {
        // a pool that also names the container agrees with it
        for p in d.pools.iter().filter(|p| p.members.contains(k)) {
            prop_assert_eq!(&p.assignment, a);
        }
    }
    for p in &d.pools {
        prop_assert!(!p.members.is_empty(), "empty pool change");
    }
    Ok(())
}

/// Runs `ops`, checking the invariants after every step; returns the
/// decisions (or errors) for determinism checks.
fn run_ops(
    kind: PolicyKind,
    ops: &[Op],
) -> Result<Vec<Result<Decision, PolicyError>>, TestCaseError> {
    let t = prop_topology();
    let cfg = prop_config();
    let mut p = new_policy(kind, &t, &cfg).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut mirror: BTreeMap<ContainerKey, Assignment> = BTreeMap::new();
    let mut reqs: BTreeMap<ContainerKey, ContainerRequest> = BTreeMap::new();
    let mut out = Vec::new();
    for op in ops {
        let res = match *op {
            Op::Alloc {
                pod,
                qos,
                milli,
                ns,
                ann,
            } => {
                let r = op_request(pod, qos, milli, ns, ann);
                let before = p.assignments().clone();
                let res = p.allocate(&r);
                match &res {
                    Ok(d) => {
                        prop_assert!(d.contains(&r.key));
                        check_exact(d, &before, p.assignments(), Some(&r.key))?;
                        for (k, a) in d.iter() {
                            mirror.insert(k.clone(), a.clone());
                        }
                        reqs.insert(r.key.clone(), r.clone());
                    }
                    Err(_) => prop_assert_eq!(p.assignments(), &before, "a refusal changed state"),
                }
                if ann == 4 {
                    prop_assert!(res.is_err(), "malformed annotation accepted");
                }
                res
            }
            Op::Release { pod } => {
                let k = key(&format!("p{pod}"));
                let before = p.assignments().clone();
                let d = p.release(&k);
                prop_assert!(!d.contains(&k));
                check_exact(&d, &before, p.assignments(), None)?;
                mirror.remove(&k);
                reqs.remove(&k);
                for (k, a) in d.iter() {
                    mirror.insert(k.clone(), a.clone());
                }
                Ok(d)
            }
            Op::SetClaims { mask } => {
                let before = p.assignments().clone();
                let claims_before = p.claims().clone();
                let res = p.set_claims(prop_claims(mask));
                match &res {
                    Ok(d) => {
                        check_exact(d, &before, p.assignments(), None)?;
                        for (k, a) in d.iter() {
                            mirror.insert(k.clone(), a.clone());
                        }
                        // containers whose claims are gone run as any other
                        for (k, a) in p.assignments() {
                            if a.pool != CLAIM_POOL
                                && let Some(r) = reqs.get_mut(k)
                            {
                                r.cpu_claims.clear();
                            }
                        }
                    }
                    Err(_) => {
                        prop_assert_eq!(p.assignments(), &before, "a refusal changed state");
                        prop_assert_eq!(p.claims(), &claims_before, "a refusal changed the claims");
                    }
                }
                res
            }
            Op::AllocClaimed { pod, second } => {
                let mut r = req(&format!("p{pod}"), Qos::Burstable, 100);
                let uid = if second { "c2" } else { "c1" };
                r.cpu_claims = vec![uid.to_owned()];
                let before = p.assignments().clone();
                let res = p.allocate(&r);
                match &res {
                    Ok(d) => {
                        check_exact(d, &before, p.assignments(), Some(&r.key))?;
                        prop_assert_eq!(
                            &d.get(&r.key).map(|a| a.cpus.clone()),
                            &p.claims().get(uid).cloned()
                        );
                        for (k, a) in d.iter() {
                            mirror.insert(k.clone(), a.clone());
                        }
                        reqs.insert(r.key.clone(), r.clone());
                    }
                    Err(_) => {
                        prop_assert!(!p.claims().contains_key(uid), "a prepared claim refused");
                        prop_assert_eq!(p.assignments(), &before, "a refusal changed state");
                    }
                }
                res
            }
        };
        let claimed: CpuSet = p
            .claims()
            .values()
            .fold(CpuSet::new(), |acc, c| acc.union(c));
        // decisions carry every change
        prop_assert_eq!(&mirror, p.assignments());
        let asg = p.assignments();
        for (k, a) in asg {
            let r = &reqs[k];
            prop_assert!(!a.cpus.is_empty(), "{} has no CPU", k);
            prop_assert!(a.cpus.is_subset(t.online_cpus()));
            prop_assert!(!a.mems.is_empty());
            let on_reserved = !a.cpus.is_disjoint(&cfg.reserved_cpus);
            if on_reserved {
                prop_assert!(
                    r.pod_namespace == "kube-system" && !a.exclusive,
                    "reserved CPU handed to {}",
                    k
                );
            }
            if a.pool == CLAIM_POOL {
                let mine = r
                    .cpu_claims
                    .iter()
                    .filter_map(|c| p.claims().get(c))
                    .fold(CpuSet::new(), |acc, c| acc.union(c));
                prop_assert_eq!(&a.cpus, &mine, "{} is not on its claims' CPUs", k);
            } else {
                prop_assert!(
                    a.cpus.is_disjoint(&claimed),
                    "{} runs on CPUs prepared for a claim",
                    k
                );
            }
            if a.exclusive {
                for (k2, a2) in asg {
                    if k2 != k && !(a.pool == CLAIM_POOL && a2.pool == CLAIM_POOL) {
                        prop_assert!(
                            a.cpus.is_disjoint(&a2.cpus),
                            "exclusive CPUs of {} shared with {}",
                            k,
                            k2
                        );
                    }
                }
            }
            if kind == PolicyKind::Balloons {
                for (k2, a2) in asg {
                    if a2.pool != a.pool {
                        prop_assert!(
                            a.cpus.is_disjoint(&a2.cpus),
                            "balloons of {} and {} overlap",
                            k,
                            k2
                        );
                    }
                }
            }
            if kind == PolicyKind::Static && !a.exclusive && a.pool == "shared" {
                // the shared pool is everything not exclusive, reserved or isolated
                let excl: CpuSet = asg
                    .values()
                    .filter(|x| x.exclusive)
                    .fold(CpuSet::new(), |acc, x| acc.union(&x.cpus));
                let expect = t
                    .online_cpus()
                    .difference(&cfg.reserved_cpus)
                    .difference(t.isolated_cpus())
                    .difference(&claimed)
                    .difference(&excl);
                prop_assert_eq!(&a.cpus, &expect);
            }
        }
        out.push(res);
    }
    // restore from the final state reproduces it without changes
    let persisted: Vec<_> = p
        .assignments()
        .iter()
        .map(|(k, a)| (reqs[k].clone(), a.clone()))
        .collect();
    let mut q = new_policy(kind, &t, &cfg).map_err(|e| TestCaseError::fail(e.to_string()))?;
    q.set_claims(p.claims().clone())
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let d = q
        .restore(persisted)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    if kind != PolicyKind::Balloons {
        prop_assert!(
            d.is_empty(),
            "restore changed {:?}",
            d.iter().map(|(k, _)| k).collect::<Vec<_>>()
        );
    }
    for (k, a) in d.iter() {
        prop_assert_eq!(Some(a), q.assignments().get(k));
    }
    prop_assert_eq!(q.assignments().len(), p.assignments().len());
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn static_invariants(ops in proptest::collection::vec(op(), 1..60)) {
        let a = run_ops(PolicyKind::Static, &ops)?;
        let b = run_ops(PolicyKind::Static, &ops)?;
        prop_assert_eq!(a, b, "non-deterministic");
    }

    #[test]
    fn topology_aware_invariants(ops in proptest::collection::vec(op(), 1..60)) {
        let a = run_ops(PolicyKind::TopologyAware, &ops)?;
        let b = run_ops(PolicyKind::TopologyAware, &ops)?;
        prop_assert_eq!(a, b, "non-deterministic");
    }

    #[test]
    fn balloons_invariants(ops in proptest::collection::vec(op(), 1..60)) {
        let a = run_ops(PolicyKind::Balloons, &ops)?;
        let b = run_ops(PolicyKind::Balloons, &ops)?;
        prop_assert_eq!(a, b, "non-deterministic");
    }

    #[test]
    fn none_invariants(ops in proptest::collection::vec(op(), 1..40)) {
        run_ops(PolicyKind::None, &ops)?;
    }
}

// ---------------------------------------------------------- reservations

#[test]
fn cpus_held_for_a_reservation_are_left_to_its_pod() {
    let t = smt16();
    for kind in [PolicyKind::Static, PolicyKind::TopologyAware] {
        let mut p = new_policy(kind, &t, &PolicyConfig::default()).unwrap();
        // Pod "r" has 4 CPUs reserved on NUMA node 0 (CPUs 0,1,8,9).
        p.set_holds(BTreeMap::from([("r".to_owned(), (0, 4))]));
        let other = p.allocate(&req("g", Qos::Guaranteed, 2000)).unwrap();
        let g = other.get(&key("g")).unwrap().cpus.clone();
        assert!(
            g.is_disjoint(&t.node_cpus(0)),
            "{kind:?}: another pod took held CPUs {g}"
        );
        let mine = p.allocate(&req("r", Qos::Guaranteed, 4000)).unwrap();
        assert_eq!(
            mine.get(&key("r")).unwrap().cpus,
            t.node_cpus(0),
            "{kind:?}: the pod gets the NUMA node held for it"
        );
        // Once it holds them, its hold no longer withholds anything.
        assert!(p.allocate(&req("h", Qos::Guaranteed, 4000)).is_ok());
    }
}

#[test]
fn holds_that_leave_too_little_refuse_other_pods() {
    let t = smt16();
    let mut p = static_policy(&t, "0,8");
    // 14 CPUs in the shared pool, 12 held: the pool keeps one after the
    // held ones are taken, so one more CPU can go.
    p.set_holds(BTreeMap::from([
        ("a".to_owned(), (1, 4)),
        ("b".to_owned(), (2, 4)),
        ("c".to_owned(), (3, 4)),
    ]));
    let e = p.allocate(&req("g", Qos::Guaranteed, 4000)).unwrap_err();
    assert!(e.to_string().contains("reserved for other pods"), "{e}");
    let e = p.allocate(&req("g", Qos::Guaranteed, 2000)).unwrap_err();
    assert!(e.to_string().contains("must keep at least one"), "{e}");
    assert!(p.allocate(&req("g", Qos::Guaranteed, 1000)).is_ok());
}
