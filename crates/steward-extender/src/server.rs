//! The extender's HTTP endpoint: `POST /filter`, `POST /prioritize` (the
//! verbs of the `KubeSchedulerConfiguration` in `deploy/scheduler/`),
//! `POST /reserve` and `POST /unreserve` for a scheduler plugin
//! ([`super::reserve`]) and `GET /healthz`. A body that is not `ExtenderArgs` gets 400 with the
//! parser's reason; other paths 404, other methods 405.
//!
//! Memory is bounded, not only each body: request bodies held at once
//! count against [`MAX_BODY_BYTES_IN_FLIGHT`] (from the Content-Length
//! before a byte is read, else as they arrive); a request that cannot get
//! its share within [`BODY_WAIT`] is answered 503 with `Retry-After`. An
//! accept that fails (out of file descriptors) is retried after a pause
//! growing to [`ACCEPT_BACKOFF_MAX`], logged once when it starts failing
//! and once when it accepts again.
//!
//! **Callers.** [`serve`] serves plain HTTP and authenticates no one.
//! [`serve_tls`] serves HTTPS (kube-scheduler's `enableHTTPS` and
//! `tlsConfig`): a client certificate is asked for and, when presented,
//! must chain to the client CAs or the handshake fails; every path but
//! `GET /healthz` and `/readyz` then needs a certificate naming one of
//! [`ExtenderTls::callers`] (subject CN, or a DNS or URI SAN), else 403.
//! Probes (kubelet presents no certificate) so pass without one.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::reserve::{self, Answer, PodVerb};
use super::{Extender, ExtenderArgs};
use steward_nodeio::bounded::TlsSource;
pub use steward_reservations::http::Callers;
use steward_reservations::http::{json, text};

/// Largest request body accepted (kube-scheduler sends whole Node objects
/// when not node-cache-capable: 5,000 nodes fit); the HTTP server's bound.
pub use steward_reservations::http::MAX_BODY;

/// Most request-body bytes held at once across all requests: one largest
/// body, or many small ones.
pub const MAX_BODY_BYTES_IN_FLIGHT: usize = 64 << 20;

/// Longest a request waits for its share of [`MAX_BODY_BYTES_IN_FLIGHT`]
/// before it is answered 503 (kube-scheduler's `httpTimeout` in
/// `deploy/scheduler/` is longer).
pub const BODY_WAIT: Duration = Duration::from_secs(2);

pub use steward_reservations::http::ACCEPT_BACKOFF_MAX;

/// Paths served to callers without a client certificate over TLS.
pub const PROBE_PATHS: &[&str] = &["/healthz", "/readyz"];

/// kube-scheduler's client certificate name (its kubeconfig user).
pub const DEFAULT_CLIENT_NAME: &str = "system:kube-scheduler";

/// Serves `extender` on `listener` over plain HTTP until `stop` is
/// cancelled: callers are not authenticated.
pub async fn serve(listener: TcpListener, extender: Arc<Extender>, stop: CancellationToken) {
    let budget = Arc::new(Semaphore::new(MAX_BODY_BYTES_IN_FLIGHT));
    steward_reservations::http::serve(listener, "extender", stop, move |req| {
        let extender = extender.clone();
        let budget = budget.clone();
        async move { route(&extender, &budget, req).await }
    })
    .await;
}

/// How the extender serves HTTPS.
pub struct ExtenderTls {
    /// The serving certificate (and client CAs) of each new connection,
    /// e.g. [`steward_nodeio::bounded::TlsFiles`] with its client CAs
    /// optional (so probes need no certificate).
    pub source: Arc<dyn TlsSource>,
    /// Who may call past the probes; `None`: anyone (TLS without client
    /// authentication).
    pub callers: Option<Callers>,
}

impl ExtenderTls {
    /// The callers allowed `names` (every path but [`PROBE_PATHS`]).
    pub fn callers(names: impl IntoIterator<Item = String>) -> Callers {
        Callers::new(names, PROBE_PATHS)
    }
}

/// Serves `extender` on `listener` over HTTPS until `stop` is cancelled.
pub async fn serve_tls(
    listener: TcpListener,
    extender: Arc<Extender>,
    tls: ExtenderTls,
    stop: CancellationToken,
) {
    let budget = Arc::new(Semaphore::new(MAX_BODY_BYTES_IN_FLIGHT));
    let callers = tls.callers;
    steward_reservations::http::serve_tls(listener, tls.source, "extender", stop, move |req| {
        let extender = extender.clone();
        let budget = budget.clone();
        let refused = callers.as_ref().and_then(|c| c.refusal(&req));
        async move {
            match refused {
                Some(r) => r,
                None => route(&extender, &budget, req).await,
            }
        }
    })
    .await;
}

/// Why a body was not read.
enum BodyRefused {
    TooLarge(String),
    Busy,
    Failed(String),
}

/// Reads a request body within the shared budget; the permit holds the
/// body's share until the request is answered.
async fn read_body(
    body: Incoming,
    budget: &Arc<Semaphore>,
) -> Result<(Vec<u8>, OwnedSemaphorePermit), BodyRefused> {
    let too_large = || BodyRefused::TooLarge(format!("the body is larger than {MAX_BODY} bytes"));
    let deadline = tokio::time::Instant::now() + BODY_WAIT;
    let share = |n: usize| {
        let budget = budget.clone();
        async move {
            let n = u32::try_from(n).map_err(|_| too_large())?;
            tokio::time::timeout_at(deadline, budget.acquire_many_owned(n))
                .await
                .map_err(|_| BodyRefused::Busy)?
                .map_err(|_| BodyRefused::Busy)
        }
    };
    let declared = body.size_hint().exact();
    let mut held = match declared {
        Some(n) if n > MAX_BODY as u64 => return Err(too_large()),
        // The whole body's share before a byte is read.
        Some(n) => share(usize::try_from(n).map_err(|_| too_large())?).await?,
        None => share(0).await?,
    };
    let mut out = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyRefused::Failed(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if out.len() + data.len() > MAX_BODY {
            return Err(too_large());
        }
        let room = held.num_permits().saturating_sub(out.len());
        if data.len() > room {
            // No length declared: the share grows as the body arrives.
            held.merge(share(data.len() - room).await?);
        }
        out.extend_from_slice(&data);
    }
    Ok((out, held))
}

async fn route(
    extender: &Extender,
    budget: &Arc<Semaphore>,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().trim_end_matches('/').to_owned();
    let verb = match path.as_str() {
        "/filter" | "/prioritize" | "/reserve" | "/unreserve" => path.clone(),
        "/healthz" | "/readyz" if req.method() == Method::GET => {
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
    let (body, _share) = match read_body(req.into_body(), budget).await {
        Ok(b) => b,
        Err(BodyRefused::TooLarge(why)) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("reading the request body: {why}\n"),
            );
        }
        Err(BodyRefused::Busy) => {
            let mut r = text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the extender is reading {MAX_BODY_BYTES_IN_FLIGHT} bytes of other requests; retry\n"
                ),
            );
            r.headers_mut().insert(
                hyper::header::RETRY_AFTER,
                hyper::header::HeaderValue::from_static("1"),
            );
            return r;
        }
        Err(BodyRefused::Failed(why)) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("reading the request body: {why}\n"),
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
