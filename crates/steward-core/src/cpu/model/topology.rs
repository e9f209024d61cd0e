//! The machine model: sockets, dies, NUMA nodes (with distances, memory and
//! memory kind), cores, SMT threads, offline and isolated CPUs.
//!
//! Built from plain values ([`Topology::new`]); reading sysfs is the job of
//! the `steward-topology` crate. [`Topology::synthetic`] builds regular
//! machines for tests and benchmarks.

use std::collections::{BTreeMap, BTreeSet};

use super::cpuset::CpuSet;

/// What kind of memory a NUMA node holds.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum MemoryKind {
    /// Ordinary DRAM (a node with CPUs is assumed to be DRAM).
    Dram,
    /// Persistent memory in memory mode (a CPU-less node by default).
    Pmem,
    /// CXL-attached memory expander.
    Cxl,
    /// High-bandwidth memory.
    Hbm,
}

impl MemoryKind {
    /// Lower-case name used in annotations and config.
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryKind::Dram => "dram",
            MemoryKind::Pmem => "pmem",
            MemoryKind::Cxl => "cxl",
            MemoryKind::Hbm => "hbm",
        }
    }

    /// Parses `dram`, `pmem`, `cxl` or `hbm` (case-insensitive).
    pub fn parse(s: &str) -> Option<MemoryKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "dram" => Some(MemoryKind::Dram),
            "pmem" => Some(MemoryKind::Pmem),
            "cxl" => Some(MemoryKind::Cxl),
            "hbm" => Some(MemoryKind::Hbm),
            _ => None,
        }
    }
}

/// One online logical CPU (hardware thread).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cpu {
    /// Logical CPU id (`cpuN`).
    pub id: u32,
    /// `physical_package_id`.
    pub socket: u32,
    /// `die_id` (0 where the kernel does not report dies).
    pub die: u32,
    /// `core_id`; unique only within (socket, die).
    pub core: u32,
    /// NUMA node holding this CPU.
    pub node: u32,
    /// Listed in `isolated` (isolcpus): the scheduler does not balance onto it.
    pub isolated: bool,
}

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NumaNode {
    /// Node id (`nodeN`).
    pub id: u32,
    /// `MemTotal` of the node in bytes.
    pub memory_bytes: u64,
    /// Memory kind (see the discovery heuristic; config may override).
    pub kind: MemoryKind,
    /// Distance to each node id (including itself), as in `nodeN/distance`.
    /// May be empty when unknown; then 10 to itself and 20 to others is assumed.
    pub distances: BTreeMap<u32, u32>,
}

/// Why a topology is inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("topology has no online CPU")]
    NoCpus,
    #[error("CPU {0} is listed twice")]
    DuplicateCpu(u32),
    #[error("NUMA node {0} is listed twice")]
    DuplicateNode(u32),
    #[error("CPU {cpu} belongs to NUMA node {node}, which does not exist")]
    UnknownNode { cpu: u32, node: u32 },
    #[error("CPU {0} is both online and offline")]
    OnlineAndOffline(u32),
    #[error("CPU id {0} exceeds the supported maximum")]
    IdTooLarge(u32),
    #[error("NUMA node {node} has a distance to node {other}, which does not exist")]
    UnknownDistanceNode { node: u32, other: u32 },
    #[error("NUMA node {0} has CPUs but memory kind override says it is not DRAM/HBM: {1}")]
    BadKindOverride(u32, &'static str),
    #[error("synthetic topology parameter {0} must be at least 1")]
    BadSynthetic(&'static str),
}

/// One physical core: the SMT threads sharing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Core {
    pub socket: u32,
    pub die: u32,
    pub node: u32,
    pub core: u32,
    pub cpus: CpuSet,
}

/// The machine model. Immutable after construction, cheap to query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    cpus: BTreeMap<u32, Cpu>,
    nodes: BTreeMap<u32, NumaNode>,
    online: CpuSet,
    offline: CpuSet,
    isolated: CpuSet,
    node_cpus: BTreeMap<u32, CpuSet>,
    socket_cpus: BTreeMap<u32, CpuSet>,
    die_cpus: BTreeMap<(u32, u32), CpuSet>,
    cores: Vec<Core>,
    core_of_cpu: BTreeMap<u32, usize>,
}

impl Topology {
    /// Builds and validates a topology. `cpus` are the online CPUs (their
    /// topology is only known while online); `offline` the offline ones.
    pub fn new(
        cpus: Vec<Cpu>,
        offline: CpuSet,
        nodes: Vec<NumaNode>,
    ) -> Result<Topology, TopologyError> {
        let mut node_map = BTreeMap::new();
        for n in nodes {
            let id = n.id;
            if node_map.insert(id, n).is_some() {
                return Err(TopologyError::DuplicateNode(id));
            }
        }
        for n in node_map.values() {
            if let Some(other) = n.distances.keys().find(|o| !node_map.contains_key(o)) {
                return Err(TopologyError::UnknownDistanceNode {
                    node: n.id,
                    other: *other,
                });
            }
        }
        let mut cpu_map = BTreeMap::new();
        for c in cpus {
            let id = c.id;
            if id > super::cpuset::MAX_ID {
                return Err(TopologyError::IdTooLarge(id));
            }
            if !node_map.contains_key(&c.node) {
                return Err(TopologyError::UnknownNode {
                    cpu: id,
                    node: c.node,
                });
            }
            if cpu_map.insert(id, c).is_some() {
                return Err(TopologyError::DuplicateCpu(id));
            }
        }
        if cpu_map.is_empty() {
            return Err(TopologyError::NoCpus);
        }
        if let Some(id) = offline.iter().find(|id| cpu_map.contains_key(id)) {
            return Err(TopologyError::OnlineAndOffline(id));
        }
        let online: CpuSet = cpu_map.keys().copied().collect();
        let isolated: CpuSet = cpu_map
            .values()
            .filter(|c| c.isolated)
            .map(|c| c.id)
            .collect();
        let mut node_cpus: BTreeMap<u32, CpuSet> =
            node_map.keys().map(|&n| (n, CpuSet::new())).collect();
        let mut socket_cpus: BTreeMap<u32, CpuSet> = BTreeMap::new();
        let mut die_cpus: BTreeMap<(u32, u32), CpuSet> = BTreeMap::new();
        let mut core_map: BTreeMap<(u32, u32, u32, u32), CpuSet> = BTreeMap::new();
        for c in cpu_map.values() {
            node_cpus.entry(c.node).or_default().insert(c.id);
            socket_cpus.entry(c.socket).or_default().insert(c.id);
            die_cpus.entry((c.socket, c.die)).or_default().insert(c.id);
            core_map
                .entry((c.socket, c.die, c.node, c.core))
                .or_default()
                .insert(c.id);
        }
        let mut cores = Vec::with_capacity(core_map.len());
        let mut core_of_cpu = BTreeMap::new();
        for ((socket, die, node, core), cpus) in core_map {
            for id in cpus.iter() {
                core_of_cpu.insert(id, cores.len());
            }
            cores.push(Core {
                socket,
                die,
                node,
                core,
                cpus,
            });
        }
        Ok(Topology {
            cpus: cpu_map,
            nodes: node_map,
            online,
            offline,
            isolated,
            node_cpus,
            socket_cpus,
            die_cpus,
            cores,
            core_of_cpu,
        })
    }

    /// Overrides the memory kind of nodes (from configuration). A node with
    /// CPUs may only be DRAM or HBM.
    pub fn with_memory_kinds(
        mut self,
        kinds: &BTreeMap<u32, MemoryKind>,
    ) -> Result<Topology, TopologyError> {
        for (&id, &kind) in kinds {
            let has_cpus = self.node_cpus.get(&id).is_some_and(|c| !c.is_empty());
            let Some(node) = self.nodes.get_mut(&id) else {
                return Err(TopologyError::UnknownNode {
                    cpu: u32::MAX,
                    node: id,
                });
            };
            if has_cpus && !matches!(kind, MemoryKind::Dram | MemoryKind::Hbm) {
                return Err(TopologyError::BadKindOverride(id, kind.as_str()));
            }
            node.kind = kind;
        }
        Ok(self)
    }

    /// Online CPUs, ascending.
    pub fn cpus(&self) -> impl Iterator<Item = &Cpu> {
        self.cpus.values()
    }

    /// One online CPU.
    pub fn cpu(&self, id: u32) -> Option<&Cpu> {
        self.cpus.get(&id)
    }

    /// NUMA nodes, ascending.
    pub fn nodes(&self) -> impl Iterator<Item = &NumaNode> {
        self.nodes.values()
    }

    /// One NUMA node.
    pub fn node(&self, id: u32) -> Option<&NumaNode> {
        self.nodes.get(&id)
    }

    /// All NUMA node ids.
    pub fn node_ids(&self) -> CpuSet {
        self.nodes.keys().copied().collect()
    }

    /// Online CPUs.
    pub fn online_cpus(&self) -> &CpuSet {
        &self.online
    }

    /// Offline CPUs.
    pub fn offline_cpus(&self) -> &CpuSet {
        &self.offline
    }

    /// Isolated (isolcpus) online CPUs.
    pub fn isolated_cpus(&self) -> &CpuSet {
        &self.isolated
    }

    /// Online CPUs of a NUMA node (empty for memory-only nodes).
    pub fn node_cpus(&self, node: u32) -> CpuSet {
        self.node_cpus.get(&node).cloned().unwrap_or_default()
    }

    /// Socket ids, ascending.
    pub fn sockets(&self) -> impl Iterator<Item = u32> + '_ {
        self.socket_cpus.keys().copied()
    }

    /// Online CPUs of a socket.
    pub fn socket_cpus(&self, socket: u32) -> CpuSet {
        self.socket_cpus.get(&socket).cloned().unwrap_or_default()
    }

    /// Die ids of a socket, ascending.
    pub fn dies(&self, socket: u32) -> impl Iterator<Item = u32> + '_ {
        self.die_cpus
            .keys()
            .filter(move |(s, _)| *s == socket)
            .map(|(_, d)| *d)
    }

    /// Online CPUs of a die.
    pub fn die_cpus(&self, socket: u32, die: u32) -> CpuSet {
        self.die_cpus
            .get(&(socket, die))
            .cloned()
            .unwrap_or_default()
    }

    /// NUMA nodes with CPUs inside a CPU set.
    pub fn nodes_of(&self, cpus: &CpuSet) -> CpuSet {
        cpus.iter()
            .filter_map(|c| self.cpus.get(&c).map(|c| c.node))
            .collect()
    }

    /// Physical cores, ordered by (socket, die, node, core id).
    pub fn cores(&self) -> &[Core] {
        &self.cores
    }

    /// Index into [`Topology::cores`] of the core holding `cpu`.
    pub fn core_index(&self, cpu: u32) -> Option<usize> {
        self.core_of_cpu.get(&cpu).copied()
    }

    /// SMT siblings of a CPU, itself included.
    pub fn siblings(&self, cpu: u32) -> CpuSet {
        self.core_index(cpu)
            .map(|i| self.cores[i].cpus.clone())
            .unwrap_or_default()
    }

    /// The most threads any core has (1 without SMT).
    pub fn threads_per_core(&self) -> usize {
        self.cores.iter().map(|c| c.cpus.len()).max().unwrap_or(1)
    }

    /// Distance between two nodes (10 to itself, 20 otherwise when unknown).
    pub fn distance(&self, a: u32, b: u32) -> u32 {
        self.nodes
            .get(&a)
            .and_then(|n| n.distances.get(&b).copied())
            .unwrap_or(if a == b { 10 } else { 20 })
    }

    /// Builds a regular machine: `sockets × dies × nodes_per_die` NUMA nodes
    /// with `cores_per_node` cores of `threads` threads each. CPU ids are
    /// numbered like Linux does on x86: first thread of every core, then the
    /// second thread of every core, and so on. `memory_only_nodes` extra
    /// CPU-less PMEM nodes are appended, each nearest to one socket in turn.
    pub fn synthetic(spec: &SyntheticSpec) -> Result<Topology, TopologyError> {
        for (name, v) in [
            ("sockets", spec.sockets),
            ("dies_per_socket", spec.dies_per_socket),
            ("nodes_per_die", spec.nodes_per_die),
            ("cores_per_node", spec.cores_per_node),
            ("threads_per_core", spec.threads_per_core),
        ] {
            if v == 0 {
                return Err(TopologyError::BadSynthetic(name));
            }
        }
        let cpu_nodes = spec.sockets * spec.dies_per_socket * spec.nodes_per_die;
        let total_cores = cpu_nodes * spec.cores_per_node;
        let total = total_cores * spec.threads_per_core;
        if total > super::cpuset::MAX_ID {
            return Err(TopologyError::IdTooLarge(total));
        }
        let mut cpus = Vec::new();
        for t in 0..spec.threads_per_core {
            for gc in 0..total_cores {
                let node = gc / spec.cores_per_node;
                let socket = node / (spec.dies_per_socket * spec.nodes_per_die);
                let die = (node / spec.nodes_per_die) % spec.dies_per_socket;
                let id = t * total_cores + gc;
                cpus.push(Cpu {
                    id,
                    socket,
                    die,
                    core: gc % (spec.cores_per_node * spec.nodes_per_die * spec.dies_per_socket),
                    node,
                    isolated: spec.isolated.contains(id),
                });
            }
        }
        let offline = spec.offline.clone();
        cpus.retain(|c| !offline.contains(c.id));
        let socket_of_node = |n: u32| n / (spec.dies_per_socket * spec.nodes_per_die);
        let all_nodes = cpu_nodes + spec.memory_only_nodes;
        let mem_socket = |n: u32| (n - cpu_nodes) % spec.sockets;
        let mut nodes = Vec::new();
        for n in 0..all_nodes {
            let mut distances = BTreeMap::new();
            for m in 0..all_nodes {
                let d = match (n < cpu_nodes, m < cpu_nodes) {
                    _ if n == m => 10,
                    (true, true) if socket_of_node(n) == socket_of_node(m) => 12,
                    (true, true) => 32,
                    (true, false) if socket_of_node(n) == mem_socket(m) => 17,
                    (false, true) if mem_socket(n) == socket_of_node(m) => 17,
                    _ => 28,
                };
                distances.insert(m, d);
            }
            nodes.push(NumaNode {
                id: n,
                memory_bytes: if n < cpu_nodes {
                    spec.memory_per_node
                } else {
                    spec.memory_per_node * 4
                },
                kind: if n < cpu_nodes {
                    MemoryKind::Dram
                } else {
                    MemoryKind::Pmem
                },
                distances,
            });
        }
        Topology::new(cpus, offline, nodes)
    }

    /// Groups of NUMA nodes with CPUs: (socket, die) → nodes, for pool trees.
    pub fn node_tree(&self) -> BTreeMap<u32, BTreeMap<u32, BTreeSet<u32>>> {
        let mut tree: BTreeMap<u32, BTreeMap<u32, BTreeSet<u32>>> = BTreeMap::new();
        for c in self.cpus.values() {
            tree.entry(c.socket)
                .or_default()
                .entry(c.die)
                .or_default()
                .insert(c.node);
        }
        tree
    }
}

/// Parameters of [`Topology::synthetic`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntheticSpec {
    pub sockets: u32,
    pub dies_per_socket: u32,
    pub nodes_per_die: u32,
    pub cores_per_node: u32,
    pub threads_per_core: u32,
    pub memory_per_node: u64,
    pub memory_only_nodes: u32,
    pub isolated: CpuSet,
    pub offline: CpuSet,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        SyntheticSpec {
            sockets: 1,
            dies_per_socket: 1,
            nodes_per_die: 1,
            cores_per_node: 2,
            threads_per_core: 1,
            memory_per_node: 16 << 30,
            memory_only_nodes: 0,
            isolated: CpuSet::new(),
            offline: CpuSet::new(),
        }
    }
}
