//! The agent's pod resources server: one view of every device, CPU and
//! memory assignment on the node, served as kubelet's podresources v1 API
//! plus the KEP's watch (`steward-podresources`).
//!
//! Its sources: this agent's device-plugin slots (published by
//! `deviceplugin::view`), the CRI resource manager's assignments (followed
//! over the proxy's own pod resources socket, when configured), and
//! kubelet's report (its pod resources socket, polled; kubelet's `List`
//! names pods without UIDs, so they are resolved through the store of the
//! agent's shared watch of this node's pods, whose deletions also drop a
//! pod from the view at once).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use steward_core::ledger::Source;
use steward_kube::{Change, ObjectKey, SharedWatch};
use steward_podresources::follow::{Resolver, follow_list, follow_watch};
use steward_podresources::{Hub, PodResourcesMetrics, WatchLimits};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::AgentError;

/// How the agent serves pod resources.
#[derive(Debug, Clone)]
pub struct PodResourcesConfig {
    /// The socket to serve on.
    pub socket: PathBuf,
    /// Its permission bits (0660 lets a monitoring agent of `group` in).
    pub mode: u32,
    /// The socket file's group, if any.
    pub group: Option<u32>,
    /// The CRI resource manager's pod resources socket to follow.
    pub cri_socket: Option<PathBuf>,
    /// kubelet's pod resources socket to poll (Kubernetes mode).
    pub kubelet_socket: Option<PathBuf>,
    /// How often kubelet's `List` is read.
    pub kubelet_poll: Duration,
    pub limits: WatchLimits,
    /// Calls per second admitted (`<= 0`: no limit) and the burst; kubelet's
    /// defaults are 100 and 10.
    pub qps: f64,
    pub burst: u32,
    pub metrics: PodResourcesMetrics,
}

impl PodResourcesConfig {
    /// kubelet's defaults for the limits, owner-only socket.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            mode: 0o600,
            group: None,
            cri_socket: None,
            kubelet_socket: None,
            kubelet_poll: Duration::from_secs(10),
            limits: WatchLimits::default(),
            qps: steward_podresources::limiter::DEFAULT_QPS,
            burst: steward_podresources::limiter::DEFAULT_BURST,
            metrics: PodResourcesMetrics::default(),
        }
    }
}

/// The running server: its hub (for the device plugins to publish to), its
/// tasks and its socket.
pub(crate) struct Running {
    pub hub: Arc<Hub>,
    pub tasks: Vec<JoinHandle<()>>,
    pub _socket: steward_nodeio::SocketGuard,
}

/// Binds the socket and starts serving and following; `pods` is the
/// agent's shared watch of this node's pods (Kubernetes mode).
pub(crate) fn start(
    cfg: &PodResourcesConfig,
    pods: Option<SharedWatch<Pod>>,
    stop: &CancellationToken,
) -> Result<Running, AgentError> {
    let hub = Hub::new(cfg.limits, cfg.metrics.clone());
    let mut opts = steward_nodeio::BindOptions::mode(cfg.mode);
    if let Some(gid) = cfg.group {
        opts = opts.with_group(gid);
    }
    let (listener, guard) =
        steward_nodeio::bind(&cfg.socket, opts).map_err(|source| AgentError::PodResources {
            path: cfg.socket.clone(),
            source,
        })?;
    tracing::info!(socket = %cfg.socket.display(), "serving pod resources");
    let mut tasks = Vec::new();
    let options = steward_podresources::serve::ServeOptions {
        qps: cfg.qps,
        burst: cfg.burst,
    };
    {
        let (hub, stop) = (hub.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = steward_podresources::serve::serve(hub, listener, options, stop).await {
                tracing::error!(error = %e, "the pod resources server stopped");
            }
        }));
    }
    if let Some(cri) = &cfg.cri_socket {
        tasks.push(tokio::spawn(follow_watch(
            hub.clone(),
            Source::Cri,
            cri.clone(),
            stop.clone(),
        )));
    }
    if let (Some(pods), Some(kubelet)) = (pods, &cfg.kubelet_socket) {
        // This node's pods: a deletion drops the pod from the view at once;
        // one missing from a relist waits for kubelet's list.
        {
            let (hub, mut changes) = (hub.clone(), pods.subscribe());
            tasks.push(tokio::spawn(async move {
                while let Some(change) = changes.next().await {
                    if let Change::Deleted(pod) = change
                        && let Some(uid) = pod.uid()
                    {
                        hub.pod_gone(&uid);
                    }
                }
            }));
        }
        // Their UIDs by namespace and name, from the watch's store.
        let pods = pods.reader();
        let resolve: Resolver = Arc::new(move |ns: &str, name: &str| {
            pods.get(&ObjectKey::new(ns, name)).and_then(|p| p.uid())
        });
        tasks.push(tokio::spawn(follow_list(
            hub.clone(),
            Source::Kubelet,
            kubelet.clone(),
            cfg.kubelet_poll,
            resolve,
            stop.clone(),
        )));
    }
    Ok(Running {
        hub,
        tasks,
        _socket: guard,
    })
}
