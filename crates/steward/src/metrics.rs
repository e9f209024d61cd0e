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
use steward_nodeio::bounded::Limits;
use tokio_util::sync::CancellationToken;

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
    // Runs as long as the process: nothing stops it.
    tokio::spawn(steward_nodeio::bounded::serve(
        listener,
        limits(),
        "metrics",
        CancellationToken::new(),
        move |req| {
            let answer = respond(&req, &registry, &readiness);
            async move { answer }
        },
    ));
    Ok(())
}

/// The metrics endpoint's bounds: `steward_nodeio::bounded`'s defaults for
/// endpoints read with `GET` (10 s for a head, 60 s idle, 64 connections)
/// with no request body (a scrape sends none).
pub fn limits() -> Limits {
    Limits {
        max_body: 0,
        ..Limits::default()
    }
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
