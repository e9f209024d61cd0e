//! The udev handler against this machine's real devices, and hotplug of a
//! loop device the test attaches.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use common::*;
use steward_discovery::handlers::udev::{self, Udev};
use steward_discovery::{DiscoverRequest, DiscoveryHandler};

#[tokio::test]
async fn enumerates_memory_devices() {
    init_tracing();
    let h = Udev::new();
    assert!(!h.shared());
    let mut s = h
        .discover(DiscoverRequest::new(
            r#"udevRules: ['SUBSYSTEM=="mem", KERNEL=="null|zero"']"#,
        ))
        .unwrap();
    let list = next_list(&mut s, 10).await;
    assert_eq!(
        ids(&list),
        ["/devices/virtual/mem/null", "/devices/virtual/mem/zero"]
    );
    let null = &list[0];
    let prop = |k: &str| null.properties.get(k).map(String::as_str);
    assert_eq!(prop(udev::DEVNODE_PROPERTY), Some("/dev/null"));
    assert_eq!(
        prop(udev::DEVPATH_PROPERTY),
        Some("/devices/virtual/mem/null")
    );
    assert_eq!(prop(udev::SUBSYSTEM_PROPERTY), Some("mem"));
    assert_eq!(null.device_specs.len(), 1);
    assert_eq!(null.device_specs[0].host_path, "/dev/null");
    assert_eq!(null.device_specs[0].container_path, "/dev/null");
    assert_eq!(null.device_specs[0].permissions, "rw");
    for key in null.properties.keys() {
        assert!(
            key.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'),
            "{key}"
        );
    }

    // A negated match and an ancestor match on the same machine.
    let mut s = h
        .discover(DiscoverRequest::new(
            r#"udevRules: ['SUBSYSTEM=="mem", KERNEL!="null", KERNEL=="null|zero"']"#,
        ))
        .unwrap();
    assert_eq!(
        ids(&next_list(&mut s, 10).await),
        ["/devices/virtual/mem/zero"]
    );
    let mut s = h
        .discover(DiscoverRequest::new(
            r#"udevRules: ['SUBSYSTEM=="mem", KERNELS=="no-such-parent"']"#,
        ))
        .unwrap();
    assert!(next_list(&mut s, 10).await.is_empty());
}

/// Runs `cmd`, returning trimmed stdout, panicking with stderr on failure.
fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn udevd_running() -> bool {
    Command::new("udevadm")
        .args(["control", "--ping"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// udevd started by this test (if none was running), stopped by PID on drop.
struct Udevd(Option<Child>);

impl Udevd {
    async fn ensure() -> Udevd {
        if udevd_running() {
            return Udevd(None);
        }
        let child = Command::new("/lib/systemd/systemd-udevd")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start systemd-udevd");
        let me = Udevd(Some(child));
        assert!(wait_until(10, udevd_running).await, "udevd did not come up");
        me
    }
}

impl Drop for Udevd {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            // SIGTERM lets udevd remove its control socket; SIGKILL if it lingers.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            for _ in 0..50 {
                if child.try_wait().is_ok_and(|s| s.is_some()) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A loop device attached to a file; detached on drop.
struct Loop(Option<String>);

impl Loop {
    fn detach(&mut self) {
        if let Some(dev) = self.0.take() {
            run("losetup", &["-d", &dev]);
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Some(dev) = self.0.take() {
            let _ = Command::new("losetup").args(["-d", &dev]).status();
        }
    }
}

/// Attaches a loop device to a fresh file and detaches it, asserting the
/// device appears in and then disappears from a running udev stream.
async fn hotplug_round(label: &str) {
    let dir = tempfile::tempdir().unwrap();
    let backing: PathBuf = dir.path().join("steward-hotplug.img");
    std::fs::write(&backing, vec![0u8; 1 << 20]).unwrap();
    let backing_text = backing.display().to_string();
    // Only loop devices backed by our file: the backing_file attribute
    // exists only while attached.
    let details = format!(
        "udevRules: ['SUBSYSTEM==\"block\", KERNEL==\"loop[0-9]*\", ATTR{{loop/backing_file}}==\"{backing_text}\"']"
    );
    let mut stream = Udev::new().discover(DiscoverRequest::new(details)).unwrap();
    assert!(
        next_list(&mut stream, 10).await.is_empty(),
        "{label}: not attached yet"
    );

    let mut attached = Loop(Some(run("losetup", &["-f", "--show", &backing_text])));
    let node = attached.0.clone().unwrap();
    let name = node.trim_start_matches("/dev/").to_string();
    let list = next_list(&mut stream, 20).await;
    assert_eq!(list.len(), 1, "{label}: {list:?}");
    assert!(
        list[0].id.ends_with(&format!("/block/{name}")),
        "{label}: {}",
        list[0].id
    );
    assert_eq!(
        list[0].properties.get(udev::DEVNODE_PROPERTY),
        Some(&node),
        "{label}"
    );
    assert_eq!(
        list[0]
            .properties
            .get(udev::SUBSYSTEM_PROPERTY)
            .map(String::as_str),
        Some("block"),
        "{label}"
    );

    attached.detach();
    let list = next_list(&mut stream, 20).await;
    assert!(
        list.is_empty(),
        "{label}: still reported after detach: {list:?}"
    );
}

#[tokio::test]
async fn loop_device_hotplug_appears_and_disappears() {
    init_tracing();
    if !udevd_running() {
        // Without udevd the handler falls back to kernel uevents.
        hotplug_round("kernel uevents (no udevd)").await;
    }
    let _udevd = Udevd::ensure().await;
    hotplug_round("udevd events").await;
}
