//! The standalone agent's read API: what `kubectl get` reads from the API
//! server in a cluster, read from the running agent on one machine. HTTP/1
//! on a unix socket in the state directory ([`SOCKET`], mode 0600), because
//! the embedded store is the running agent's alone (one process may open
//! it). `steward get instances --state-dir DIR` reads it; so can
//! `curl --unix-socket DIR/agent.sock http://agent/instances`.
//!
//! - `GET /instances`: a Kubernetes-style `List` of the Instances in the
//!   store, as the custom resources look in a cluster.
//! - `GET /configurations`: the Configurations applied, each with the
//!   status this node would write in a cluster (its handlers and their
//!   state, `DetailsValid`, `Discovering`), kept by the discovery loop in a
//!   [`LocalView`]; it exists only while the agent runs.
//!
//! Anything else answers 404 (405 for another method) with a one-line
//! reason. Read-only: nothing here writes the store.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;
use steward_nodeio::BindOptions;
use steward_nodeio::bounded::Limits;
use tokio_util::sync::CancellationToken;

use steward_api::Configuration;

use crate::NodeStore;

/// The socket's file name in the state directory.
pub const SOCKET: &str = "agent.sock";

/// Owner only: the Instances name host devices.
const SOCKET_MODE: u32 = 0o600;

/// The Configurations the standalone agent applied, with their status as
/// this node sees it; written by the discovery loop, read by the API.
#[derive(Clone, Debug, Default)]
pub struct LocalView {
    configurations: Arc<Mutex<BTreeMap<(String, String), Configuration>>>,
}

impl LocalView {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<(String, String), Configuration>> {
        // Plain values: a panic elsewhere leaves the map usable.
        self.configurations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// A Configuration (with its status) applied or changed.
    pub(crate) fn set(&self, c: Configuration) {
        let key = (
            c.metadata.namespace.clone().unwrap_or_default(),
            c.metadata.name.clone().unwrap_or_default(),
        );
        self.lock().insert(key, c);
    }

    /// A Configuration removed.
    pub(crate) fn remove(&self, namespace: &str, name: &str) {
        self.lock().remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Every Configuration, by namespace and name.
    pub fn list(&self) -> Vec<Configuration> {
        self.lock().values().cloned().collect()
    }
}

/// Serves the API on `path` until `stop` is cancelled; the socket file is
/// removed when it ends. It returns only once every connection has ended,
/// so the store is no longer held by it (a new agent may open it at once).
pub async fn serve(
    path: &Path,
    state: NodeStore,
    view: LocalView,
    stop: CancellationToken,
) -> Result<(), steward_nodeio::NodeIoError> {
    let (listener, _guard) = steward_nodeio::bind(path, BindOptions::mode(SOCKET_MODE))?;
    tracing::info!(path = %path.display(), "serving the local read API");
    steward_nodeio::bounded::serve(listener, limits(), "local API", stop, move |req| {
        let answer = respond(&req, &state, &view);
        async move { answer }
    })
    .await;
    Ok(())
}

/// The local API's bounds: `steward_nodeio::bounded`'s defaults for
/// endpoints read with `GET` (10 s for a head, 60 s idle) with no request
/// body and 16 connections (one user's `steward get` and `curl`).
pub fn limits() -> Limits {
    Limits {
        max_body: 0,
        max_connections: 16,
        ..Limits::default()
    }
}

fn respond<B>(req: &Request<B>, state: &NodeStore, view: &LocalView) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if path != "/instances" && path != "/configurations" {
        return error(
            StatusCode::NOT_FOUND,
            "no such resource; GET /instances or /configurations",
        );
    }
    if req.method() != Method::GET {
        return error(StatusCode::METHOD_NOT_ALLOWED, "read-only: use GET");
    }
    if path == "/configurations" {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": view.list()});
        return reply(StatusCode::OK, list.to_string());
    }
    match state.instances() {
        Ok(mut items) => {
            items.sort_by(|a, b| {
                (&a.metadata.namespace, &a.metadata.name)
                    .cmp(&(&b.metadata.namespace, &b.metadata.name))
            });
            let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
            reply(StatusCode::OK, list.to_string())
        }
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("reading the Instances: {e}"),
        ),
    }
}

fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    reply(status, json!({"error": message}).to_string())
}

fn reply(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn http(path: &Path, request: &str) -> String {
        let mut s = tokio::net::UnixStream::connect(path).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn lists_the_store_and_refuses_anything_else() {
        let dir = tempfile::tempdir().unwrap();
        let store = NodeStore::open(dir.path()).unwrap();
        let socket = dir.path().join(SOCKET);
        let stop = CancellationToken::new();
        let server = tokio::spawn({
            let (socket, stop) = (socket.clone(), stop.clone());
            async move { serve(&socket, store, LocalView::default(), stop).await }
        });
        while !socket.exists() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let ok = http(&socket, "GET /instances HTTP/1.0\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.0 200"), "{ok}");
        assert!(
            ok.ends_with(r#"{"apiVersion":"v1","items":[],"kind":"List"}"#),
            "{ok}"
        );
        let configs = http(&socket, "GET /configurations HTTP/1.0\r\n\r\n").await;
        assert!(
            configs.ends_with(r#"{"apiVersion":"v1","items":[],"kind":"List"}"#),
            "{configs}"
        );
        let missing = http(&socket, "GET /pods HTTP/1.0\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.0 404"), "{missing}");
        let write = http(&socket, "DELETE /instances HTTP/1.0\r\n\r\n").await;
        assert!(write.starts_with("HTTP/1.0 405"), "{write}");
        assert!(write.contains("read-only"), "{write}");
        stop.cancel();
        server.await.unwrap().unwrap();
        assert!(!socket.exists(), "the socket is removed when the API stops");
    }
}
