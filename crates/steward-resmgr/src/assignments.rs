//! What the CRI resource manager pinned, as records of the node view
//! (`steward_core::ledger`): the CPUs and memory nodes of every container it
//! holds in its cache, and what the node's topology makes allocatable. The
//! pod resources server publishes these as the `Cri` source.

use std::collections::BTreeSet;

use steward_core::cpu::{CpuSet, Topology};
use steward_core::ledger::{Allocatable, MemoryAssignment, PodAssignments, PodRef};

use crate::cache::{CacheData, ContainerState};

/// kubelet's memory manager name for ordinary memory.
const MEMORY: &str = "memory";

fn numa(set: &CpuSet) -> BTreeSet<i64> {
    set.iter().map(i64::from).collect()
}

/// Every pod with a container holding an assignment, with the CPUs, the
/// exclusivity and the memory (its limit, or request, on its memory nodes)
/// of each such container. Exited containers hold nothing. A record whose
/// cpuset text does not parse is left out (the cache's own load checks
/// reject such files; this never fails the view).
pub fn pods(data: &CacheData) -> Vec<PodAssignments> {
    let mut out: std::collections::BTreeMap<&str, PodAssignments> = Default::default();
    for c in data.containers.values() {
        if c.state == ContainerState::Exited {
            continue;
        }
        let (Some(a), Some(pod)) = (c.assignment.as_ref(), data.pods.get(&c.pod_id)) else {
            continue;
        };
        let (Ok(cpus), Ok(mems)) = (CpuSet::parse(&a.cpus), CpuSet::parse(&a.mems)) else {
            continue;
        };
        let entry = out.entry(pod.uid.as_str()).or_insert_with(|| {
            PodAssignments::new(PodRef::new(&pod.uid, &pod.namespace, &pod.name))
        });
        let container = entry.container_mut(&c.name);
        container.cpus = cpus;
        container.exclusive_cpus = a.exclusive && !container.cpus.is_empty();
        let size = c
            .request
            .memory_limit_bytes
            .unwrap_or(c.request.memory_request_bytes);
        container.memory = if size > 0 && !mems.is_empty() {
            vec![MemoryAssignment {
                memory_type: MEMORY.to_string(),
                size,
                numa_nodes: numa(&mems),
            }]
        } else {
            Vec::new()
        };
    }
    out.into_values().collect()
}

/// What the topology makes allocatable: the online CPUs that are not
/// isolated, and each NUMA node's memory.
pub fn allocatable(topology: &Topology) -> Allocatable {
    let mut memory: Vec<MemoryAssignment> = topology
        .nodes()
        .filter(|n| n.memory_bytes > 0)
        .map(|n| MemoryAssignment {
            memory_type: MEMORY.to_string(),
            size: n.memory_bytes,
            numa_nodes: BTreeSet::from([i64::from(n.id)]),
        })
        .collect();
    memory.sort();
    Allocatable {
        devices: Default::default(),
        cpus: topology.online_cpus().difference(topology.isolated_cpus()),
        memory,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cache::{
        AssignmentRecord, ContainerRecord, PodRecord, PodState, RequestRecord, ResourcesRecord,
    };

    fn container(
        id: &str,
        name: &str,
        cpus: &str,
        exclusive: bool,
        state: ContainerState,
    ) -> ContainerRecord {
        ContainerRecord {
            id: id.into(),
            pod_id: "s1".into(),
            name: name.into(),
            request: RequestRecord {
                qos: "Guaranteed".into(),
                cpu_request_milli: 1000,
                cpu_limit_milli: Some(1000),
                memory_request_bytes: 64 << 20,
                memory_limit_bytes: Some(64 << 20),
                cpu_claims: Vec::new(),
            },
            assignment: Some(AssignmentRecord {
                cpus: cpus.into(),
                mems: "0".into(),
                exclusive,
                pool: "p".into(),
            }),
            kubelet_resources: ResourcesRecord::default(),
            resources: ResourcesRecord::default(),
            state,
            cgroups_path: None,
            blockio_class: None,
            rdt_class: None,
            seq: 0,
        }
    }

    #[test]
    fn running_containers_show_their_cpus_and_memory_exited_ones_nothing() {
        let mut data = CacheData::default();
        data.pods.insert(
            "s1".into(),
            PodRecord {
                id: "s1".into(),
                uid: "u1".into(),
                name: "web".into(),
                namespace: "apps".into(),
                cgroup_parent: String::new(),
                annotations: BTreeMap::new(),
                labels: BTreeMap::new(),
                state: PodState::Ready,
            },
        );
        data.containers.insert(
            "c1".into(),
            container("c1", "main", "1", true, ContainerState::Running),
        );
        data.containers.insert(
            "c2".into(),
            container("c2", "old", "0", false, ContainerState::Exited),
        );
        let pods = pods(&data);
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].pod, PodRef::new("u1", "apps", "web"));
        let main = &pods[0].containers["main"];
        assert_eq!(main.cpus, CpuSet::from_iter([1]));
        assert!(main.exclusive_cpus);
        assert_eq!(main.memory[0].size, 64 << 20);
        assert_eq!(main.memory[0].numa_nodes, BTreeSet::from([0]));
        assert!(!pods[0].containers.contains_key("old"));
    }
}
