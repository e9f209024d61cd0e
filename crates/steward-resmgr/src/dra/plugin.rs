//! `v1.DRAPlugin` for driver `cpu.steward.dev`: what kubelet's DRA
//! manager calls on the DRA socket.
//!
//! * NodePrepareResources: each claim is read from the API
//!   ([`super::claim`]), its CPUs recorded in the resource manager's
//!   ledger (durable before the answer: `prepare_cpu_claim`), its CDI spec
//!   written ([`super::cdi`]); the answer lists each allocated device with
//!   the claim's CDI device.
//! * NodeUnprepareResources: the claim's CPUs given back, its spec
//!   removed. A claim this node never prepared answers success: kubelet
//!   retries an unprepare error until it succeeds.
//!
//! Batch semantics: one answer per claim UID, each with its own error; one
//! claim failing disturbs no other.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use steward_proto::dra::v1::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
    dra_plugin_server::{DraPlugin, DraPluginServer},
};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::cdi;
use super::claim::{self, ClaimName};
use crate::manager::ResourceManager;

/// Largest message decoded or encoded (gRPC's default, as kubelet's).
const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The DRAPlugin service over the resource manager.
#[derive(Clone)]
pub struct CpuPlugin {
    manager: Weak<ResourceManager>,
    client: kube::Client,
    node: String,
    cdi_dir: PathBuf,
    op_timeout: Duration,
}

impl CpuPlugin {
    pub fn new(
        manager: Weak<ResourceManager>,
        client: kube::Client,
        node: String,
        cdi_dir: PathBuf,
        op_timeout: Duration,
    ) -> Self {
        Self {
            manager,
            client,
            node,
            cdi_dir,
            op_timeout,
        }
    }

    /// The services of the DRA socket: `v1.DRAPlugin` only.
    pub fn routes(&self) -> Routes {
        Routes::new(
            DraPluginServer::new(self.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
    }

    fn manager(&self) -> Result<Arc<ResourceManager>, Status> {
        self.manager
            .upgrade()
            .ok_or_else(|| Status::unavailable("steward resource manager is shutting down"))
    }

    async fn prepare_one(
        &self,
        manager: &ResourceManager,
        claim: ClaimName,
    ) -> Result<Vec<Device>, String> {
        claim::check(&claim).map_err(|e| e.to_string())?;
        let allocated = claim::read(&self.client, &claim, &self.node, self.op_timeout)
            .await
            .map_err(|e| e.to_string())?;
        manager
            .prepare_cpu_claim(allocated.claim.clone())
            .await
            .map_err(|e| format!("preparing the CPUs of ResourceClaim {claim}: {e}"))?;
        cdi::write(&self.cdi_dir, &claim.uid).map_err(|e| e.to_string())?;
        let cdi_id = cdi::device_id(&claim.uid);
        Ok(allocated
            .results
            .into_iter()
            .map(|r| Device {
                request_names: vec![r.request],
                pool_name: r.pool,
                device_name: r.device,
                cdi_device_ids: vec![cdi_id.clone()],
                share_id: None,
            })
            .collect())
    }

    async fn unprepare_one(
        &self,
        manager: &ResourceManager,
        claim: &ClaimName,
    ) -> Result<(), String> {
        if claim.uid.is_empty() {
            return Err(claim::ClaimError::Incomplete(claim.clone()).to_string());
        }
        manager
            .unprepare_cpu_claim(&claim.uid)
            .await
            .map_err(|e| format!("unpreparing ResourceClaim {claim}: {e}"))?;
        // A UID that names no file cannot have a spec.
        if claim::valid_uid(&claim.uid) {
            cdi::remove(&self.cdi_dir, &claim.uid).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

fn name_of(c: Claim) -> ClaimName {
    ClaimName {
        uid: c.uid,
        namespace: c.namespace,
        name: c.name,
    }
}

#[tonic::async_trait]
impl DraPlugin for CpuPlugin {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let manager = self.manager()?;
        let answers = futures::future::join_all(request.into_inner().claims.into_iter().map(|c| {
            let claim = name_of(c);
            let manager = &manager;
            async move {
                let uid = claim.uid.clone();
                let answer = match self.prepare_one(manager, claim.clone()).await {
                    Ok(devices) => {
                        tracing::info!(%claim, devices = devices.len(), "CPU claim prepared");
                        NodePrepareResourceResponse {
                            devices,
                            error: String::new(),
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%claim, %error, "NodePrepareResources refused a CPU claim");
                        NodePrepareResourceResponse {
                            devices: Vec::new(),
                            error,
                        }
                    }
                };
                (uid, answer)
            }
        }))
        .await;
        Ok(Response::new(NodePrepareResourcesResponse {
            claims: answers.into_iter().collect::<HashMap<_, _>>(),
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let manager = self.manager()?;
        let mut claims = HashMap::new();
        for c in request.into_inner().claims {
            let claim = name_of(c);
            let error = match self.unprepare_one(&manager, &claim).await {
                Ok(()) => {
                    tracing::info!(%claim, "CPU claim unprepared");
                    String::new()
                }
                Err(error) => {
                    tracing::warn!(%claim, %error, "NodeUnprepareResources failed for a CPU claim");
                    error
                }
            };
            claims.insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}
