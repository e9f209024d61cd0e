//! tcp-probe against real listeners on loopback addresses 127.0.0.1-4:
//! refused by default (a Configuration's author must not reach the node's
//! own services), probed where the node's operator allows loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::*;
use steward_discovery::handlers::network::{self, ProbeScope, TcpProbe};
use steward_discovery::{DiscoverRequest, DiscoveryError, DiscoveryHandler};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A listener that greets every connection with `banner`.
fn greeter(listener: TcpListener, banner: &'static [u8]) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = conn.write_all(banner).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            });
        }
    })
}

/// Binds 127.0.0.2, .3 and .4 on one free port (retrying if another test took it).
async fn three_listeners() -> (u16, Vec<TcpListener>) {
    for _ in 0..50 {
        let first = TcpListener::bind("127.0.0.2:0").await.unwrap();
        let port = first.local_addr().unwrap().port();
        let rest = [
            TcpListener::bind(("127.0.0.3", port)).await,
            TcpListener::bind(("127.0.0.4", port)).await,
        ];
        if let [Ok(b), Ok(c)] = rest {
            return (port, vec![first, b, c]);
        }
    }
    panic!("no port free on 127.0.0.2-4");
}

fn addr(a: &str, port: u16) -> SocketAddr {
    SocketAddr::new(a.parse::<IpAddr>().unwrap(), port)
}

/// The handler as a node whose operator allows probing loopback
/// (`--tcp-probe-allow-cidr=127.0.0.0/8`) runs it.
fn loopback_allowed() -> TcpProbe {
    TcpProbe::with_scope(ProbeScope::new(["127.0.0.0/8".parse().unwrap()]))
}

#[tokio::test]
async fn finds_peers_drops_closed_ones_and_checks_banners() {
    init_tracing();
    let (port, mut listeners) = three_listeners().await;
    let c = greeter(listeners.pop().unwrap(), b"SSH-2.0-imposter\r\n"); // 127.0.0.4
    let b = greeter(listeners.pop().unwrap(), b"RTSP/1.0 200 OK\r\n"); // 127.0.0.3
    let a = greeter(listeners.pop().unwrap(), b"RTSP/1.0 200 OK\r\n"); // 127.0.0.2

    let handler = loopback_allowed();
    assert!(handler.shared());

    // Without a banner check every listener is a device.
    let details =
        format!("{{targets: ['127.0.0.0/29'], ports: [{port}], interval: 200ms, timeout: 300ms}}");
    let mut all = handler.discover(DiscoverRequest::new(details)).unwrap();
    let found = next_list(&mut all, 10).await;
    assert_eq!(
        ids(&found),
        [
            format!("tcp://127.0.0.2:{port}"),
            format!("tcp://127.0.0.3:{port}"),
            format!("tcp://127.0.0.4:{port}"),
        ]
    );
    assert_eq!(
        found[1]
            .properties
            .get(network::ADDRESS_PROPERTY)
            .map(String::as_str),
        Some("127.0.0.3")
    );
    assert_eq!(
        found[1].properties.get(network::PORT_PROPERTY).cloned(),
        Some(port.to_string())
    );

    // With `expect`, the imposter on .4 is not reported.
    let details = format!(
        "{{targets: [127.0.0.2, 127.0.0.3, 127.0.0.4, 127.0.0.5], ports: [{port}], interval: 200ms, timeout: 300ms, expect: 'RTSP/1.0'}}"
    );
    let mut rtsp = handler.discover(DiscoverRequest::new(details)).unwrap();
    assert_eq!(
        ids(&next_list(&mut rtsp, 10).await),
        [
            format!("tcp://127.0.0.2:{port}"),
            format!("tcp://127.0.0.3:{port}")
        ]
    );

    // Closing .3 removes it from both streams.
    b.abort();
    let _ = b.await;
    assert!(
        wait_until(5, || std::net::TcpStream::connect(addr("127.0.0.3", port))
            .is_err())
        .await
    );
    assert_eq!(
        ids(&next_list(&mut all, 10).await),
        [
            format!("tcp://127.0.0.2:{port}"),
            format!("tcp://127.0.0.4:{port}")
        ]
    );
    assert_eq!(
        ids(&next_list(&mut rtsp, 10).await),
        [format!("tcp://127.0.0.2:{port}")]
    );

    // Unchanged rounds push nothing.
    let quiet = tokio::time::timeout(
        Duration::from_millis(900),
        futures::StreamExt::next(&mut rtsp),
    )
    .await;
    assert!(quiet.is_err(), "pushed an unchanged list: {quiet:?}");
    a.abort();
    c.abort();
}

#[tokio::test]
async fn refuses_oversized_subnets() {
    let handler = TcpProbe::new();
    match handler.discover(DiscoverRequest::new(
        "{targets: ['10.0.0.0/16'], ports: [80]}",
    )) {
        Err(DiscoveryError::InvalidDetails(msg)) => {
            assert!(msg.contains("10.0.0.0/16") && msg.contains("/20"), "{msg}")
        }
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("a /16 was accepted"),
    }
}

/// A Configuration naming the node's own loopback service (the attack): by
/// default it is refused before anything is probed, and the service sees no
/// connection; where the operator allows loopback, the service is found.
#[tokio::test]
async fn loopback_services_are_not_probed_unless_the_operator_allows_them() {
    init_tracing();
    let service = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = service.local_addr().unwrap().port();
    let attacks = [
        format!("{{targets: [127.0.0.1], ports: [{port}], interval: 100ms, timeout: 300ms}}"),
        format!("{{targets: ['127.0.0.0/30'], ports: [{port}], interval: 100ms, timeout: 300ms}}"),
        format!(
            "{{targets: ['::ffff:127.0.0.1'], ports: [{port}], interval: 100ms, timeout: 300ms}}"
        ),
        format!(
            "{{targets: [10.255.255.1, 0.0.0.0], ports: [{port}], interval: 100ms, timeout: 300ms}}"
        ),
    ];
    for details in &attacks {
        match TcpProbe::new().discover(DiscoverRequest::new(details.clone())) {
            Err(DiscoveryError::InvalidDetails(msg)) => {
                assert!(msg.starts_with("tcp-probe: targets["), "{msg}");
                assert!(
                    msg.contains("does not probe") && msg.contains("--tcp-probe-allow-cidr"),
                    "{msg}"
                );
            }
            Err(e) => panic!("{details}: wrong error {e}"),
            Ok(_) => panic!("{details}: a node-local target was accepted"),
        }
    }
    // Nothing connected: no probe round ever ran.
    let accepted = tokio::time::timeout(Duration::from_millis(700), service.accept()).await;
    assert!(
        accepted.is_err(),
        "the loopback service was connected to: {accepted:?}"
    );

    // The operator allows loopback: the same Configuration finds the service.
    let greeter = greeter(service, b"hello\r\n");
    let mut found = loopback_allowed()
        .discover(DiscoverRequest::new(attacks[0].clone()))
        .unwrap();
    assert_eq!(
        ids(&next_list(&mut found, 10).await),
        [format!("tcp://127.0.0.1:{port}")]
    );
    // An allowance of one address does not open the rest of loopback.
    let one = TcpProbe::with_scope(ProbeScope::new(["127.0.0.1".parse().unwrap()]));
    assert!(
        one.discover(DiscoverRequest::new(attacks[0].clone()))
            .is_ok()
    );
    assert!(matches!(
        one.discover(DiscoverRequest::new(attacks[1].clone())),
        Err(DiscoveryError::InvalidDetails(_))
    ));
    greeter.abort();
}
