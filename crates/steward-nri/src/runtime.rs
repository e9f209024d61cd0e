//! Calls to the runtime's `Runtime` service (connection 2): RegisterPlugin
//! and UpdateContainers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, oneshot};

use crate::error::NriError;
use crate::mux::RUNTIME_SERVICE_CONN;
use crate::proto::nri::{
    ContainerEviction, ContainerUpdate, Empty, RUNTIME_SERVICE, RegisterPluginRequest,
    UpdateContainersRequest, UpdateContainersResponse,
};
use crate::proto::rpc::ttrpc::Response;
use crate::status::RpcStatus;
use crate::ttrpc;

/// A message for the socket writer: connection id and a whole ttrpc message.
pub(crate) type Outbound = mpsc::UnboundedSender<(u32, Vec<u8>)>;
/// Calls waiting for their response, by stream id.
pub(crate) type Pending = Arc<Mutex<HashMap<u32, oneshot::Sender<Response>>>>;

/// A handle for calling the runtime; cheap to clone.
#[derive(Clone)]
pub struct RuntimeClient {
    out: Outbound,
    pending: Pending,
    /// Next stream id: client-initiated streams are odd.
    next_stream: Arc<AtomicU32>,
    timeout: Duration,
}

impl RuntimeClient {
    pub(crate) fn new(out: Outbound, pending: Pending, timeout: Duration) -> Self {
        Self {
            out,
            pending,
            next_stream: Arc::new(AtomicU32::new(1)),
            timeout,
        }
    }

    /// Registers the plugin as `index-name`.
    pub async fn register(&self, name: &str, index: &str) -> Result<(), NriError> {
        let req = RegisterPluginRequest {
            plugin_name: name.to_owned(),
            plugin_idx: index.to_owned(),
        };
        match self.call("RegisterPlugin", req.encode_to_vec()).await {
            Ok(payload) => Empty::decode(payload.as_slice())
                .map(|_| ())
                .map_err(|source| NriError::Decode {
                    method: "RegisterPlugin",
                    source,
                }),
            Err(NriError::Rpc { status, .. }) => Err(NriError::Registration {
                name: format!("{index}-{name}"),
                status,
            }),
            Err(e) => Err(e),
        }
    }

    /// Asks the runtime to update (and evict) containers outside of any
    /// call of its own; answers the updates that failed.
    pub async fn update_containers(
        &self,
        update: Vec<ContainerUpdate>,
        evict: Vec<ContainerEviction>,
    ) -> Result<Vec<ContainerUpdate>, NriError> {
        let req = UpdateContainersRequest { update, evict };
        let payload = self.call("UpdateContainers", req.encode_to_vec()).await?;
        UpdateContainersResponse::decode(payload.as_slice())
            .map(|r| r.failed)
            .map_err(|source| NriError::Decode {
                method: "UpdateContainers",
                source,
            })
    }

    async fn call(&self, method: &'static str, payload: Vec<u8>) -> Result<Vec<u8>, NriError> {
        let stream = self.next_stream.fetch_add(2, Ordering::Relaxed);
        let timeout_nano = i64::try_from(self.timeout.as_nanos()).unwrap_or(i64::MAX);
        let msg = ttrpc::encode_request(stream, RUNTIME_SERVICE, method, payload, timeout_nano)?;
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(stream, tx);
        if self.out.send((RUNTIME_SERVICE_CONN, msg)).is_err() {
            self.forget(stream);
            return Err(NriError::Closed);
        }
        let resp = match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(_)) => return Err(NriError::Closed),
            Err(_) => {
                self.forget(stream);
                return Err(NriError::Timeout {
                    method,
                    timeout_ms: self.timeout.as_millis(),
                });
            }
        };
        if let Some(status) = resp.status.as_ref().and_then(RpcStatus::from_wire) {
            return Err(NriError::Rpc { method, status });
        }
        Ok(resp.payload)
    }

    fn forget(&self, stream: u32) {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&stream);
    }
}
