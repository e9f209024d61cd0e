//! Serving the pod resources service on a unix socket the caller bound
//! (with `steward_nodeio::bind`), to grpc-go and gRPC C-core clients alike.

use std::sync::Arc;

use steward_nodeio::{AuthorityMode, UnixIncoming};
use steward_proto::podresources::v1::pod_resources_lister_server::PodResourcesListerServer;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use crate::hub::Hub;
use crate::service::PodResourcesService;

/// Largest request or response message, set explicitly (a List of a busy
/// node is well under it).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// How the server is run.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// Calls per second admitted (`<= 0`: no limit) and the burst.
    pub qps: f64,
    pub burst: u32,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            qps: crate::limiter::DEFAULT_QPS,
            burst: crate::limiter::DEFAULT_BURST,
        }
    }
}

/// Serves until `cancel`, then closes every stream. The `:authority` fix
/// is on: third-party clients (gRPC C-core among them) dial this socket.
pub async fn serve(
    hub: Arc<Hub>,
    listener: UnixListener,
    options: ServeOptions,
    cancel: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    serve_with_authority(hub, listener, options, AuthorityMode::Fix, cancel).await
}

/// [`serve`] with the `:authority` handling chosen (the benchmark measures
/// what the fix costs).
pub async fn serve_with_authority(
    hub: Arc<Hub>,
    listener: UnixListener,
    options: ServeOptions,
    authority: AuthorityMode,
    cancel: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let service = PodResourcesListerServer::new(PodResourcesService::new(
        hub.clone(),
        options.qps,
        options.burst,
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(UnixIncoming::new(listener, authority), async move {
            cancel.cancelled().await;
            hub.close_watchers();
        })
        .await
}
