//! The accept loop: a connection slot taken before each accept, one task
//! per connection, and a back-off while accepting fails.

use std::future::Future;
use std::io;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::connection::connection;
use super::limits::Limits;
use super::tls::{PeerCertificates, TlsSource};
use super::{ACCEPT_BACKOFF_MAX, ACCEPT_BACKOFF_MIN};
use crate::backoff::Backoff;

/// A listener [`serve`] accepts connections from.
pub trait Listener: Send + 'static {
    /// One accepted connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection.
    fn accept_io(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept_io(&self) -> io::Result<Self::Io> {
        self.accept().await.map(|(s, _)| s)
    }
}

impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept_io(&self) -> io::Result<Self::Io> {
        self.accept().await.map(|(s, _)| s)
    }
}

/// Serves `handler` on `listener` within `limits` until `stop` is
/// cancelled, one task per connection; `what` names the endpoint in logs.
/// It returns once every connection has ended; dropped, it ends them too.
pub async fn serve<L, H, F>(
    listener: L,
    limits: Limits,
    what: &'static str,
    stop: CancellationToken,
    handler: H,
) where
    L: Listener,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    serve_with(listener, limits, None, what, stop, handler).await;
}

/// [`serve`] over TLS: each connection is first given a TLS handshake with
/// the configuration `tls` gives at that moment, which must complete
/// within [`Limits::header_timeout`] of the accept (the connection holds
/// its slot meanwhile, and is closed past it); its requests then carry the
/// client's [`PeerCertificates`].
pub async fn serve_tls<L, H, F>(
    listener: L,
    limits: Limits,
    tls: Arc<dyn TlsSource>,
    what: &'static str,
    stop: CancellationToken,
    handler: H,
) where
    L: Listener,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    serve_with(listener, limits, Some(tls), what, stop, handler).await;
}

async fn serve_with<L, H, F>(
    listener: L,
    limits: Limits,
    tls: Option<Arc<dyn TlsSource>>,
    what: &'static str,
    stop: CancellationToken,
    handler: H,
) where
    L: Listener,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let limits = Arc::new(limits.normalized());
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let budget = Arc::new(Semaphore::new(limits.buffered));
    let large = Arc::new(Semaphore::new(limits.buffered_large));
    let mut connections = tokio::task::JoinSet::new();
    // While accepting fails: since when, how often.
    let mut failing: Option<(Instant, u64)> = None;
    let mut backoff = Backoff::doubling(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX);
    loop {
        while connections.try_join_next().is_some() {}
        // A connection's slot is taken before it is accepted: past the
        // cap, new connections wait in the backlog.
        let slot = tokio::select! {
            () = stop.cancelled() => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(s) => s,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept_io() => accepted,
        };
        let io = match accepted {
            Ok(io) => {
                if let Some((since, failures)) = failing.take() {
                    tracing::info!(
                        endpoint = what,
                        failures,
                        after = ?since.elapsed(),
                        "accepting connections again"
                    );
                }
                backoff.reset();
                io
            }
            Err(e) => {
                drop(slot);
                match &mut failing {
                    Some((_, failures)) => *failures += 1,
                    None => {
                        tracing::warn!(
                            endpoint = what,
                            error = %e,
                            "cannot accept connections; retrying with backoff (logged again when it recovers)"
                        );
                        failing = Some((Instant::now(), 1));
                    }
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                }
                continue;
            }
        };
        let budgets = (budget.clone(), large.clone());
        let (limits, stop, handler) = (limits.clone(), stop.clone(), handler.clone());
        let Some(tls) = &tls else {
            connections.spawn(connection(
                io, limits, budgets, what, stop, handler, None, slot,
            ));
            continue;
        };
        let tls = tls.clone();
        connections.spawn(async move {
            // Files read again (when changed) off the accept loop.
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config());
            let Some((io, peer)) = handshake(acceptor, io, &limits, what, &stop).await else {
                return;
            };
            connection(io, limits, budgets, what, stop, handler, Some(peer), slot).await;
        });
    }
    connections.shutdown().await;
}

/// The TLS handshake of one connection, within the header deadline.
async fn handshake<S>(
    acceptor: tokio_rustls::TlsAcceptor,
    io: S,
    limits: &Limits,
    what: &'static str,
    stop: &CancellationToken,
) -> Option<(tokio_rustls::server::TlsStream<S>, PeerCertificates)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let done = tokio::select! {
        () = stop.cancelled() => return None,
        done = tokio::time::timeout(limits.header_timeout, acceptor.accept(io)) => done,
    };
    match done {
        Ok(Ok(stream)) => {
            let peer = stream
                .get_ref()
                .1
                .peer_certificates()
                .map(|chain| chain.iter().map(|c| c.clone().into_owned()).collect())
                .unwrap_or_default();
            Some((stream, PeerCertificates(Arc::new(peer))))
        }
        Ok(Err(e)) => {
            tracing::debug!(endpoint = what, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(
                endpoint = what,
                timeout = ?limits.header_timeout,
                "TLS handshake not completed within the header timeout; closed"
            );
            None
        }
    }
}
