//! The node view's types on the wire: kubelet's podresources v1 messages.
//!
//! Both directions: the server answers with them, and the clients that follow
//! kubelet's socket (or another steward process's) turn them back into
//! records of a [`Source`](steward_core::ledger::Source).

use std::collections::BTreeSet;

use steward_core::cpu::CpuSet;
use steward_core::ledger::{
    Action, Allocatable, ClaimDevice, ContainerAssignments, DynamicAssignment, MemoryAssignment,
    PodAssignments, PodEvent, PodRef, allocatable::AllocatableEvent,
};
use steward_proto::podresources::v1 as wire;

fn topology(numa: &BTreeSet<i64>) -> Option<wire::TopologyInfo> {
    (!numa.is_empty()).then(|| wire::TopologyInfo {
        nodes: numa.iter().map(|id| wire::NumaNode { id: *id }).collect(),
    })
}

fn numa_of(t: Option<&wire::TopologyInfo>) -> BTreeSet<i64> {
    t.map(|t| t.nodes.iter().map(|n| n.id).collect())
        .unwrap_or_default()
}

fn memory(m: &MemoryAssignment) -> wire::ContainerMemory {
    wire::ContainerMemory {
        memory_type: m.memory_type.clone(),
        size: m.size,
        topology: topology(&m.numa_nodes),
    }
}

fn memory_of(m: &wire::ContainerMemory) -> MemoryAssignment {
    MemoryAssignment {
        memory_type: m.memory_type.clone(),
        size: m.size,
        numa_nodes: numa_of(m.topology.as_ref()),
    }
}

fn cpu_ids(cpus: &CpuSet) -> Vec<i64> {
    cpus.iter().map(i64::from).collect()
}

/// CPU ids from the wire; ids that are negative or too large are skipped
/// (and counted by the caller if it cares) rather than failing the report.
fn cpus_of(ids: &[i64]) -> CpuSet {
    ids.iter()
        .filter_map(|id| u32::try_from(*id).ok())
        .filter(|id| *id <= steward_core::cpu::MAX_ID)
        .collect()
}

/// One pod as `PodResources`.
pub fn pod_resources(p: &PodAssignments) -> wire::PodResources {
    wire::PodResources {
        name: p.pod.name.clone(),
        namespace: p.pod.namespace.clone(),
        // No pod-level exclusive CPUs or memory in steward (kubelet 1.37+).
        cpu_ids: Vec::new(),
        memory: Vec::new(),
        containers: p
            .containers
            .iter()
            .map(|(name, c)| wire::ContainerResources {
                name: name.clone(),
                devices: c
                    .devices
                    .iter()
                    .map(|d| wire::ContainerDevices {
                        resource_name: d.resource_name.clone(),
                        device_ids: d.device_ids.iter().cloned().collect(),
                        topology: topology(&d.numa_nodes),
                    })
                    .collect(),
                // As kubelet reports them (its GetCPUs and GetMemory): a
                // container's CPUs and memory only when they are its own. A
                // container on the shared pool reports none.
                cpu_ids: if c.exclusive_cpus {
                    cpu_ids(&c.cpus)
                } else {
                    Vec::new()
                },
                memory: if c.exclusive_cpus {
                    c.memory.iter().map(memory).collect()
                } else {
                    Vec::new()
                },
                dynamic_resources: c
                    .dynamic
                    .iter()
                    .map(|d| wire::DynamicResource {
                        claim_name: d.claim_name.clone(),
                        claim_namespace: d.claim_namespace.clone(),
                        claim_resources: d
                            .devices
                            .iter()
                            .map(|r| wire::ClaimResource {
                                cdi_devices: r
                                    .cdi_devices
                                    .iter()
                                    .map(|n| wire::CdiDevice { name: n.clone() })
                                    .collect(),
                                driver_name: r.driver_name.clone(),
                                pool_name: r.pool_name.clone(),
                                device_name: r.device_name.clone(),
                                // steward hands out no DRA share IDs.
                                share_id: None,
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// A pod from the wire. podresources carries no UID, so the caller names
/// one: kubelet's List is keyed by namespace/name.
pub fn pod_assignments(uid: &str, p: &wire::PodResources) -> PodAssignments {
    let mut out = PodAssignments::new(PodRef::new(uid, &p.namespace, &p.name));
    for c in &p.containers {
        let target: &mut ContainerAssignments = out.container_mut(&c.name);
        for d in &c.devices {
            target.add_devices(
                &d.resource_name,
                d.device_ids.iter().cloned(),
                &numa_of(d.topology.as_ref()),
            );
        }
        target.cpus = cpus_of(&c.cpu_ids);
        // On the wire a container's CPUs are its exclusive ones (kubelet
        // reports none for a container on the shared pool; so does steward).
        target.exclusive_cpus = !target.cpus.is_empty();
        target.memory = c.memory.iter().map(memory_of).collect();
        target.dynamic = c
            .dynamic_resources
            .iter()
            .map(|d| DynamicAssignment {
                claim_name: d.claim_name.clone(),
                claim_namespace: d.claim_namespace.clone(),
                devices: d
                    .claim_resources
                    .iter()
                    .map(|r| ClaimDevice {
                        driver_name: r.driver_name.clone(),
                        pool_name: r.pool_name.clone(),
                        device_name: r.device_name.clone(),
                        cdi_devices: r.cdi_devices.iter().map(|c| c.name.clone()).collect(),
                    })
                    .collect(),
            })
            .collect();
    }
    out
}

/// A watch event on the wire.
pub fn pod_event(e: &PodEvent) -> wire::ListAndWatchPodResourcesResponse {
    wire::ListAndWatchPodResourcesResponse {
        action: match e.action {
            Action::Added => wire::WatchPodAction::Added,
            Action::Deleted => wire::WatchPodAction::Deleted,
            Action::Updated => wire::WatchPodAction::Updated,
        } as i32,
        uid: e.pod.uid().to_string(),
        pod_resources: vec![pod_resources(&e.pod)],
    }
}

/// The action of a watch event from the wire (unknown numbers are updates:
/// the event still carries the pod's whole state).
pub fn action_of(action: i32) -> Action {
    match wire::WatchPodAction::try_from(action) {
        Ok(wire::WatchPodAction::Added) => Action::Added,
        Ok(wire::WatchPodAction::Deleted) => Action::Deleted,
        _ => Action::Updated,
    }
}

fn devices(a: &Allocatable) -> Vec<wire::ContainerDevices> {
    let mut out = Vec::new();
    for (name, devs) in &a.devices {
        for (id, numa) in devs {
            out.push(wire::ContainerDevices {
                resource_name: name.clone(),
                device_ids: vec![id.clone()],
                topology: topology(numa),
            });
        }
    }
    out
}

/// Allocatable resources as `GetAllocatableResources` answers (one entry
/// per device, as kubelet does, so each carries its own topology).
pub fn allocatable(a: &Allocatable) -> wire::AllocatableResourcesResponse {
    wire::AllocatableResourcesResponse {
        devices: devices(a),
        cpu_ids: cpu_ids(&a.cpus),
        memory: a.memory.iter().map(memory).collect(),
    }
}

/// Allocatable resources from the wire.
pub fn allocatable_of(r: &wire::AllocatableResourcesResponse) -> Allocatable {
    let mut out = Allocatable::default();
    for d in &r.devices {
        let numa = numa_of(d.topology.as_ref());
        let entry = out.devices.entry(d.resource_name.clone()).or_default();
        for id in &d.device_ids {
            entry.insert(id.clone(), numa.clone());
        }
    }
    out.cpus = cpus_of(&r.cpu_ids);
    out.memory = r.memory.iter().map(memory_of).collect();
    out.memory.sort();
    out
}

/// An allocatable watch event on the wire.
pub fn allocatable_event(e: &AllocatableEvent) -> wire::ListAndWatchAllocatableResourcesResponse {
    wire::ListAndWatchAllocatableResourcesResponse {
        devices: devices(&e.resources),
        cpu_ids: cpu_ids(&e.resources.cpus),
        memory: e.resources.memory.iter().map(memory).collect(),
        action: match e.action {
            Action::Added => wire::WatchResourceAction::ResourceAdded,
            Action::Deleted => wire::WatchResourceAction::ResourceDeleted,
            Action::Updated => wire::WatchResourceAction::ResourceUpdated,
        } as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_survives_the_round_trip_through_the_wire() {
        let mut p = PodAssignments::new(PodRef::new("u1", "ns", "web"));
        let c = p.container_mut("main");
        c.add_devices("steward.dev/cam", ["cam-0", "cam-1"], &BTreeSet::from([1]));
        c.cpus = CpuSet::from_iter([2, 3]);
        c.exclusive_cpus = true;
        c.memory = vec![MemoryAssignment {
            memory_type: "memory".into(),
            size: 1 << 30,
            numa_nodes: BTreeSet::from([0]),
        }];
        c.dynamic = vec![DynamicAssignment {
            claim_name: "gpu".into(),
            claim_namespace: "ns".into(),
            devices: vec![ClaimDevice {
                driver_name: "steward.dev".into(),
                pool_name: "node-a".into(),
                device_name: "cam-0".into(),
                cdi_devices: vec!["steward.dev/cam=cam-0".into()],
            }],
        }];
        p.container_mut("init");
        let back = pod_assignments("u1", &pod_resources(&p));
        assert_eq!(back, p);
    }

    #[test]
    fn a_container_on_the_shared_pool_reports_no_cpus_or_memory_as_kubelet_does() {
        let mut p = PodAssignments::new(PodRef::new("u1", "ns", "web"));
        let c = p.container_mut("side");
        c.cpus = CpuSet::from_iter([0, 1]);
        c.memory = vec![MemoryAssignment {
            memory_type: "memory".into(),
            size: 1 << 20,
            numa_nodes: BTreeSet::from([0]),
        }];
        let wire = pod_resources(&p);
        assert!(wire.containers[0].cpu_ids.is_empty());
        assert!(wire.containers[0].memory.is_empty());
        let back = pod_assignments("u1", &wire);
        assert!(back.containers["side"].cpus.is_empty());
        assert!(!back.containers["side"].exclusive_cpus);
    }

    #[test]
    fn out_of_range_cpu_ids_are_skipped_not_fatal() {
        assert_eq!(cpus_of(&[-1, 3, i64::MAX]), CpuSet::from_iter([3]));
    }
}
