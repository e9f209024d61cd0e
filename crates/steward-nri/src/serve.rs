//! The plugin's `Plugin` service: decodes a call, runs the handler, encodes
//! the answer. Transport-free, so it is tested without a socket.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prost::Message;

use crate::handler::Handler;
use crate::proto::nri::{
    ConfigureRequest, ConfigureResponse, Container, CreateContainerRequest, Empty, PLUGIN_SERVICE,
    PodSandbox, StateChangeEvent, StopContainerRequest, SynchronizeRequest, SynchronizeResponse,
    UpdateContainerRequest,
};
use crate::status::{Code, RpcStatus};

/// Upstream's default request timeout, until Configure tells the real one.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Serves the runtime's calls with a [`Handler`].
pub struct PluginService<H> {
    handler: H,
    /// Pods and containers of a split Synchronize (`more` set) so far.
    pending_sync: Mutex<Option<(Vec<PodSandbox>, Vec<Container>)>>,
    /// The runtime's request timeout (ms), from Configure.
    request_timeout_ms: AtomicU64,
}

fn decode<M: Message + Default>(method: &str, payload: &[u8]) -> Result<M, RpcStatus> {
    M::decode(payload).map_err(|e| {
        RpcStatus::new(
            Code::InvalidArgument,
            format!("{method}: malformed request: {e}"),
        )
    })
}

impl<H: Handler> PluginService<H> {
    /// A service calling `handler`.
    pub fn new(handler: H) -> Self {
        Self {
            handler,
            pending_sync: Mutex::new(None),
            request_timeout_ms: AtomicU64::new(DEFAULT_REQUEST_TIMEOUT.as_millis() as u64),
        }
    }

    /// The handler.
    pub fn handler(&self) -> &H {
        &self.handler
    }

    /// How long the runtime waits for an answer (Configure's
    /// `request_timeout`; 2 s until then, upstream's default).
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms.load(Ordering::Relaxed))
    }

    /// Answers one call: the encoded response, or an error status.
    pub async fn call(
        &self,
        service: &str,
        method: &str,
        payload: &[u8],
    ) -> Result<Vec<u8>, RpcStatus> {
        if service != PLUGIN_SERVICE {
            return Err(RpcStatus::new(
                Code::Unimplemented,
                format!("service {service}"),
            ));
        }
        match method {
            "Configure" => {
                let req: ConfigureRequest = decode(method, payload)?;
                if req.request_timeout > 0 {
                    self.request_timeout_ms
                        .store(req.request_timeout as u64, Ordering::Relaxed);
                }
                let events = self.handler.configure(req).await?;
                Ok(ConfigureResponse { events: events.0 }.encode_to_vec())
            }
            "Synchronize" => {
                let req: SynchronizeRequest = decode(method, payload)?;
                self.synchronize(req).await
            }
            "Shutdown" => {
                let _: Empty = decode(method, payload)?;
                self.handler.shutdown().await;
                Ok(Empty {}.encode_to_vec())
            }
            "CreateContainer" => {
                let req: CreateContainerRequest = decode(method, payload)?;
                Ok(self.handler.create_container(req).await?.encode_to_vec())
            }
            "UpdateContainer" => {
                let req: UpdateContainerRequest = decode(method, payload)?;
                Ok(self.handler.update_container(req).await?.encode_to_vec())
            }
            "StopContainer" => {
                let req: StopContainerRequest = decode(method, payload)?;
                Ok(self.handler.stop_container(req).await?.encode_to_vec())
            }
            "StateChange" => {
                let req: StateChangeEvent = decode(method, payload)?;
                self.handler.state_change(req).await?;
                Ok(Empty {}.encode_to_vec())
            }
            // Newer NRI's dedicated lifecycle calls (RunPodSandbox, …) land
            // here: upstream runtimes fall back to StateChange on this answer.
            other => Err(RpcStatus::unimplemented(other)),
        }
    }

    /// A split Synchronize (`more` set) is answered `more` with no updates
    /// until the last part, as upstream's stub does; the handler then sees
    /// every pod and container at once.
    async fn synchronize(&self, req: SynchronizeRequest) -> Result<Vec<u8>, RpcStatus> {
        let (pods, containers) = {
            let mut pending = self
                .pending_sync
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let (mut pods, mut containers) = pending.take().unwrap_or_default();
            pods.extend(req.pods);
            containers.extend(req.containers);
            if req.more {
                *pending = Some((pods, containers));
                return Ok(SynchronizeResponse {
                    update: Vec::new(),
                    more: true,
                }
                .encode_to_vec());
            }
            (pods, containers)
        };
        let update = self.handler.synchronize(pods, containers).await?;
        Ok(SynchronizeResponse {
            update,
            more: false,
        }
        .encode_to_vec())
    }
}

#[cfg(test)]
mod tests;
