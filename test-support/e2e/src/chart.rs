//! The Helm chart rendered with a real helm 4 (the helm shipped beside
//! kubectl 1.35 and the one beside 1.37), for the tests that apply or
//! inspect it. Test support: a helm that cannot be run, or a render that
//! fails, panics with what helm printed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use steward_testing_apiserver::kube_tools;

/// Release name the tests render.
pub const RELEASE: &str = "t";
/// Namespace the tests render into.
pub const NAMESPACE: &str = "steward-system";

/// The default helm 4: `STEWARD_HELM` (set by scripts/test, which installs
/// it) or `helm`.
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
/// CRDs when `include_crds`), rendered by the helm of every pair of
/// `steward_testing_apiserver::kube_tools` (the helm beside kubectl 1.35 and
/// beside 1.37): the first helm's text. Each helm must render the same
/// objects (the text around them, e.g. blank lines between documents,
/// differs between helm 4 releases).
pub fn template(sets: &[&str], include_crds: bool) -> String {
    let mut first: Option<(PathBuf, String)> = None;
    for tools in kube_tools::all() {
        let text = template_with(&tools.helm, sets, include_crds);
        match &first {
            None => first = Some((tools.helm, text)),
            Some((helm, want)) => {
                let (a, b) = (documents(want), documents(&text));
                if let Some((x, y)) = a.iter().zip(&b).find(|(x, y)| x != y) {
                    panic!(
                        "{} and {} render {sets:?} differently:\n{x}\nvs\n{y}",
                        helm.display(),
                        tools.helm.display()
                    );
                }
                assert_eq!(
                    a.len(),
                    b.len(),
                    "{} and {} render {sets:?} into different numbers of objects",
                    helm.display(),
                    tools.helm.display()
                );
            }
        }
    }
    first.map(|(_, t)| t).unwrap_or_default()
}

/// `helm template` of the chart with the helm binary `helm`.
pub fn template_with(helm: &Path, sets: &[&str], include_crds: bool) -> String {
    let mut cmd = command(helm, "template", sets);
    if include_crds {
        cmd.arg("--include-crds");
    }
    let out = output(helm, &mut cmd);
    assert!(
        out.status.success(),
        "{} template {sets:?} failed: {}",
        helm.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `helm ACTION` (`template`, of release [`RELEASE`], or `lint`) of the
/// chart into [`NAMESPACE`] with `sets`, by the helm binary `helm`: what it
/// printed and how it exited, whatever that was.
pub fn run(helm: &Path, action: &str, sets: &[&str]) -> Output {
    output(helm, &mut command(helm, action, sets))
}

/// `helm template` of the chart with `sets` by the helm binary `helm`,
/// which must refuse them: what helm printed on stderr (the reason).
pub fn refused(helm: &Path, sets: &[&str]) -> String {
    let out = run(helm, "template", sets);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "{} template {sets:?} was accepted",
        helm.display()
    );
    stderr
}

fn command(helm: &Path, action: &str, sets: &[&str]) -> Command {
    let mut cmd = Command::new(helm);
    cmd.arg(action);
    if action == "template" {
        cmd.arg(RELEASE);
    }
    cmd.arg(chart_dir()).args(["--namespace", NAMESPACE]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    cmd
}

fn output(helm: &Path, cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| {
        panic!(
            "running {}: {e}; run scripts/test (it installs helm 4) or set STEWARD_HELM_135 and STEWARD_HELM_137",
            helm.display()
        )
    })
}

/// The YAML documents of a rendered manifest.
pub fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}
