//! The v0 transport through real unix sockets and TCP on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use steward_discovery::client::{self, ClientOptions};
use steward_discovery::handlers::debug_echo::{self, DebugEcho};
use steward_discovery::policy::RegistrationPolicy;
use steward_discovery::registration::{self, Registration};
use steward_discovery::{
    DeviceStream, DiscoverRequest, DiscoveryError, DiscoveryHandler, Endpoint, server,
};
use steward_proto::discovery::v0 as proto;
use steward_proto::discovery::v0::registration_client::RegistrationClient;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

fn opts() -> ClientOptions {
    ClientOptions {
        connect_timeout: Duration::from_secs(2),
        open_timeout: Duration::from_secs(5),
    }
}

/// A running agent-side registration server.
struct Agent {
    rx: mpsc::Receiver<Registration>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: JoinHandle<Result<(), DiscoveryError>>,
}

impl Agent {
    async fn start(socket: &Path) -> Agent {
        let (tx, rx) = mpsc::channel(16);
        let (stop, shutdown) = shutdown_pair();
        let task = tokio::spawn(registration::serve(
            socket.to_path_buf(),
            tx,
            // Network handlers on loopback are what these tests register.
            RegistrationPolicy::new([], vec!["127.0.0.0/8".parse().unwrap()]),
            shutdown,
        ));
        // Connectable, not merely present: a stale file may be there first.
        assert!(
            wait_until(5, || std::os::unix::net::UnixStream::connect(socket)
                .is_ok())
            .await,
            "registration socket never accepted a connection"
        );
        Agent { rx, stop, task }
    }

    async fn next_registration(&mut self) -> Registration {
        tokio::time::timeout(Duration::from_secs(10), self.rx.recv())
            .await
            .expect("no registration within 10s")
            .expect("registration channel closed")
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("registration server did not stop")
            .unwrap()
            .unwrap();
    }
}

/// A running external DH.
struct External {
    stop: tokio::sync::oneshot::Sender<()>,
    task: JoinHandle<Result<(), DiscoveryError>>,
}

impl External {
    fn start(handler: Arc<dyn DiscoveryHandler>, listen: PathBuf, agent: PathBuf) -> External {
        let (stop, shutdown) = shutdown_pair();
        let task = tokio::spawn(server::run_external(handler, listen, agent, shutdown));
        External { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("external handler did not stop while streams were open")
            .unwrap()
            .unwrap();
    }
}

async fn raw_registration_client(socket: &Path) -> RegistrationClient<tonic::transport::Channel> {
    let channel = steward_proto::uds::endpoint()
        .connect_with_connector(steward_proto::uds::UnixConnector::new(socket))
        .await
        .unwrap();
    RegistrationClient::new(channel)
}

#[tokio::test]
async fn external_handler_registers_and_streams_devices_over_the_wire() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let agent_sock = dir.path().join("agent-registration.sock");
    let dh_sock = dir.path().join("debug-echo.sock");
    let availability = dir.path().join("availability");
    let mut agent = Agent::start(&agent_sock).await;
    let dh = External::start(
        Arc::new(DebugEcho::new(true)),
        dh_sock.clone(),
        agent_sock.clone(),
    );

    let reg = agent.next_registration().await;
    assert_eq!(reg.key.name, debug_echo::NAME);
    assert_eq!(
        reg.key.endpoint,
        Endpoint::Uds(dh_sock.display().to_string())
    );
    assert!(reg.shared, "shared comes from DebugEcho::new(true)");
    let dh_mode = std::fs::metadata(&dh_sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(dh_mode, 0o600);

    let details = format!(
        "{{descriptions: [foo0, foo1], availabilityFile: {}, pollInterval: 20ms}}",
        availability.display()
    );
    let mut stream = client::discover(&reg.key.endpoint, DiscoverRequest::new(details), &opts())
        .await
        .unwrap();
    let first = next_list(&mut stream, 5).await;
    assert_eq!(ids(&first), ["foo0", "foo1"]);
    assert_eq!(
        first[0]
            .properties
            .get(debug_echo::DESCRIPTION_PROPERTY)
            .map(String::as_str),
        Some("foo0")
    );

    std::fs::write(&availability, "OFFLINE\n").unwrap();
    assert!(
        next_list(&mut stream, 5).await.is_empty(),
        "OFFLINE hides devices"
    );
    std::fs::write(&availability, "ONLINE").unwrap();
    assert_eq!(ids(&next_list(&mut stream, 5).await), ["foo0", "foo1"]);

    // 1,000 generated devices cross the wire in one message.
    let mut big = client::discover(
        &reg.key.endpoint,
        DiscoverRequest::new("count: 1000\nprefix: bench"),
        &opts(),
    )
    .await
    .unwrap();
    let list = next_list(&mut big, 5).await;
    assert_eq!(list.len(), 1000);
    assert_eq!(list[999].id, "bench-999");

    // Shutdown completes although streams are open, and they end cleanly.
    dh.stop().await;
    match next_item(&mut stream, 5).await {
        None | Some(Err(DiscoveryError::Stream(_))) => {}
        Some(other) => panic!("expected the stream to end, got {other:?}"),
    }
    assert!(!dh_sock.exists(), "handler socket removed on shutdown");
    agent.stop().await;
    assert!(
        !agent_sock.exists(),
        "registration socket removed on shutdown"
    );
}

#[tokio::test]
async fn reregisters_when_the_agent_socket_is_recreated() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let agent_sock = dir.path().join("agent.sock");
    let dh_sock = dir.path().join("dh.sock");
    // The handler starts first: it must wait for the agent.
    let dh = External::start(
        Arc::new(DebugEcho::new(false)),
        dh_sock.clone(),
        agent_sock.clone(),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut agent = Agent::start(&agent_sock).await;
    let first = agent.next_registration().await;
    assert_eq!(
        first.key.endpoint,
        Endpoint::Uds(dh_sock.display().to_string())
    );
    assert!(!first.shared);
    agent.stop().await;
    assert!(!agent_sock.exists());

    // Agent restart: a new socket at the same path.
    let mut agent = Agent::start(&agent_sock).await;
    let again = agent.next_registration().await;
    assert_eq!(again, first);
    // Only once per socket incarnation.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        agent.rx.try_recv().is_err(),
        "registered twice with the same agent"
    );
    dh.stop().await;
    agent.stop().await;
}

#[tokio::test]
async fn registration_socket_is_private_and_replaces_stale_sockets_only() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("reg.sock");
    // A stale socket left by a crashed agent.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(std::fs::metadata(&sock).unwrap().file_type().is_socket());
    let agent = Agent::start(&sock).await;
    let meta = std::fs::metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // A second agent on the live socket is refused; the first keeps working.
    let (tx, _rx) = mpsc::channel(1);
    let err = registration::serve(sock.clone(), tx, RegistrationPolicy::default(), async {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("in use"), "{err}");
    registration::register(&sock, "probe", &Endpoint::Uds("/x/y.sock".into()), false)
        .await
        .unwrap();
    let mut agent = agent;
    assert_eq!(agent.next_registration().await.key.name, "probe");
    agent.stop().await;

    // A regular file is never deleted.
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "keep").unwrap();
    let (tx, _rx) = mpsc::channel(1);
    let err = registration::serve(file.clone(), tx, RegistrationPolicy::default(), async {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
}

#[tokio::test]
async fn invalid_registrations_are_rejected_with_invalid_argument() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("reg.sock");
    let mut agent = Agent::start(&sock).await;

    let cases = [
        (
            "",
            Endpoint::Uds("/run/dh.sock".into()),
            "name must not be empty",
        ),
        (
            "udev",
            Endpoint::Uds("dh.sock".into()),
            "absolute unix socket path",
        ),
        (
            "udev",
            Endpoint::Uds(String::new()),
            "absolute unix socket path",
        ),
        ("onvif", Endpoint::Network("not a url".into()), "not a URL"),
        (
            "onvif",
            Endpoint::Network("/run/dh.sock".into()),
            "not a URL",
        ),
    ];
    for (name, endpoint, text) in &cases {
        match registration::register(&sock, name, endpoint, false).await {
            Err(DiscoveryError::Registration(msg)) => {
                assert!(msg.contains(text), "{name:?} {endpoint:?}: {msg}")
            }
            other => panic!("{name:?} {endpoint:?}: expected rejection, got {other:?}"),
        }
    }
    // The raw status is INVALID_ARGUMENT, also for an unknown endpoint type.
    let mut raw = raw_registration_client(&sock).await;
    let status = raw
        .register_discovery_handler(proto::RegisterDiscoveryHandlerRequest {
            name: "x".into(),
            endpoint: "/a.sock".into(),
            endpoint_type: 9,
            shared: false,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("unknown endpoint type 9"),
        "{}",
        status.message()
    );
    assert!(
        agent.rx.try_recv().is_err(),
        "an invalid registration was forwarded"
    );

    // A valid NETWORK registration goes through.
    registration::register(
        &sock,
        "onvif",
        &Endpoint::Network("http://127.0.0.1:8080".into()),
        true,
    )
    .await
    .unwrap();
    let reg = agent.next_registration().await;
    assert_eq!(
        reg.key.endpoint,
        Endpoint::Network("http://127.0.0.1:8080".into())
    );
    assert!(reg.shared);
    agent.stop().await;
}

#[tokio::test]
async fn invalid_details_and_unreachable_handlers() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("dh.sock");
    let (stop, shutdown) = shutdown_pair();
    let task = tokio::spawn(server::serve_uds(
        Arc::new(DebugEcho::new(false)),
        sock.clone(),
        shutdown,
    ));
    assert!(wait_until(5, || sock.exists()).await);
    let endpoint = Endpoint::Uds(sock.display().to_string());
    match client::discover(
        &endpoint,
        DiscoverRequest::new("descriptions: [oops"),
        &opts(),
    )
    .await
    {
        Err(DiscoveryError::InvalidDetails(msg)) => assert!(msg.contains("debug-echo"), "{msg}"),
        other => panic!("expected InvalidDetails, got {:?}", other.err()),
    }
    let _ = stop.send(());
    task.await.unwrap().unwrap();

    let missing = Endpoint::Uds(dir.path().join("nobody.sock").display().to_string());
    let started = Instant::now();
    // Spawned: the client future must be Send for the agent to run it on a task.
    let result =
        tokio::spawn(
            async move { client::discover(&missing, DiscoverRequest::new(""), &opts()).await },
        )
        .await
        .unwrap();
    match result {
        Err(DiscoveryError::Connect(msg)) => assert!(msg.contains("nobody.sock"), "{msg}"),
        other => panic!("expected Connect, got {:?}", other.err()),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    match client::discover(&Endpoint::Embedded, DiscoverRequest::new(""), &opts()).await {
        Err(DiscoveryError::Connect(_)) => {}
        other => panic!("expected Connect, got {:?}", other.err()),
    }
}

#[tokio::test]
async fn network_endpoint_over_loopback_tcp() {
    init_tracing();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, shutdown) = shutdown_pair();
    let task = tokio::spawn(server::serve_tcp(
        Arc::new(DebugEcho::new(true)),
        listener,
        shutdown,
    ));
    let endpoint = Endpoint::Network(format!("http://127.0.0.1:{port}"));
    let mut stream = client::discover(
        &endpoint,
        DiscoverRequest::new("descriptions: [cam]"),
        &opts(),
    )
    .await
    .unwrap();
    assert_eq!(ids(&next_list(&mut stream, 5).await), ["cam"]);
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// A handler that sends one list and then fails.
struct FailsAfterOne;

impl DiscoveryHandler for FailsAfterOne {
    fn name(&self) -> &str {
        "fails"
    }
    fn shared(&self) -> bool {
        false
    }
    fn discover(&self, _req: DiscoverRequest) -> Result<DeviceStream, DiscoveryError> {
        use futures::StreamExt;
        let items = vec![
            Ok(vec![steward_discovery::Device {
                id: "only".into(),
                properties: Default::default(),
                mounts: vec![],
                device_specs: vec![],
            }]),
            Err(DiscoveryError::Handler("sensor bus went away".into())),
        ];
        Ok(futures::stream::iter(items)
            .chain(futures::stream::pending())
            .boxed())
    }
}

#[tokio::test]
async fn handler_errors_cross_the_wire_and_end_the_stream() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("dh.sock");
    let (stop, shutdown) = shutdown_pair();
    let task = tokio::spawn(server::serve_uds(
        Arc::new(FailsAfterOne),
        sock.clone(),
        shutdown,
    ));
    assert!(wait_until(5, || sock.exists()).await);
    let endpoint = Endpoint::Uds(sock.display().to_string());
    let mut stream = client::discover(&endpoint, DiscoverRequest::new(""), &opts())
        .await
        .unwrap();
    assert_eq!(ids(&next_list(&mut stream, 5).await), ["only"]);
    match next_item(&mut stream, 5).await {
        Some(Err(DiscoveryError::Handler(msg))) => {
            assert!(msg.contains("sensor bus went away"), "{msg}")
        }
        other => panic!("expected a Handler error, got {other:?}"),
    }
    assert!(
        next_item(&mut stream, 5).await.is_none(),
        "stream ends after an error"
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn hostile_registrations_are_refused_over_the_wire() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("reg.sock");
    let (tx, mut rx) = mpsc::channel(16);
    let (stop, shutdown) = shutdown_pair();
    let task = tokio::spawn(registration::serve(
        sock.clone(),
        tx,
        RegistrationPolicy::new(
            ["debug-echo".to_owned()],
            vec!["10.0.0.0/8".parse().unwrap()],
        ),
        shutdown,
    ));
    assert!(
        wait_until(5, || std::os::unix::net::UnixStream::connect(&sock).is_ok()).await,
        "registration socket never accepted a connection"
    );
    // A legitimate handler first.
    let onvif = Endpoint::Uds("/run/steward/onvif.sock".into());
    registration::register(&sock, "onvif", &onvif, false)
        .await
        .unwrap();
    assert_eq!(rx.recv().await.unwrap().key.name, "onvif");
    let cases = [
        // The agent's own embedded handler's name.
        (
            "debug-echo",
            Endpoint::Uds("/run/evil.sock".into()),
            tonic::Code::PermissionDenied,
            "served by the agent itself",
        ),
        // Another handler's endpoint.
        (
            "opcua",
            onvif.clone(),
            tonic::Code::AlreadyExists,
            "registered by discovery handler \"onvif\"",
        ),
        // Network endpoints outside the allowed networks, or by name.
        (
            "net",
            Endpoint::Network("http://169.254.169.254:80".into()),
            tonic::Code::PermissionDenied,
            "outside the allowed networks",
        ),
        (
            "net",
            Endpoint::Network("http://kubernetes.default:443".into()),
            tonic::Code::PermissionDenied,
            "not a name",
        ),
    ];
    let mut raw = raw_registration_client(&sock).await;
    for (name, endpoint, code, text) in cases {
        let (endpoint_type, text_endpoint) = match &endpoint {
            Endpoint::Uds(p) => (0, p.clone()),
            Endpoint::Network(u) => (1, u.clone()),
            Endpoint::Embedded => unreachable!(),
        };
        let status = raw
            .register_discovery_handler(proto::RegisterDiscoveryHandlerRequest {
                name: name.into(),
                endpoint: text_endpoint,
                endpoint_type,
                shared: false,
            })
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            code,
            "{name} {endpoint:?}: {}",
            status.message()
        );
        assert!(
            status.message().contains(text),
            "{name}: {}",
            status.message()
        );
        // The handler's own client reports it as a refused registration.
        match registration::register(&sock, name, &endpoint, false).await {
            Err(DiscoveryError::Registration(msg)) => assert!(msg.contains(text), "{msg}"),
            other => panic!("{name}: expected a refusal, got {other:?}"),
        }
    }
    assert!(
        rx.try_recv().is_err(),
        "a refused registration was forwarded"
    );
    // Inside the allowed network: accepted; the legitimate handler again: accepted.
    registration::register(
        &sock,
        "net",
        &Endpoint::Network("http://10.1.2.3:8080".into()),
        false,
    )
    .await
    .unwrap();
    registration::register(&sock, "onvif", &onvif, false)
        .await
        .unwrap();
    assert_eq!(rx.recv().await.unwrap().key.name, "net");
    assert_eq!(rx.recv().await.unwrap().key.name, "onvif");
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}
