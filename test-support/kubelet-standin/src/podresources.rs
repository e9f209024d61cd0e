//! The podresources v1 service kubelet serves on `<root>/pod-resources/kubelet.sock`.
//!
//! Devices and DRA claims (`dynamic_resources`) are reported; `cpu_ids`
//! and `memory` stay empty because the stand-in has no CPU or memory manager.

use std::collections::BTreeMap;
use std::sync::Arc;

use steward_proto::podresources::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse,
    ListAndWatchAllocatableResourcesRequest, ListAndWatchAllocatableResourcesResponse,
    ListAndWatchPodResourcesRequest, ListAndWatchPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, NumaNode, PodResources, TopologyInfo,
    pod_resources_lister_server::PodResourcesLister,
};
use tonic::{Request, Response, Status};

use crate::checkpoint::NO_TOPOLOGY;
use crate::manager::{Allocation, State};
use crate::pods::PodStatus;
use crate::shared::Shared;

pub(crate) struct PodResourcesService {
    pub shared: Arc<Shared>,
}

fn entry(resource: &str, id: &str, numa: Option<i64>) -> ContainerDevices {
    ContainerDevices {
        resource_name: resource.to_string(),
        device_ids: vec![id.to_string()],
        topology: numa.map(|id| TopologyInfo {
            nodes: vec![NumaNode { id }],
        }),
    }
}

/// Kubelet reports one `ContainerDevices` per device and NUMA node.
fn allocation_devices(resources: &BTreeMap<String, Allocation>) -> Vec<ContainerDevices> {
    let mut out = Vec::new();
    for (resource, alloc) in resources {
        let mut rows: Vec<(String, Option<i64>)> = Vec::new();
        for (numa, ids) in &alloc.devices {
            let node = (*numa != NO_TOPOLOGY).then_some(*numa);
            rows.extend(ids.iter().map(|id| (id.clone(), node)));
        }
        rows.sort();
        out.extend(rows.iter().map(|(id, node)| entry(resource, id, *node)));
    }
    out
}

pub(crate) fn pod_resources(state: &State, pod: &PodStatus) -> PodResources {
    let allocations = state.pod_devices.get(&pod.uid);
    let containers = pod
        .spec
        .containers
        .iter()
        .map(|c| ContainerResources {
            name: c.name.clone(),
            devices: allocations
                .and_then(|a| a.get(&c.name))
                .map(allocation_devices)
                .unwrap_or_default(),
            dynamic_resources: crate::dra::dynamic_resources(state, &pod.spec, c),
            ..Default::default()
        })
        .collect();
    PodResources {
        name: pod.spec.name.clone(),
        namespace: pod.spec.namespace.clone(),
        containers,
        ..Default::default() // no pod-level exclusive CPUs or memory
    }
}

pub(crate) fn allocatable(state: &State) -> Vec<ContainerDevices> {
    let mut out = Vec::new();
    for (resource, entry_state) in &state.resources {
        for id in &entry_state.state.healthy {
            match entry_state.state.topology.get(id).filter(|n| !n.is_empty()) {
                Some(nodes) => out.extend(nodes.iter().map(|n| entry(resource, id, Some(*n)))),
                None => out.push(entry(resource, id, None)),
            }
        }
    }
    out
}

type WatchStream<T> = futures::stream::Empty<Result<T, Status>>;

#[tonic::async_trait]
impl PodResourcesLister for PodResourcesService {
    type ListAndWatchStream = WatchStream<ListAndWatchPodResourcesResponse>;
    type ListAndWatchAllocatableResourcesStream =
        WatchStream<ListAndWatchAllocatableResourcesResponse>;

    /// kubelet never merged the watch: it answers Unimplemented, and so does
    /// the stand-in, so clients are tested against what they will meet.
    async fn list_and_watch(
        &self,
        _request: Request<ListAndWatchPodResourcesRequest>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        Err(Status::unimplemented(
            "ListAndWatch is not served by kubelet",
        ))
    }

    async fn list_and_watch_allocatable_resources(
        &self,
        _request: Request<ListAndWatchAllocatableResourcesRequest>,
    ) -> Result<Response<Self::ListAndWatchAllocatableResourcesStream>, Status> {
        Err(Status::unimplemented(
            "ListAndWatchAllocatableResources is not served by kubelet",
        ))
    }

    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let st = self.shared.lock();
        let mut pods: Vec<&PodStatus> = st
            .pods
            .values()
            .filter(|p| !p.phase.is_terminal())
            .collect();
        pods.sort_by(|a, b| {
            (&a.spec.namespace, &a.spec.name).cmp(&(&b.spec.namespace, &b.spec.name))
        });
        let pod_resources = pods.into_iter().map(|p| pod_resources(&st, p)).collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        let st = self.shared.lock();
        Ok(Response::new(AllocatableResourcesResponse {
            devices: allocatable(&st),
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        let req = request.into_inner();
        let st = self.shared.lock();
        let matching = || {
            st.pods
                .values()
                .filter(|p| p.spec.name == req.pod_name && p.spec.namespace == req.pod_namespace)
        };
        // Prefer a live pod over an old terminated one with the same name.
        let pod = matching()
            .find(|p| !p.phase.is_terminal())
            .or_else(|| matching().next());
        match pod {
            Some(pod) => Ok(Response::new(GetPodResourcesResponse {
                pod_resources: Some(pod_resources(&st, pod)),
            })),
            None => Err(Status::not_found(format!(
                "pod {} in namespace {} not found",
                req.pod_name, req.pod_namespace
            ))),
        }
    }
}
