//! Tests of the model: cpusets, topology, request derivation, annotations and the CPU picker.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::Hints;
use crate::cpu::testing::*;
use crate::cpu::*;

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
