//! State shared between the public handle, the gRPC servers and the
//! per-plugin ListAndWatch tasks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::watch;
use tracing::{error, warn};

use crate::checkpoint;
use crate::error::Error;
use crate::manager::State;
use crate::pods::PodStatus;

/// File name of the device manager checkpoint inside the plugin directory.
pub const CHECKPOINT_FILE: &str = "kubelet_internal_checkpoint";
/// File (in the root dir) where the stand-in remembers its pods across a
/// process restart; a real kubelet re-learns them from the API server and the
/// container runtime instead.
pub const PODS_FILE: &str = "kubelet-standin-pods.json";

/// Well-known locations under the stand-in's root directory.
#[derive(Debug, Clone)]
pub struct Paths {
    pub root: PathBuf,
    pub plugin_dir: PathBuf,
    pub kubelet_socket: PathBuf,
    pub checkpoint: PathBuf,
    pub pod_resources_dir: PathBuf,
    pub pod_resources_socket: PathBuf,
    pub pods_file: PathBuf,
    /// `<root>/plugins_registry`: registration sockets of kubelet plugins
    /// (DRA drivers), found by the plugin watcher.
    pub plugins_registry: PathBuf,
    /// `<root>/plugins`: where plugins conventionally put their service
    /// sockets (`plugins/<driver>/dra.sock`).
    pub plugins_dir: PathBuf,
    /// `<root>/dra_manager_state`: the DRA manager's checkpoint.
    pub dra_checkpoint: PathBuf,
}

impl Paths {
    pub fn new(root: &Path) -> Self {
        let plugin_dir = root.join("device-plugins");
        let pod_resources_dir = root.join("pod-resources");
        Paths {
            root: root.to_path_buf(),
            kubelet_socket: plugin_dir.join(steward_proto::deviceplugin::v1beta1::KUBELET_SOCKET),
            checkpoint: plugin_dir.join(CHECKPOINT_FILE),
            plugin_dir,
            pod_resources_socket: pod_resources_dir.join("kubelet.sock"),
            pod_resources_dir,
            pods_file: root.join(PODS_FILE),
            plugins_registry: root.join("plugins_registry"),
            plugins_dir: root.join("plugins"),
            dra_checkpoint: root.join(crate::dra_state::DRA_CHECKPOINT_FILE),
        }
    }
}

pub(crate) struct Shared {
    pub paths: Paths,
    pub node_name: String,
    pub api: Option<kube::Client>,
    state: Mutex<State>,
    changes: watch::Sender<u64>,
    /// Kubelet admits one pod at a time.
    pub admission: tokio::sync::Mutex<()>,
    /// One DRA prepare/unprepare at a time (kubelet's claim info cache lock
    /// spans less, but its pod workers never race on one claim).
    pub dra_ops: tokio::sync::Mutex<()>,
}

impl Shared {
    pub fn new(paths: Paths, node_name: String, api: Option<kube::Client>, state: State) -> Self {
        let (changes, _) = watch::channel(0);
        Shared {
            paths,
            node_name,
            api,
            state: Mutex::new(state),
            changes,
            admission: tokio::sync::Mutex::new(()),
            dra_ops: tokio::sync::Mutex::new(()),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock only happens in a failing test; the
        // data is still the best we have.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes every waiter.
    pub fn notify(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Writes the device checkpoint from `state`.
    pub fn write_checkpoint(&self, state: &State) -> Result<(), Error> {
        checkpoint::write(&self.paths.checkpoint, &state.checkpoint_data())
    }

    /// Writes the checkpoint, logging instead of failing (for state changes
    /// that are not part of an admission).
    pub fn write_checkpoint_logged(&self, state: &State) {
        if let Err(e) = self.write_checkpoint(state) {
            error!(error = %e, "failed to write device manager checkpoint");
        }
    }

    /// Writes the DRA manager's checkpoint from `state`.
    pub fn write_dra_checkpoint(&self, state: &State) -> Result<(), Error> {
        crate::dra_state::write(&self.paths.dra_checkpoint, state.dra_claims.values())
    }

    pub fn write_pods(&self, state: &State) {
        let result = serde_json::to_vec_pretty(&state.pods)
            .map_err(|e| Error::io(&self.paths.pods_file, std::io::Error::other(e)))
            .and_then(|bytes| checkpoint::write_atomic(&self.paths.pods_file, &bytes));
        if let Err(e) = result {
            error!(error = %e, "failed to persist pod table");
        }
    }

    pub fn read_pods(path: &Path) -> BTreeMap<String, PodStatus> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                warn!(error = %e, "ignoring unreadable pod table");
                BTreeMap::new()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                warn!(error = %e, "ignoring unreadable pod table");
                BTreeMap::new()
            }
        }
    }
}
