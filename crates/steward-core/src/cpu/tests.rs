//! Tests of the cpu module: cpusets, topology, request derivation,
//! annotations, the CPU picker and every policy, plus property tests of the
//! allocation invariants.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

/// 2 sockets × 2 NUMA nodes × 2 cores × 2 threads = 16 CPUs. CPU ids:
/// core k has threads k and k+8; node n holds cores 2n, 2n+1.
fn smt16() -> Topology {
    Topology::synthetic(&SyntheticSpec {
        sockets: 2,
        nodes_per_die: 2,
        cores_per_node: 2,
        threads_per_core: 2,
        memory_per_node: 4 << 30,
        ..SyntheticSpec::default()
    })
    .unwrap()
}

fn req(pod: &str, qos: Qos, milli: u64) -> ContainerRequest {
    ContainerRequest {
        key: ContainerKey::new(pod, "c"),
        pod_namespace: "default".into(),
        pod_name: pod.into(),
        qos,
        cpu_request_milli: milli,
        cpu_limit_milli: (qos == Qos::Guaranteed).then_some(milli),
        memory_request_bytes: 0,
        memory_limit_bytes: None,
        annotations: BTreeMap::new(),
    }
}

fn annotated(mut r: ContainerRequest, k: &str, v: &str) -> ContainerRequest {
    r.annotations.insert(k.into(), v.into());
    r
}

fn key(pod: &str) -> ContainerKey {
    ContainerKey::new(pod, "c")
}

// ---------------------------------------------------------------- cpuset

#[test]
fn cpuset_parses_and_prints_canonical_list() {
    assert_eq!(set("0-3,8,10-11").to_string(), "0-3,8,10-11");
    assert_eq!(set("11,10,8,3,2,1,0").to_string(), "0-3,8,10-11");
    assert_eq!(set(" 0-1 , 5\n").to_string(), "0-1,5");
    assert_eq!(set("7-7").to_string(), "7");
    assert!(set("").is_empty());
    assert_eq!(set("\n").len(), 0);
    assert_eq!(set("0-3,8").len(), 5);
    assert_eq!(
        set("62-66").iter().collect::<Vec<_>>(),
        vec![62, 63, 64, 65, 66]
    );
}

#[test]
fn cpuset_rejects_malformed_input() {
    for bad in ["a", "1-", "-1", "1,,2", ",", "1-2-3", "0x3", "+1", "1 2"] {
        assert!(
            matches!(CpuSet::parse(bad), Err(CpuSetError::Syntax { .. })),
            "{bad:?} should be a syntax error"
        );
    }
    assert!(matches!(
        CpuSet::parse("5-3"),
        Err(CpuSetError::ReversedRange { .. })
    ));
    assert!(matches!(
        CpuSet::parse("0-4294967295"),
        Err(CpuSetError::TooLarge { .. })
    ));
    assert!(matches!(
        CpuSet::parse("99999999999999999999999"),
        Err(CpuSetError::TooLarge { .. })
    ));
    let msg = CpuSet::parse("1,x").unwrap_err().to_string();
    assert!(msg.contains("\"x\""), "{msg}");
}

#[test]
fn cpuset_operations() {
    let a = set("0-7");
    let b = set("4-11");
    assert_eq!(a.union(&b), set("0-11"));
    assert_eq!(a.intersection(&b), set("4-7"));
    assert_eq!(a.difference(&b), set("0-3"));
    assert_eq!(b.difference(&a), set("8-11"));
    assert_eq!(a.intersection_len(&b), 4);
    assert!(set("1-2").is_subset(&a));
    assert!(!b.is_subset(&a));
    assert!(set("0-1").is_disjoint(&set("2-3")));
    // canonical: equal sets compare equal whatever built them
    let mut c = set("0-100");
    for i in 5..=100 {
        c.remove(i);
    }
    assert_eq!(c, set("0-4"));
}

#[test]
fn cpuset_beyond_inline_storage_stays_canonical() {
    let mut big = set("250-260,1000");
    assert_eq!(big.len(), 12);
    assert!(big.contains(1000) && big.contains(256));
    big.remove(1000);
    assert_eq!(big, set("250-260"));
    for i in 256..=260 {
        big.remove(i);
    }
    // back under 256 ids: equal (and hashing equal) to a set built small
    assert_eq!(big, set("250-255"));
    let h = |s: &CpuSet| {
        use std::hash::{Hash, Hasher};
        let mut st = std::collections::hash_map::DefaultHasher::new();
        s.hash(&mut st);
        st.finish()
    };
    assert_eq!(h(&big), h(&set("250-255")));
    assert_eq!(set("0-3").union(&set("300")), set("0-3,300"));
    assert_eq!(set("0-3,300").intersection(&set("3,300")), set("3,300"));
    assert_eq!(set("0-3,300").difference(&set("300")), set("0-3"));
    assert!(set("0-3").is_subset(&set("0-3,300")));
    assert!(!set("0-3,300").is_subset(&set("0-3")));
    let mut u = set("1");
    u.union_with(&set("700"));
    u.difference_with(&set("700"));
    assert_eq!(u, set("1"));
    assert_eq!(CpuSet::range(0, MAX_ID).len(), MAX_ID as usize + 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn cpuset_ops_match_btreeset(
        a in proptest::collection::btree_set(0u32..600, 0..40),
        b in proptest::collection::btree_set(0u32..600, 0..40),
    ) {
        let sa: CpuSet = a.iter().copied().collect();
        let sb: CpuSet = b.iter().copied().collect();
        let of = |x: std::collections::BTreeSet<u32>| -> CpuSet { x.into_iter().collect() };
        prop_assert_eq!(sa.union(&sb), of(a.union(&b).copied().collect()));
        prop_assert_eq!(sa.intersection(&sb), of(a.intersection(&b).copied().collect()));
        prop_assert_eq!(sa.difference(&sb), of(a.difference(&b).copied().collect()));
        prop_assert_eq!(sa.intersection_len(&sb), a.intersection(&b).count());
        prop_assert_eq!(sa.is_subset(&sb), a.is_subset(&b));
        let mut m = sa.clone();
        m.difference_with(&sb);
        prop_assert_eq!(m, sa.difference(&sb));
    }

    #[test]
    fn cpuset_display_parse_roundtrip(ids in proptest::collection::btree_set(0u32..300, 0..60)) {
        let s: CpuSet = ids.iter().copied().collect();
        let back = CpuSet::parse(&s.to_string()).unwrap();
        prop_assert_eq!(&back, &s);
        prop_assert_eq!(back.iter().collect::<Vec<_>>(), ids.into_iter().collect::<Vec<_>>());
    }
}

// -------------------------------------------------------------- topology

#[test]
fn synthetic_topology_shape() {
    let t = smt16();
    assert_eq!(t.online_cpus(), &set("0-15"));
    assert_eq!(t.sockets().count(), 2);
    assert_eq!(t.node_ids(), set("0-3"));
    assert_eq!(t.node_cpus(0), set("0-1,8-9"));
    assert_eq!(t.socket_cpus(1), set("4-7,12-15"));
    assert_eq!(t.siblings(3), set("3,11"));
    assert_eq!(t.threads_per_core(), 2);
    assert_eq!(t.cores().len(), 8);
    assert_eq!(t.distance(0, 1), 12);
    assert_eq!(t.distance(0, 2), 32);
}

#[test]
fn topology_rejects_inconsistent_input() {
    let node = NumaNode {
        id: 0,
        memory_bytes: 1,
        kind: MemoryKind::Dram,
        distances: BTreeMap::new(),
    };
    let cpu = |id, node| Cpu {
        id,
        socket: 0,
        die: 0,
        core: id,
        node,
        isolated: false,
    };
    assert_eq!(
        Topology::new(vec![cpu(0, 1)], CpuSet::new(), vec![node.clone()]),
        Err(TopologyError::UnknownNode { cpu: 0, node: 1 })
    );
    assert_eq!(
        Topology::new(
            vec![cpu(0, 0), cpu(0, 0)],
            CpuSet::new(),
            vec![node.clone()]
        ),
        Err(TopologyError::DuplicateCpu(0))
    );
    assert_eq!(
        Topology::new(vec![cpu(0, 0)], set("0"), vec![node.clone()]),
        Err(TopologyError::OnlineAndOffline(0))
    );
    assert_eq!(
        Topology::new(vec![], CpuSet::new(), vec![node.clone()]),
        Err(TopologyError::NoCpus)
    );
    let t = Topology::new(vec![cpu(0, 0)], CpuSet::new(), vec![node]).unwrap();
    assert!(matches!(
        t.with_memory_kinds(&BTreeMap::from([(0, MemoryKind::Pmem)])),
        Err(TopologyError::BadKindOverride(0, "pmem"))
    ));
}

// --------------------------------------------------------------- requests

#[test]
fn qos_follows_kubernetes_rules() {
    let full = ContainerResources {
        cpu_request_milli: Some(1000),
        cpu_limit_milli: Some(1000),
        memory_request_bytes: Some(1 << 20),
        memory_limit_bytes: Some(1 << 20),
    };
    assert_eq!(qos_of(&[full]), Qos::Guaranteed);
    // requests default to limits
    let limits_only = ContainerResources {
        cpu_limit_milli: Some(500),
        memory_limit_bytes: Some(1 << 20),
        ..Default::default()
    };
    assert_eq!(qos_of(&[limits_only, full]), Qos::Guaranteed);
    let lower = ContainerResources {
        cpu_request_milli: Some(500),
        ..full
    };
    assert_eq!(qos_of(&[full, lower]), Qos::Burstable);
    let no_mem = ContainerResources {
        memory_limit_bytes: None,
        memory_request_bytes: None,
        ..full
    };
    assert_eq!(qos_of(&[no_mem]), Qos::Burstable);
    assert_eq!(qos_of(&[ContainerResources::default()]), Qos::BestEffort);
    assert_eq!(
        qos_of(&[ContainerResources::default(), full]),
        Qos::Burstable
    );
}

#[test]
fn cpu_request_recovered_exactly_from_shares() {
    // 1m and 2m both give the minimum 2 shares: indistinguishable from none
    for milli in 3..=70_000u64 {
        let shares = (milli * 1024 / 1000).max(2);
        assert_eq!(cpu_request_from_shares(shares), milli, "shares {shares}");
    }
    assert_eq!(cpu_request_from_shares(2), 0);
    assert_eq!(cpu_limit_from_quota(150_000, 100_000), Some(1500));
    assert_eq!(cpu_limit_from_quota(-1, 100_000), None);
    assert_eq!(cpu_limit_from_quota(1000, 0), None);
}

#[test]
fn qos_and_requests_from_cri() {
    assert_eq!(
        qos_from_cgroup_parent("kubepods-besteffort-pod12.slice"),
        Some(Qos::BestEffort)
    );
    assert_eq!(
        qos_from_cgroup_parent("/kubepods/burstable/pod12"),
        Some(Qos::Burstable)
    );
    assert_eq!(
        qos_from_cgroup_parent("kubepods-pod12.slice"),
        Some(Qos::Guaranteed)
    );
    assert_eq!(qos_from_cgroup_parent("/system.slice"), None);
    let g = derive_from_cri(
        &CriResources {
            cpu_shares: 2048,
            cpu_quota: 200_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 1 << 30,
        },
        "kubepods-pod1.slice",
    );
    assert_eq!(g.qos, Qos::Guaranteed);
    assert_eq!(g.cpu_request_milli, 2000);
    assert_eq!(g.memory_request_bytes, 1 << 30);
    let b = derive_from_cri(
        &CriResources {
            cpu_shares: 256,
            cpu_quota: 0,
            cpu_period: 100_000,
            memory_limit_in_bytes: 0,
        },
        "",
    );
    assert_eq!(
        (b.qos, b.cpu_request_milli, b.memory_request_bytes),
        (Qos::Burstable, 250, 0)
    );
    let be = derive_from_cri(
        &CriResources {
            cpu_shares: 2,
            ..Default::default()
        },
        "",
    );
    assert_eq!(be.qos, Qos::BestEffort);
}

#[test]
fn annotations_are_validated_and_per_container_overrides_win() {
    let r = annotated(req("p", Qos::Guaranteed, 1000), ANN_PREFER_ISOLATED, "true");
    assert_eq!(Hints::parse(&r).unwrap().prefer_isolated, Some(true));
    let r = annotated(r, &format!("{ANN_PREFER_ISOLATED}.container.c"), "false");
    assert_eq!(Hints::parse(&r).unwrap().prefer_isolated, Some(false));
    // another container's override does not apply, but is validated
    let r2 = annotated(
        req("p", Qos::Guaranteed, 1000),
        &format!("{ANN_PREFER_SHARED}.container.other"),
        "true",
    );
    assert_eq!(Hints::parse(&r2).unwrap().prefer_shared, None);
    let bad_other = annotated(
        req("p", Qos::Guaranteed, 1000),
        &format!("{ANN_PREFER_SHARED}.container.other"),
        "yes",
    );
    assert!(matches!(
        Hints::parse(&bad_other),
        Err(PolicyError::BadAnnotation { key, .. }) if key.ends_with(".container.other")
    ));
    let tiers = annotated(
        req("p", Qos::Burstable, 10),
        ANN_MEMORY_TIER,
        "pmem, dram,pmem",
    );
    assert_eq!(
        Hints::parse(&tiers).unwrap().memory_tiers,
        Some(vec![MemoryKind::Dram, MemoryKind::Pmem])
    );
    let bad_tier = annotated(req("p", Qos::Burstable, 10), ANN_MEMORY_TIER, "dram,flash");
    let err = Hints::parse(&bad_tier).unwrap_err();
    assert!(err.to_string().contains(ANN_MEMORY_TIER), "{err}");
    let unknown = annotated(req("p", Qos::Burstable, 10), "cpu.steward.dev/turbo", "on");
    assert_eq!(
        Hints::parse(&unknown),
        Err(PolicyError::UnknownAnnotation {
            key: "cpu.steward.dev/turbo".into()
        })
    );
    let unknown2 = annotated(req("p", Qos::Burstable, 10), "steward.dev/x", "1");
    assert!(matches!(
        Hints::parse(&unknown2),
        Err(PolicyError::UnknownAnnotation { .. })
    ));
    // foreign domains are not ours to judge
    let foreign = annotated(req("p", Qos::Burstable, 10), "example.com/steward.dev", "x");
    assert_eq!(Hints::parse(&foreign).unwrap(), Hints::default());
    let bad_balloon = annotated(req("p", Qos::Burstable, 10), ANN_BALLOON, "a b");
    assert!(matches!(
        Hints::parse(&bad_balloon),
        Err(PolicyError::BadAnnotation { .. })
    ));
}

// ----------------------------------------------------------------- picker

#[test]
fn picker_takes_whole_cores_within_fewest_nodes() {
    let t = smt16();
    let p = Picker::new(&t);
    let all = t.online_cpus().clone();
    // 2 CPUs: one whole core (a sibling pair)
    let two = p.take(&all, 2).unwrap();
    assert_eq!(two, set("0,8"));
    // 4 CPUs: one whole NUMA node
    assert_eq!(p.take(&all, 4).unwrap(), t.node_cpus(0));
    // 8 CPUs: one whole socket
    assert_eq!(p.take(&all, 8).unwrap(), t.socket_cpus(0));
    // 3 CPUs: a whole core plus one thread, in one node
    let three = p.take(&all, 3).unwrap();
    assert_eq!(t.nodes_of(&three).len(), 1);
    assert_eq!(three, set("0-1,8"));
    // with CPU 0 used, 1 CPU packs onto its sibling, keeping whole cores free
    let avail = all.difference(&set("0"));
    assert_eq!(p.take(&avail, 1).unwrap(), set("8"));
    // with node 0 half used, 2 CPUs go to the node that still has a whole core
    // that fits best: node 0 (2 free = one whole core 1,9)
    let avail = all.difference(&set("0,8"));
    assert_eq!(p.take(&avail, 2).unwrap(), set("1,9"));
    // with 0 and 9 used, node 0 has 2 free CPUs on split cores; a whole core
    // elsewhere is preferred
    let avail = all.difference(&set("0,9"));
    assert_eq!(p.take(&avail, 2).unwrap(), set("2,10"));
    // 10 CPUs: a whole socket plus a whole core of the other
    let ten = p.take(&all, 10).unwrap();
    assert_eq!(ten.len(), 10);
    assert!(t.socket_cpus(0).is_subset(&ten));
    assert_eq!(t.nodes_of(&ten).len(), 3);
    assert_eq!(p.take(&all, 17), None);
    assert_eq!(p.take(&all, 0), Some(CpuSet::new()));
    assert_eq!(p.take(&set("0-3"), 5), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn picker_gives_n_available_cpus(used in proptest::collection::btree_set(0u32..16, 0..16), n in 0usize..17) {
        let t = smt16();
        let p = Picker::new(&t);
        let avail = t.online_cpus().difference(&used.iter().copied().collect());
        match p.take(&avail, n) {
            Some(c) => {
                prop_assert_eq!(c.len(), n);
                prop_assert!(c.is_subset(&avail));
                // deterministic
                prop_assert_eq!(Some(c), p.take(&avail, n));
            }
            None => prop_assert!(avail.len() < n),
        }
    }
}

// ----------------------------------------------------------------- static

fn static_policy(t: &Topology, reserved: &str) -> Box<dyn Policy> {
    new_policy(
        PolicyKind::Static,
        t,
        &PolicyConfig {
            reserved_cpus: set(reserved),
            ..PolicyConfig::default()
        },
    )
    .unwrap()
}

#[test]
fn none_policy_gives_everything_but_reserved() {
    let t = smt16();
    let mut p = new_policy(
        PolicyKind::None,
        &t,
        &PolicyConfig {
            reserved_cpus: set("0,8"),
            ..PolicyConfig::default()
        },
    )
    .unwrap();
    assert_eq!(p.kind(), PolicyKind::None);
    let d = p.allocate(&req("a", Qos::Guaranteed, 2000)).unwrap();
    assert_eq!(d.get(&key("a")).unwrap().cpus, set("1-7,9-15"));
    assert_eq!(d.get(&key("a")).unwrap().mems, set("0-3"));
    let mut sys = req("k", Qos::Burstable, 100);
    sys.pod_namespace = "kube-system".into();
    assert_eq!(
        p.allocate(&sys).unwrap().get(&sys.key).unwrap().cpus,
        set("0,8")
    );
    assert!(p.release(&key("a")).is_empty());
    assert_eq!(p.assignments().len(), 1);
}

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

// --------------------------------------------------------- topology-aware

fn ta(t: &Topology, reserved: &str) -> Box<dyn Policy> {
    new_policy(
        PolicyKind::TopologyAware,
        t,
        &PolicyConfig {
            reserved_cpus: set(reserved),
            ..PolicyConfig::default()
        },
    )
    .unwrap()
}

#[test]
fn topology_aware_uses_smallest_pool_and_pins_memory() {
    let t = smt16();
    let mut p = ta(&t, "");
    let d = p.allocate(&req("g2", Qos::Guaranteed, 2000)).unwrap();
    let g2 = &d.get(&key("g2")).unwrap();
    assert!(g2.pool.starts_with("node"), "{}", g2.pool);
    assert_eq!(t.nodes_of(&g2.cpus), g2.mems);
    assert_eq!(g2.mems.len(), 1);
    // 6 CPUs do not fit a 4-CPU node: the socket pool
    let d = p.allocate(&req("g6", Qos::Guaranteed, 6000)).unwrap();
    let g6 = &d.get(&key("g6")).unwrap();
    assert!(g6.pool.starts_with("socket"), "{}", g6.pool);
    assert_eq!(g6.mems.len(), 2);
    assert!(g6.cpus.is_disjoint(&g2.cpus));
    // 9 exclusive CPUs can only come from the root
    let d = p.allocate(&req("s", Qos::Burstable, 500)).unwrap();
    let s = &d.get(&key("s")).unwrap();
    assert!(s.pool.starts_with("node"));
    assert!(s.cpus.is_disjoint(&g2.cpus) && s.cpus.is_disjoint(&g6.cpus));
    assert_eq!(t.nodes_of(&s.cpus), s.mems);
    // shared container in a pool is updated when an exclusive grant shrinks it
    let node_of_s = s.pool.clone();
    let more = p.allocate(&req("g1", Qos::Guaranteed, 1000)).unwrap();
    if more.get(&key("g1")).unwrap().pool == node_of_s {
        assert!(more.contains(&key("s")));
    }
}

#[test]
fn topology_aware_spills_shared_load_up_the_tree() {
    let t = smt16();
    let mut p = ta(&t, "");
    // 4 nodes × 4 CPUs; 3500m each fits one node, 4 of them fill 4 nodes
    for i in 0..4 {
        let d = p
            .allocate(&req(&format!("s{i}"), Qos::Burstable, 3500))
            .unwrap();
        assert!(
            d.get(&key(&format!("s{i}")))
                .unwrap()
                .pool
                .starts_with("node")
        );
    }
    let pools: std::collections::BTreeSet<_> =
        p.assignments().values().map(|a| a.pool.clone()).collect();
    assert_eq!(pools.len(), 4, "spread over nodes: {pools:?}");
    // 1000m more fits no node (500m left each) nor socket (1000m left, but the
    // sum over the socket's nodes is 7000 of 8000): the socket can take it
    let d = p.allocate(&req("x", Qos::Burstable, 1000)).unwrap();
    assert!(d.get(&key("x")).unwrap().pool.starts_with("socket"));
    // nothing can take 2000m more
    let before = p.assignments().clone();
    assert!(matches!(
        p.allocate(&req("y", Qos::Burstable, 2000)),
        Err(PolicyError::Insufficient { .. })
    ));
    assert_eq!(p.assignments(), &before);
    // and no exclusive CPU can be carved out of fully loaded shared pools
    assert!(p.allocate(&req("g", Qos::Guaranteed, 1000)).is_err());
}

#[test]
fn topology_aware_memory_tiers() {
    let t = Topology::synthetic(&SyntheticSpec {
        sockets: 2,
        cores_per_node: 2,
        threads_per_core: 2,
        memory_only_nodes: 2,
        ..SyntheticSpec::default()
    })
    .unwrap();
    // nodes 0,1 have CPUs; 2 (near socket 0) and 3 (near socket 1) are PMEM
    assert_eq!(t.node(2).unwrap().kind, MemoryKind::Pmem);
    let mut p = ta(&t, "");
    let r = annotated(
        req("m", Qos::Guaranteed, 1000),
        ANN_MEMORY_TIER,
        "dram,pmem",
    );
    let a = p.allocate(&r).unwrap().get(&key("m")).unwrap().clone();
    let cpu_node = t.nodes_of(&a.cpus).first().unwrap();
    assert_eq!(a.mems, [cpu_node, cpu_node + 2].into_iter().collect());
    let r = annotated(req("pm", Qos::Burstable, 100), ANN_MEMORY_TIER, "pmem");
    let a = p.allocate(&r).unwrap().get(&key("pm")).unwrap().clone();
    assert_eq!(a.mems.len(), 1);
    assert!(a.mems.first().unwrap() >= 2);
    let r = annotated(req("c", Qos::Burstable, 100), ANN_MEMORY_TIER, "cxl");
    let err = p.allocate(&r).unwrap_err();
    assert!(err.to_string().contains("cxl"), "{err}");
    // config may say node 3 is CXL
    let mut q = new_policy(
        PolicyKind::TopologyAware,
        &t,
        &PolicyConfig {
            memory_kinds: BTreeMap::from([(3, MemoryKind::Cxl)]),
            ..PolicyConfig::default()
        },
    )
    .unwrap();
    assert_eq!(
        q.allocate(&r).unwrap().get(&key("c")).unwrap().mems,
        set("3")
    );
    // memory requests are accounted: 16 GiB DRAM + 64 GiB PMEM per socket
    let mut big = req("big", Qos::Burstable, 100);
    big.memory_request_bytes = 200 << 30;
    assert!(matches!(
        q.allocate(&big),
        Err(PolicyError::Insufficient { .. })
    ));
}

#[test]
fn topology_aware_prefers_isolated_when_asked() {
    let t = Topology::synthetic(&SyntheticSpec {
        sockets: 1,
        nodes_per_die: 2,
        cores_per_node: 4,
        isolated: set("2-3"),
        ..SyntheticSpec::default()
    })
    .unwrap();
    let mut p = ta(&t, "");
    let r = annotated(req("i", Qos::Guaranteed, 2000), ANN_PREFER_ISOLATED, "true");
    assert_eq!(
        p.allocate(&r).unwrap().get(&key("i")).unwrap().cpus,
        set("2-3")
    );
    let d = p.allocate(&req("s", Qos::Burstable, 100)).unwrap();
    assert!(d.get(&key("s")).unwrap().cpus.is_disjoint(&set("2-3")));
    // Burstable asking not to share gets floor(request) exclusive CPUs
    let r = annotated(req("b", Qos::Burstable, 2500), ANN_PREFER_SHARED, "false");
    let a = p.allocate(&r).unwrap().get(&key("b")).unwrap().clone();
    assert!(a.exclusive);
    assert_eq!(a.cpus.len(), 2);
}

// --------------------------------------------------------------- balloons

fn balloons(t: &Topology, types: Vec<BalloonType>) -> Result<Box<dyn Policy>, PolicyError> {
    new_policy(
        PolicyKind::Balloons,
        t,
        &PolicyConfig {
            reserved_cpus: set("0"),
            balloons: types,
            ..PolicyConfig::default()
        },
    )
}

fn btype(name: &str, min: u32, max: u32, max_balloons: u32) -> BalloonType {
    BalloonType {
        name: name.into(),
        min_cpus: min,
        max_cpus: max,
        min_balloons: 0,
        max_balloons,
        namespaces: Vec::new(),
        prefer_isolated: false,
    }
}

#[test]
fn balloons_grow_and_shrink_with_load() {
    let t = smt16();
    let mut p = balloons(&t, vec![btype("db", 0, 4, 2)]).unwrap();
    let r1 = annotated(req("a", Qos::Burstable, 1500), ANN_BALLOON, "db");
    let a = p.allocate(&r1).unwrap().get(&key("a")).unwrap().clone();
    assert_eq!(a.pool, "db[0]");
    assert_eq!(a.cpus.len(), 2);
    // joining grows the balloon; both members are in the decision
    let r2 = annotated(req("b", Qos::Burstable, 1000), ANN_BALLOON, "db");
    let d = p.allocate(&r2).unwrap();
    assert_eq!(d.len(), 2);
    // the grown balloon is stated once with its members
    assert_eq!(d.pools.len(), 1);
    assert_eq!(d.pools[0].assignment.pool, "db[0]");
    assert_eq!(d.pools[0].members.len(), 2);
    assert_eq!(d.get(&key("a")).unwrap().cpus.len(), 3);
    assert!(
        a.cpus.is_subset(&d.get(&key("a")).unwrap().cpus),
        "grows in place"
    );
    // beyond max_cpus: a second balloon
    let r3 = annotated(req("c", Qos::Burstable, 2000), ANN_BALLOON, "db");
    let c = p.allocate(&r3).unwrap().get(&key("c")).unwrap().clone();
    assert_eq!(c.pool, "db[1]");
    assert!(c.cpus.is_disjoint(&p.assignments()[&key("a")].cpus));
    // max_balloons reached
    let r4 = annotated(req("e", Qos::Burstable, 3000), ANN_BALLOON, "db");
    assert!(matches!(
        p.allocate(&r4),
        Err(PolicyError::Insufficient { .. })
    ));
    // shrink on release
    let d = p.release(&key("b"));
    assert_eq!(d.get(&key("a")).unwrap().cpus.len(), 2);
    // other containers go to the implicit default balloon, never on reserved CPU 0
    let z = p
        .allocate(&req("z", Qos::BestEffort, 0))
        .unwrap()
        .get(&key("z"))
        .unwrap()
        .clone();
    assert_eq!(z.pool, "default[0]");
    assert_eq!(z.cpus.len(), 1);
    assert!(!z.cpus.contains(0));
    // empty balloon beyond min_balloons disappears
    p.release(&key("c"));
    assert!(p.assignments().values().all(|a| a.pool != "db[1]"));
}

#[test]
fn balloons_config_and_annotation_errors() {
    let t = smt16();
    let mut p = balloons(&t, vec![btype("db", 1, 2, 0)]).unwrap();
    let r = annotated(req("a", Qos::Burstable, 100), ANN_BALLOON, "web");
    let err = p.allocate(&r).unwrap_err();
    assert!(
        matches!(&err, PolicyError::BadAnnotation { key, .. } if key == ANN_BALLOON),
        "{err}"
    );
    assert!(p.assignments().is_empty());
    assert!(matches!(
        balloons(&t, vec![btype("x", 3, 2, 0)]),
        Err(PolicyError::BadConfig(_))
    ));
    assert!(matches!(
        balloons(&t, vec![btype("x", 1, 2, 0), btype("x", 1, 2, 0)]),
        Err(PolicyError::BadConfig(_))
    ));
    assert!(matches!(
        balloons(&t, vec![btype("bad name", 1, 2, 0)]),
        Err(PolicyError::BadConfig(_))
    ));
    let mut many = btype("many", 8, 0, 0);
    many.min_balloons = 2;
    assert!(matches!(
        balloons(&t, vec![many]),
        Err(PolicyError::BadConfig(_))
    ));
    // min_balloons exist from the start; namespaces route pods
    let mut ns = btype("infra", 2, 0, 0);
    ns.min_balloons = 1;
    ns.namespaces = vec!["monitoring".into()];
    let mut p = balloons(&t, vec![ns]).unwrap();
    let mut r = req("m", Qos::Burstable, 100);
    r.pod_namespace = "monitoring".into();
    let a = p.allocate(&r).unwrap().get(&key("m")).unwrap().clone();
    assert_eq!((a.pool.as_str(), a.cpus.len()), ("infra[0]", 2));
}

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
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..24, 0u8..3, 0u64..5000, 0u8..8, 0u8..8).prop_map(|(pod, qos, milli, ns, ann)| Op::Alloc { pod, qos, milli, ns, ann }),
        1 => (0u8..24).prop_map(|pod| Op::Release { pod }),
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
        };
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
            if a.exclusive {
                for (k2, a2) in asg {
                    if k2 != k {
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
