//! A gRPC C-core client (Python grpcio) against tonic servers on unix
//! sockets: refused by plain h2, served through `UnixIncoming`; and a
//! grpc-go-style client (tonic, steward-proto's connector) still served.

use std::path::{Path, PathBuf};
use std::process::Command;

use prost::Message;
use steward_nodeio::{BindOptions, UnixIncoming};
use steward_proto::deviceplugin::v1beta1::{
    Empty, RegisterRequest,
    registration_client::RegistrationClient,
    registration_server::{Registration, RegistrationServer},
};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

struct Echo;

#[tonic::async_trait]
impl Registration for Echo {
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        if req.get_ref().resource_name == "steward.dev/ok" {
            Ok(Response::new(Empty {}))
        } else {
            Err(Status::invalid_argument("unexpected resource name"))
        }
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/grpc_call.py")
}

/// Runs the grpcio script; `None` (after printing why) when python3 or
/// grpcio is not installed.
fn grpcio_call(socket: &Path, calls: u32) -> Option<(bool, String)> {
    let req = RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "x.sock".into(),
        resource_name: "steward.dev/ok".into(),
        options: None,
    };
    let hex: String = req
        .encode_to_vec()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let out = match Command::new("python3")
        .arg(script())
        .arg(socket)
        .arg("/v1beta1.Registration/Register")
        .arg(hex)
        .arg("unary")
        .arg(calls.to_string())
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
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    Some((out.status.success(), stdout))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_is_reset_by_plain_h2_and_served_through_unix_incoming() {
    let dir = tempfile::tempdir().unwrap();

    // Control: the plain listener, as every steward server had it.
    let plain = dir.path().join("plain.sock");
    let (listener, _g1) = steward_nodeio::bind(&plain, BindOptions::mode(0o600)).unwrap();
    let plain_server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Echo))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let Some((ok, out)) = grpcio_call(&plain, 1) else {
        return;
    };
    eprintln!("plain h2 answered grpcio: {}", out.trim());
    assert!(
        !ok,
        "plain h2 is expected to refuse grpcio's default authority: {out}"
    );
    plain_server.abort();

    // The fix.
    let fixed = dir.path().join("fixed.sock");
    let (listener, _g2) = steward_nodeio::bind(&fixed, BindOptions::mode(0o600)).unwrap();
    let incoming = UnixIncoming::with_authority_fix(listener);
    let replaced = incoming.replaced_counter();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Echo))
            .serve_with_incoming(incoming),
    );
    // Three calls on one channel: later ones use the client's dynamic table.
    let (ok, out) = grpcio_call(&fixed, 3).unwrap();
    assert!(ok, "grpcio through UnixIncoming failed: {out}");
    assert_eq!(out.lines().filter(|l| *l == "OK ").count(), 3, "{out}");
    assert!(
        replaced.load(std::sync::atomic::Ordering::Relaxed) >= 3,
        "the authority was rewritten on every call"
    );

    // A grpc-go–style client (authority "localhost") is served as before.
    let channel = steward_proto::uds::endpoint()
        .connect_with_connector(steward_proto::uds::UnixConnector::new(&fixed))
        .await
        .unwrap();
    let mut client = RegistrationClient::new(channel);
    let req = RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "x.sock".into(),
        resource_name: "steward.dev/ok".into(),
        options: None,
    };
    for _ in 0..3 {
        client.register(req.clone()).await.unwrap();
    }
    let status = client
        .register(RegisterRequest {
            resource_name: "other".into(),
            ..req
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    server.abort();
}
