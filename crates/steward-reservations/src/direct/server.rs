//! The leader's `/v1/decide` endpoint ([`super::wire`]). Every replica
//! serves it; only the leader's decision loop takes asks, a standby
//! answers 421 so the extender looks for the leader again.

use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::pending::{Ask, Outcome};
use super::wire::{DECIDE_PATH, DecideRequest, MAX_REQUEST};
use crate::http::{json, text};
use crate::metrics::ControllerMetrics;

/// Longest an ask is waited for, whatever the caller says.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// What the endpoint hands asks to.
#[derive(Debug, Clone)]
pub struct DecideHandle {
    /// The decision loop's queue of asks.
    pub asks: mpsc::Sender<Ask>,
    /// Whether this replica leads.
    pub leading: watch::Receiver<bool>,
    /// Where answered asks are counted.
    pub metrics: ControllerMetrics,
}

/// Serves `/v1/decide` on `listener` until `stop` is cancelled (or the
/// future is dropped: its connections go with it).
pub async fn serve(listener: TcpListener, handle: DecideHandle, stop: CancellationToken) {
    crate::http::serve(listener, "decide", stop, move |req| {
        let handle = handle.clone();
        async move {
            let (outcome, answer) = route(&handle, req).await;
            if let Some(o) = outcome {
                handle.metrics.ask(o);
            }
            answer
        }
    })
    .await;
}

/// The answer, and the outcome it counts as (`None`: not an ask).
async fn route(
    handle: &DecideHandle,
    req: Request<Incoming>,
) -> (Option<&'static str>, Response<Full<Bytes>>) {
    let path = req.uri().path().trim_end_matches('/').to_owned();
    if path != DECIDE_PATH {
        return (
            None,
            text(StatusCode::NOT_FOUND, format!("no route {path}\n")),
        );
    }
    if req.method() != Method::POST {
        return (
            None,
            text(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{DECIDE_PATH} takes POST\n"),
            ),
        );
    }
    let (outcome, answer) = ask(handle, req).await;
    (Some(outcome), answer)
}

async fn ask(
    handle: &DecideHandle,
    req: Request<Incoming>,
) -> (&'static str, Response<Full<Bytes>>) {
    let body = match Limited::new(req.into_body(), MAX_REQUEST).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return (
                "bad_request",
                text(
                    StatusCode::BAD_REQUEST,
                    format!("reading the request body (at most {MAX_REQUEST} bytes): {e}\n"),
                ),
            );
        }
    };
    let ask: DecideRequest = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            return (
                "bad_request",
                text(
                    StatusCode::BAD_REQUEST,
                    format!("the body is not a DecideRequest: {e}\n"),
                ),
            );
        }
    };
    // A closed channel: the election is gone with its process.
    let leads = *handle.leading.borrow() && handle.leading.has_changed().is_ok();
    if !leads {
        return (
            "not_leading",
            text(
                StatusCode::MISDIRECTED_REQUEST,
                "this controller replica does not lead; ask the one the Lease names\n".into(),
            ),
        );
    }
    let (reply, answer) = oneshot::channel();
    let wait = Duration::from_millis(ask.timeout_ms).min(MAX_WAIT);
    if handle
        .asks
        .try_send(Ask {
            spec: ask.spec,
            reply,
        })
        .is_err()
    {
        return (
            "busy",
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the leader is not taking asks now (queue full or stopping); retry\n".into(),
            ),
        );
    }
    match tokio::time::timeout(wait, answer).await {
        Ok(Ok(Outcome::Decided(r))) => ("decided", json(&r)),
        Ok(Ok(Outcome::Refused(why))) => (
            "refused",
            text(StatusCode::UNPROCESSABLE_ENTITY, format!("{why}\n")),
        ),
        Ok(Ok(Outcome::Failed(why))) => {
            ("failed", text(StatusCode::BAD_GATEWAY, format!("{why}\n")))
        }
        Ok(Err(_)) => (
            "busy",
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the leader stopped deciding (leadership changed); retry\n".into(),
            ),
        ),
        Err(_) => (
            "undecided",
            text(
                StatusCode::ACCEPTED,
                format!("not decided within {wait:?}; the ask is written\n"),
            ),
        ),
    }
}
