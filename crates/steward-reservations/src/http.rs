//! The HTTP/1.1 serving both endpoints share (the extender's verbs and the
//! leader's direct decisions), and the answer builders.
//!
//! Serving is `steward_nodeio::bounded`: each request is read whole, within
//! a header and a body deadline, before a handler (and so its body budget)
//! sees it; a body over [`limits`]' `max_body` is refused from its
//! `Content-Length`; idle connections are closed, connections per listener
//! capped, and a failing accept (out of file descriptors) is retried after
//! a pause growing to [`ACCEPT_BACKOFF_MAX`], logged once when it starts
//! failing and once when it accepts again.
//!
//! Over TLS ([`serve_tls`]) the handshake is under the header deadline, and
//! [`Callers`] says which client certificates may call which paths.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use steward_nodeio::bounded::{self, Limits, PeerCertificates, TlsSource};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Longest pause between accepts while they fail.
pub const ACCEPT_BACKOFF_MAX: Duration = bounded::ACCEPT_BACKOFF_MAX;

/// Largest request body accepted (kube-scheduler sends whole Node objects
/// when not node-cache-capable: 5,000 nodes fit).
pub const MAX_BODY: usize = 64 << 20;

/// The bounds of both endpoints: kube-scheduler gives an extender call 5 s
/// (`httpTimeout` in `deploy/scheduler/`), so a head or a body slower than
/// that is of no use to it; a body up to the extender's 64 MiB; 256
/// connections (every scheduler and controller replica, with room), 60 s
/// idle; 16 MiB of heads and small bodies and 64 MiB of large bodies
/// (over 1 MiB: whole Node objects) held at once while they arrive.
pub fn limits() -> Limits {
    Limits {
        header_timeout: Duration::from_secs(5),
        body_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(60),
        max_head: 64 << 10,
        max_body: MAX_BODY as u64,
        max_connections: 256,
        buffered: 16 << 20,
        buffered_large: 64 << 20,
    }
}

/// Serves `handler` on `listener` within [`limits`] until `stop` is
/// cancelled, one task per connection; `what` names the endpoint in logs.
pub async fn serve<H, F>(
    listener: TcpListener,
    what: &'static str,
    stop: CancellationToken,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    bounded::serve(listener, limits(), what, stop, handler).await;
}

/// [`serve`] over TLS with the configuration `tls` gives each new
/// connection; requests carry the client's [`PeerCertificates`].
pub async fn serve_tls<H, F>(
    listener: TcpListener,
    tls: Arc<dyn TlsSource>,
    what: &'static str,
    stop: CancellationToken,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    bounded::serve_tls(listener, limits(), tls, what, stop, handler).await;
}

/// Who may call an endpoint served over TLS: a client whose verified
/// certificate names (subject common name, DNS or URI alternative name)
/// one of `names`; `GET` of the `open` paths (probes: kubelet presents no
/// certificate) needs none. Anything else is answered 403 after the
/// handshake. A certificate that does not chain to the client CAs never
/// gets that far: the handshake fails.
#[derive(Debug, Clone)]
pub struct Callers {
    names: Arc<BTreeSet<String>>,
    open: &'static [&'static str],
}

impl Callers {
    pub fn new(names: impl IntoIterator<Item = String>, open: &'static [&'static str]) -> Self {
        Self {
            names: Arc::new(names.into_iter().collect()),
            open,
        }
    }

    /// The allowed names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// `None` if `req` may be served; else the 403 to answer.
    pub fn refusal<B>(&self, req: &Request<B>) -> Option<Response<Full<Bytes>>> {
        let path = req.uri().path().trim_end_matches('/');
        if req.method() == hyper::Method::GET && self.open.contains(&path) {
            return None;
        }
        let names = req
            .extensions()
            .get::<PeerCertificates>()
            .map(PeerCertificates::names)
            .unwrap_or_default();
        if names.iter().any(|n| self.names.contains(n)) {
            return None;
        }
        let why = if names.is_empty() {
            format!("{path} needs a client certificate (none was presented)\n")
        } else {
            format!(
                "the client certificate's names {names:?} are not among those allowed to call {path}\n"
            )
        };
        tracing::debug!(path, ?names, "caller refused");
        Some(text(StatusCode::FORBIDDEN, why))
    }
}

pub fn reply(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

pub fn text(status: StatusCode, msg: String) -> Response<Full<Bytes>> {
    reply(status, "text/plain; charset=utf-8", msg.into_bytes())
}

pub fn json<T: serde::Serialize>(v: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec(v) {
        Ok(body) => reply(StatusCode::OK, "application/json", body),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the answer: {e}"),
        ),
    }
}
