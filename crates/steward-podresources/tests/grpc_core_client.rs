//! A gRPC C-core client (Python grpcio, as many monitoring agents are) with
//! its default `:authority` for a unix socket: served, not reset.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use prost::Message;
use steward_core::ledger::Source;
use steward_proto::podresources::v1 as wire;

fn grpcio(socket: &Path, method: &str, kind: &str) -> Option<(bool, String)> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../steward-nodeio/tests/fixtures/grpc_call.py");
    let out = match Command::new("python3")
        .arg(script)
        .arg(socket)
        .arg(method)
        .arg("")
        .arg(kind)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "python3 is required in CI: {e}"
            );
            println!("SKIPPED: python3 cannot be run ({e})");
            return None;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.code() == Some(3) {
        assert!(
            std::env::var_os("CI").is_none(),
            "grpcio is required in CI: {stdout}"
        );
        println!("SKIPPED: grpcio is not installed: {stdout}");
        return None;
    }
    Some((out.status.success(), stdout))
}

fn decode<M: Message + Default>(stdout: &str) -> M {
    let hex = stdout.lines().next().unwrap().strip_prefix("OK ").unwrap();
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    M::decode(bytes.as_slice()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_lists_and_watches_with_its_default_authority() {
    let server = unlimited().await;
    server
        .hub
        .upsert(Source::Slots, pod_with("web", &["cam-0"]));
    let socket = server.socket.clone();
    let list = tokio::task::spawn_blocking({
        let socket = socket.clone();
        move || grpcio(&socket, "/v1.PodResourcesLister/List", "unary")
    })
    .await
    .unwrap();
    let Some((ok, stdout)) = list else { return };
    assert!(ok, "grpcio List failed: {stdout}");
    let resp: wire::ListPodResourcesResponse = decode(&stdout);
    assert_eq!(resp.pod_resources[0].name, "web");

    let watch = tokio::task::spawn_blocking(move || {
        grpcio(&socket, "/v1.PodResourcesLister/ListAndWatch", "stream")
    })
    .await
    .unwrap();
    let (ok, stdout) = watch.unwrap();
    assert!(ok, "grpcio ListAndWatch failed: {stdout}");
    let first: wire::ListAndWatchPodResourcesResponse = decode(&stdout);
    assert_eq!(first.action, wire::WatchPodAction::Added as i32);
    assert_eq!(first.uid, "web");
}
