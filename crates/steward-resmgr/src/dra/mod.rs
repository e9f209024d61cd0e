//! The node's CPUs as a DRA driver of their own, `cpu.steward.dev`
//! ([`CPU_DRIVER`]): the transport half. What a claim's CPUs are and how
//! they are kept apart from the policies' is the manager's
//! (`crate::manager`'s `cpu_claims`, `steward_core::cpu::devices`); this
//! module only speaks to the API server and to kubelet.
//!
//! * [`slices`]: the CPUs [`ResourceManager::cpu_devices`] names, as this
//!   node's ResourceSlices (pool = the node), written again after every
//!   cache save that changed them.
//! * [`claim`]: reading an allocated ResourceClaim at prepare (its CPUs of
//!   this node, the pods it is reserved for).
//! * [`cdi`]: the CDI spec per prepared claim (`cpu.steward.dev/claim=<uid>`,
//!   the claim named in the container's environment).
//! * [`plugin`]: `v1.DRAPlugin` (NodePrepareResources /
//!   NodeUnprepareResources), served on kubelet's plugin sockets by the
//!   shared skeleton ([`steward_nodeio::kubelet_plugin`]).
//! * [`gc`]: the safety net under unprepare (claims gone from the API are
//!   unprepared).
//!
//! [`start`] spawns them; `steward nri-plugin --dra-cpus` does.

pub mod cdi;
pub mod claim;
pub mod gc;
pub mod plugin;
pub mod slices;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use steward_core::cpu::devices::CPU_DRIVER;
use steward_nodeio::Readiness;
use steward_nodeio::kubelet_plugin::{self, KubeletPlugin};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::manager::ResourceManager;

/// The readiness condition: the CPU driver registered with kubelet.
pub const READINESS: &str = "dra-cpus";
/// `PluginInfo.supported_versions`: only `v1.DRAPlugin` is served.
pub const SUPPORTED_SERVICES: [&str; 1] = [steward_proto::dra::v1::SERVICE_VERSION];
/// Where CDI spec files go unless told otherwise.
pub const CDI_DIR_DEFAULT: &str = "/var/run/cdi";

/// Everything the CPU driver needs.
#[derive(Clone)]
pub struct DraCpuConfig {
    /// The API server (ResourceSlices written, ResourceClaims read).
    pub client: kube::Client,
    /// This node's name: the pool and `nodeName` of its slices.
    pub node: String,
    /// The kubelet plugin's sockets (driver [`CPU_DRIVER`]).
    pub plugin: KubeletPlugin,
    /// Where the claims' CDI spec files are written.
    pub cdi_dir: PathBuf,
    /// Bound on each API read of a prepare or a sweep.
    pub op_timeout: Duration,
    /// How often prepared claims are read back ([`gc`]).
    pub gc_interval: Duration,
    /// How long a failed slice write waits before the next try.
    pub retry: Duration,
    /// Readiness (the condition [`READINESS`]).
    pub readiness: Readiness,
}

impl std::fmt::Debug for DraCpuConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraCpuConfig")
            .field("node", &self.node)
            .field("plugin", &self.plugin)
            .field("cdi_dir", &self.cdi_dir)
            .finish_non_exhaustive()
    }
}

impl DraCpuConfig {
    /// Defaults for `node` under a kubelet rooted at `kubelet_root`.
    pub fn new(
        client: kube::Client,
        node: String,
        kubelet_root: &Path,
        cdi_dir: PathBuf,
        readiness: Readiness,
    ) -> Self {
        Self {
            client,
            node,
            plugin: KubeletPlugin::new(kubelet_root, CPU_DRIVER, &SUPPORTED_SERVICES, READINESS),
            cdi_dir,
            op_timeout: Duration::from_secs(5),
            gc_interval: Duration::from_secs(60),
            retry: Duration::from_secs(1),
            readiness,
        }
    }
}

/// Spawns the driver's tasks: the slice publisher (woken by `saves`, a
/// counter bumped after every cache save), the kubelet plugin and the
/// safety net. They end when `stop` is cancelled or they are aborted.
pub fn start(
    manager: Arc<ResourceManager>,
    cfg: DraCpuConfig,
    saves: watch::Receiver<u64>,
    stop: CancellationToken,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(slices::publish(
        manager.clone(),
        cfg.client.clone(),
        cfg.node.clone(),
        cfg.retry,
        saves,
        stop.clone(),
    )));
    tasks.push(tokio::spawn(gc::collect(
        Arc::downgrade(&manager),
        cfg.client.clone(),
        cfg.node.clone(),
        cfg.cdi_dir.clone(),
        cfg.gc_interval,
        cfg.op_timeout,
    )));
    let service = plugin::CpuPlugin::new(
        Arc::downgrade(&manager),
        cfg.client.clone(),
        cfg.node.clone(),
        cfg.cdi_dir.clone(),
        cfg.op_timeout,
    );
    let serve = kubelet_plugin::serve(
        cfg.plugin.clone(),
        move || service.routes(),
        cfg.readiness.clone(),
    );
    tasks.push(tokio::spawn(async move {
        tokio::select! {
            () = serve => {}
            () = stop.cancelled() => {}
        }
    }));
    tasks
}
