//! DH side of the v0 protocol: serves a [`DiscoveryHandler`] and keeps it
//! registered with the agent.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use steward_nodeio::FileIdentity;
use steward_nodeio::backoff::Backoff;
use steward_proto::discovery::v0 as proto;
use steward_proto::discovery::v0::discovery_handler_server::{self, DiscoveryHandlerServer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;
use tonic::{Request, Response, Status};

use crate::client::MAX_MESSAGE_BYTES;
use crate::convert::{device_to_proto, request_from_proto};
use crate::{DiscoveryError, DiscoveryHandler, Endpoint, registration, uds};

/// Mode of a handler's own socket.
pub const SOCKET_MODE: u32 = 0o600;
/// How often [`run_external`] checks whether the agent's registration socket
/// was re-created (agent restart).
pub const AGENT_SOCKET_POLL: Duration = Duration::from_millis(500);
/// Longest pause between two failed registration attempts.
pub const MAX_REGISTER_BACKOFF: Duration = Duration::from_secs(10);
/// First pause after a failed registration attempt; doubled per failure.
const FIRST_REGISTER_BACKOFF: Duration = Duration::from_millis(200);

type ResponseStream = Pin<Box<dyn Stream<Item = Result<proto::DiscoverResponse, Status>> + Send>>;

/// The v0 `DiscoveryHandler` service backed by a [`DiscoveryHandler`]. Every
/// response stream ends when `stop` is cancelled, so a graceful server
/// shutdown does not wait for endless streams.
struct Service {
    handler: Arc<dyn DiscoveryHandler>,
    stop: CancellationToken,
}

/// How a handler error travels over the wire (the client maps it back).
pub fn error_to_status(err: &DiscoveryError) -> Status {
    match err {
        DiscoveryError::InvalidDetails(m) => Status::invalid_argument(m.clone()),
        DiscoveryError::Timeout(m) => Status::deadline_exceeded(m.clone()),
        other => Status::aborted(other.to_string()),
    }
}

#[tonic::async_trait]
impl discovery_handler_server::DiscoveryHandler for Service {
    type DiscoverStream = ResponseStream;

    async fn discover(
        &self,
        request: Request<proto::DiscoverRequest>,
    ) -> Result<Response<Self::DiscoverStream>, Status> {
        let req = request_from_proto(request.into_inner());
        let name = self.handler.name().to_string();
        let devices = match self.handler.discover(req) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(handler = %name, error = %e, "refused Discover request");
                return Err(error_to_status(&e));
            }
        };
        tracing::info!(handler = %name, "Discover stream started");
        let stop = self.stop.clone().cancelled_owned();
        let out = devices.take_until(stop).scan(false, move |failed, item| {
            let next = if *failed {
                None
            } else {
                match item {
                    Ok(list) => Some(Ok(proto::DiscoverResponse {
                        devices: list.iter().map(device_to_proto).collect(),
                    })),
                    Err(e) => {
                        tracing::warn!(handler = %name, error = %e, "discovery failed");
                        *failed = true;
                        Some(Err(error_to_status(&e)))
                    }
                }
            };
            futures::future::ready(next)
        });
        Ok(Response::new(Box::pin(out)))
    }
}

async fn serve_incoming<I, IO, IE>(
    handler: Arc<dyn DiscoveryHandler>,
    incoming: I,
    stop: CancellationToken,
) -> Result<(), DiscoveryError>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let service = DiscoveryHandlerServer::new(Service {
        handler,
        stop: stop.clone(),
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
        .await
        .map_err(|e| {
            DiscoveryError::Io(std::io::Error::other(format!(
                "discovery handler server failed: {}",
                uds::error_chain(&e)
            )))
        })
}

/// Runs `fut` (a server) until it ends or `shutdown` completes; on shutdown
/// cancels `stop` and lets the server drain.
async fn until_shutdown<F>(
    server: F,
    stop: CancellationToken,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DiscoveryError>
where
    F: Future<Output = Result<(), DiscoveryError>>,
{
    // Dropped unfinished, the streams (on connection tasks of their own)
    // and the registrar end too.
    let _cancel_on_drop = stop.clone().drop_guard();
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => r,
        () = shutdown => {
            stop.cancel();
            server.await
        }
    }
}

/// Serves `handler` on the unix socket `listen` (mode 0600) without
/// registering. Runs until `shutdown`.
pub async fn serve_uds(
    handler: Arc<dyn DiscoveryHandler>,
    listen: PathBuf,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DiscoveryError> {
    let (incoming, guard) = uds::bind(&listen, SOCKET_MODE)?;
    let stop = CancellationToken::new();
    let server = serve_incoming(handler, incoming, stop.clone());
    let result = until_shutdown(server, stop, shutdown).await;
    drop(guard);
    result
}

/// Serves `handler` on a TCP listener (for `NETWORK` endpoints, e.g.
/// `http://127.0.0.1:PORT`) without registering. Runs until `shutdown`.
pub async fn serve_tcp(
    handler: Arc<dyn DiscoveryHandler>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DiscoveryError> {
    let stop = CancellationToken::new();
    let server = serve_incoming(handler, TcpListenerStream::new(listener), stop.clone());
    until_shutdown(server, stop, shutdown).await
}

/// DH side: serves DiscoveryHandler for `handler` on `listen` (a unix socket
/// path) and registers with the agent; re-registers whenever the agent's
/// registration socket is re-created (agent restart). Runs until shutdown.
///
/// Registration failures (agent not up yet, rejected) are logged and retried
/// with backoff; only failing to serve is an error.
pub async fn run_external(
    handler: Arc<dyn DiscoveryHandler>,
    listen: PathBuf,
    agent_socket: PathBuf,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DiscoveryError> {
    let endpoint = match listen.to_str() {
        Some(p) if listen.is_absolute() => Endpoint::Uds(p.to_string()),
        _ => {
            return Err(DiscoveryError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "listen path {} must be an absolute UTF-8 path",
                    listen.display()
                ),
            )));
        }
    };
    let (incoming, guard) = uds::bind(&listen, SOCKET_MODE)?;
    let stop = CancellationToken::new();
    tracing::info!(handler = handler.name(), socket = %listen.display(), agent = %agent_socket.display(), "serving external discovery handler");
    let registrar = tokio::spawn(keep_registered(
        handler.name().to_string(),
        handler.shared(),
        endpoint,
        agent_socket,
        stop.clone(),
    ));
    let server = serve_incoming(handler, incoming, stop.clone());
    let result = until_shutdown(server, stop, shutdown).await;
    registrar.abort();
    drop(guard);
    result
}

/// Registers whenever the agent socket appears with a new identity.
async fn keep_registered(
    name: String,
    shared: bool,
    endpoint: Endpoint,
    agent_socket: PathBuf,
    stop: CancellationToken,
) {
    let mut registered: Option<FileIdentity> = None;
    let mut backoff = Backoff::doubling(FIRST_REGISTER_BACKOFF, MAX_REGISTER_BACKOFF);
    let mut failures = 0u32;
    loop {
        let current = FileIdentity::of(&agent_socket);
        if current.is_none() {
            // The agent is gone; whatever appears next is a new agent.
            registered = None;
        }
        let mut pause = AGENT_SOCKET_POLL;
        if current.is_some() && current != registered {
            match registration::register(&agent_socket, &name, &endpoint, shared).await {
                Ok(()) => {
                    tracing::info!(handler = %name, agent = %agent_socket.display(), "registered with the agent");
                    registered = current;
                    backoff.reset();
                    failures = 0;
                }
                Err(e) => {
                    failures += 1;
                    log_failure(&name, &agent_socket, &e, failures);
                    pause = backoff.next_delay();
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stop.cancelled() => return,
        }
    }
}

fn log_failure(name: &str, agent: &Path, e: &DiscoveryError, failures: u32) {
    if failures <= 3 || failures.is_power_of_two() {
        tracing::warn!(handler = %name, agent = %agent.display(), error = %e, failures, "registration with the agent failed, will retry");
    } else {
        tracing::debug!(handler = %name, error = %e, failures, "registration failed again");
    }
}
