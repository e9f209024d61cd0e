//! Shared helpers for the stand-in's own tests.
// Test-only helpers: panicking on unexpected responses is the point.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub use steward_testing_apiserver::ApiServer;

/// A raw HTTP response.
#[derive(Debug)]
pub struct Raw {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Raw {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    pub fn header(&self, name: &str) -> Vec<String> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .collect()
    }
    /// Newline-delimited watch events.
    pub fn events(&self) -> Vec<Value> {
        self.body
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// Minimal HTTP/1.1 client (Connection: close, chunked decoding) for requests the
/// kube client cannot express.
pub async fn raw(
    server: &ApiServer,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> Raw {
    let headers: Vec<(&str, &str)> = content_type
        .map(|ct| vec![("Content-Type", ct)])
        .unwrap_or_default();
    raw_with(server, method, path, &headers, body.as_bytes()).await
}

/// [`raw`] with arbitrary request headers and a binary body.
pub async fn raw_with(
    server: &ApiServer,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Raw {
    let addr = server.url().trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    s.write_all(&bytes).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8(buf).unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Raw {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

pub fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap()
}

pub fn pod_on_node(name: &str, node: &str) -> Pod {
    let mut p = pod(name);
    p.spec.as_mut().unwrap().node_name = Some(node.to_string());
    p
}

/// The Status carried by a kube API error.
pub fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Polls `f` until it returns true or ~3 s pass.
pub async fn eventually<F, Fut>(mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..60 {
        if f().await {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    false
}
