//! Writes a [`Topology`] as a minimal sysfs tree: the files
//! [`crate::discover`] reads, in the kernel's formats. Used to generate the
//! committed fixtures (`examples/gen_fixtures.rs`), the benchmark's
//! 256-CPU machine and round-trip tests.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::Path;

use steward_core::cpu::{CpuSet, SyntheticSpec, Topology, TopologyError};

fn write(path: &Path, text: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, text)
}

/// Writes `topo` under `root` (which should be empty): `devices/system/cpu`
/// and `devices/system/node`.
pub fn write_sysfs(root: &Path, topo: &Topology) -> io::Result<()> {
    let cpu_root = root.join("devices/system/cpu");
    let node_root = root.join("devices/system/node");
    let online = topo.online_cpus();
    let offline = topo.offline_cpus();
    let possible = online.union(offline);
    write(&cpu_root.join("online"), &format!("{online}\n"))?;
    write(&cpu_root.join("offline"), &format!("{offline}\n"))?;
    write(&cpu_root.join("possible"), &format!("{possible}\n"))?;
    write(&cpu_root.join("present"), &format!("{possible}\n"))?;
    write(
        &cpu_root.join("isolated"),
        &format!("{}\n", topo.isolated_cpus()),
    )?;
    for c in topo.cpus() {
        let dir = cpu_root.join(format!("cpu{}", c.id));
        write(&dir.join("online"), "1\n")?;
        let t = dir.join("topology");
        write(&t.join("physical_package_id"), &format!("{}\n", c.socket))?;
        write(&t.join("die_id"), &format!("{}\n", c.die))?;
        write(&t.join("core_id"), &format!("{}\n", c.core))?;
        write(
            &t.join("thread_siblings_list"),
            &format!("{}\n", topo.siblings(c.id)),
        )?;
        write(
            &t.join("core_siblings_list"),
            &format!("{}\n", topo.socket_cpus(c.socket)),
        )?;
    }
    for id in offline.iter() {
        // offline CPUs have no topology directory
        write(&cpu_root.join(format!("cpu{id}/online")), "0\n")?;
    }
    let ids = topo.node_ids();
    let with_cpu: CpuSet = topo
        .nodes()
        .filter(|n| !topo.node_cpus(n.id).is_empty())
        .map(|n| n.id)
        .collect();
    let with_mem: CpuSet = topo
        .nodes()
        .filter(|n| n.memory_bytes > 0)
        .map(|n| n.id)
        .collect();
    write(&node_root.join("online"), &format!("{ids}\n"))?;
    write(&node_root.join("possible"), &format!("{ids}\n"))?;
    write(&node_root.join("has_cpu"), &format!("{with_cpu}\n"))?;
    write(&node_root.join("has_memory"), &format!("{with_mem}\n"))?;
    for n in topo.nodes() {
        let dir = node_root.join(format!("node{}", n.id));
        write(&dir.join("cpulist"), &format!("{}\n", topo.node_cpus(n.id)))?;
        let distances: Vec<String> = ids
            .iter()
            .map(|o| topo.distance(n.id, o).to_string())
            .collect();
        write(&dir.join("distance"), &format!("{}\n", distances.join(" ")))?;
        let kb = n.memory_bytes / 1024;
        let mut meminfo = String::new();
        let _ = writeln!(meminfo, "Node {} MemTotal:       {kb} kB", n.id);
        let _ = writeln!(meminfo, "Node {} MemFree:        {kb} kB", n.id);
        let _ = writeln!(meminfo, "Node {} MemUsed:        0 kB", n.id);
        write(&dir.join("meminfo"), &meminfo)?;
    }
    Ok(())
}

/// The fixture machines committed under `fixtures/`, by directory name.
pub fn fixture_specs() -> Result<Vec<(&'static str, Topology)>, TopologyError> {
    let gib = 1u64 << 30;
    Ok(vec![
        (
            // 2 sockets × 2 NUMA nodes × 2 cores × 2 threads = 16 CPUs
            "2s-4n-smt",
            Topology::synthetic(&SyntheticSpec {
                sockets: 2,
                dies_per_socket: 1,
                nodes_per_die: 2,
                cores_per_node: 2,
                threads_per_core: 2,
                memory_per_node: 4 * gib,
                ..SyntheticSpec::default()
            })?,
        ),
        (
            // 8 NUMA nodes × 4 cores, 2 sockets with 2 dies each, no SMT = 32 CPUs
            "8n-32c",
            Topology::synthetic(&SyntheticSpec {
                sockets: 2,
                dies_per_socket: 2,
                nodes_per_die: 2,
                cores_per_node: 4,
                threads_per_core: 1,
                memory_per_node: 2 * gib,
                ..SyntheticSpec::default()
            })?,
        ),
        (
            // 2 DRAM nodes with CPUs + 2 CPU-less memory nodes
            "memory-tiers",
            Topology::synthetic(&SyntheticSpec {
                sockets: 2,
                cores_per_node: 2,
                threads_per_core: 2,
                memory_per_node: 4 * gib,
                memory_only_nodes: 2,
                ..SyntheticSpec::default()
            })?,
        ),
        (
            // 1 socket, 4 cores × 2 threads; CPUs 2,6 isolated, 3,7 offline
            "offline-isolated",
            Topology::synthetic(&SyntheticSpec {
                cores_per_node: 4,
                threads_per_core: 2,
                memory_per_node: 8 * gib,
                isolated: CpuSet::range(2, 2).union(&CpuSet::range(6, 6)),
                offline: CpuSet::range(3, 3).union(&CpuSet::range(7, 7)),
                ..SyntheticSpec::default()
            })?,
        ),
    ])
}

/// The benchmark machine: 2 sockets × 2 dies × 2 NUMA nodes (8 nodes),
/// 16 cores per node, 2 threads per core = 256 CPUs.
pub fn bench_topology() -> Result<Topology, TopologyError> {
    Topology::synthetic(&SyntheticSpec {
        sockets: 2,
        dies_per_socket: 2,
        nodes_per_die: 2,
        cores_per_node: 16,
        threads_per_core: 2,
        memory_per_node: 64 << 30,
        ..SyntheticSpec::default()
    })
}
