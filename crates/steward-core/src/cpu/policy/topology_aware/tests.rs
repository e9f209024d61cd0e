//! Tests of the `topology-aware` policy.

use std::collections::BTreeMap;

use crate::cpu::testing::*;
use crate::cpu::*;

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
