//! The extender's HTTP endpoint: `POST /filter`, `POST /prioritize` (the
//! verbs of the `KubeSchedulerConfiguration` in `deploy/scheduler/`),
//! `POST /reserve` and `POST /unreserve` for a scheduler plugin
//! ([`super::reserve`]) and `GET /healthz`. A body that is not `ExtenderArgs` gets 400 with the
//! parser's reason; other paths 404, other methods 405.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::reserve::{self, Answer, PodVerb};
use super::{Extender, ExtenderArgs};

/// Largest request body accepted (kube-scheduler sends whole Node objects
/// when not node-cache-capable: 5,000 nodes fit).
pub const MAX_BODY: usize = 64 << 20;

/// Serves `extender` on `listener` until `stop` is cancelled.
pub async fn serve(listener: TcpListener, extender: Arc<Extender>, stop: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "extender accept failed");
                    continue;
                }
            },
        };
        let extender = extender.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let extender = extender.clone();
                async move { Ok::<_, Infallible>(route(&extender, req).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await
            {
                tracing::debug!(error = %e, "extender connection ended");
            }
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn text(status: StatusCode, msg: String) -> Response<Full<Bytes>> {
    reply(status, "text/plain; charset=utf-8", msg.into_bytes())
}

fn json<T: serde::Serialize>(v: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec(v) {
        Ok(body) => reply(StatusCode::OK, "application/json", body),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the answer: {e}"),
        ),
    }
}

async fn route(extender: &Extender, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().trim_end_matches('/').to_owned();
    let verb = match path.as_str() {
        "/filter" | "/prioritize" | "/reserve" | "/unreserve" => path.clone(),
        "/healthz" if req.method() == Method::GET => {
            return text(StatusCode::OK, "ok\n".into());
        }
        _ => return text(StatusCode::NOT_FOUND, format!("no route {path}\n")),
    };
    if req.method() != Method::POST {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{verb} takes POST\n"),
        );
    }
    let body = match http_body_util::Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("reading the request body: {e}\n"),
            );
        }
    };
    if verb == "/reserve" || verb == "/unreserve" {
        return pod_verb(extender, &verb, &body).await;
    }
    let args: ExtenderArgs = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("the body is not kube-scheduler's ExtenderArgs: {e}\n"),
            );
        }
    };
    if verb == "/filter" {
        json(&extender.filter(&args).await)
    } else {
        json(&extender.prioritize(&args).await)
    }
}

async fn pod_verb(extender: &Extender, verb: &str, body: &[u8]) -> Response<Full<Bytes>> {
    let v: PodVerb = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("the body is not {{namespace, name, uid, node | reason}}: {e}\n"),
            );
        }
    };
    let client = extender.client();
    let answer = if verb == "/reserve" {
        reserve::reserve(client, &v).await
    } else {
        reserve::unreserve(client, &v).await
    };
    match answer {
        Ok(Answer::Ok(m)) => text(StatusCode::OK, format!("{m}\n")),
        Ok(Answer::Refused(m)) => text(StatusCode::CONFLICT, format!("{m}\n")),
        Ok(Answer::Bad(m)) => text(StatusCode::BAD_REQUEST, format!("{m}\n")),
        Err(e) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("reading or writing the pod's Reservation failed: {e}\n"),
        ),
    }
}
