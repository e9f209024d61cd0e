//! `steward cri-proxy`: the CRI resource manager between kubelet and the runtime.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use steward_resmgr::{Metrics, ProxyConfig};

#[derive(Debug, clap::Args)]
pub struct CriProxyArgs {
    /// Socket the proxy serves CRI on (point kubelet's --container-runtime-endpoint here).
    #[arg(long, default_value = "/var/run/steward/cri.sock")]
    listen: PathBuf,
    /// The runtime's CRI socket.
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    runtime: PathBuf,
    /// Directory of the proxy's state cache.
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
    metrics_address: Option<std::net::SocketAddr>,
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
    /// over the CPUs and memory this proxy assigns, on this socket (mode 0660).
    /// The agent follows it (its --cri-pod-resources-socket) to show the whole node.
    #[arg(long)]
    pod_resources_socket: Option<PathBuf>,
    /// Serve the CRI socket through the `:authority` fix (`--authority-fix=true`),
    /// for CRI clients built on gRPC C-core (Python grpcio, C++), which send the
    /// socket path as `:authority` and are otherwise reset. kubelet, crictl and
    /// containerd's tools (grpc-go) do not need it.
    #[arg(long, default_value_t = steward_resmgr::AUTHORITY_FIX_DEFAULT, action = clap::ArgAction::Set)]
    authority_fix: bool,
}

pub async fn run(args: CriProxyArgs) -> anyhow::Result<()> {
    let mut cfg = ProxyConfig::new(args.listen, args.runtime, args.state_dir);
    cfg.config_file = args.config;
    cfg.allow_policy_switch = args.allow_policy_switch;
    cfg.sysfs_root = args.sysfs_root;
    cfg.cgroup_root = args.cgroup_root;
    cfg.verify_interval = args.verify_interval;
    cfg.pod_resources_socket = args.pod_resources_socket;
    cfg.authority_fix = args.authority_fix;
    if let (true, Some(node)) = (args.cluster, args.node_name) {
        let client = kube::Client::try_default()
            .await
            .context("connecting to the Kubernetes API for --cluster")?;
        let mut cluster = steward_resmgr::ClusterConfig::new(client, node);
        cluster.namespace = args.config_namespace;
        cfg.cluster = Some(cluster);
    }
    let mut registry = prometheus_client::registry::Registry::default();
    cfg.metrics = Metrics::register(&mut registry);
    cfg.pod_resources_metrics.register(&mut registry);
    let readiness = steward_nodeio::Readiness::new();
    readiness.not_ready(
        "cri-proxy",
        "starting: reaching the runtime and re-syncing the cache",
    );
    if let Some(addr) = args.metrics_address {
        crate::metrics::serve(addr, registry, readiness.clone()).await?;
    }
    let proxy = steward_resmgr::Proxy::start(cfg)
        .await
        .context("CRI proxy failed")?;
    readiness.ready("cri-proxy");
    crate::shutdown_signal().await;
    proxy.shutdown().await;
    Ok(())
}
