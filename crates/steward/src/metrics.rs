//! A small HTTP endpoint: `/metrics` (Prometheus text format), `/healthz`
//! (the process answers) and `/readyz` (every readiness condition holds; 503
//! with one line per condition that does not).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use prometheus_client::registry::Registry;
use steward_nodeio::Readiness;

/// Binds `addr` and serves the registry in the background.
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    readiness: Readiness,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics address {addr}"))?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    let registry = Arc::new(registry);
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(err) => {
                    tracing::warn!(%err, "metrics endpoint accept failed");
                    continue;
                }
            };
            let registry = registry.clone();
            let readiness = readiness.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let registry = registry.clone();
                    let readiness = readiness.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(respond(&req, &registry, &readiness))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(err) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await
                {
                    tracing::debug!(%err, "metrics connection ended with an error");
                }
            });
        }
    });
    Ok(())
}

fn respond<B>(
    req: &Request<B>,
    registry: &Registry,
    readiness: &Readiness,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match req.uri().path() {
        "/metrics" => {
            let mut text = String::new();
            match prometheus_client::encoding::text::encode(&mut text, registry) {
                Ok(()) => (
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                ),
                Err(err) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("encoding metrics failed: {err}\n"),
                ),
            }
        }
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        "/readyz" => match readiness.report() {
            (true, text) => (StatusCode::OK, "text/plain", text),
            (false, text) => (StatusCode::SERVICE_UNAVAILABLE, "text/plain", text),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_string(),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp
}
