//! `steward extender`: kube-scheduler's extender for pods that ask for
//! steward slots (Filter awaits the reservation controller's decision).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use steward_reservations::extender::{Extender, ExtenderConfig, LeaderLease, server};
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
    /// Namespace of the reservation controller's election Lease, whose
    /// holder says (annotation `steward.dev/decide-endpoint`) where the
    /// leader decides: Filter asks it there directly, and writes the
    /// Reservation and waits for its status only when it does not answer.
    #[arg(long, env = "POD_NAMESPACE", default_value = "steward-system")]
    leader_lease_namespace: String,
    /// Name of the reservation controller's election Lease (its
    /// `--lease-name`).
    #[arg(long, default_value = "steward-controller")]
    leader_lease_name: String,
    /// Never ask the leader directly: every Filter writes the pod's
    /// Reservation and waits for the controller's status (the API path),
    /// and no Lease is read. For controllers run without --decide-listen.
    #[arg(long)]
    no_direct: bool,
}

impl ExtenderArgs {
    /// The Lease the leader is followed on (`None`: `--no-direct`).
    pub(crate) fn leader(&self) -> Option<LeaderLease> {
        (!self.no_direct).then(|| LeaderLease {
            namespace: self.leader_lease_namespace.clone(),
            name: self.leader_lease_name.clone(),
        })
    }
}

pub async fn run(args: ExtenderArgs) -> anyhow::Result<()> {
    let client = steward_kube::client::connect("extender", None)
        .await
        .context("connecting to the API server")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding the extender address {}", args.listen))?;
    tracing::info!(address = %args.listen, "serving the scheduler extender (/filter, /prioritize, /healthz)");
    let leader = args.leader();
    match &leader {
        Some(l) => {
            tracing::info!(namespace = %l.namespace, lease = %l.name, "asking the leading controller directly (through the API when it does not answer)");
        }
        None => tracing::info!("--no-direct: asking the controller through the API only"),
    }
    let cfg = ExtenderConfig {
        decision_timeout: args.decision_timeout,
        leader,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn parse(flags: &[&str]) -> ExtenderArgs {
        let mut argv = vec!["steward", "extender"];
        argv.extend(flags);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Extender(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn the_leader_is_followed_on_the_named_lease_unless_no_direct() {
        let args = parse(&["--leader-lease-namespace=ops", "--leader-lease-name=other"]);
        assert_eq!(
            args.leader(),
            Some(LeaderLease {
                namespace: "ops".into(),
                name: "other".into()
            })
        );
        assert!(parse(&["--no-direct"]).leader().is_none());
        // The controller's own Lease by default.
        if std::env::var_os("POD_NAMESPACE").is_none() {
            assert_eq!(
                parse(&[]).leader(),
                Some(LeaderLease {
                    namespace: "steward-system".into(),
                    name: "steward-controller".into()
                })
            );
        }
    }
}
