//! `steward agent` and `steward instances`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use steward_agent::deviceplugin::DevicePluginConfig;
use steward_agent::{AgentConfig, AgentMetrics, Mode};

pub const DEFAULT_REGISTRATION_SOCKET: &str = "/var/lib/steward/registration.sock";
const DEFAULT_STATE_DIR: &str = "/var/lib/steward";

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// Run with no API server: Configurations from a file, Instances in the embedded store.
    #[arg(long, requires = "configurations")]
    standalone: bool,
    /// Multi-document YAML of Configurations (standalone mode; reloaded when it changes).
    #[arg(long)]
    configurations: Option<PathBuf>,
    /// This node's name (the Kubernetes Node name).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Directory of the node's embedded store.
    #[arg(long, env = "STEWARD_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Unix socket discovery handlers register on.
    #[arg(long, env = "STEWARD_REGISTRATION_SOCKET", default_value = DEFAULT_REGISTRATION_SOCKET)]
    registration_socket: PathBuf,
    /// Built-in handlers run inside the agent (comma separated; empty for none).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "debug-echo,udev,tcp-probe"
    )]
    embedded: Vec<String>,
    /// How long an Offline discovery handler is kept before it is removed.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    offline_grace: Duration,
    /// Address of the Prometheus metrics endpoint (`/metrics`), liveness (`/healthz`) and readiness (`/readyz`).
    #[arg(long)]
    metrics_address: Option<std::net::SocketAddr>,
    /// Do not serve this node's Instances as kubelet device plugins (Kubernetes mode).
    #[arg(long)]
    no_device_plugins: bool,
    /// kubelet's root directory (device-plugins/ and pod-resources/ are under it).
    #[arg(long, env = "STEWARD_KUBELET_DIR", default_value = "/var/lib/kubelet")]
    kubelet_dir: PathBuf,
    /// Where CDI spec files for Instances are written (empty: no CDI).
    #[arg(long, default_value = "/var/run/cdi", value_parser = path_or_empty)]
    cdi_dir: PathBuf,
    /// Host path prefixes device nodes given to containers (device plugin
    /// answers, CDI specs) must resolve under, on this node, whatever the
    /// Instance says (comma separated, matched on whole path components).
    #[arg(long, value_delimiter = ',', default_value = "/dev/")]
    allowed_device_paths: Vec<String>,
    /// Host path prefixes mounts given to containers must resolve under
    /// (comma separated; empty, the default: no host mounts at all).
    #[arg(long, value_delimiter = ',', default_value = "")]
    allowed_mount_paths: Vec<String>,
    /// Hand block devices (disks) to containers when their path is allowed.
    #[arg(long)]
    allow_block_devices: bool,
    /// Where the agent sees the host's `/` (host paths are resolved there,
    /// symlinks included), e.g. /host with the host's /dev mounted at /host/dev.
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// How long a claimed slot may wait for its pod to appear before it is released.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    slot_pending_timeout: Duration,
    /// Serve the node's pod resources (kubelet's podresources v1 API plus the
    /// watch, over every device, CPU and memory assignment) on this socket,
    /// e.g. /var/lib/kubelet/pod-resources/steward.sock. Off when not given.
    #[arg(long)]
    pod_resources_socket: Option<PathBuf>,
    /// Give the pod resources socket to this group id and mode 0660 (a
    /// monitoring agent in that group may connect); default: owner only.
    #[arg(long, requires = "pod_resources_socket")]
    pod_resources_group: Option<u32>,
    /// The CRI proxy's pod resources socket (its --pod-resources-socket), followed
    /// so the CPUs and memory it assigns are in this agent's view.
    #[arg(long, requires = "pod_resources_socket")]
    cri_pod_resources_socket: Option<PathBuf>,
    /// How often kubelet's own pod resources are read into the view (Kubernetes mode).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    kubelet_pod_resources_poll: Duration,
    /// A network (CIDR, e.g. 10.244.0.0/16) that NETWORK discovery handler
    /// endpoints may point into; repeat for several. Without it, external
    /// handlers must register unix sockets.
    #[arg(long = "network-handler-cidr", value_name = "CIDR")]
    network_handler_cidrs: Vec<steward_discovery::policy::Cidr>,
    /// Addresses in refused ranges such as loopback and link-local that the
    /// tcp-probe handler may probe on this node (CIDR, e.g. 127.0.0.1/32;
    /// repeat for several). Default: none, whatever a Configuration names.
    #[arg(long = "tcp-probe-allow-cidr", value_name = "CIDR")]
    tcp_probe_allow_cidrs: Vec<steward_discovery::policy::Cidr>,
    /// Also serve the devices through Dynamic Resource Allocation as the
    /// driver steward.dev: publish them as resource.k8s.io/v1 ResourceSlices
    /// (one device per slot) and serve the DRA kubelet plugin
    /// (<kubelet-dir>/plugins_registry/steward.dev-reg.sock,
    /// <kubelet-dir>/plugins/steward.dev/dra.sock) on the device plugins'
    /// slot ledger. Needs CDI (--cdi-dir) and the device plugins.
    #[arg(long, conflicts_with_all = ["standalone", "no_device_plugins"])]
    dra: bool,
    /// With --dra: publish an Instance of two or more slots as one device
    /// with consumable capacity (allowMultipleAllocations, its free slots
    /// as capacity "slots") instead of one device per slot. Needs
    /// DRAConsumableCapacity (on by default from Kubernetes 1.36); where
    /// the API server drops it, one device per slot is published and one
    /// warning says so.
    #[arg(long, requires = "dra")]
    dra_consumable_capacity: bool,
    /// Who removes a deleted Node from the Instances: `agent` (every agent
    /// follows every Node, each receiving every Node's every change) or
    /// `controller` (the leader of `steward controller` does, with one
    /// watch; give it where the controller runs).
    #[arg(long, value_enum, default_value_t = DeletedNodes::Agent, conflicts_with = "standalone")]
    deleted_nodes: DeletedNodes,
    /// Follow only the Instances, SlotClaims and Reservations labeled with
    /// this node (steward.dev/n-<hash of the node name>), instead of every
    /// one in the cluster, so that each change reaches only the nodes that
    /// see its Instance. Needs `steward controller`, whose leader keeps the
    /// labels (on objects written before them too).
    #[arg(long, conflicts_with = "standalone")]
    select_by_node_labels: bool,
    /// The UID of the pod this agent runs in (the downward API's
    /// metadata.uid), for a DaemonSet that rolls with maxSurge: the DRA
    /// kubelet plugin's sockets are named after it, so the old and the new
    /// agent are registered with kubelet side by side, and the new agent
    /// relays calls to the old one until the old one stops and frees the
    /// node's store (kubelet 1.33+).
    #[arg(long, env = "POD_UID")]
    pod_uid: Option<String>,
    /// How long the agent waits for the node's store while another agent
    /// holds it (default: 60s; 10m with --pod-uid, where the agent before
    /// this one stops only once this one is ready).
    #[arg(long, value_parser = parse_duration)]
    store_wait: Option<Duration>,
}

/// Who removes a deleted Node from the Instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeletedNodes {
    /// Every agent follows the Nodes.
    Agent,
    /// The controller's leader does; the agents do not follow the Nodes.
    Controller,
}

#[derive(Debug, clap::Args)]
pub struct InstancesArgs {
    /// The standalone agent's state directory.
    #[arg(long, env = "STEWARD_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
}

pub fn parse_duration(s: &str) -> Result<Duration, steward_discovery::duration::DurationError> {
    steward_discovery::duration::parse_duration(s)
}

/// A path where the empty string is meaningful (clap's own path parser
/// refuses it).
fn path_or_empty(s: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(s))
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let host_paths = steward_agent::host_paths::HostPathPolicy::new(
        &args.host_root,
        &args.allowed_device_paths,
        &args.allowed_mount_paths,
        args.allow_block_devices,
    )
    .context("--allowed-device-paths / --allowed-mount-paths")?;
    tracing::info!(policy = ?host_paths, "host path policy");
    let device_plugins = (!args.standalone && !args.no_device_plugins).then(|| {
        let cdi = (!args.cdi_dir.as_os_str().is_empty()).then(|| args.cdi_dir.clone());
        let mut dp = DevicePluginConfig::new(&args.kubelet_dir, cdi);
        dp.slots.pending_timeout_ms =
            u64::try_from(args.slot_pending_timeout.as_millis()).unwrap_or(u64::MAX);
        dp
    });
    if args.dra && args.cdi_dir.as_os_str().is_empty() {
        anyhow::bail!(
            "--dra needs CDI: a DRA device reaches its container as a CDI device (set --cdi-dir)"
        );
    }
    let mode = if args.standalone {
        let file = args
            .configurations
            .context("--standalone needs --configurations FILE")?;
        Mode::Standalone {
            configurations_file: file,
        }
    } else {
        let client = steward_kube::client::connect("agent", Some(&args.node_name))
            .await
            .context("connecting to the Kubernetes API (use --standalone to run without one)")?;
        Mode::Kubernetes(client)
    };
    let mut cfg = AgentConfig::new(
        args.node_name,
        args.state_dir,
        args.registration_socket,
        mode,
    );
    let names: Vec<&str> = args
        .embedded
        .iter()
        .map(String::as_str)
        .filter(|n| !n.is_empty())
        .collect();
    let handler_options = steward_discovery::handlers::HandlerOptions {
        tcp_probe: steward_discovery::handlers::network::ProbeScope::new(
            args.tcp_probe_allow_cidrs,
        ),
    };
    if !handler_options.tcp_probe.allowed().is_empty() {
        tracing::info!(allowed = ?handler_options.tcp_probe.allowed(), "tcp-probe may probe these node-local addresses");
    }
    cfg.embedded_handlers = steward_agent::embedded_handlers(&names, &handler_options)?;
    cfg.network_handler_cidrs = args.network_handler_cidrs;
    cfg.host_paths = host_paths;
    cfg.device_plugins = device_plugins;
    cfg.dra_slices = args.dra;
    cfg.follow_node_deletions = args.deleted_nodes == DeletedNodes::Agent;
    cfg.select_by_node_labels = args.select_by_node_labels;
    if args.dra_consumable_capacity {
        cfg.dra_layout = steward_core::dra::Layout::Consumable;
    }
    let pod_uid = args.pod_uid.filter(|uid| !uid.is_empty());
    if args.dra {
        let mut dra = steward_agent::dra::DraPluginConfig::new(&args.kubelet_dir);
        dra.instance = pod_uid.clone();
        cfg.dra_plugin = Some(dra);
    }
    cfg.store_wait = match (args.store_wait, &pod_uid) {
        (Some(wait), _) => wait,
        (None, Some(_)) => Duration::from_secs(600),
        (None, None) => cfg.store_wait,
    };
    let mut registry = prometheus_client::registry::Registry::default();
    if let Some(socket) = args.pod_resources_socket {
        let mut pr = steward_agent::pod_resources::PodResourcesConfig::new(socket);
        if let Some(gid) = args.pod_resources_group {
            pr.group = Some(gid);
            pr.mode = 0o660;
        }
        pr.cri_socket = args.cri_pod_resources_socket;
        if !args.standalone {
            pr.kubelet_socket = Some(args.kubelet_dir.join("pod-resources").join("kubelet.sock"));
        }
        pr.kubelet_poll = args.kubelet_pod_resources_poll;
        pr.metrics.register(&mut registry);
        cfg.pod_resources = Some(pr);
    }
    cfg.registry.offline_grace_ms =
        u64::try_from(args.offline_grace.as_millis()).unwrap_or(u64::MAX);

    cfg.metrics = Some(AgentMetrics::register(&mut registry));
    if let Some(addr) = args.metrics_address {
        crate::metrics::serve(addr, registry, cfg.readiness.clone()).await?;
    }
    steward_agent::run(cfg, crate::shutdown_signal())
        .await
        .context("agent failed")
}

/// The running agent's Instances (its read API), or its store's when it
/// is stopped; see `steward get instances --state-dir` for tables as in a
/// cluster.
pub async fn print_instances(args: &InstancesArgs) -> anyhow::Result<()> {
    let (mut instances, _) =
        crate::cli::standalone_view::instances(&args.state_dir, Duration::from_secs(10)).await?;
    instances.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    println!(
        "{:<34} {:<16} {:<7} {:<20} {:<28} PROPERTIES",
        "NAME", "CONFIGURATION", "SHARED", "NODES", "DEVICE"
    );
    for inst in &instances {
        let name = inst.metadata.name.clone().unwrap_or_default();
        let props: Vec<String> = inst
            .spec
            .properties
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!(
            "{:<34} {:<16} {:<7} {:<20} {:<28} {}",
            name,
            inst.spec.configuration_name,
            inst.spec.shared,
            inst.spec.nodes.join(","),
            inst.spec.device_id,
            props.join(" ")
        );
    }
    println!("{} instance(s)", instances.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        agent: AgentArgs,
    }

    #[test]
    fn empty_cdi_dir_means_no_cdi() -> Result<(), clap::Error> {
        let off = Cli::try_parse_from(["agent", "--node-name", "n", "--cdi-dir", ""])?;
        assert!(off.agent.cdi_dir.as_os_str().is_empty());
        let default = Cli::try_parse_from(["agent", "--node-name", "n"])?;
        assert_eq!(default.agent.cdi_dir, PathBuf::from("/var/run/cdi"));
        Ok(())
    }

    /// Devices under /dev/ and no host mounts unless the operator says so.
    #[test]
    fn host_path_flags_default_to_dev_and_no_mounts() -> Result<(), clap::Error> {
        let default = Cli::try_parse_from(["agent", "--node-name", "n"])?;
        let policy = steward_agent::host_paths::HostPathPolicy::new(
            &default.agent.host_root,
            &default.agent.allowed_device_paths,
            &default.agent.allowed_mount_paths,
            default.agent.allow_block_devices,
        )
        .map_err(|e| clap::Error::raw(clap::error::ErrorKind::InvalidValue, e))?;
        assert_eq!(policy, steward_agent::host_paths::HostPathPolicy::default());
        // An agent configured without the flags (a test's) holds the same.
        let cfg = AgentConfig::new(
            "n",
            "state",
            "agent.sock",
            Mode::Standalone {
                configurations_file: PathBuf::from("configurations.yaml"),
            },
        );
        assert_eq!(cfg.host_paths, policy);
        let set = Cli::try_parse_from([
            "agent",
            "--node-name",
            "n",
            "--allowed-mount-paths",
            "/etc/steward/,/opt/x",
            "--allowed-device-paths",
            "/dev/bus/usb",
        ])?;
        assert_eq!(set.agent.allowed_mount_paths, ["/etc/steward/", "/opt/x"]);
        assert_eq!(set.agent.allowed_device_paths, ["/dev/bus/usb"]);
        Ok(())
    }

    #[test]
    fn dra_has_one_name() -> Result<(), clap::Error> {
        assert!(
            Cli::try_parse_from(["agent", "--node-name", "n", "--dra"])?
                .agent
                .dra
        );
        let other = Cli::try_parse_from(["agent", "--node-name", "n", "--dra-resource-slices"]);
        assert!(other.is_err(), "a second name for --dra was accepted");
        Ok(())
    }
}
