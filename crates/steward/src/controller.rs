//! `steward controller`: the reservation controller (run two replicas; one
//! leads on a Lease and is the only writer of decisions).

use std::time::Duration;

use anyhow::Context;
use steward_nodeio::Readiness;
use steward_reservations::ControllerConfig;
use tokio_util::sync::CancellationToken;

#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    /// Namespace of the leader-election Lease (the controller's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "steward-system")]
    lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "steward-controller")]
    lease_name: String,
    /// This replica's identity in the Lease (the pod name).
    #[arg(long, env = "POD_NAME")]
    identity: String,
    /// How long a Reserved reservation waits for its pod's claims before it
    /// is released.
    #[arg(long, default_value = "2m", value_parser = crate::agent::parse_duration)]
    reservation_ttl: Duration,
    /// Lease duration: how long a leader that stopped renewing keeps the
    /// others away.
    #[arg(long, default_value = "15s", value_parser = crate::agent::parse_duration)]
    lease_duration: Duration,
    /// How long the leader may fail to renew before it stops deciding (less
    /// than the lease duration).
    #[arg(long, default_value = "10s", value_parser = crate::agent::parse_duration)]
    renew_deadline: Duration,
    /// Between election attempts and renewals.
    #[arg(long, default_value = "2s", value_parser = crate::agent::parse_duration)]
    retry_period: Duration,
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long)]
    metrics_address: Option<std::net::SocketAddr>,
    /// Also keep one resource.k8s.io/v1 DeviceClass per Configuration,
    /// named <configuration>.<namespace>.steward.dev, selecting that
    /// Configuration's devices (the leader writes them; classes without the
    /// label app.kubernetes.io/managed-by=steward are never touched). Off by
    /// default: needs the resource.k8s.io/v1 API (Kubernetes 1.34+).
    #[arg(long)]
    dra_device_classes: bool,
}

pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.renew_deadline < args.lease_duration,
        "--renew-deadline ({:?}) must be shorter than --lease-duration ({:?}), or two leaders could overlap",
        args.renew_deadline,
        args.lease_duration
    );
    anyhow::ensure!(!args.identity.is_empty(), "--identity must not be empty");
    let client = steward_kube::client::connect("controller", Some(&args.identity))
        .await
        .context("connecting to the API server")?;
    let mut cfg = ControllerConfig::new(&args.lease_namespace, &args.identity);
    cfg.lease.name = args.lease_name;
    cfg.lease.lease_duration = args.lease_duration;
    cfg.lease.renew_deadline = args.renew_deadline;
    cfg.lease.retry_period = args.retry_period;
    cfg.ttl = args.reservation_ttl;
    cfg.device_classes = args.dra_device_classes;
    let mut registry = prometheus_client::registry::Registry::default();
    cfg.metrics = steward_reservations::ControllerMetrics::register(&mut registry);
    if let Some(addr) = args.metrics_address {
        // A standby replica is ready too: readiness says the process runs
        // and reaches nothing it cannot; leading is the Lease's business.
        crate::metrics::serve(addr, registry, Readiness::default()).await?;
    }
    let stop = CancellationToken::new();
    let signal = stop.clone();
    tokio::spawn(async move {
        crate::shutdown_signal().await;
        signal.cancel();
    });
    steward_reservations::run(client, cfg, stop)
        .await
        .context("the reservation controller")
}
