//! One connection: hyper serving the handler behind the gate, and the
//! counts the gate and the service share to tell a refusal's stand-in
//! request from a real one and an idle connection from a busy one.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::gate::Gate;
use super::limits::Limits;
use super::refusal::refused;
use super::shared::Shared;
use super::tls::PeerCertificates;

/// Serves one connection; its slot is freed when it ends. The requests of
/// a TLS connection carry what its `peer` presented.
#[allow(clippy::too_many_arguments)]
pub(super) async fn connection<S, H, F>(
    io: S,
    limits: Arc<Limits>,
    budget: (Arc<Semaphore>, Arc<Semaphore>),
    what: &'static str,
    stop: CancellationToken,
    handler: H,
    peer: Option<PeerCertificates>,
    _slot: OwnedSemaphorePermit,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let shared = Arc::new(Shared::new());
    let gate = Gate::new(io, limits, budget, shared.clone(), what);
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        if let Some(peer) = &peer {
            req.extensions_mut().insert(peer.clone());
        }
        let index = shared.seen.fetch_add(1, Ordering::SeqCst);
        let refusal = shared.refusal_for(index);
        let answered = Answered(shared.clone());
        let handler = handler.clone();
        async move {
            let _answered = answered;
            Ok::<_, Infallible>(match refusal {
                Some((status, why)) => refused(status, why),
                None => handler(req).await,
            })
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(gate), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => if let Err(e) = r {
            tracing::debug!(endpoint = what, error = %e, "connection ended");
        },
        () = stop.cancelled() => {}
    }
}

/// Counts an answer when the service's future ends (answered or dropped).
struct Answered(Arc<Shared>);

impl Drop for Answered {
    fn drop(&mut self) {
        *Shared::lock(&self.0.answered_at) = Instant::now();
        self.0.answered.fetch_add(1, Ordering::SeqCst);
    }
}
