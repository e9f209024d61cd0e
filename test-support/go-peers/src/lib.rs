//! Finds the Go peers built by `scripts/go-peers.sh`.
//!
//! A Go peer is a client or server whose wire bytes come from upstream Go
//! code: `encoding/json` with kube-scheduler's field names, grpc-go, the
//! types kubelet and the CRI generate. The test command builds them and sets
//! `STEWARD_GO_PEERS`; a test asks for one by name.

use std::path::PathBuf;

/// The environment variable naming the directory of built peers.
pub const PEERS_DIR_ENV: &str = "STEWARD_GO_PEERS";

/// The path of the Go peer `name`, or `None` (with a loud line on stderr)
/// when the peers were not built. Under CI (`CI` set) a missing peer is a
/// failure, never a skip.
pub fn binary(name: &str) -> Option<PathBuf> {
    let in_ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false");
    let found = std::env::var_os(PEERS_DIR_ENV)
        .map(|dir| PathBuf::from(dir).join(name))
        .filter(|path| path.is_file());
    match found {
        Some(path) => Some(path),
        None if in_ci => panic!(
            "Go peer {name} not found: {PEERS_DIR_ENV} must name the directory scripts/go-peers.sh builds"
        ),
        None => {
            eprintln!(
                "SKIPPED: Go peer {name} not built; run `eval \"$(scripts/go-peers.sh)\"` and export {PEERS_DIR_ENV}"
            );
            None
        }
    }
}
