//! docs/TROUBLESHOOTING.md quotes the messages steward emits: each quoted
//! line (`> …`) must still exist in the code or the chart, `…` standing for
//! the variable parts. A reworded error fails here until the page follows.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `crates/*/src` and every file of the chart's
/// templates, concatenated.
fn corpus() -> String {
    fn walk(dir: &Path, out: &mut String, keep: &dyn Fn(&Path) -> bool) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out, keep);
            } else if keep(&p) {
                out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
                out.push('\n');
            }
        }
    }
    let mut out = String::new();
    for krate in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        walk(&krate.path().join("src"), &mut out, &|p| {
            p.extension().is_some_and(|e| e == "rs")
        });
    }
    walk(
        &root().join("deploy/helm/steward/templates"),
        &mut out,
        &|_| true,
    );
    out
}

#[test]
fn every_quoted_message_exists_in_the_code() {
    let page = std::fs::read_to_string(root().join("docs/TROUBLESHOOTING.md")).unwrap();
    let code = corpus();
    let quoted: Vec<&str> = page.lines().filter_map(|l| l.strip_prefix("> ")).collect();
    assert!(quoted.len() >= 15, "only {} messages quoted", quoted.len());
    let mut missing = Vec::new();
    for message in &quoted {
        for piece in message.split('…').map(str::trim).filter(|p| !p.is_empty()) {
            if !code.contains(piece) {
                missing.push(format!("{piece:?} (from {message:?})"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "quoted in docs/TROUBLESHOOTING.md but not found in the code:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_reworded_message_would_be_caught() {
    let code = corpus();
    assert!(!code.contains("this sentence is in no error of steward"));
    assert!(code.contains("is held by node"));
}
