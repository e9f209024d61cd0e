//! Every test binary that creates pods in the shared containerd runs in
//! nextest's `containerd` group (one at a time): a CRI proxy adopts every
//! container of its runtime, so a concurrent test's pod changes its
//! decisions. A new binary left out of the group fails here, not as a
//! flaky test elsewhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn package_name(dir: &Path) -> String {
    let toml = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    toml.lines()
        .find_map(|l| l.trim().strip_prefix("name = "))
        .map(|n| n.trim_matches('"').to_owned())
        .unwrap()
}

#[test]
fn containerd_tests_are_grouped() {
    let config = std::fs::read_to_string(root().join(".config/nextest.toml")).unwrap();
    let filter = config
        .split("[[profile.default.overrides]]")
        .find(|block| block.contains("test-group = 'containerd'"))
        .and_then(|block| {
            block
                .lines()
                .find_map(|l| l.trim().strip_prefix("filter = "))
        })
        .expect("the containerd group's filter")
        .to_owned();
    let mut checked = 0;
    for top in ["crates", "test-support"] {
        for krate in std::fs::read_dir(root().join(top)).unwrap() {
            let dir = krate.unwrap().path();
            let Ok(tests) = std::fs::read_dir(dir.join("tests")) else {
                continue;
            };
            let package = package_name(&dir);
            for t in tests {
                let path = t.unwrap().path();
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                if !text.contains("Containerd::") {
                    continue;
                }
                checked += 1;
                let stem = path.file_stem().unwrap().to_string_lossy().to_string();
                let whole_package = filter
                    .match_indices(&format!("package({package})"))
                    .any(|(i, m)| !filter[i + m.len()..].trim_start().starts_with('&'));
                assert!(
                    whole_package || filter.contains(&format!("binary({stem})")),
                    "{} uses the shared containerd but its binary is not in the containerd group: {filter}",
                    path.display()
                );
            }
        }
    }
    assert!(checked >= 10, "only {checked} containerd test files found");
}
