//! `steward extender`: kube-scheduler's extender for pods that ask for
//! steward slots (Filter awaits the reservation controller's decision).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use steward_reservations::extender::{Extender, ExtenderConfig, server};
use tokio_util::sync::CancellationToken;

#[derive(Debug, clap::Args)]
pub struct ExtenderArgs {
    /// Address kube-scheduler calls (`urlPrefix` of the extender in its
    /// KubeSchedulerConfiguration; verbs `filter` and `prioritize`).
    #[arg(long, default_value = "0.0.0.0:8888")]
    listen: SocketAddr,
    /// Longest wait for the reservation controller inside one Filter call;
    /// past it every node fails as retryable and the scheduler retries.
    #[arg(long, default_value = "2s", value_parser = crate::agent::parse_duration)]
    decision_timeout: Duration,
}

pub async fn run(args: ExtenderArgs) -> anyhow::Result<()> {
    let client = steward_kube::client::connect("extender", None)
        .await
        .context("connecting to the API server")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding the extender address {}", args.listen))?;
    tracing::info!(address = %args.listen, "serving the scheduler extender (/filter, /prioritize, /healthz)");
    let cfg = ExtenderConfig {
        decision_timeout: args.decision_timeout,
        ..ExtenderConfig::default()
    };
    let stop = CancellationToken::new();
    let signal = stop.clone();
    tokio::spawn(async move {
        crate::shutdown_signal().await;
        signal.cancel();
    });
    server::serve(listener, Arc::new(Extender::new(client, cfg)), stop).await;
    Ok(())
}
