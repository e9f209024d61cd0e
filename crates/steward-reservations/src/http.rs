//! The HTTP/1.1 serving both endpoints share (the extender's verbs and the
//! leader's direct decisions): an accept loop that survives failing
//! accepts, and the answer builders.
//!
//! An accept that fails (out of file descriptors) is retried after a pause
//! growing to [`ACCEPT_BACKOFF_MAX`], logged once when it starts failing
//! and once when it accepts again.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// First pause after a failed accept; doubled up to [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause between accepts while they fail.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Serves `handler` on `listener` until `stop` is cancelled, one task per
/// connection; `what` names the endpoint in logs.
pub(crate) async fn serve<H, F>(
    listener: TcpListener,
    what: &'static str,
    stop: CancellationToken,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    // Connections end with the endpoint (dropped or stopped): a peer
    // sees it gone, not a silent socket.
    let mut connections = tokio::task::JoinSet::new();
    // While accepting fails: since when, how often, the next pause.
    let mut failing: Option<(tokio::time::Instant, u64)> = None;
    let mut pause = ACCEPT_BACKOFF_MIN;
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                if let Some((since, failures)) = failing.take() {
                    tracing::info!(
                        endpoint = what,
                        failures,
                        after = ?since.elapsed(),
                        "accepting connections again"
                    );
                }
                pause = ACCEPT_BACKOFF_MIN;
                stream
            }
            Err(e) => {
                match &mut failing {
                    Some((_, failures)) => *failures += 1,
                    None => {
                        tracing::warn!(
                            endpoint = what,
                            error = %e,
                            "cannot accept connections; retrying with backoff (logged again when it recovers)"
                        );
                        failing = Some((tokio::time::Instant::now(), 1));
                    }
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        let handler = handler.clone();
        let stop = stop.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let answer = handler(req);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r {
                    tracing::debug!(endpoint = what, error = %e, "connection ended");
                },
                () = stop.cancelled() => {}
            }
        });
    }
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
