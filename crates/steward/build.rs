//! Records the git commit the binary is built from, for `steward version`.
//!
//! `STEWARD_GIT_COMMIT` in the build's environment wins (a packager building
//! from a tarball can name the commit); otherwise `git rev-parse HEAD`.
//! Without git, or outside a work tree, the commit is unknown: the build
//! never fails for it.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=STEWARD_GIT_COMMIT");
    let commit = match std::env::var("STEWARD_GIT_COMMIT") {
        Ok(c) => c.trim().to_owned(),
        Err(_) => {
            // Rebuild when HEAD moves: HEAD itself (a checkout), the branch
            // it points to (a commit) and packed-refs (after a gc).
            for args in [
                &["rev-parse", "--git-path", "HEAD"][..],
                &["rev-parse", "--git-path", "packed-refs"][..],
            ] {
                if let Some(p) = git(args).map(PathBuf::from).filter(|p| p.exists()) {
                    println!("cargo:rerun-if-changed={}", p.display());
                }
            }
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
                && let Some(p) = git(&["rev-parse", "--git-path", &branch])
                    .map(PathBuf::from)
                    .filter(|p| p.exists())
            {
                println!("cargo:rerun-if-changed={}", p.display());
            }
            git(&["rev-parse", "--short=12", "HEAD"])
                .filter(|c| c.chars().all(|ch| ch.is_ascii_hexdigit()))
                .unwrap_or_default()
        }
    };
    println!("cargo:rustc-env=STEWARD_GIT_COMMIT={commit}");
}
