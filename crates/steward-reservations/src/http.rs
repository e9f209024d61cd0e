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

use std::future::Future;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use steward_nodeio::bounded::{self, Limits};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Longest pause between accepts while they fail.
pub const ACCEPT_BACKOFF_MAX: Duration = bounded::ACCEPT_BACKOFF_MAX;

/// The bounds of both endpoints: kube-scheduler gives an extender call 5 s
/// (`httpTimeout` in `deploy/scheduler/`), so a head or a body slower than
/// that is of no use to it; a body up to the extender's 64 MiB; 256
/// connections (every scheduler and controller replica, with room), 60 s
/// idle; 16 MiB of heads and small bodies and 64 MiB of large bodies
/// (over 1 MiB: whole Node objects) held at once while they arrive.
pub(crate) fn limits() -> Limits {
    Limits {
        header_timeout: Duration::from_secs(5),
        body_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(60),
        max_head: 64 << 10,
        max_body: crate::extender::server::MAX_BODY as u64,
        max_connections: 256,
        buffered: 16 << 20,
        buffered_large: 64 << 20,
    }
}

/// Serves `handler` on `listener` within [`limits`] until `stop` is
/// cancelled, one task per connection; `what` names the endpoint in logs.
pub(crate) async fn serve<H, F>(
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

pub(crate) fn reply(
    status: StatusCode,
    content_type: &str,
    body: Vec<u8>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

pub(crate) fn text(status: StatusCode, msg: String) -> Response<Full<Bytes>> {
    reply(status, "text/plain; charset=utf-8", msg.into_bytes())
}

pub(crate) fn json<T: serde::Serialize>(v: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec(v) {
        Ok(body) => reply(StatusCode::OK, "application/json", body),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the answer: {e}"),
        ),
    }
}
