//! One `steward nri-plugin` per state directory: the real process, no
//! runtime needed (the lock is taken before the NRI socket is dialled, so
//! each plugin here keeps retrying a socket that does not exist). A second
//! plugin on the same state directory exits non-zero naming the first and
//! what to do; once the first is killed with SIGKILL (the kernel drops its
//! lock), a new one starts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use steward_testing_containerd::wait_log;
use tokio::process::{Child, Command};

fn command(dir: &Path, index: &str) -> Command {
    let mut c = common::nri_plugin(dir, &dir.join("nri.sock"), "steward-lock");
    c.args(["--nri-index", index]);
    c
}

fn start(dir: &Path, index: &str, log: &Path) -> Child {
    common::spawn_logging(command(dir, index), log).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_plugin_on_the_same_state_directory_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), "policy: { active: none }").unwrap();
    let log1 = dir.path().join("plugin1.log");
    let mut first = start(dir.path(), "10", &log1);
    let first_pid = first.id().unwrap();
    // Past the lock: it is dialling the (absent) NRI socket.
    wait_log(&log1, "no NRI socket at", 1).await;

    // Another index does not help: the state directory is the same.
    let second = tokio::time::timeout(
        Duration::from_secs(20),
        command(dir.path(), "11").stderr(Stdio::piped()).output(),
    )
    .await
    .expect("the second plugin did not exit")
    .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    eprintln!("{stderr}");
    assert!(!second.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "another steward nri-plugin already runs on state directory {}",
            dir.path().join("state").display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("pid {first_pid} on host")),
        "{stderr}"
    );
    assert!(stderr.contains("NRI plugin 10-steward-lock at"), "{stderr}");
    assert!(stderr.contains("Stop that one first"), "{stderr}");
    assert!(!stderr.contains("no NRI socket at"), "it dialled: {stderr}");
    // The first one is untouched.
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first plugin exited"
    );

    // SIGKILL: no goodbye, and still no stale lock.
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    let log3 = dir.path().join("plugin3.log");
    let mut third = start(dir.path(), "10", &log3);
    wait_log(&log3, "no NRI socket at", 1).await;
    let holder = std::fs::read_to_string(dir.path().join("state/nri-plugin.lock")).unwrap();
    assert!(
        holder.contains(&format!("pid {} on host", third.id().unwrap())),
        "{holder}"
    );
    third.start_kill().unwrap();
    third.wait().await.unwrap();
}
