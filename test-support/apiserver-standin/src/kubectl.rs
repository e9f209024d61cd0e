//! A real kubectl (1.35 or newer) pointed at a stand-in, for tests: its own
//! kubeconfig and HOME (discovery and HTTP caches) in a private directory
//! removed on drop. Tests take kubectl 1.35 and 1.37 in turn from
//! [`crate::kube_tools`] ([`Kubectl::of`]); [`Kubectl::new`] takes
//! `STEWARD_KUBECTL` (scripts/test sets it, installing kubectl through
//! scripts/kube-tools.sh) or `kubectl` on PATH.
//!
//! Test support: a kubectl that cannot be run, or a command expected to
//! succeed that fails, panics with what kubectl printed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::ApiServer;
use crate::kube_tools::KubeTools;
pub use crate::kube_tools::kubectl_bin;

/// Upper bound of one kubectl invocation.
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(60);

/// A kubeconfig pointing at one stand-in, in a private directory (also kubectl's HOME,
/// so its discovery / HTTP caches are per test), and the kubectl binary.
pub struct Kubectl {
    bin: PathBuf,
    dir: PathBuf,
    /// kubectl's own `gitVersion`, named in failures.
    version: String,
}

impl Drop for Kubectl {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Kubectl {
    pub async fn new(server: &ApiServer) -> Self {
        Self::with_bin(server, kubectl_bin()).await
    }

    /// As [`Kubectl::new`], with the kubectl of `tools`; panics unless it is
    /// the minor `tools` names.
    pub async fn of(server: &ApiServer, tools: &KubeTools) -> Self {
        let k = Self::with_bin(server, tools.kubectl.clone()).await;
        if let Some(minor) = tools.minor {
            assert_eq!(
                k.minor(),
                minor,
                "{} is {}, not kubectl 1.{minor}",
                k.bin.display(),
                k.version
            );
        }
        k
    }

    /// As [`Kubectl::new`], with the kubectl binary `bin` (another version).
    pub async fn with_bin(server: &ApiServer, bin: PathBuf) -> Self {
        let dir = std::env::temp_dir().join(format!("steward-kubectl-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": server.url()}}],
            "users": [{"name": "nobody", "user": {}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "nobody"}}],
            "current-context": "standin"
        });
        std::fs::write(dir.join("kubeconfig"), kubeconfig.to_string()).unwrap();
        let mut k = Kubectl {
            bin,
            dir,
            version: String::new(),
        };
        k.version = k.check_version().await;
        k
    }

    pub fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(args)
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
            .env("HOME", &self.dir)
            .env_remove("KUBERC")
            .env_remove("KUBECTL_KUBERC")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    pub async fn output(&self, args: &[&str]) -> Output {
        let run = self.command(args).output();
        match tokio::time::timeout(KUBECTL_TIMEOUT, run).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => panic!(
                "running {} {args:?}: {e}; run scripts/test (it installs kubectl 1.35 and 1.37) or set STEWARD_KUBECTL \
                 (eval \"$(scripts/kube-tools.sh)\")",
                self.bin.display()
            ),
            Err(_) => panic!(
                "kubectl {} {args:?} did not finish within {KUBECTL_TIMEOUT:?}",
                self.version
            ),
        }
    }

    /// Runs kubectl and returns its stdout; panics with stderr when it fails.
    pub async fn ok(&self, args: &[&str]) -> String {
        let out = self.output(args).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "kubectl {} {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
            self.version,
            out.status
        );
        stdout
    }

    /// kubectl's `gitVersion`; panics unless it is 1.35 or newer.
    async fn check_version(&self) -> String {
        let out = self.output(&["version", "--client", "-o", "json"]).await;
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let cv = &v["clientVersion"];
        let minor: u32 = cv["minor"]
            .as_str()
            .unwrap_or_default()
            .trim_end_matches('+')
            .parse()
            .unwrap_or(0);
        assert!(
            cv["major"] == "1" && minor >= 35,
            "{} is {} (kubectl 1.35 or newer is needed); run scripts/test or set STEWARD_KUBECTL \
             (eval \"$(scripts/kube-tools.sh)\")",
            self.bin.display(),
            cv["gitVersion"]
        );
        cv["gitVersion"].as_str().unwrap_or("?").to_owned()
    }

    /// kubectl's minor version, from its `gitVersion` (`v1.<minor>.<patch>`).
    pub fn minor(&self) -> u32 {
        self.version
            .split('.')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap_or(0)
    }

    /// kubectl's `gitVersion`, e.g. `v1.37.1`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The private directory (kubeconfig, HOME, files written by [`Kubectl::write`]).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The kubeconfig file kubectl uses.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    pub fn write(&self, name: &str, v: &Value) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
        p
    }
}
