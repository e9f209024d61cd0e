//! The Helm chart rendered with a real helm 4, for the tests that apply or
//! inspect it. Test support: a helm that cannot be run, or a render that
//! fails, panics with what helm printed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// Release name the tests render.
pub const RELEASE: &str = "t";
/// Namespace the tests render into.
pub const NAMESPACE: &str = "steward-system";

/// helm 4: `STEWARD_HELM` (set by scripts/test, which installs it) or `helm`.
pub fn helm() -> PathBuf {
    std::env::var_os("STEWARD_HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("helm"))
}

/// `deploy/helm/steward`.
pub fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/steward")
}

/// `helm template` of the chart into [`NAMESPACE`] with `sets` (and the
/// CRDs when `include_crds`): the text.
pub fn template(sets: &[&str], include_crds: bool) -> String {
    let mut cmd = Command::new(helm());
    cmd.args(["template", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE]);
    if include_crds {
        cmd.arg("--include-crds");
    }
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "running {}: {e}; run scripts/test (it installs helm 4) or set STEWARD_HELM",
            helm().display()
        )
    });
    assert!(
        out.status.success(),
        "helm template {sets:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The YAML documents of a rendered manifest.
pub fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}
