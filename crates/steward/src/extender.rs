//! `steward extender`: kube-scheduler's extender for pods that ask for
//! steward slots (Filter awaits the reservation controller's decision).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use steward_extender::server::ExtenderTls;
use steward_extender::{Extender, ExtenderConfig, LeaderLease, server};
use steward_nodeio::bounded::{ClientAuth, TlsFiles};
use steward_reservations::direct::transport::DecideTrust;
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
    /// Authenticate to the leader's `/v1/decide` with the bearer token in
    /// this file, read again whenever it changes: a projected
    /// ServiceAccount token of audience `steward-decide` (the controller's
    /// --decide-token-audience) that kubelet rotates.
    #[arg(long, value_name = "PATH")]
    decide_token_file: Option<std::path::PathBuf>,
    /// Ask the leader's `/v1/decide` over HTTPS only, its certificate
    /// verified against the CAs in this PEM file (the issuer of the
    /// controller's --decide-tls-cert-file), read again whenever it
    /// changes. An `http://` endpoint in the Lease is then refused without
    /// connecting, and a leader whose certificate does not verify is not
    /// asked: Filter asks through the API instead. Needs
    /// --decide-server-name.
    #[arg(long, value_name = "PEM", requires = "decide_server_name")]
    decide_ca_file: Option<PathBuf>,
    /// The DNS name the leader's certificate must carry, e.g.
    /// `steward-controller-decide.steward-system.svc`: the extender dials
    /// the pod IP the Lease names, but checks the certificate against this
    /// name (pod IPs change, the name does not). Needs --decide-ca-file.
    #[arg(long, value_name = "NAME", requires = "decide_ca_file")]
    decide_server_name: Option<String>,
    /// Serve HTTPS with this PEM certificate (chain) for kube-scheduler's
    /// `enableHTTPS: true` (with --tls-key-file). Read again, with the key
    /// and the client CAs, for a new connection whenever one of the files
    /// changed, so a rotated certificate is served without a restart.
    #[arg(long, requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The PEM private key of --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// PEM CAs a caller's client certificate must chain to (kube-scheduler's
    /// `tlsConfig.certFile` issuer). Every path but GET /healthz and /readyz
    /// then needs a certificate named in --client-names (403 otherwise); one
    /// from another CA fails the handshake. Needs --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    client_ca_file: Option<PathBuf>,
    /// Names a client certificate may carry (subject CN, or a DNS or URI
    /// SAN), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = server::DEFAULT_CLIENT_NAME,
        requires = "client_ca_file"
    )]
    client_names: Vec<String>,
}

impl ExtenderArgs {
    /// The Lease the leader is followed on (`None`: `--no-direct`).
    pub fn leader(&self) -> Option<LeaderLease> {
        (!self.no_direct).then(|| LeaderLease {
            namespace: self.leader_lease_namespace.clone(),
            name: self.leader_lease_name.clone(),
        })
    }

    /// How the leader is authenticated on the direct path, the CA file
    /// read now (`None`: it is not, plain HTTP).
    pub fn decide_trust(&self) -> anyhow::Result<Option<DecideTrust>> {
        let (Some(ca), Some(name)) = (&self.decide_ca_file, &self.decide_server_name) else {
            return Ok(None);
        };
        anyhow::ensure!(
            !self.no_direct,
            "--decide-ca-file and --decide-server-name authenticate the leader on the direct path, which --no-direct turns off"
        );
        let trust = DecideTrust::new(ca.clone(), name.trim())
            .context("reading the leader's CA (--decide-ca-file, --decide-server-name)")?;
        Ok(Some(trust))
    }

    /// How HTTPS is served, read from the files (`None`: plain HTTP).
    pub(crate) fn tls(&self) -> anyhow::Result<Option<ExtenderTls>> {
        let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) else {
            return Ok(None);
        };
        let client = self.client_ca_file.as_ref().map(|ca| ClientAuth {
            ca_file: ca.clone(),
            // Probes present no certificate: checked per request.
            optional: true,
        });
        let callers = client.is_some().then(|| {
            ExtenderTls::callers(
                self.client_names
                    .iter()
                    .map(|n| n.trim().to_owned())
                    .filter(|n| !n.is_empty()),
            )
        });
        let files = TlsFiles::new(cert.clone(), key.clone(), client, "extender")
            .context("reading the extender's TLS files")?;
        Ok(Some(ExtenderTls {
            source: Arc::new(files),
            callers,
        }))
    }
}

pub async fn run(args: ExtenderArgs) -> anyhow::Result<()> {
    let tls = args.tls()?;
    let decide_trust = args.decide_trust()?;
    let client = steward_kube::client::connect("extender", None)
        .await
        .context("connecting to the API server")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding the extender address {}", args.listen))?;
    match &tls {
        None => {
            tracing::info!(address = %args.listen, "serving the scheduler extender over HTTP (/filter, /prioritize, /reserve, /unreserve, /healthz)");
            tracing::warn!(
                "the extender serves plain HTTP: its callers are not authenticated, and any client that reaches it can take or release scheduling capacity (--tls-cert-file, --tls-key-file, --client-ca-file)"
            );
        }
        Some(t) => match &t.callers {
            Some(c) => tracing::info!(
                address = %args.listen,
                client_names = ?c.names().collect::<Vec<_>>(),
                "serving the scheduler extender over HTTPS; callers need a client certificate so named (probes excepted)"
            ),
            None => {
                tracing::info!(address = %args.listen, "serving the scheduler extender over HTTPS");
                tracing::warn!(
                    "no --client-ca-file: the extender's callers are not authenticated, and any client that reaches it can take or release scheduling capacity"
                );
            }
        },
    }
    let leader = args.leader();
    match &leader {
        Some(l) => {
            tracing::info!(namespace = %l.namespace, lease = %l.name, "asking the leading controller directly (through the API when it does not answer)");
            match &decide_trust {
                Some(t) => tracing::info!(
                    ca_file = %t.ca_file().display(),
                    server_name = %t.server_name(),
                    "asking the leader over HTTPS only, its certificate verified"
                ),
                None => tracing::warn!(
                    "the leader is asked over plain HTTP: it is not authenticated to the extender (whoever the Lease names is asked), and the extender's token and asks travel in clear (--decide-ca-file, --decide-server-name; the controller's --decide-tls-cert-file)"
                ),
            }
        }
        None => tracing::info!("--no-direct: asking the controller through the API only"),
    }
    let cfg = ExtenderConfig {
        decision_timeout: args.decision_timeout,
        leader,
        decide_token: args
            .decide_token_file
            .clone()
            .map(steward_reservations::direct::token::DecideToken::new),
        decide_trust,
        ..ExtenderConfig::default()
    };
    let stop = CancellationToken::new();
    let signal = stop.clone();
    tokio::spawn(async move {
        crate::shutdown_signal().await;
        signal.cancel();
    });
    let extender = Arc::new(Extender::new(client, cfg));
    match tls {
        None => server::serve(listener, extender, stop).await,
        Some(tls) => server::serve_tls(listener, extender, tls, stop).await,
    }
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

    #[test]
    fn tls_flags_come_together_and_name_the_scheduler_by_default() {
        let tls = |flags: &[&str]| {
            let mut argv = vec!["steward", "extender"];
            argv.extend(flags);
            Cli::try_parse_from(argv).map(|_| ())
        };
        assert!(parse(&[]).tls().unwrap().is_none());
        assert!(parse(&[]).client_names == ["system:kube-scheduler"]);
        // A certificate without its key, or client CAs without serving TLS.
        assert!(tls(&["--tls-cert-file=/c"]).is_err());
        assert!(tls(&["--tls-key-file=/k"]).is_err());
        assert!(tls(&["--client-ca-file=/ca"]).is_err());
        assert!(tls(&["--client-names=a"]).is_err());
        let args = parse(&[
            "--tls-cert-file=/c",
            "--tls-key-file=/k",
            "--client-ca-file=/ca",
            "--client-names=a, b,,c",
        ]);
        assert_eq!(args.client_names, ["a", " b", "", "c"]);
        // Files that do not exist are an error at startup, not a plain
        // HTTP fallback.
        let e = args.tls().err().unwrap();
        assert!(format!("{e:#}").contains("/c"), "{e:#}");
    }

    #[test]
    fn decide_trust_flags_come_together() {
        let cli = |flags: &[&str]| {
            let mut argv = vec!["steward", "extender"];
            argv.extend(flags);
            Cli::try_parse_from(argv).map(|_| ())
        };
        let err = cli(&["--decide-ca-file=/ca"]).unwrap_err();
        assert!(err.to_string().contains("--decide-server-name"), "{err}");
        let err = cli(&["--decide-server-name=n"]).unwrap_err();
        assert!(err.to_string().contains("--decide-ca-file"), "{err}");
        // Neither: plain HTTP, as before.
        assert!(parse(&[]).decide_trust().unwrap().is_none());
        // A CA file that cannot be read is an error at startup.
        let args = parse(&[
            "--decide-ca-file=/nonexistent/ca.crt",
            "--decide-server-name=n",
        ]);
        let e = args.decide_trust().unwrap_err();
        assert!(format!("{e:#}").contains("/nonexistent/ca.crt"), "{e:#}");
        let ca = format!(
            "--decide-ca-file={}/../steward-reservations/tests/fixtures/tls/ca.crt",
            env!("CARGO_MANIFEST_DIR")
        );
        let name = "--decide-server-name=steward-controller-decide.steward-system.svc";
        let trust = parse(&[&ca, name]).decide_trust().unwrap().unwrap();
        assert_eq!(
            trust.server_name(),
            "steward-controller-decide.steward-system.svc"
        );
        // Nothing to authenticate without the direct path.
        let e = parse(&[&ca, name, "--no-direct"])
            .decide_trust()
            .unwrap_err();
        assert!(e.to_string().contains("--no-direct"), "{e}");
    }

    #[test]
    fn tls_files_make_an_https_extender_with_its_callers() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../steward-reservations/tests/fixtures/tls"
        );
        let cert = format!("--tls-cert-file={dir}/server.crt");
        let key = format!("--tls-key-file={dir}/server.key");
        let ca = format!("--client-ca-file={dir}/ca.crt");
        let tls = parse(&[&cert, &key, &ca, "--client-names=a, b,,c"])
            .tls()
            .unwrap()
            .unwrap();
        let names: Vec<_> = tls.callers.unwrap().names().map(str::to_owned).collect();
        assert_eq!(names, ["a", "b", "c"]);
        // Without client CAs: HTTPS, no caller check.
        assert!(
            parse(&[&cert, &key])
                .tls()
                .unwrap()
                .unwrap()
                .callers
                .is_none()
        );
    }
}
