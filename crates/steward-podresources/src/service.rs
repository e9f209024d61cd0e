//! The `PodResourcesLister` gRPC service over the hub: kubelet's v1 rpcs
//! plus the KEP's two watches, rate limited like kubelet.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use steward_proto::podresources::v1 as wire;
use steward_proto::podresources::v1::pod_resources_lister_server::PodResourcesLister;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

use crate::hub::{Hub, WatchStream};
use crate::limiter::TokenBucket;
use crate::metrics::V1;

/// Response header of the watch rpcs: how many messages at the head of the
/// stream describe the state at subscription. A client that knows it can
/// tell the snapshot from the changes (and replace what it knew); others
/// ignore it.
pub const INITIAL_EVENTS_HEADER: &str = "x-steward-initial-events";

/// The service. Cheap to clone.
#[derive(Clone)]
pub struct PodResourcesService {
    hub: Arc<Hub>,
    limiter: Arc<Mutex<TokenBucket>>,
}

impl PodResourcesService {
    /// `qps <= 0` turns the rate limit off.
    pub fn new(hub: Arc<Hub>, qps: f64, burst: u32) -> Self {
        Self {
            hub,
            limiter: Arc::new(Mutex::new(TokenBucket::new(qps, burst, Instant::now()))),
        }
    }

    /// Counts the call and takes a token, as kubelet's interceptor does.
    fn admit(&self) -> Result<(), Status> {
        let m = self.hub.metrics();
        m.requests_total.get_or_create(&V1).inc();
        let mut bucket = self.limiter.lock().unwrap_or_else(PoisonError::into_inner);
        if bucket.try_take(Instant::now()) {
            Ok(())
        } else {
            m.rejected.get_or_create(&V1).inc();
            Err(Status::resource_exhausted(format!(
                "pod resources: rejected by the rate limit; retry in {:?}",
                bucket.wait_hint()
            )))
        }
    }
}

fn with_initial_header<M>(stream: WatchStream<M>) -> Response<WatchStream<M>> {
    let n = stream.initial_len();
    let mut resp = Response::new(stream);
    resp.metadata_mut()
        .insert(INITIAL_EVENTS_HEADER, MetadataValue::from(n as u64));
    resp
}

#[tonic::async_trait]
impl PodResourcesLister for PodResourcesService {
    type ListAndWatchStream = WatchStream<wire::ListAndWatchPodResourcesResponse>;
    type ListAndWatchAllocatableResourcesStream =
        WatchStream<wire::ListAndWatchAllocatableResourcesResponse>;

    async fn list(
        &self,
        _request: Request<wire::ListPodResourcesRequest>,
    ) -> Result<Response<wire::ListPodResourcesResponse>, Status> {
        let m = self.hub.metrics();
        m.requests_list.get_or_create(&V1).inc();
        self.admit().inspect_err(|_| {
            m.errors_list.get_or_create(&V1).inc();
        })?;
        Ok(Response::new(wire::ListPodResourcesResponse {
            pod_resources: self.hub.list(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<wire::AllocatableResourcesRequest>,
    ) -> Result<Response<wire::AllocatableResourcesResponse>, Status> {
        let m = self.hub.metrics();
        m.requests_get_allocatable.get_or_create(&V1).inc();
        self.admit().inspect_err(|_| {
            m.errors_get_allocatable.get_or_create(&V1).inc();
        })?;
        Ok(Response::new(self.hub.allocatable()))
    }

    async fn get(
        &self,
        request: Request<wire::GetPodResourcesRequest>,
    ) -> Result<Response<wire::GetPodResourcesResponse>, Status> {
        let m = self.hub.metrics();
        m.requests_get.get_or_create(&V1).inc();
        let fail = |s: Status| {
            m.errors_get.get_or_create(&V1).inc();
            s
        };
        self.admit().map_err(fail)?;
        let req = request.into_inner();
        if req.pod_name.is_empty() || req.pod_namespace.is_empty() {
            return Err(fail(Status::invalid_argument(
                "pod_name and pod_namespace are both required",
            )));
        }
        match self.hub.get(&req.pod_namespace, &req.pod_name) {
            Some(pod) => Ok(Response::new(wire::GetPodResourcesResponse {
                pod_resources: Some(pod),
            })),
            None => Err(fail(Status::not_found(format!(
                "pod {} in namespace {} not found",
                req.pod_name, req.pod_namespace
            )))),
        }
    }

    async fn list_and_watch(
        &self,
        _request: Request<wire::ListAndWatchPodResourcesRequest>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        self.hub
            .metrics()
            .requests_list_and_watch
            .get_or_create(&V1)
            .inc();
        self.admit()?;
        let stream = self.hub.watch_pods().inspect_err(|_| {
            self.hub.metrics().rejected.get_or_create(&V1).inc();
        })?;
        Ok(with_initial_header(stream))
    }

    async fn list_and_watch_allocatable_resources(
        &self,
        _request: Request<wire::ListAndWatchAllocatableResourcesRequest>,
    ) -> Result<Response<Self::ListAndWatchAllocatableResourcesStream>, Status> {
        self.hub
            .metrics()
            .requests_list_and_watch_allocatable
            .get_or_create(&V1)
            .inc();
        self.admit()?;
        let stream = self.hub.watch_allocatable().inspect_err(|_| {
            self.hub.metrics().rejected.get_or_create(&V1).inc();
        })?;
        Ok(with_initial_header(stream))
    }
}
