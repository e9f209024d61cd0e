//! The extender over HTTPS with client certificates, as kube-scheduler
//! calls it with `enableHTTPS: true` and a `tlsConfig`: real sockets, a
//! rustls client, the certificates of `steward-reservations/tests/fixtures/tls` (README.md
//! there). Filter with the scheduler's certificate is served; without a
//! certificate, or with one from the right CA naming someone else, 403;
//! from another CA the handshake fails; probes need no certificate; a
//! client that never sends a ClientHello is cut off at the header
//! deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use steward_extender::server::{self, ExtenderTls};
use steward_extender::{Extender, ExtenderConfig};
use steward_nodeio::bounded::rustls::{self, ClientConfig, RootCertStore};
use steward_nodeio::bounded::rustls_pki_types::pem::PemObject;
use steward_nodeio::bounded::rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use steward_nodeio::bounded::{ClientAuth, TlsFiles, tokio_rustls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../steward-reservations/tests/fixtures/tls/{name}"))
}

/// The extender over HTTPS, allowing kube-scheduler's name; its address.
async fn https_extender(stop: &CancellationToken) -> SocketAddr {
    // Filter of a pod asking for no steward slot reads no API server.
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let ext = Arc::new(Extender::new(
        client,
        ExtenderConfig {
            shared_watch: false,
            ..ExtenderConfig::default()
        },
    ));
    let files = TlsFiles::new(
        fixture("server.crt"),
        fixture("server.key"),
        Some(ClientAuth {
            ca_file: fixture("ca.crt"),
            optional: true,
        }),
        "extender",
    )
    .unwrap();
    let tls = ExtenderTls {
        source: Arc::new(files),
        callers: Some(ExtenderTls::callers([
            server::DEFAULT_CLIENT_NAME.to_owned()
        ])),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server::serve_tls(listener, ext, tls, stop.clone()));
    addr
}

/// A client trusting the fixtures' CA, presenting `client` (a fixture's
/// name) if any.
fn client_config(client: Option<&str>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(fixture("ca.crt")).unwrap())
        .unwrap();
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
    Arc::new(match client {
        None => builder.with_no_client_auth(),
        Some(name) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_file(fixture(&format!("{name}.crt"))).unwrap()],
                PrivateKeyDer::from_pem_file(fixture(&format!("{name}.key"))).unwrap(),
            )
            .unwrap(),
    })
}

/// One request over HTTPS to `localhost` (the server certificate's name);
/// the whole answer, or why the connection failed.
async fn call(
    addr: SocketAddr,
    client: Option<&str>,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<String> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(client_config(client));
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out))
        .await
        .map_err(|_| std::io::Error::other("no answer within 10 s"))??;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

const ARGS: &str = r#"{"Pod":{"metadata":{"namespace":"default","name":"p","uid":"u1"},"spec":{"containers":[{"name":"c"}]}},"NodeNames":["node-a","node-b"]}"#;

#[tokio::test]
async fn filter_over_https_with_the_schedulers_certificate_is_served() {
    let stop = CancellationToken::new();
    let addr = https_extender(&stop).await;
    let got = call(addr, Some("scheduler"), "POST", "/filter", ARGS)
        .await
        .unwrap();
    assert!(got.starts_with("HTTP/1.1 200 OK"), "{got}");
    // The handler answered: both candidates pass (the pod asks for no
    // steward slot).
    let body = &got[got.find("\r\n\r\n").unwrap() + 4..];
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(
        v["NodeNames"],
        serde_json::json!(["node-a", "node-b"]),
        "{v}"
    );
    stop.cancel();
}

#[tokio::test]
async fn without_a_client_certificate_only_the_probes_are_served() {
    let stop = CancellationToken::new();
    let addr = https_extender(&stop).await;
    for path in ["/healthz", "/readyz"] {
        let got = call(addr, None, "GET", path, "").await.unwrap();
        assert!(got.starts_with("HTTP/1.1 200 OK"), "{path}: {got}");
    }
    for (method, path) in [
        ("POST", "/filter"),
        ("POST", "/prioritize"),
        ("POST", "/reserve"),
        ("POST", "/unreserve"),
        // Not a probe: the open paths are GET only.
        ("POST", "/healthz"),
        ("GET", "/nowhere"),
    ] {
        let got = call(addr, None, method, path, ARGS).await.unwrap();
        assert!(
            got.starts_with("HTTP/1.1 403 Forbidden"),
            "{method} {path}: {got}"
        );
        assert!(got.contains("needs a client certificate"), "{got}");
    }
    stop.cancel();
}

#[tokio::test]
async fn a_certificate_from_the_right_ca_with_another_name_is_forbidden() {
    let stop = CancellationToken::new();
    let addr = https_extender(&stop).await;
    for path in ["/filter", "/reserve"] {
        let got = call(addr, Some("evil"), "POST", path, ARGS).await.unwrap();
        assert!(got.starts_with("HTTP/1.1 403 Forbidden"), "{path}: {got}");
        assert!(got.contains("[\"evil\"]"), "{got}");
    }
    // A name in a DNS or URI SAN is read too: this one is not allowed.
    let got = call(addr, Some("san-only"), "POST", "/filter", ARGS)
        .await
        .unwrap();
    assert!(got.starts_with("HTTP/1.1 403 Forbidden"), "{got}");
    assert!(
        got.contains("spiffe://cluster.local/ns/kube-system/sa/kube-scheduler"),
        "{got}"
    );
    // Probes stay open to any verified caller.
    let got = call(addr, Some("evil"), "GET", "/healthz", "")
        .await
        .unwrap();
    assert!(got.starts_with("HTTP/1.1 200 OK"), "{got}");
    stop.cancel();
}

#[tokio::test]
async fn a_certificate_from_another_ca_fails_the_handshake() {
    let stop = CancellationToken::new();
    let addr = https_extender(&stop).await;
    // The scheduler's own name, from a CA the extender does not trust.
    // With TLS 1.3 the client learns of the refusal on its first read.
    for path in ["/filter", "/healthz"] {
        let got = call(addr, Some("scheduler-other-ca"), "POST", path, ARGS).await;
        let e = got.expect_err("a certificate from another CA was served");
        assert!(e.to_string().contains("alert"), "{path}: {e}");
    }
    // The server is still serving.
    let got = call(addr, Some("scheduler"), "POST", "/filter", ARGS)
        .await
        .unwrap();
    assert!(got.starts_with("HTTP/1.1 200 OK"), "{got}");
    stop.cancel();
}

#[tokio::test]
async fn a_client_that_never_completes_the_handshake_is_cut_off_at_the_header_deadline() {
    let stop = CancellationToken::new();
    let addr = https_extender(&stop).await;
    // One that sends nothing, one that sends a ClientHello's first bytes.
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut partial = tokio::net::TcpStream::connect(addr).await.unwrap();
    partial
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00])
        .await
        .unwrap();
    let start = Instant::now();
    for s in [&mut silent, &mut partial] {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(15), s.read(&mut buf))
            .await
            .expect("the server never closed the connection")
            .unwrap_or(0);
        assert_eq!(n, 0, "the server answered a handshake never completed");
    }
    // The extender's header deadline is 5 s.
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(4500) && took < Duration::from_secs(9),
        "closed after {took:?}"
    );
    // Its slot is free and the server serves on.
    let got = call(addr, Some("scheduler"), "POST", "/filter", ARGS)
        .await
        .unwrap();
    assert!(got.starts_with("HTTP/1.1 200 OK"), "{got}");
    stop.cancel();
}
