//! CDI devices into a container on either runtime, checked from inside it.
//!
//! containerd 2.x applies the CDI devices named in `ContainerConfig.CDI_devices`
//! itself, reading specs from the directory it was configured with
//! (`Containerd::cdi_spec_dir`); containerd 1.6 knows no CDI, so there the
//! kubelet stand-in resolves the specs and applies them as plain CRI edits.
//! Either way the container must end up with the same environment, device
//! nodes and mounts, which [`assert_edits_inside`] checks with `exec`.

use std::path::{Path, PathBuf};

use steward_proto::cri::runtime::v1::runtime_service_client::RuntimeServiceClient;
use steward_testing_containerd::{Containerd, exec_sync};
use steward_testing_kubelet::cdi::{ContainerEdits, Injection};
use tonic::transport::Channel;

/// Where the CDI specs of a test go for the runtime behind `ctrd`, and who
/// applies them: the runtime's own spec directory and [`Injection::Runtime`]
/// when it injects CDI (containerd 2.x), else `fallback` and
/// [`Injection::StandIn`].
pub async fn target(ctrd: &Containerd, fallback: &Path) -> (PathBuf, Injection) {
    let version = match ctrd.runtime_version().await {
        Ok(v) => v,
        Err(e) => panic!("CRI Version: {e}"),
    };
    if !version.injects_cdi() {
        return (fallback.to_path_buf(), Injection::StandIn);
    }
    match ctrd.cdi_spec_dir() {
        Some(dir) => (dir.to_path_buf(), Injection::Runtime),
        None => panic!(
            "{} {} injects CDI devices, but its spec directory is unknown (set {})",
            version.name,
            version.version,
            steward_testing_containerd::CDI_SPEC_DIR_ENV
        ),
    }
}

/// Checks from inside `container_id` that `edits` were applied: every
/// environment entry (the last one of a name wins), every device node a
/// character or block device, every mount in `/proc/mounts` (read-only if
/// its options say `ro`).
pub async fn assert_edits_inside(
    rt: &mut RuntimeServiceClient<Channel>,
    container_id: &str,
    edits: &ContainerEdits,
) {
    let run = |out: Result<steward_testing_containerd::ExecOutput, _>, what: &str| match out {
        Ok(o) => o.stdout,
        Err(e) => panic!("{what}: {e}"),
    };
    let env = run(exec_sync(rt, container_id, &["env"]).await, "env");
    for (i, entry) in edits.env.iter().enumerate() {
        let key = entry.split_once('=').map_or(entry.as_str(), |(k, _)| k);
        let overridden = edits.env[i + 1..]
            .iter()
            .any(|later| later.split_once('=').map_or(later.as_str(), |(k, _)| k) == key);
        assert!(
            overridden || env.lines().any(|l| l == entry),
            "{entry} missing from the container's environment:\n{env}"
        );
    }
    for node in &edits.device_nodes {
        let ls = run(
            exec_sync(rt, container_id, &["ls", "-l", &node.path]).await,
            &format!("ls -l {}", node.path),
        );
        assert!(
            ls.starts_with('c') || ls.starts_with('b'),
            "{} is a device node in the container: {ls}",
            node.path
        );
    }
    if edits.mounts.is_empty() {
        return;
    }
    let mounts = run(
        exec_sync(rt, container_id, &["cat", "/proc/mounts"]).await,
        "cat /proc/mounts",
    );
    for m in &edits.mounts {
        let line = mounts
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(m.container_path.as_str()));
        let Some(line) = line else {
            panic!(
                "{} is not mounted in the container:\n{mounts}",
                m.container_path
            );
        };
        if m.options.iter().any(|o| o == "ro") {
            let opts = line.split_whitespace().nth(3).unwrap_or_default();
            assert!(
                opts.split(',').any(|o| o == "ro"),
                "{} is mounted read-only: {line}",
                m.container_path
            );
        }
    }
}
