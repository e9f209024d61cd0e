//! The connection to the real runtime and the raw relay.
//!
//! Calls that are not intercepted are relayed as whole HTTP/2 gRPC streams:
//! request headers, every length-prefixed message frame and the trailers go
//! through byte for byte, by method path, in both directions and for as long
//! as the stream lives. Nothing is decoded, so streaming rpcs and rpcs this
//! build has never heard of (a newer kubelet) pass untouched.
//!
//! The raw relay uses its own HTTP/2 connection (no request queue in front
//! of it, re-dialled when it breaks); calls the proxy makes itself use a
//! typed tonic channel.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use steward_proto::cri::runtime::v1::runtime_service_client::RuntimeServiceClient;
use tonic::body::Body;
use tonic::transport::Channel;
use tracing::{debug, info, warn};

use crate::error::ResmgrError;

/// A lazily connected, self-reconnecting channel to the runtime's socket.
#[derive(Clone, Debug)]
pub struct Upstream {
    channel: Channel,
    raw: Arc<RawConn>,
    path: Arc<PathBuf>,
    healthy: Arc<AtomicBool>,
    went_down: Arc<AtomicBool>,
    timeout: Duration,
}

impl Upstream {
    /// A channel to the runtime at `path`. Nothing is dialled until the first
    /// call; a runtime that goes away is re-dialled on the next call.
    /// `timeout` bounds calls the proxy itself makes (not relayed ones).
    pub fn new(path: &Path, timeout: Duration) -> Result<Self, ResmgrError> {
        let channel = steward_proto::uds::endpoint()
            .connect_timeout(timeout)
            .connect_with_connector_lazy(steward_proto::uds::UnixConnector::new(path));
        Ok(Self {
            channel,
            raw: Arc::new(RawConn {
                path: path.to_path_buf(),
                timeout,
                current: std::sync::Mutex::new(None),
                dialing: tokio::sync::Mutex::new(()),
            }),
            path: Arc::new(path.to_path_buf()),
            healthy: Arc::new(AtomicBool::new(true)),
            went_down: Arc::new(AtomicBool::new(false)),
            timeout,
        })
    }

    /// Runtime socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Deadline for calls the proxy makes on its own behalf.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A typed CRI runtime client on the shared channel.
    pub fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone())
    }

    /// Whether the last call reached the runtime.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Record whether the runtime answered. Returns the previous value.
    pub fn set_healthy(&self, up: bool) -> bool {
        let was = self.healthy.swap(up, Ordering::Relaxed);
        if !up {
            self.went_down.store(true, Ordering::Relaxed);
        }
        if was != up {
            if up {
                info!(runtime = %self.path.display(), "runtime reachable again");
            } else {
                warn!(runtime = %self.path.display(), "runtime unreachable");
            }
        }
        was
    }

    /// Whether the runtime was seen unreachable since the last call of this
    /// (which clears it): after an outage the cache must be re-synced.
    pub fn take_went_down(&self) -> bool {
        self.went_down.swap(false, Ordering::Relaxed)
    }

    /// Relay one gRPC call unchanged and hand back the runtime's response
    /// stream. A runtime that cannot be reached becomes `UNAVAILABLE`.
    pub async fn forward(&self, req: http::Request<Body>) -> http::Response<Body> {
        match self.raw.send(req).await {
            Ok(resp) => {
                self.set_healthy(true);
                resp.map(Body::new)
            }
            Err(e) => {
                self.set_healthy(false);
                debug!(error = %e, "relay failed");
                tonic::Status::unavailable(format!(
                    "runtime at {} is unreachable: {e}",
                    self.path.display()
                ))
                .into_http()
            }
        }
    }

    /// Turn a status from a typed call into an error, tracking reachability.
    pub fn classify(&self, call: &'static str, status: tonic::Status) -> ResmgrError {
        if is_transport_failure(&status) {
            self.set_healthy(false);
            ResmgrError::RuntimeUnreachable {
                path: self.path.to_path_buf(),
                reason: format!("{call}: {}", status.message()),
                source: Some(Box::new(status)),
            }
        } else {
            self.set_healthy(true);
            ResmgrError::runtime(call, status)
        }
    }
}

/// Why a relayed call did not reach the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Connecting to the runtime socket took too long.
    #[error("connecting timed out after {0:?}")]
    ConnectTimeout(Duration),
    /// Connecting to the runtime socket failed.
    #[error("connecting: {0}")]
    Connect(#[source] std::io::Error),
    /// The HTTP/2 handshake with the runtime failed.
    #[error("HTTP/2 handshake: {0}")]
    Handshake(#[source] hyper::Error),
    /// The request's URI could not be made absolute.
    #[error("bad request URI: {0}")]
    Uri(#[source] http::Error),
    /// The connection failed while relaying.
    #[error("relaying: {0}")]
    Send(#[source] hyper::Error),
}

/// One HTTP/2 connection to the runtime for relayed calls.
#[derive(Debug)]
struct RawConn {
    path: PathBuf,
    timeout: Duration,
    current: std::sync::Mutex<Option<SendRequest<Body>>>,
    dialing: tokio::sync::Mutex<()>,
}

impl RawConn {
    fn live(&self) -> Option<SendRequest<Body>> {
        let guard = self.current.lock().ok()?;
        guard.as_ref().filter(|s| !s.is_closed()).cloned()
    }

    async fn sender(&self) -> Result<SendRequest<Body>, RelayError> {
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let _one_dialer = self.dialing.lock().await;
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let stream =
            tokio::time::timeout(self.timeout, tokio::net::UnixStream::connect(&self.path))
                .await
                .map_err(|_| RelayError::ConnectTimeout(self.timeout))?
                .map_err(RelayError::Connect)?;
        let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .adaptive_window(true)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(RelayError::Handshake)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(error = %e, "relay connection to the runtime ended");
            }
        });
        if let Ok(mut g) = self.current.lock() {
            *g = Some(send.clone());
        }
        Ok(send)
    }

    async fn send(
        &self,
        req: http::Request<Body>,
    ) -> Result<http::Response<hyper::body::Incoming>, RelayError> {
        let (mut parts, body) = req.into_parts();
        // HTTP/2 needs scheme and authority; the runtime ignores them.
        let pq = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
        parts.uri = http::Uri::builder()
            .scheme("http")
            .authority("localhost")
            .path_and_query(pq)
            .build()
            .map_err(RelayError::Uri)?;
        let mut send = self.sender().await?;
        match send
            .send_request(http::Request::from_parts(parts, body))
            .await
        {
            Ok(resp) => Ok(resp),
            Err(e) => {
                if let Ok(mut g) = self.current.lock() {
                    *g = None;
                }
                Err(RelayError::Send(e))
            }
        }
    }
}

/// Whether a status means "never reached the runtime" rather than "the
/// runtime refused": `UNAVAILABLE` made on this side from a transport,
/// HTTP/2 or I/O error (found in its source chain), never from the text of
/// a message (a runtime may answer `UNAVAILABLE` itself, with any text).
pub fn is_transport_failure(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    if status.code() != tonic::Code::Unavailable {
        return false;
    }
    let mut next = status.source();
    while let Some(e) = next {
        if e.is::<tonic::transport::Error>()
            || e.is::<hyper::Error>()
            || e.is::<std::io::Error>()
            || e.is::<RelayError>()
        {
            return true;
        }
        next = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn transport_failures_are_told_by_their_source_not_their_text() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let mut s = tonic::Status::unavailable("anything");
        s.set_source(Arc::new(refused));
        assert!(is_transport_failure(&s));
        // The runtime's own UNAVAILABLE, whatever it says.
        for text in ["transport error", "error trying to connect", "busy"] {
            assert!(
                !is_transport_failure(&tonic::Status::unavailable(text)),
                "{text}"
            );
        }
        // A source that is not a transport error.
        let mut s = tonic::Status::unavailable("x");
        s.set_source(Arc::new(std::fmt::Error));
        assert!(!is_transport_failure(&s));
        // Other codes never are.
        let mut s = tonic::Status::internal("x");
        s.set_source(Arc::new(std::io::Error::other("x")));
        assert!(!is_transport_failure(&s));
    }
}
