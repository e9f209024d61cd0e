//! Test support: a private containerd with the CRI plugin, local images and
//! CRI client helpers.
//!
//! [`Containerd::from_env_or_start`] either attaches to a running containerd
//! (env [`SOCK_ENV`]) or starts one with `scripts/containerd.sh` in a
//! temporary directory and stops it again (processes, mounts, cgroups, CNI
//! bridge) when dropped. [`Containerd::shared`] does the same but hands out
//! one instance per test process, so tests running in parallel share it.
//!
//! Pods built with [`Containerd::pod_config`] live under the instance's own
//! cgroup parent, so cleanup never touches anybody else's cgroups.
//!
//! The images [`BUSYBOX_IMAGE`] and [`PAUSE_IMAGE`] are built locally by
//! `scripts/build-images.sh` and imported at start; no registry is needed.
//!
//! `scripts/test` runs the containerd-backed tests twice: once attached to
//! containerd 1.6, once to containerd 2.x ([`SOCK_ENV`] and friends point at
//! it). [`Containerd::runtime_version`] says which one a test talks to;
//! [`Containerd::cdi_spec_dir`] where a CDI-injecting runtime reads specs.
//! [`Containerd2`] is a private 2.x instance of a test's own (NRI tests);
//! [`wait_log`] waits for a line in a process's log file (an NRI plugin's).

mod containerd2;
mod logs;
mod pods;
mod version;

pub use containerd2::{BIN_ENV as CONTAINERD2_BIN_ENV, Containerd2, bin_dir, bin_dir_or_skip};
pub use logs::{count_in_log, wait_log};
pub use pods::{ContainerSpec, ExecOutput, cleanup_pod, exec_sync, run_pod_with_container};
pub use version::{RuntimeVersion, runtime_version};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use steward_proto::cri::runtime::v1 as cri;
use steward_proto::cri::runtime::v1::image_service_client::ImageServiceClient;
use steward_proto::cri::runtime::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;
use tracing::{debug, info, warn};

/// Workload image: static busybox with applet symlinks in `/bin`; its default
/// command sleeps until SIGTERM.
pub const BUSYBOX_IMAGE: &str = "steward.local/busybox:latest";
/// Sandbox image: sleeps forever, exits on SIGTERM.
pub const PAUSE_IMAGE: &str = "steward.local/pause:latest";
/// Use an already running containerd listening on this unix socket.
pub const SOCK_ENV: &str = "STEWARD_CONTAINERD_SOCK";
/// Cgroup parent for pods when attaching through [`SOCK_ENV`]
/// (default [`DEFAULT_EXTERNAL_CGROUP_PARENT`]).
pub const CGROUP_PARENT_ENV: &str = "STEWARD_CONTAINERD_CGROUP_PARENT";
/// The directory an attached containerd reads CDI specs from (set only for
/// a runtime that injects CDI devices itself, i.e. containerd 2.x).
pub const CDI_SPEC_DIR_ENV: &str = "STEWARD_CONTAINERD_CDI_SPEC_DIR";
/// Cgroup parent used with an external containerd when [`CGROUP_PARENT_ENV`]
/// is unset.
pub const DEFAULT_EXTERNAL_CGROUP_PARENT: &str = "/steward-test/external";
/// Kubernetes namespace written into pod metadata.
pub const POD_NAMESPACE: &str = "steward-test";
/// Label carrying the generated pod name.
pub const POD_LABEL: &str = "steward.test/pod";
/// Label naming the test process that created a pod (its pid): what
/// [`Containerd`]'s drop sweeps, so a test that panics leaves no pod behind
/// in a shared containerd for the next test to adopt.
pub const OWNER_LABEL: &str = "steward.test/owner";
/// Longest the sweep of a dropped [`Containerd`] may take.
const SWEEP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Errors of the harness.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// Running the control script failed before it could report.
    #[error("running {script}: {source}")]
    Spawn {
        /// Script path.
        script: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The control script exited unsuccessfully.
    #[error(
        "`{script} {action}` failed ({status}); is this root with containerd, runc, busybox-static and the CNI plugins installable?\n{stderr}"
    )]
    Script {
        /// Script path.
        script: PathBuf,
        /// `start` or `stop`.
        action: &'static str,
        /// Exit status.
        status: std::process::ExitStatus,
        /// Captured standard error.
        stderr: String,
    },
    /// The start script did not print an expected `KEY=value` line.
    #[error("containerd.sh start printed no {0} line")]
    MissingOutput(&'static str),
    /// The socket named by [`SOCK_ENV`] does not exist.
    #[error("{SOCK_ENV}={0} does not exist")]
    NoSocket(PathBuf),
    /// A temporary directory could not be created.
    #[error("creating a temporary directory: {0}")]
    TempDir(#[source] std::io::Error),
    /// A runtime for the pod sweep could not be built.
    #[error("building a runtime for the pod sweep: {0}")]
    Runtime(#[source] std::io::Error),
    /// The pod sweep did not finish in time.
    #[error("the pod sweep took longer than {0:?}")]
    SweepTimeout(std::time::Duration),
    /// The shared-instance lock was poisoned by a panicking test.
    #[error("shared containerd lock poisoned")]
    Poisoned,
    /// Connecting to the CRI socket failed.
    #[error("connecting to {path}: {source}")]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: tonic::transport::Error,
    },
    /// A CRI call failed.
    #[error("CRI {call}: {status}")]
    Cri {
        /// Name of the RPC.
        call: &'static str,
        /// Status returned by the runtime.
        #[source]
        status: Box<tonic::Status>,
    },
    /// A command run with ExecSync exited non-zero.
    #[error("exec {cmd:?} in {container_id} exited {exit_code}: {stderr}")]
    ExecFailed {
        /// Container the command ran in.
        container_id: String,
        /// The command.
        cmd: Vec<String>,
        /// Its exit code.
        exit_code: i32,
        /// Its standard error.
        stderr: String,
    },
}

impl HarnessError {
    fn cri(call: &'static str) -> impl FnOnce(tonic::Status) -> Self {
        move |status| HarnessError::Cri {
            call,
            status: Box::new(status),
        }
    }
}

/// A containerd instance with the CRI plugin.
#[derive(Debug)]
pub struct Containerd {
    sock: PathBuf,
    cgroup_parent: String,
    cdi_spec_dir: Option<PathBuf>,
    owned: Option<Owned>,
}

/// A containerd started by us; stopped and cleaned up on drop.
#[derive(Debug)]
struct Owned {
    script: PathBuf,
    state_dir: tempfile::TempDir,
    pid: Option<u32>,
}

impl Drop for Owned {
    fn drop(&mut self) {
        info!(pid = ?self.pid, "stopping private containerd");
        match Command::new(&self.script)
            .arg("stop")
            .arg(self.state_dir.path())
            .stdin(std::process::Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => debug!("containerd stopped"),
            Ok(out) => warn!(
                status = %out.status,
                stderr = %String::from_utf8_lossy(&out.stderr),
                "containerd.sh stop failed"
            ),
            Err(e) => warn!(error = %e, "running containerd.sh stop failed"),
        }
    }
}

/// Dropped (at a test's end, or while it unwinds from a panic): every pod
/// this process created in an attached containerd is stopped and removed.
/// A containerd we started is stopped as a whole instead.
impl Drop for Containerd {
    fn drop(&mut self) {
        if self.owned.is_none() {
            sweep_own_pods(&self.sock);
        }
    }
}

/// Removes the pods labelled with this process as [`OWNER_LABEL`], on a
/// thread of its own (the drop may run inside, or unwind out of, a tokio
/// runtime), bounded by [`SWEEP_TIMEOUT`].
fn sweep_own_pods(sock: &Path) {
    let sock = sock.to_path_buf();
    let owner = std::process::id().to_string();
    let sweeper = std::thread::spawn(move || -> Result<usize, HarnessError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(HarnessError::Runtime)?;
        rt.block_on(async {
            tokio::time::timeout(SWEEP_TIMEOUT, remove_pods_of(&sock, &owner))
                .await
                .map_err(|_| HarnessError::SweepTimeout(SWEEP_TIMEOUT))?
        })
    });
    match sweeper.join() {
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => warn!(pods = n, "removed pods a test left behind"),
        Ok(Err(e)) => warn!(error = %e, "could not remove this test's pods"),
        Err(_) => warn!("the pod sweep panicked"),
    }
}

/// Stops and removes every pod whose [`OWNER_LABEL`] is `owner`; returns
/// how many there were.
pub async fn remove_pods_of(sock: &Path, owner: &str) -> Result<usize, HarnessError> {
    let (mut runtime, _) = cri_client(sock).await?;
    let pods = own_pods(&mut runtime, owner).await?;
    for id in &pods {
        cleanup_pod(&mut runtime, id).await?;
    }
    Ok(pods.len())
}

/// Ids of the pod sandboxes whose [`OWNER_LABEL`] is `owner`.
pub async fn own_pods(
    runtime: &mut RuntimeServiceClient<Channel>,
    owner: &str,
) -> Result<Vec<String>, HarnessError> {
    Ok(runtime
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: HashMap::from([(OWNER_LABEL.to_owned(), owner.to_owned())]),
                ..Default::default()
            }),
        })
        .await
        .map_err(HarnessError::cri("ListPodSandbox"))?
        .into_inner()
        .items
        .into_iter()
        .map(|p| p.id)
        .collect())
}

static SHARED: Mutex<Weak<Containerd>> = Mutex::new(Weak::new());

impl Containerd {
    /// Attach to the containerd named by [`SOCK_ENV`], or start a private one
    /// (root only) that is stopped when the returned value is dropped.
    pub fn from_env_or_start() -> Result<Self, HarnessError> {
        if let Some(sock) = std::env::var_os(SOCK_ENV).filter(|s| !s.is_empty()) {
            let sock = PathBuf::from(sock);
            if !sock.exists() {
                return Err(HarnessError::NoSocket(sock));
            }
            let cgroup_parent = std::env::var(CGROUP_PARENT_ENV)
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| DEFAULT_EXTERNAL_CGROUP_PARENT.to_owned());
            let cdi_spec_dir = std::env::var_os(CDI_SPEC_DIR_ENV)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from);
            info!(sock = %sock.display(), %cgroup_parent, ?cdi_spec_dir, "using external containerd");
            return Ok(Self {
                sock,
                cgroup_parent,
                cdi_spec_dir,
                owned: None,
            });
        }
        Self::start()
    }

    /// Like [`Self::from_env_or_start`], but one instance per process: every
    /// caller gets the same containerd while any of them holds it.
    pub fn shared() -> Result<Arc<Self>, HarnessError> {
        let mut slot = SHARED.lock().map_err(|_| HarnessError::Poisoned)?;
        if let Some(existing) = slot.upgrade() {
            return Ok(existing);
        }
        let fresh = Arc::new(Self::from_env_or_start()?);
        *slot = Arc::downgrade(&fresh);
        Ok(fresh)
    }

    /// Attach to a running containerd (not stopped on drop; this process's
    /// pods in it are removed on drop).
    pub fn attach(sock: impl Into<PathBuf>, cgroup_parent: impl Into<String>) -> Self {
        Self {
            sock: sock.into(),
            cgroup_parent: cgroup_parent.into(),
            cdi_spec_dir: None,
            owned: None,
        }
    }

    /// Start a private containerd in a new temporary directory.
    pub fn start() -> Result<Self, HarnessError> {
        let script = scripts_dir().join("containerd.sh");
        let state_dir = tempfile::Builder::new()
            .prefix("steward-containerd-")
            .tempdir()
            .map_err(HarnessError::TempDir)?;
        info!(state_dir = %state_dir.path().display(), "starting private containerd");
        let out = Command::new(&script)
            .arg("start")
            .arg(state_dir.path())
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|source| HarnessError::Spawn {
                script: script.clone(),
                source,
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        // From here on, dropping `owned` runs `stop`, also on the error paths
        // below, so a half-started instance is still cleaned up.
        let owned = Owned {
            script: script.clone(),
            state_dir,
            pid: parse_var(&stdout, "CONTAINERD_PID").and_then(|p| p.parse().ok()),
        };
        if !out.status.success() {
            return Err(HarnessError::Script {
                script,
                action: "start",
                status: out.status,
                stderr,
            });
        }
        let sock = parse_var(&stdout, "CONTAINERD_SOCK")
            .map(PathBuf::from)
            .ok_or(HarnessError::MissingOutput("CONTAINERD_SOCK"))?;
        let cgroup_parent = parse_var(&stdout, "CONTAINERD_CGROUP_PARENT")
            .map(str::to_owned)
            .ok_or(HarnessError::MissingOutput("CONTAINERD_CGROUP_PARENT"))?;
        info!(sock = %sock.display(), %cgroup_parent, pid = ?owned.pid, "private containerd running");
        Ok(Self {
            sock,
            cgroup_parent,
            cdi_spec_dir: parse_var(&stdout, "CONTAINERD_CDI_SPEC_DIR").map(PathBuf::from),
            owned: Some(owned),
        })
    }

    /// The CRI (and containerd API) unix socket.
    pub fn sock(&self) -> &Path {
        &self.sock
    }

    /// The cgroup parent all pods of this instance go under, e.g.
    /// `/steward-test/1a2b3c4d`.
    pub fn cgroup_parent(&self) -> &str {
        &self.cgroup_parent
    }

    /// Where this runtime reads CDI specs from, if it injects CDI devices
    /// itself (containerd 2.x as `scripts/test` starts it); `None` for 1.6.
    pub fn cdi_spec_dir(&self) -> Option<&Path> {
        self.cdi_spec_dir.as_deref()
    }

    /// The runtime's name and version (CRI `Version`).
    pub async fn runtime_version(&self) -> Result<RuntimeVersion, HarnessError> {
        runtime_version(&self.sock).await
    }

    /// State directory of a containerd we started (None when attached).
    pub fn state_dir(&self) -> Option<&Path> {
        self.owned.as_ref().map(|o| o.state_dir.path())
    }

    /// PID of a containerd we started (None when attached).
    pub fn pid(&self) -> Option<u32> {
        self.owned.as_ref().and_then(|o| o.pid)
    }

    /// Connect CRI clients to this instance.
    pub async fn client(
        &self,
    ) -> Result<(RuntimeServiceClient<Channel>, ImageServiceClient<Channel>), HarnessError> {
        cri_client(&self.sock).await
    }

    /// A minimal, uniquely named pod sandbox config under this instance's
    /// cgroup parent.
    pub fn pod_config(&self, prefix: &str, network: PodNetwork) -> cri::PodSandboxConfig {
        pod_sandbox_config(&self.cgroup_parent, prefix, network)
    }
}

/// Directory holding `containerd.sh` and `build-images.sh`.
pub fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
}

fn parse_var<'a>(output: &'a str, key: &str) -> Option<&'a str> {
    output.lines().find_map(|line| {
        line.strip_prefix(key)
            .and_then(|rest| rest.strip_prefix('='))
            .map(str::trim)
    })
}

/// CRI runtime and image clients over a unix socket (one shared channel).
pub async fn cri_client(
    sock: impl AsRef<Path>,
) -> Result<(RuntimeServiceClient<Channel>, ImageServiceClient<Channel>), HarnessError> {
    let path = sock.as_ref().to_path_buf();
    let connect_err = |source| HarnessError::Connect {
        path: path.clone(),
        source,
    };
    let channel = steward_proto::uds::endpoint()
        .connect_with_connector(steward_proto::uds::UnixConnector::new(&path))
        .await
        .map_err(connect_err)?;
    Ok((
        RuntimeServiceClient::new(channel.clone()),
        ImageServiceClient::new(channel),
    ))
}

/// Network of a pod sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodNetwork {
    /// Share the node's network namespace; no CNI involved.
    Host,
    /// Own network namespace wired up by the runtime's CNI configuration.
    Pod,
}

/// A name unique within this machine for the lifetime of the process:
/// `prefix-<pid>-<counter>-<nanos>` (lower-case, DNS-label sized).
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let prefix: String = prefix
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(30)
        .collect();
    format!("{prefix}-{}-{n}-{nanos:x}", std::process::id())
}

fn namespace_options(network: PodNetwork) -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: match network {
            PodNetwork::Host => cri::NamespaceMode::Node,
            PodNetwork::Pod => cri::NamespaceMode::Pod,
        } as i32,
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        target_id: String::new(),
        userns_options: None,
    }
}

/// A minimal pod sandbox config: unique name and uid, the given network,
/// and cgroup parent `<cgroup_parent>/<name>`.
pub fn pod_sandbox_config(
    cgroup_parent: &str,
    prefix: &str,
    network: PodNetwork,
) -> cri::PodSandboxConfig {
    let name = unique_name(prefix);
    let parent = cgroup_parent.trim_end_matches('/');
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.clone(),
            uid: format!("uid-{name}"),
            namespace: POD_NAMESPACE.to_owned(),
            attempt: 0,
        }),
        // A hostname needs a private UTS namespace, which host-network pods
        // do not get.
        hostname: match network {
            PodNetwork::Host => String::new(),
            PodNetwork::Pod => name.chars().take(63).collect(),
        },
        labels: HashMap::from([
            (POD_LABEL.to_owned(), name.clone()),
            (OWNER_LABEL.to_owned(), std::process::id().to_string()),
        ]),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: format!("{parent}/{name}"),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(network)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Host path of a container's cgroup for a v1 `controller` (e.g. `memory`,
/// `cpuset`), given its pod's cgroup parent, as the runtime lays it out with
/// the cgroupfs driver: `/sys/fs/cgroup/<controller><parent>/<container_id>`.
pub fn host_cgroup_dir(controller: &str, pod_cgroup_parent: &str, container_id: &str) -> PathBuf {
    PathBuf::from(format!(
        "/sys/fs/cgroup/{controller}{}/{container_id}",
        pod_cgroup_parent.trim_end_matches('/')
    ))
}

#[cfg(test)]
mod tests;
