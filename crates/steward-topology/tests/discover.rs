//! Discovery from sysfs fixture trees, malformed trees and this machine's
//! own sysfs; policies run on discovered machines.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use steward_core::cpu::{
    ContainerKey, ContainerRequest, CpuSet, MemoryKind, PolicyConfig, PolicyKind, Qos,
    SyntheticSpec, Topology, new_policy,
};
use steward_topology::fixture::{fixture_specs, write_sysfs};
use steward_topology::{DiscoverOptions, TopologyError, discover, discover_with};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

fn files(root: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.insert(
                    p.strip_prefix(root).unwrap().to_path_buf(),
                    fs::read_to_string(&p).unwrap(),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

#[test]
fn fixtures_match_generator() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, topo) in fixture_specs().unwrap() {
        let dir = tmp.path().join(name);
        write_sysfs(&dir, &topo).unwrap();
        assert_eq!(
            files(&fixture(name)),
            files(&dir),
            "fixtures/{name} drifted: run `cargo run -p steward-topology --example gen_fixtures`"
        );
        // and reading it back gives the machine it was written from
        assert_eq!(discover(&fixture(name)).unwrap(), topo, "{name}");
    }
}

#[test]
fn two_sockets_four_nodes_smt() {
    let t = discover(&fixture("2s-4n-smt")).unwrap();
    assert_eq!(t.online_cpus(), &set("0-15"));
    assert_eq!(t.sockets().collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(t.node_ids(), set("0-3"));
    assert_eq!(t.threads_per_core(), 2);
    assert_eq!(t.siblings(0), set("0,8"));
    assert_eq!(t.socket_cpus(1), set("4-7,12-15"));
    assert_eq!(t.node_cpus(3), set("6-7,14-15"));
    assert_eq!(t.distance(0, 1), 12);
    assert_eq!(t.distance(0, 3), 32);
    assert_eq!(t.node(2).unwrap().memory_bytes, 4 << 30);
    assert!(t.nodes().all(|n| n.kind == MemoryKind::Dram));
}

#[test]
fn eight_nodes_with_dies() {
    let t = discover(&fixture("8n-32c")).unwrap();
    assert_eq!(t.online_cpus().len(), 32);
    assert_eq!(t.node_ids().len(), 8);
    assert_eq!(t.threads_per_core(), 1);
    assert_eq!(t.dies(0).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(t.die_cpus(1, 1), set("24-31"));
    assert!(t.nodes().all(|n| t.node_cpus(n.id).len() == 4));
}

#[test]
fn memory_only_nodes_are_pmem_unless_told_otherwise() {
    let root = fixture("memory-tiers");
    let t = discover(&root).unwrap();
    assert_eq!(t.node_ids(), set("0-3"));
    assert!(t.node_cpus(2).is_empty() && t.node_cpus(3).is_empty());
    assert_eq!(t.node(0).unwrap().kind, MemoryKind::Dram);
    assert_eq!(t.node(2).unwrap().kind, MemoryKind::Pmem);
    assert_eq!(t.node(3).unwrap().memory_bytes, 16 << 30);
    assert_eq!(t.distance(0, 2), 17);
    assert_eq!(t.distance(0, 3), 28);
    let opts = DiscoverOptions {
        cpu_less_kind: MemoryKind::Cxl,
        memory_kinds: BTreeMap::from([(3, MemoryKind::Hbm)]),
    };
    let t = discover_with(&root, &opts).unwrap();
    assert_eq!(t.node(2).unwrap().kind, MemoryKind::Cxl);
    assert_eq!(t.node(3).unwrap().kind, MemoryKind::Hbm);
    // a node with CPUs cannot be declared PMEM
    let bad = DiscoverOptions {
        memory_kinds: BTreeMap::from([(0, MemoryKind::Pmem)]),
        ..DiscoverOptions::default()
    };
    assert!(matches!(
        discover_with(&root, &bad),
        Err(TopologyError::Model(_))
    ));
}

#[test]
fn offline_and_isolated_cpus() {
    let t = discover(&fixture("offline-isolated")).unwrap();
    assert_eq!(t.online_cpus(), &set("0-2,4-6"));
    assert_eq!(t.offline_cpus(), &set("3,7"));
    assert_eq!(t.isolated_cpus(), &set("2,6"));
    assert!(t.cpu(3).is_none());
    // CPU 3's sibling 7 is offline too: core 3 is gone entirely
    assert_eq!(t.cores().len(), 3);
    // no policy hands out an offline or isolated CPU uninvited
    for kind in [
        PolicyKind::Static,
        PolicyKind::TopologyAware,
        PolicyKind::Balloons,
    ] {
        let mut p = new_policy(kind, &t, &PolicyConfig::default()).unwrap();
        let d = p.allocate(&request("g", Qos::Guaranteed, 2000)).unwrap();
        let d2 = p.allocate(&request("b", Qos::Burstable, 500)).unwrap();
        for a in d.iter().map(|(_, a)| a).chain(d2.iter().map(|(_, a)| a)) {
            assert!(a.cpus.is_disjoint(&set("2-3,6-7")), "{kind:?}: {a:?}");
        }
    }
}

fn copy_tree(from: &Path, to: &Path) {
    for (rel, text) in files(from) {
        let p = to.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }
}

#[test]
fn malformed_trees_give_errors_naming_the_file() {
    let cases: Vec<(&str, &str, Option<&str>)> = vec![
        (
            "devices/system/cpu/online",
            "0-x",
            Some("devices/system/cpu/online"),
        ),
        ("devices/system/cpu/isolated", "3-1", Some("isolated")),
        (
            "devices/system/cpu/cpu5/topology/core_id",
            "five",
            Some("cpu5/topology/core_id"),
        ),
        (
            "devices/system/node/node1/distance",
            "10 20",
            Some("node1/distance"),
        ),
        (
            "devices/system/node/node0/meminfo",
            "Node 0 MemTotal: lots kB",
            Some("node0/meminfo"),
        ),
        (
            "devices/system/cpu/cpu1/topology/thread_siblings_list",
            "1",
            None,
        ),
        ("devices/system/node/node1/cpulist", "0-3", None),
    ];
    for (file, content, names) in cases {
        let tmp = tempfile::tempdir().unwrap();
        copy_tree(&fixture("2s-4n-smt"), tmp.path());
        fs::write(tmp.path().join(file), content).unwrap();
        let err = discover(tmp.path()).expect_err(file);
        let msg = err.to_string();
        match names {
            Some(n) => assert!(msg.contains(n), "{file}: {msg}"),
            None => assert!(
                matches!(err, TopologyError::Inconsistent(_)),
                "{file}: {msg}"
            ),
        }
    }
    // a missing file of an online CPU
    let tmp = tempfile::tempdir().unwrap();
    copy_tree(&fixture("2s-4n-smt"), tmp.path());
    fs::remove_file(tmp.path().join("devices/system/cpu/cpu2/topology/core_id")).unwrap();
    assert!(matches!(
        discover(tmp.path()),
        Err(TopologyError::Io { .. })
    ));
    // no sysfs at all
    assert!(matches!(
        discover(&tmp.path().join("nope")),
        Err(TopologyError::Io { .. })
    ));
}

#[test]
fn kernel_without_numa_directory_is_one_node() {
    let tmp = tempfile::tempdir().unwrap();
    copy_tree(&fixture("offline-isolated"), tmp.path());
    fs::remove_dir_all(tmp.path().join("devices/system/node")).unwrap();
    let t = discover(tmp.path()).unwrap();
    assert_eq!(t.node_ids(), set("0"));
    assert_eq!(t.node_cpus(0), set("0-2,4-6"));
}

#[test]
fn this_machine() {
    let sys = Path::new("/sys");
    if !sys.join("devices/system/cpu/online").exists() {
        eprintln!("no sysfs here; skipping");
        return;
    }
    let t = discover(sys).unwrap();
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap();
    let processors = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    assert_eq!(t.online_cpus().len(), processors);
    assert!(!t.node_ids().is_empty());
    // every online CPU is in exactly one node, and nodes with CPUs have memory
    let mut seen = CpuSet::new();
    for n in t.nodes() {
        let c = t.node_cpus(n.id);
        assert!(c.is_disjoint(&seen));
        seen = seen.union(&c);
        if !c.is_empty() {
            assert!(n.memory_bytes > 0, "node {} without memory", n.id);
        }
    }
    assert_eq!(&seen, t.online_cpus());
    // a policy works on it
    let mut p = new_policy(PolicyKind::TopologyAware, &t, &PolicyConfig::default()).unwrap();
    let d = p.allocate(&request("x", Qos::Burstable, 100)).unwrap();
    assert!(
        d.get(&ContainerKey::new("x", "c"))
            .unwrap()
            .cpus
            .is_subset(t.online_cpus())
    );
}

#[test]
fn config_and_cpusets_serialise() {
    assert_eq!(serde_json::to_string(&set("0-3,9")).unwrap(), "\"0-3,9\"");
    assert_eq!(
        serde_json::from_str::<CpuSet>("\"2,1\"").unwrap(),
        set("1-2")
    );
    assert!(serde_json::from_str::<CpuSet>("\"2-1\"").is_err());
    let cfg: PolicyConfig = serde_json::from_str(
        r#"{"reserved_cpus":"0-1","memory_kinds":{"3":"cxl"},"balloons":[{"name":"db","max_cpus":4}]}"#,
    )
    .unwrap();
    assert_eq!(cfg.reserved_cpus, set("0-1"));
    assert_eq!(cfg.memory_kinds[&3], MemoryKind::Cxl);
    assert_eq!(cfg.reserved_namespaces, vec!["kube-system".to_string()]);
    assert_eq!(cfg.balloons[0].max_cpus, 4);
    assert!(serde_json::from_str::<PolicyConfig>(r#"{"reservd_cpus":"0"}"#).is_err());
    assert!(serde_json::from_str::<PolicyConfig>(r#"{"reserved_cpus":"0-"}"#).is_err());
    assert_eq!(
        serde_json::to_string(&PolicyKind::TopologyAware).unwrap(),
        "\"topology-aware\""
    );
    assert_eq!(
        "balloons".parse::<PolicyKind>().unwrap(),
        PolicyKind::Balloons
    );
    assert!("fancy".parse::<PolicyKind>().is_err());
}

fn request(pod: &str, qos: Qos, milli: u64) -> ContainerRequest {
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
        cpu_claims: Vec::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    /// Any regular machine written as sysfs reads back identically.
    #[test]
    fn sysfs_roundtrip(
        sockets in 1u32..3, dies in 1u32..3, nodes in 1u32..3, cores in 1u32..4,
        threads in 1u32..3, mem_only in 0u32..2, iso in 0u32..4, off in 0u32..3,
    ) {
        let spec = SyntheticSpec {
            sockets,
            dies_per_socket: dies,
            nodes_per_die: nodes,
            cores_per_node: cores,
            threads_per_core: threads,
            memory_per_node: 1 << 30,
            memory_only_nodes: mem_only,
            isolated: CpuSet::range(iso, iso),
            // never CPU 0; only with SMT, so the node keeps an online CPU
            // (a node without online CPUs reads as memory-only: see the heuristic)
            offline: if off == 0 || threads == 1 { CpuSet::new() } else { CpuSet::range(off + 4, off + 4) },
        };
        let topo = Topology::synthetic(&spec).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        write_sysfs(tmp.path(), &topo).unwrap();
        prop_assert_eq!(discover(tmp.path()).unwrap(), topo);
    }
}
