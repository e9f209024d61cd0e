//! Tests of the `static` policy.

use crate::cpu::testing::*;
use crate::cpu::*;

#[test]
fn static_gives_exclusive_cpus_and_shrinks_shared_pool() {
    let t = smt16();
    let mut p = static_policy(&t, "0,8");
    let d = p.allocate(&req("be", Qos::BestEffort, 0)).unwrap();
    assert_eq!(d.get(&key("be")).unwrap().cpus, set("1-7,9-15"));
    assert_eq!(d.get(&key("be")).unwrap().pool, "shared");
    let d = p.allocate(&req("g", Qos::Guaranteed, 2000)).unwrap();
    let g = &d.get(&key("g")).unwrap();
    assert!(g.exclusive);
    // the whole free core of node 0, not the reserved one
    assert_eq!(g.cpus, set("1,9"));
    // the shared container's pool shrank: it is in the decision
    assert_eq!(d.get(&key("be")).unwrap().cpus, set("2-7,10-15"));
    // fractional Guaranteed and Burstable share
    let d = p.allocate(&req("f", Qos::Guaranteed, 1500)).unwrap();
    assert_eq!(d.len(), 1);
    assert!(!d.get(&key("f")).unwrap().exclusive);
    let d = p.allocate(&req("b", Qos::Burstable, 3000)).unwrap();
    assert!(!d.get(&key("b")).unwrap().exclusive);
    // opt-out of exclusivity
    let shared = annotated(req("s", Qos::Guaranteed, 1000), ANN_PREFER_SHARED, "true");
    assert!(
        !p.allocate(&shared)
            .unwrap()
            .get(&key("s"))
            .unwrap()
            .exclusive
    );
    // release gives the CPUs back to every shared container, stated once
    // for the pool
    let d = p.release(&key("g"));
    assert_eq!(d.len(), 4);
    assert!(d.iter().map(|(_, a)| a).all(|a| a.cpus == set("1-7,9-15")));
    assert!(d.containers.is_empty(), "{d:?}");
    assert_eq!(d.pools.len(), 1);
    assert_eq!(d.pools[0].assignment.pool, "shared");
    assert_eq!(
        d.pools[0].members.iter().collect::<Vec<_>>(),
        [key("b"), key("be"), key("f"), key("s")]
            .iter()
            .collect::<Vec<_>>()
    );
    assert_eq!(d.expand().len(), 4);
    // an exclusive grant: its own assignment plus the shrunk pool
    let d = p.allocate(&req("g2", Qos::Guaranteed, 1000)).unwrap();
    assert_eq!(d.containers.keys().collect::<Vec<_>>(), [&key("g2")]);
    assert_eq!(d.pools.len(), 1);
    assert_eq!(d.len(), 5);
    assert!(d.get(&key("g2")).unwrap().exclusive);
    assert!(
        d.get(&key("be"))
            .unwrap()
            .cpus
            .is_disjoint(&d.get(&key("g2")).unwrap().cpus)
    );
    // a snapshot held by the caller is not changed by later decisions
    let held = d.clone();
    p.release(&key("be"));
    p.release(&key("g2"));
    assert!(held.contains(&key("be")));
    assert_eq!(held.len(), 5);
    assert!(!p.assignments().contains_key(&key("g")));
    // unknown key: nothing
    assert_eq!(p.release(&key("nope")), Decision::default());
}

#[test]
fn static_keeps_one_shared_cpu_and_refusals_change_nothing() {
    let t = smt16();
    let mut p = static_policy(&t, "0");
    p.allocate(&req("be", Qos::BestEffort, 0)).unwrap();
    let before = p.assignments().clone();
    // 15 allocatable: 15 exclusive would leave the shared pool empty
    let err = p
        .allocate(&req("huge", Qos::Guaranteed, 15_000))
        .unwrap_err();
    assert!(matches!(err, PolicyError::Insufficient { .. }), "{err}");
    assert_eq!(p.assignments(), &before);
    let d = p.allocate(&req("big", Qos::Guaranteed, 14_000)).unwrap();
    assert_eq!(d.get(&key("be")).unwrap().cpus.len(), 1);
    // absurd request and bad annotation: clear errors, no change
    let before = p.assignments().clone();
    assert!(matches!(
        p.allocate(&req("x", Qos::Guaranteed, u64::MAX)),
        Err(PolicyError::BadRequest { .. })
    ));
    let bad = annotated(
        req("y", Qos::Burstable, 1),
        "memory.steward.dev/teir",
        "dram",
    );
    assert!(matches!(
        p.allocate(&bad),
        Err(PolicyError::UnknownAnnotation { key }) if key == "memory.steward.dev/teir"
    ));
    let mut lim = req("z", Qos::Burstable, 500);
    lim.cpu_limit_milli = Some(100);
    assert!(matches!(
        p.allocate(&lim),
        Err(PolicyError::BadRequest { .. })
    ));
    assert_eq!(p.assignments(), &before);
}

#[test]
fn static_reserved_cpus_only_for_reserved_namespaces() {
    let t = smt16();
    let mut p = static_policy(&t, "0,8");
    let mut sys = req("sys", Qos::Guaranteed, 1000);
    sys.pod_namespace = "kube-system".into();
    let a = p.allocate(&sys).unwrap().get(&sys.key).unwrap().clone();
    assert_eq!(
        (a.cpus, a.exclusive, a.pool.as_str()),
        (set("0,8"), false, "reserved")
    );
    for i in 0..7 {
        let d = p.allocate(&req(&format!("g{i}"), Qos::Guaranteed, 2000));
        if let Ok(d) = d {
            assert!(
                d.iter()
                    .map(|(_, a)| a)
                    .filter(|a| a.exclusive)
                    .all(|a| a.cpus.is_disjoint(&set("0,8")))
            );
        }
    }
    // reserved CPUs outside online are a config error
    assert!(matches!(
        new_policy(
            PolicyKind::Static,
            &t,
            &PolicyConfig {
                reserved_cpus: set("40"),
                ..PolicyConfig::default()
            }
        ),
        Err(PolicyError::BadConfig(_))
    ));
    assert!(matches!(
        new_policy(
            PolicyKind::Static,
            &t,
            &PolicyConfig {
                reserved_cpus: set("0-15"),
                ..PolicyConfig::default()
            }
        ),
        Err(PolicyError::BadConfig(_))
    ));
}

#[test]
fn static_isolated_cpus_only_on_request() {
    let t = Topology::synthetic(&SyntheticSpec {
        cores_per_node: 4,
        threads_per_core: 2,
        isolated: set("2,6"),
        offline: set("3,7"),
        ..SyntheticSpec::default()
    })
    .unwrap();
    assert_eq!(t.online_cpus(), &set("0-2,4-6"));
    let mut p = static_policy(&t, "0");
    let d = p.allocate(&req("be", Qos::BestEffort, 0)).unwrap();
    assert_eq!(d.get(&key("be")).unwrap().cpus, set("1,4-5"));
    let iso = annotated(
        req("iso", Qos::Guaranteed, 2000),
        ANN_PREFER_ISOLATED,
        "true",
    );
    let d = p.allocate(&iso).unwrap();
    assert_eq!(d.get(&key("iso")).unwrap().cpus, set("2,6"));
    assert_eq!(d.len(), 1, "shared pool unchanged");
    // no isolated CPU left: falls back to ordinary CPUs
    let iso2 = annotated(
        req("iso2", Qos::Guaranteed, 1000),
        ANN_PREFER_ISOLATED,
        "true",
    );
    let d = p.allocate(&iso2).unwrap();
    assert!(d.get(&key("iso2")).unwrap().cpus.is_subset(&set("1,4-5")));
}

#[test]
fn static_reallocate_keeps_cpus_and_restore_reports_differences() {
    let t = smt16();
    let mut p = static_policy(&t, "0");
    p.allocate(&req("a", Qos::Guaranteed, 2000)).unwrap();
    p.allocate(&req("b", Qos::Guaranteed, 1000)).unwrap();
    p.allocate(&req("s", Qos::Burstable, 100)).unwrap();
    let a_cpus = p.assignments()[&key("a")].cpus.clone();
    let d = p.allocate(&req("a", Qos::Guaranteed, 2000)).unwrap();
    assert_eq!(d.get(&key("a")).unwrap().cpus, a_cpus);
    assert_eq!(d.len(), 1);
    // restart: a new policy restores the same state, nothing to change
    let persisted: Vec<_> = ["a", "b", "s"]
        .iter()
        .map(|k| {
            let r = if *k == "s" {
                req(k, Qos::Burstable, 100)
            } else if *k == "a" {
                req(k, Qos::Guaranteed, 2000)
            } else {
                req(k, Qos::Guaranteed, 1000)
            };
            (r, p.assignments()[&key(k)].clone())
        })
        .collect();
    let mut q = static_policy(&t, "0");
    let d = q.restore(persisted.clone()).unwrap();
    assert!(d.is_empty(), "{d:?}");
    assert_eq!(q.assignments(), p.assignments());
    // a corrupted cache: b claims a's CPUs; a keeps them (sorted first), b moves
    let mut bad = persisted.clone();
    bad[1].1.cpus = a_cpus.iter().take(1).collect();
    let mut q = static_policy(&t, "0");
    let d = q.restore(bad).unwrap();
    assert!(d.contains(&key("b")));
    assert!(q.assignments()[&key("b")].cpus.is_disjoint(&a_cpus));
    // restore with an invalid request fails and changes nothing
    let before = q.assignments().clone();
    let mut broken = persisted;
    broken[0]
        .0
        .annotations
        .insert("cpu.steward.dev/x".into(), "1".into());
    assert!(q.restore(broken).is_err());
    assert_eq!(q.assignments(), &before);
}

#[test]
fn reconfigure_moves_containers_off_new_reserved_cpus() {
    let t = smt16();
    let mut p = static_policy(&t, "0");
    p.allocate(&req("s", Qos::Burstable, 100)).unwrap();
    p.allocate(&req("a", Qos::Guaranteed, 2000)).unwrap();
    let a = p.assignments()[&key("a")].cpus.clone();
    let cfg = PolicyConfig {
        reserved_cpus: a.clone(),
        ..PolicyConfig::default()
    };
    let d = p.reconfigure(&cfg).unwrap();
    assert!(d.get(&key("a")).unwrap().cpus.is_disjoint(&a));
    assert!(d.get(&key("s")).unwrap().cpus.is_disjoint(&a));
    let new_a = &d.get(&key("a")).unwrap().cpus;
    assert_eq!(
        d.get(&key("s")).unwrap().cpus,
        t.online_cpus().difference(&a).difference(new_a)
    );
    // a bad config is refused and nothing changes
    let before = p.assignments().clone();
    assert!(
        p.reconfigure(&PolicyConfig {
            reserved_cpus: set("99"),
            ..PolicyConfig::default()
        })
        .is_err()
    );
    assert_eq!(p.assignments(), &before);
}
