//! `steward get assignments` and `steward watch assignments` as a user runs
//! them: the binary against a pod resources server on a real unix socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use steward_core::cpu::CpuSet;
use steward_core::ledger::{PodAssignments, PodRef, Source};
use steward_podresources::serve::{ServeOptions, serve};
use steward_podresources::{Hub, PodResourcesMetrics, WatchLimits};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

const STEWARD: &str = env!("CARGO_BIN_EXE_steward");

fn pod(uid: &str, devices: &[&str], cpus: &[u32]) -> PodAssignments {
    let mut p = PodAssignments::new(PodRef::new(uid, "apps", uid));
    let c = p.container_mut("main");
    if !devices.is_empty() {
        c.add_devices(
            "steward.dev/cam",
            devices.iter().copied(),
            &BTreeSet::from([0]),
        );
    }
    c.cpus = CpuSet::from_iter(cpus.iter().copied());
    c.exclusive_cpus = !cpus.is_empty();
    p
}

struct Served {
    hub: std::sync::Arc<Hub>,
    socket: std::path::PathBuf,
    _cancel: tokio_util::sync::DropGuard,
    _dir: tempfile::TempDir,
}

async fn served() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("steward.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let hub = Hub::new(WatchLimits::default(), PodResourcesMetrics::default());
    let cancel = CancellationToken::new();
    tokio::spawn(serve(
        hub.clone(),
        listener,
        ServeOptions::default(),
        cancel.clone(),
    ));
    Served {
        hub,
        socket,
        _cancel: cancel.drop_guard(),
        _dir: dir,
    }
}

#[tokio::test]
async fn get_assignments_prints_a_table_and_json() {
    let s = served().await;
    s.hub.upsert(Source::Slots, pod("web", &["cam-0"], &[]));
    s.hub.upsert(Source::Cri, pod("db", &[], &[2, 3]));
    let out = tokio::process::Command::new(STEWARD)
        .args(["get", "assignments", "--socket"])
        .arg(&s.socket)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "NAMESPACE",
            "POD",
            "CONTAINER",
            "DEVICES",
            "CPUS",
            "MEMORY",
            "NUMA"
        ]
    );
    assert_eq!(lines[1], ["apps", "db", "main", "-", "2-3", "-", "-"]);
    assert_eq!(lines[2], ["apps", "web", "main", "cam-0", "-", "-", "0"]);

    let out = tokio::process::Command::new(STEWARD)
        .args(["get", "assignments", "-o", "json", "--socket"])
        .arg(&s.socket)
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v[1]["containers"]["main"]["devices"][0]["deviceIds"][0],
        "cam-0"
    );
}

#[tokio::test]
async fn watch_assignments_prints_one_line_per_event() {
    let s = served().await;
    s.hub.upsert(Source::Slots, pod("web", &["cam-0"], &[]));
    let mut child = tokio::process::Command::new(STEWARD)
        .args(["watch", "assignments", "--count", "3", "--socket"])
        .arg(&s.socket)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(first.starts_with("ADDED    apps/web uid=web"), "{first}");
    // The KEP's example through the CLI: web's cam-0 goes to api.
    s.hub.pod_gone("web");
    s.hub.upsert(Source::Slots, pod("api", &["cam-0"], &[]));
    let second = lines.next_line().await.unwrap().unwrap();
    let third = lines.next_line().await.unwrap().unwrap();
    assert!(second.starts_with("DELETED  apps/web"), "{second}");
    assert!(
        third.starts_with("ADDED    apps/api") && third.contains("devices=steward.dev/cam=cam-0"),
        "{third}"
    );
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "--count 3 ends the watch");
}

#[tokio::test]
async fn a_missing_socket_is_one_clear_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(STEWARD)
        .args(["get", "assignments", "--socket"])
        .arg(dir.path().join("absent.sock"))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no pod resources socket at"), "{err}");
}
