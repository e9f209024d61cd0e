//! `steward nri-plugin`: the CRI resource manager as an NRI plugin of the
//! container runtime (no kubelet reconfiguration, no hop on CRI calls).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use steward_resmgr::nri::{NriConfig, NriPlugin};
use steward_resmgr::{Metrics, ProxyConfig};

#[derive(Debug, clap::Args)]
pub struct NriPluginArgs {
    /// The runtime's NRI socket.
    #[arg(long, default_value = "/var/run/nri/nri.sock")]
    nri_socket: PathBuf,
    /// The plugin's index (two digits: the runtime calls plugins in index order).
    #[arg(long, default_value = "10")]
    nri_index: String,
    /// The plugin's name.
    #[arg(long, default_value = "steward")]
    nri_name: String,
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
    /// Serve the pod resources API over the CPUs and memory this plugin assigns, on this socket (mode 0660).
    #[arg(long)]
    pod_resources_socket: Option<PathBuf>,
}

pub async fn run(args: NriPluginArgs) -> anyhow::Result<()> {
    // No CRI socket is served or called: these two are placeholders.
    let mut cfg = ProxyConfig::new(
        PathBuf::from("/nonexistent"),
        args.nri_socket.clone(),
        args.state_dir,
    );
    cfg.config_file = args.config;
    cfg.allow_policy_switch = args.allow_policy_switch;
    cfg.sysfs_root = args.sysfs_root;
    cfg.cgroup_root = args.cgroup_root;
    cfg.verify_interval = args.verify_interval;
    cfg.pod_resources_socket = args.pod_resources_socket;
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
    readiness.not_ready("nri-plugin", "starting: registering with the runtime");
    if let Some(addr) = args.metrics_address {
        crate::metrics::serve(addr, registry, readiness.clone()).await?;
    }
    let mut nri = NriConfig::new(cfg);
    nri.socket = args.nri_socket;
    nri.index = args.nri_index;
    nri.name = args.nri_name;
    let plugin = NriPlugin::start(nri).await.context("NRI plugin failed")?;
    let registered = async {
        if plugin
            .registered(1, Duration::from_secs(u64::MAX / 4))
            .await
        {
            readiness.ready("nri-plugin");
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = crate::shutdown_signal() => {}
        () = registered => {}
    }
    plugin.shutdown().await;
    Ok(())
}
