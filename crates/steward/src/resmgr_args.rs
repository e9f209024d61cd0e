//! The flags `steward cri-proxy` and `steward nri-plugin` share: the
//! resource manager's own (state, configuration, cgroupfs, read-back,
//! cluster, pod resources, metrics), flattened into both, and the start
//! both make from them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use steward_nodeio::Readiness;
use steward_resmgr::{ClusterConfig, ManagerConfig, Metrics};

#[derive(Debug, clap::Args)]
pub struct ManagerArgs {
    /// Directory of the resource manager's state cache.
    #[arg(long, default_value = "/var/lib/steward/resmgr")]
    state_dir: PathBuf,
    /// Configuration file (policy, CRI, block I/O, RDT); reloaded when it changes.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Let a changed `policy.active` in the configuration switch the running policy.
    #[arg(long)]
    allow_policy_switch: bool,
    /// sysfs root for topology discovery.
    #[arg(long, default_value = "/sys")]
    sysfs_root: PathBuf,
    /// cgroupfs root.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    cgroup_root: PathBuf,
    /// How often applied cpusets and memory limits are read back from cgroupfs (0s: never).
    #[arg(long, default_value = "30s", value_parser = crate::agent::parse_duration)]
    verify_interval: Duration,
    /// Address of the Prometheus metrics endpoint (`/metrics`), liveness (`/healthz`) and readiness (`/readyz`).
    #[arg(long)]
    metrics_address: Option<SocketAddr>,
    /// Take configuration from the cluster (ConfigMaps steward-resmgr.node.<node> >
    /// steward-resmgr.group.<group> > steward-resmgr.default) and publish the policy
    /// and topology on the Node; needs this node's name.
    #[arg(long, requires = "node_name")]
    cluster: bool,
    /// This node's name (the Kubernetes Node name), with --cluster.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Namespace of the configuration ConfigMaps, with --cluster.
    #[arg(long, default_value = "kube-system")]
    config_namespace: String,
    /// Serve the pod resources API (kubelet's podresources v1 plus the watch)
    /// over the CPUs and memory this resource manager assigns, on this socket
    /// (mode 0660). The agent follows it (its --cri-pod-resources-socket) to
    /// show the whole node.
    #[arg(long)]
    pod_resources_socket: Option<PathBuf>,
    /// kubelet's own pod resources socket, asked at start whether kubelet's
    /// CPU manager assigns CPUs itself (policy static): then this resource
    /// manager refuses to start, since the two would rewrite each other's
    /// cpusets. Not given, or kubelet not answering: not checked (a
    /// warning says so).
    #[arg(long)]
    kubelet_pod_resources_socket: Option<PathBuf>,
}

impl ManagerArgs {
    /// `--state-dir`.
    pub fn state_dir(&self) -> &std::path::Path {
        &self.state_dir
    }

    /// The resource manager's configuration (connected to the API server
    /// with `--cluster`), its metrics served at `--metrics-address`, and
    /// `component` not ready (`why`) until the caller says it is.
    pub async fn start(
        self,
        component: &'static str,
        why: &'static str,
    ) -> anyhow::Result<(ManagerConfig, Readiness)> {
        if let Some(socket) = &self.kubelet_pod_resources_socket {
            check_kubelet_cpus(socket).await?;
        }
        let mut cfg = ManagerConfig::new(self.state_dir);
        cfg.config_file = self.config;
        cfg.allow_policy_switch = self.allow_policy_switch;
        cfg.sysfs_root = self.sysfs_root;
        cfg.cgroup_root = self.cgroup_root;
        cfg.verify_interval = self.verify_interval;
        cfg.pod_resources_socket = self.pod_resources_socket;
        if let (true, Some(node)) = (self.cluster, self.node_name) {
            let client = steward_kube::client::connect("resmgr", Some(&node))
                .await
                .context("connecting to the Kubernetes API for --cluster")?;
            let mut cluster = ClusterConfig::new(client, node);
            cluster.namespace = self.config_namespace;
            cfg.cluster = Some(cluster);
        }
        let mut registry = prometheus_client::registry::Registry::default();
        cfg.metrics = Metrics::register(&mut registry);
        cfg.pod_resources_metrics.register(&mut registry);
        let readiness = Readiness::new();
        readiness.not_ready(component, why);
        if let Some(addr) = self.metrics_address {
            crate::metrics::serve(addr, registry, readiness.clone()).await?;
        }
        Ok((cfg, readiness))
    }
}

/// Refuses to run beside a kubelet whose CPU manager pins; a kubelet that
/// does not answer (not started yet, an older one) is a warning.
async fn check_kubelet_cpus(socket: &std::path::Path) -> anyhow::Result<()> {
    use steward_resmgr::kubelet_cpus;
    match kubelet_cpus::ask(socket, Duration::from_secs(10)).await {
        Ok(verdict) => {
            verdict.check(socket)?;
            tracing::info!(socket = %socket.display(), "kubelet's CPU manager assigns no CPU (policy none): the cpusets are this resource manager's");
        }
        Err(e) => {
            tracing::warn!(error = %e, "not checked whether kubelet's CPU manager assigns CPUs itself (it must be policy none)");
        }
    }
    Ok(())
}
