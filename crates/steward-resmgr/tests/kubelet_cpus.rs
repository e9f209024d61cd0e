//! The check that kubelet's CPU manager leaves the cpusets to steward,
//! against kubelet's own pod resources v1 server code path (the Go peer:
//! kubelet's generated types and grpc-go) answering GetAllocatableResources
//! as kubelet does under CPU manager policy `none` (no CPU) and `static`
//! (its allocatable CPUs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use steward_resmgr::kubelet_cpus::{self, KubeletCpus};

/// The Go peer serving kubelet's pod resources with `cpus` allocatable;
/// stops when dropped (its stdin closes, and it is killed).
struct Kubelet(Child);

impl Drop for Kubelet {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn kubelet(socket: &Path, cpus: &str) -> Option<Kubelet> {
    let bin = steward_testing_gopeers::binary("kubelet-grpc")?;
    let mut child = Command::new(bin)
        .args(["podresources-server", "-socket"])
        .arg(socket)
        .args(["-cpus", cpus])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("\"listening\""), "{line}");
    Some(Kubelet(child))
}

#[tokio::test]
async fn policy_none_passes_and_static_is_refused_with_its_cpus() {
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("none.sock");
    let Some(_none) = kubelet(&none, "") else {
        return;
    };
    let verdict = kubelet_cpus::ask(&none, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(verdict, KubeletCpus::Unpinned);
    assert_eq!(verdict.check(&none), Ok(()));

    let fixed = dir.path().join("static.sock");
    let Some(_static) = kubelet(&fixed, "1,2,3") else {
        return;
    };
    let verdict = kubelet_cpus::ask(&fixed, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(verdict, KubeletCpus::Pinning(vec![1, 2, 3]));
    let err = verdict.check(&fixed).unwrap_err();
    assert!(
        err.to_string().contains("cpuManagerPolicy to none"),
        "{err}"
    );
}

#[tokio::test]
async fn no_kubelet_socket_is_unreachable_not_a_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let err = kubelet_cpus::ask(&dir.path().join("absent.sock"), Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("absent.sock"), "{err}");
}
