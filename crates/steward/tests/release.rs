//! One version for a release, and the kubectl plugin.
//!
//! The workspace version (Cargo.toml) is the release's version: the chart's
//! `version` and `appVersion` repeat it (the image's tag is the appVersion),
//! and the built binary's `steward version` prints it. scripts/release checks
//! the same on the built image and chart package.
//!
//! `kubectl steward …`: the binary installed as `kubectl-steward` on PATH is
//! found by a real kubectl (`kubectl plugin list`) and run by it, against the
//! API server stand-in, with the same output as `steward …`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{Cluster, STEWARD};
use kube::Api;
use kube::api::PostParams;
use steward_api::{Instance, InstanceSpec, cdi_name};
use steward_testing_apiserver::kube_tools::{self, KubeTools};
use steward_testing_apiserver::kubectl::Kubectl;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The value of `key:` at the start of a line of a flat YAML or TOML
/// section, unquoted.
fn field(text: &str, key: &str, sep: char) -> String {
    let line = text
        .lines()
        .find(|l| {
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(sep))
        })
        .unwrap_or_else(|| panic!("no {key} in\n{text}"));
    line.split_once(sep)
        .unwrap()
        .1
        .trim()
        .trim_matches('"')
        .to_owned()
}

fn workspace_version() -> String {
    let toml = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let section: String = toml
        .lines()
        .skip_while(|l| l.trim() != "[workspace.package]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .collect::<Vec<_>>()
        .join("\n");
    field(&section, "version", '=')
}

#[test]
fn the_binary_the_chart_and_the_image_tag_share_the_workspace_version() {
    let version = workspace_version();
    let chart = std::fs::read_to_string(repo().join("deploy/helm/steward/Chart.yaml")).unwrap();
    assert_eq!(field(&chart, "version", ':'), version, "Chart.yaml version");
    assert_eq!(
        field(&chart, "appVersion", ':'),
        version,
        "Chart.yaml appVersion"
    );
    // The image tag defaults to the appVersion.
    let helpers =
        std::fs::read_to_string(repo().join("deploy/helm/steward/templates/_helpers.tpl")).unwrap();
    assert!(
        helpers.contains("(default .Chart.AppVersion .Values.image.tag)"),
        "the image tag no longer follows the appVersion"
    );
    let values = std::fs::read_to_string(repo().join("deploy/helm/steward/values.yaml")).unwrap();
    assert!(
        values.contains("\n  tag: \"\"\n"),
        "values.yaml pins an image tag"
    );

    let out = std::process::Command::new(STEWARD)
        .args(["version", "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["version"], version.as_str());
    // This test runs from a git work tree: the build knew its commit.
    if repo().join(".git").exists() {
        let commit = v["gitCommit"].as_str().unwrap_or_default();
        assert!(
            commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit()),
            "{v}"
        );
    }
    let text = std::process::Command::new(STEWARD)
        .arg("version")
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.starts_with(&format!("steward {version} (commit ")),
        "{text}"
    );
}

/// `scripts/release --check` (Cargo.toml, Chart.yaml and the binary) passes
/// on this tree and fails, naming the part, on a chart that disagrees.
#[test]
fn the_release_script_checks_that_the_versions_agree() {
    let script = repo().join("scripts/release");
    let run = |chart: &Path| {
        std::process::Command::new(&script)
            .args(["--check", "--binary", STEWARD, "--chart"])
            .arg(chart)
            .output()
            .unwrap()
    };
    let ok = run(&repo().join("deploy/helm/steward"));
    assert!(
        ok.status.success(),
        "{}{}",
        text(&ok.stdout),
        text(&ok.stderr)
    );
    assert!(
        text(&ok.stdout).contains(&format!("==> agree: {}", workspace_version())),
        "{}",
        text(&ok.stdout)
    );

    let other = tempfile::tempdir().unwrap();
    let chart = std::fs::read_to_string(repo().join("deploy/helm/steward/Chart.yaml")).unwrap();
    let bumped: String = chart
        .lines()
        .map(|l| {
            if l.starts_with("appVersion:") {
                "appVersion: \"99.0.0\"".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(other.path().join("Chart.yaml"), bumped).unwrap();
    let bad = run(other.path());
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad.stdout));
    let stderr = text(&bad.stderr);
    assert!(
        stderr.contains(&format!(
            "appVersion ({}/Chart.yaml) is 99.0.0, but the workspace version is {}",
            other.path().display(),
            workspace_version()
        )),
        "{stderr}"
    );
}

/// A directory holding `kubectl-steward`, a symlink to the built binary, as
/// scripts/release installs it.
fn plugin_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(STEWARD, dir.path().join("kubectl-steward")).unwrap();
    dir
}

fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    if let Some(p) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(paths).unwrap()
}

async fn kubectl(k: &Kubectl, dir: &Path, args: &[&str]) -> Output {
    k.command(args)
        .env("PATH", path_with(dir))
        .output()
        .await
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_finds_and_runs_the_plugin() {
    kube_tools::each(kubectl_finds_and_runs_the_plugin_with).await;
}

async fn kubectl_finds_and_runs_the_plugin_with(t: KubeTools) {
    let home = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(home.path()).await.unwrap();
    let mut cam = Instance::new(
        "cam-a",
        InstanceSpec {
            configuration_name: "cams".into(),
            device_id: "dev-cam-a".into(),
            shared: false,
            nodes: vec!["node-a".into()],
            capacity: 2,
            properties: Default::default(),
            mounts: vec![],
            device_specs: vec![],
            cdi_name: cdi_name("cams", "cam-a"),
        },
    );
    cam.metadata.namespace = Some("default".into());
    Api::<Instance>::namespaced(cluster.client(), "default")
        .create(&PostParams::default(), &cam)
        .await
        .unwrap();
    let k = Kubectl::of(&cluster.server, &t).await;
    let plugins = plugin_dir();
    let installed = plugins.path().join("kubectl-steward");

    let list = kubectl(&k, plugins.path(), &["plugin", "list"]).await;
    assert!(
        text(&list.stdout).contains(installed.to_str().unwrap()),
        "kubectl plugin list:\n{}\n{}",
        text(&list.stdout),
        text(&list.stderr)
    );
    assert!(
        !text(&list.stderr).contains("warning"),
        "{}",
        text(&list.stderr)
    );

    let version = kubectl(&k, plugins.path(), &["steward", "version"]).await;
    assert!(version.status.success(), "{version:?}");
    assert!(
        text(&version.stdout)
            .starts_with(&format!("steward {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{}",
        text(&version.stdout)
    );

    // A cluster command, through kubectl's environment (its KUBECONFIG):
    // the same table `steward get instances` prints.
    let via_kubectl = kubectl(&k, plugins.path(), &["steward", "get", "instances"]).await;
    assert!(
        via_kubectl.status.success(),
        "{}",
        text(&via_kubectl.stderr)
    );
    let direct = tokio::process::Command::new(STEWARD)
        .args(["get", "instances"])
        .env("KUBECONFIG", k.kubeconfig())
        .env("HOME", k.dir())
        .output()
        .await
        .unwrap();
    assert!(direct.status.success(), "{}", text(&direct.stderr));
    assert!(
        text(&via_kubectl.stdout).contains("cam-a"),
        "{}",
        text(&via_kubectl.stdout)
    );
    // The same table but for AGE, which moves on between the two calls.
    assert_eq!(
        without_age(&text(&via_kubectl.stdout)),
        without_age(&text(&direct.stdout))
    );

    // Usage names the plugin; the components are not kubectl commands.
    let help = kubectl(&k, plugins.path(), &["steward", "--help"]).await;
    let help = text(&help.stdout);
    assert!(help.contains("Usage: kubectl steward"), "{help}");
    assert!(!help.contains("cri-proxy"), "{help}");
    let agent = kubectl(&k, plugins.path(), &["steward", "agent"]).await;
    assert_eq!(agent.status.code(), Some(2), "{agent:?}");
    assert!(
        text(&agent.stderr).contains("run it as `steward agent`"),
        "{}",
        text(&agent.stderr)
    );
    cluster.server.shutdown().await;
}

/// A table with its last column (AGE) dropped, columns single-spaced.
fn without_age(table: &str) -> Vec<String> {
    table
        .lines()
        .map(|line| {
            let cells: Vec<&str> = line.split_whitespace().collect();
            cells[..cells.len().saturating_sub(1)].join(" ")
        })
        .collect()
}
