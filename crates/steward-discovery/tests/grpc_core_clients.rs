//! The discovery servers (the agent's Registration server, a handler's
//! DiscoveryHandler server) answer a gRPC C-core client (Python grpcio)
//! that dials their unix socket with its default `:authority` (the
//! percent-encoded socket path, which h2 alone would reset).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use prost::Message;
use steward_discovery::handlers::debug_echo::DebugEcho;
use steward_discovery::policy::RegistrationPolicy;
use steward_discovery::{registration, server};
use steward_proto::discovery::v0 as proto;

/// Runs the shared grpcio fixture; `None` (after printing why) when python3
/// or grpcio is not installed.
fn grpcio(socket: &Path, method: &str, request: &[u8], kind: &str) -> Option<(bool, String)> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../steward-nodeio/tests/fixtures/grpc_call.py");
    let hex: String = request.iter().map(|b| format!("{b:02x}")).collect();
    let out = match Command::new("python3")
        .arg(script)
        .arg(socket)
        .arg(method)
        .arg(hex)
        .arg(kind)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            println!("SKIPPED: python3 cannot be run ({e}); install python3 and grpcio");
            return None;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.code() == Some(3) {
        println!(
            "SKIPPED: grpcio is not installed ({}); python3 -m pip install grpcio",
            stdout.trim()
        );
        return None;
    }
    Some((out.status.success(), stdout))
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_registers_with_the_agent_and_discovers_from_a_handler() {
    let dir = tempfile::tempdir().unwrap();

    // The agent's Registration server.
    let agent = dir.path().join("agent-registration.sock");
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let (stop_agent, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent_task = tokio::spawn(registration::serve(
        agent.clone(),
        tx,
        RegistrationPolicy::default(),
        async {
            let _ = stopped.await;
        },
    ));
    for _ in 0..100 {
        if agent.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let handler_socket = dir.path().join("dh.sock");
    let req = proto::RegisterDiscoveryHandlerRequest {
        name: "from-python".into(),
        endpoint: handler_socket.display().to_string(),
        endpoint_type: 0,
        shared: true,
    };
    let Some((ok, out)) = grpcio(
        &agent,
        "/v0.Registration/RegisterDiscoveryHandler",
        &req.encode_to_vec(),
        "unary",
    ) else {
        return;
    };
    assert!(ok, "grpcio Register failed: {out}");
    let reg = rx.recv().await.unwrap();
    assert_eq!(reg.key.name, "from-python");
    assert!(reg.shared);

    // A handler's DiscoveryHandler server (server streaming).
    let (stop_dh, dh_stopped) = tokio::sync::oneshot::channel::<()>();
    let dh_task = tokio::spawn(server::serve_uds(
        Arc::new(DebugEcho::new(false)),
        handler_socket.clone(),
        async {
            let _ = dh_stopped.await;
        },
    ));
    for _ in 0..100 {
        if handler_socket.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let req = proto::DiscoverRequest {
        discovery_details: "descriptions: [from-python]".into(),
        discovery_properties: Default::default(),
    };
    let (ok, out) = grpcio(
        &handler_socket,
        "/v0.DiscoveryHandler/Discover",
        &req.encode_to_vec(),
        "stream",
    )
    .unwrap();
    assert!(ok, "grpcio Discover failed: {out}");
    let hex = out.lines().next().unwrap().strip_prefix("OK ").unwrap();
    let resp = proto::DiscoverResponse::decode(unhex(hex).as_slice()).unwrap();
    assert_eq!(resp.devices.len(), 1, "{resp:?}");
    assert!(
        resp.devices[0]
            .properties
            .values()
            .any(|v| v == "from-python"),
        "{resp:?}"
    );

    let _ = stop_dh.send(());
    dh_task.await.unwrap().unwrap();
    let _ = stop_agent.send(());
    agent_task.await.unwrap().unwrap();
    assert!(
        !agent.exists(),
        "the agent's socket is removed when it stops"
    );
}
