//! The container image `scripts/build-image` makes, run in a real
//! containerd: imported as an OCI image-layout tarball (no registry), its
//! entrypoint runs the standalone agent as the pod's process, and the same
//! binary inside answers `--version`, `crds` and `get instances` (the
//! agent's read API) as it does on the host. The image ships its shared
//! libraries, so a missing one fails here, not on a node. The pod is
//! removed by the harness even when the test panics, the image by a guard.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use steward_testing_containerd::{
    ContainerSpec, Containerd, PodNetwork, cleanup_pod, exec_sync, run_pod_with_container,
};

const STEWARD: &str = env!("CARGO_BIN_EXE_steward");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn containerd() -> Arc<Containerd> {
    Containerd::shared().unwrap_or_else(|e| {
        panic!("cannot start or reach containerd (root, containerd and runc are needed): {e}")
    })
}

/// Removes the test's image from containerd, also when the test panics.
struct ImageGuard {
    sock: PathBuf,
    name: String,
}

impl Drop for ImageGuard {
    fn drop(&mut self) {
        let _ = Command::new("ctr")
            .arg("-a")
            .arg(&self.sock)
            .args(["-n", "k8s.io", "images", "rm", &self.name])
            .output();
    }
}

fn host(args: &[&str]) -> String {
    let out = Command::new(STEWARD).args(args).output().unwrap();
    assert!(out.status.success(), "steward {args:?} on the host failed");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_the_agent_and_every_subcommand_in_containerd() {
    let ctrd = containerd();
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("steward.tar");
    let name = format!("steward.local/steward:test-{}", std::process::id());

    let built = Command::new(root().join("scripts/build-image"))
        .args(["--binary", STEWARD, "--name", &name])
        .arg(&tar)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&built.stdout);
    assert!(
        built.status.success(),
        "build-image failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    assert!(said.contains(&name), "{said}");

    let imported = Command::new("ctr")
        .arg("-a")
        .arg(ctrd.sock())
        .args(["-n", "k8s.io", "images", "import"])
        .arg(&tar)
        .output()
        .unwrap();
    assert!(
        imported.status.success(),
        "ctr images import: {}",
        String::from_utf8_lossy(&imported.stderr)
    );
    let _image = ImageGuard {
        sock: ctrd.sock().to_path_buf(),
        name: name.clone(),
    };

    let (mut rt, _) = ctrd.client().await.unwrap();
    let sandbox = ctrd.pod_config("image", PodNetwork::Host);
    // No command: the image's entrypoint (steward) with these arguments.
    let spec = ContainerSpec::new("agent").image(&name).entrypoint_args([
        "agent",
        "--standalone",
        "--configurations",
        "/var/lib/steward/configurations.yaml",
        "--node-name",
        "image-test",
        "--embedded",
        "debug-echo",
    ]);
    let (sandbox_id, container) = run_pod_with_container(&mut rt, &sandbox, &spec)
        .await
        .unwrap();

    // The agent in the container serves its read API once it is up.
    let started = Instant::now();
    let listed = loop {
        match exec_sync(
            &mut rt,
            &container,
            &[
                "steward",
                "get",
                "instances",
                "--state-dir",
                "/var/lib/steward",
            ],
        )
        .await
        {
            Ok(out) => break out,
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                eprintln!("waiting for the agent in the container: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the agent in the container never answered: {e}"),
        }
    };
    assert_eq!(listed.stdout, "");
    assert!(
        listed.stderr.contains("No resources found"),
        "{}",
        listed.stderr
    );
    let version = exec_sync(&mut rt, &container, &["steward", "--version"])
        .await
        .unwrap();
    assert_eq!(version.stdout, host(&["--version"]));
    let crds = exec_sync(&mut rt, &container, &["steward", "crds"])
        .await
        .unwrap();
    assert_eq!(crds.stdout, host(&["crds"]));

    cleanup_pod(&mut rt, &sandbox_id).await.unwrap();
}
