//! `steward controller`: the reservation controller (run two replicas; one
//! leads on a Lease and is the only writer of decisions).

use std::net::{Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use steward_leader::direct::server::DecideTls;
use steward_leader::{ControllerConfig, DecideConfig};
use steward_nodeio::Readiness;
use steward_nodeio::bounded::TlsFiles;
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
    /// Also serve `POST /v1/decide` on this address (the direct path): the
    /// extenders follow the election Lease to the leader's URL and ask it
    /// there, instead of writing the Reservation and waiting for its status
    /// (they fall back to that when the leader does not answer). Every
    /// replica listens; only the leader answers. Off when absent.
    #[arg(long, value_name = "ADDR")]
    decide_listen: Option<SocketAddr>,
    /// The URL extenders reach `--decide-listen` at, written in the Lease
    /// while leading, e.g. `http://$(POD_IP):8444` (`https://` with
    /// --decide-tls-cert-file; an IPv6 address may be given without
    /// brackets, as `$(POD_IP)` expands). Absent: `http://` (`https://`)
    /// and the address bound, which must then be a specific one (not
    /// 0.0.0.0). Needs --decide-listen.
    #[arg(long, env = "STEWARD_DECIDE_ADVERTISE", value_name = "URL")]
    decide_advertise: Option<String>,
    /// Authenticate `/v1/decide` callers: each bearer token is reviewed by
    /// the API server (TokenReview, audience --decide-token-audience; the
    /// controller needs `create` on tokenreviews.authentication.k8s.io)
    /// and only --decide-allowed-users are served (401 without a valid
    /// token, 403 for another user). Implied by --decide-allowed-users.
    #[arg(long)]
    decide_authenticate: bool,
    /// The usernames allowed to ask on `/v1/decide`, comma-separated: the
    /// extenders' ServiceAccount,
    /// e.g. `system:serviceaccount:steward-system:steward-extender`.
    #[arg(long, value_delimiter = ',', value_name = "USERS")]
    decide_allowed_users: Vec<String>,
    /// The audience the extenders' tokens are projected for and reviewed
    /// with.
    #[arg(long, default_value = steward_leader::direct::auth::DECIDE_AUDIENCE)]
    decide_token_audience: String,
    /// Serve `/v1/decide` over HTTPS with this PEM certificate (chain) and
    /// --decide-tls-key-file: the extenders verify it (their
    /// --decide-ca-file and --decide-server-name, a DNS name the
    /// certificate must carry), so the leader is authenticated to them and
    /// their tokens and asks do not travel in clear. No client
    /// certificate is asked for (callers are authenticated by their
    /// tokens). Read again, with the key, for a new connection whenever
    /// either file changed. The advertised URL is then `https://`. Needs
    /// --decide-listen.
    #[arg(long, value_name = "PEM", requires = "decide_tls_key_file")]
    decide_tls_cert_file: Option<PathBuf>,
    /// The PEM private key of --decide-tls-cert-file.
    #[arg(long, value_name = "PEM", requires = "decide_tls_cert_file")]
    decide_tls_key_file: Option<PathBuf>,
    /// The leader removes a deleted Node from the Instances at once; a node
    /// that Instances name but that has no Node object (a deletion missed
    /// while no replica led) is removed once it has stayed absent this
    /// long.
    #[arg(long, default_value = "1m", value_parser = crate::agent::parse_duration)]
    deleted_node_grace: Duration,
}

impl ControllerArgs {
    /// The direct path as `--decide-listen` and `--decide-advertise` ask
    /// for it (`None`: off), refused before anything starts when it could
    /// not work.
    pub fn decide(&self) -> anyhow::Result<Option<DecideConfig>> {
        let advertise = self.decide_advertise.as_deref();
        let Some(listen) = self.decide_listen else {
            anyhow::ensure!(
                advertise.is_none(),
                "--decide-advertise (or STEWARD_DECIDE_ADVERTISE) needs --decide-listen: without an address to listen on the direct path is off and nothing would be advertised"
            );
            return Ok(None);
        };
        let tls = self.decide_tls_cert_file.is_some();
        let advertise = match advertise {
            Some(url) => Some(advertised_url(url, tls)?),
            None => {
                anyhow::ensure!(
                    !listen.ip().is_unspecified(),
                    "--decide-advertise is needed: --decide-listen {listen} is not an address extenders can reach (give the URL they reach this replica at, e.g. {}://$(POD_IP):{})",
                    scheme(tls),
                    listen.port()
                );
                None
            }
        };
        Ok(Some(DecideConfig { listen, advertise }))
    }

    /// The audience and the users allowed when `/v1/decide` authenticates
    /// its callers (`None`: it does not).
    pub(crate) fn decide_auth(&self) -> anyhow::Result<Option<(String, Vec<String>)>> {
        let users: Vec<String> = self
            .decide_allowed_users
            .iter()
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if !self.decide_authenticate && users.is_empty() {
            return Ok(None);
        }
        anyhow::ensure!(
            self.decide_listen.is_some(),
            "--decide-authenticate and --decide-allowed-users need --decide-listen (they authenticate its callers)"
        );
        anyhow::ensure!(
            !users.is_empty(),
            "--decide-authenticate needs --decide-allowed-users: any pod can get a token of any audience, only the allowed usernames restrict who asks"
        );
        anyhow::ensure!(
            !self.decide_token_audience.is_empty(),
            "--decide-token-audience must not be empty"
        );
        Ok(Some((self.decide_token_audience.clone(), users)))
    }

    /// How `/v1/decide` is served over HTTPS, the files read now (`None`:
    /// plain HTTP).
    pub fn decide_tls(&self) -> anyhow::Result<Option<DecideTls>> {
        let (Some(cert), Some(key)) = (&self.decide_tls_cert_file, &self.decide_tls_key_file)
        else {
            return Ok(None);
        };
        anyhow::ensure!(
            self.decide_listen.is_some(),
            "--decide-tls-cert-file and --decide-tls-key-file need --decide-listen (they serve it)"
        );
        // No client certificates: the callers present tokens.
        let files = TlsFiles::new(cert.clone(), key.clone(), None, "decide")
            .context("reading the decide endpoint's TLS files")?;
        Ok(Some(DecideTls {
            source: Arc::new(files),
        }))
    }
}

pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.renew_deadline < args.lease_duration,
        "--renew-deadline ({:?}) must be shorter than --lease-duration ({:?}), or two leaders could overlap",
        args.renew_deadline,
        args.lease_duration
    );
    anyhow::ensure!(!args.identity.is_empty(), "--identity must not be empty");
    let decide = args.decide()?;
    let decide_auth = args.decide_auth()?;
    let decide_tls = args.decide_tls()?;
    if decide.is_some() && decide_tls.is_none() {
        tracing::warn!(
            "/v1/decide is served over plain HTTP: the leader is not authenticated to the extenders, and their tokens and asks travel in clear (--decide-tls-cert-file, --decide-tls-key-file; the extenders' --decide-ca-file)"
        );
    }
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
    cfg.decide = decide;
    cfg.decide_tls = decide_tls;
    cfg.decide_auth = decide_auth.map(|(audience, users)| {
        use steward_leader::direct::auth::{ApiServerTokenReview, Authenticator};
        let reviewer = ApiServerTokenReview::new(client.clone(), &audience);
        Arc::new(Authenticator::new(Arc::new(reviewer), users))
    });
    if let Some(gone) = cfg.node_gone.as_mut() {
        gone.grace = args.deleted_node_grace;
    }
    let mut registry = prometheus_client::registry::Registry::default();
    cfg.metrics = steward_leader::ControllerMetrics::register(&mut registry);
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
    steward_leader::run(client, cfg, stop)
        .await
        .context("the reservation controller")
}

/// The scheme of the decide endpoint: `https` when it serves TLS.
fn scheme(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}

/// `url` checked (`http://`, or `https://` when the endpoint serves `tls`,
/// and a host) and with an IPv6 host that came without brackets
/// (`http://fd00::5:8444`, as `$(POD_IP)` expands) bracketed; the last `:`
/// then starts the port.
fn advertised_url(url: &str, tls: bool) -> anyhow::Result<String> {
    let scheme = scheme(tls);
    let Some(rest) = url.strip_prefix(scheme).and_then(|r| r.strip_prefix("://")) else {
        if tls {
            anyhow::bail!(
                "--decide-advertise {url:?} must start with https:// (the decide endpoint serves HTTPS: --decide-tls-cert-file)"
            );
        }
        anyhow::bail!(
            "--decide-advertise {url:?} must start with http:// (the extenders call the leader over plain HTTP; --decide-tls-cert-file serves HTTPS)"
        );
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    anyhow::ensure!(
        !authority.is_empty(),
        "--decide-advertise {url:?} names no host"
    );
    if let Some((host, port)) = authority.rsplit_once(':')
        && host.parse::<Ipv6Addr>().is_ok()
        && port.parse::<u16>().is_ok()
    {
        return Ok(format!("{scheme}://[{host}]:{port}{path}"));
    }
    Ok(url.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn parse(flags: &[&str]) -> ControllerArgs {
        let mut argv = vec!["steward", "controller", "--identity=controller-0"];
        argv.extend(flags);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Controller(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    fn decide(flags: &[&str]) -> anyhow::Result<Option<DecideConfig>> {
        parse(flags).decide()
    }

    #[test]
    fn the_direct_path_is_off_without_decide_listen() {
        assert!(decide(&[]).unwrap().is_none());
    }

    #[test]
    fn decide_listen_and_advertise_reach_the_config() {
        let d = decide(&[
            "--decide-listen=0.0.0.0:8444",
            "--decide-advertise=http://10.1.2.3:8444",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(d.listen, "0.0.0.0:8444".parse().unwrap());
        assert_eq!(d.advertise.as_deref(), Some("http://10.1.2.3:8444"));
        // A specific address advertises itself.
        let d = decide(&["--decide-listen=127.0.0.1:0"]).unwrap().unwrap();
        assert!(d.advertise.is_none());
    }

    #[test]
    fn advertise_without_listen_is_refused_with_the_reason() {
        let err = decide(&["--decide-advertise=http://10.1.2.3:8444"]).unwrap_err();
        assert!(
            err.to_string()
                .contains("--decide-advertise (or STEWARD_DECIDE_ADVERTISE) needs --decide-listen"),
            "{err}"
        );
    }

    #[test]
    fn only_http_urls_are_advertised() {
        for bad in [
            "https://10.1.2.3:8444",
            "10.1.2.3:8444",
            "http://",
            "http:///v1",
        ] {
            let flag = format!("--decide-advertise={bad}");
            let err = decide(&["--decide-listen=0.0.0.0:8444", &flag]).unwrap_err();
            assert!(
                err.to_string().contains("--decide-advertise"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn an_unspecified_listen_address_needs_an_advertised_url() {
        let err = decide(&["--decide-listen=0.0.0.0:8444"]).unwrap_err();
        assert!(
            err.to_string().contains("--decide-advertise is needed"),
            "{err}"
        );
    }

    #[test]
    fn decide_authentication_is_off_unless_asked_and_needs_allowed_users() {
        assert!(
            parse(&["--decide-listen=127.0.0.1:0"])
                .decide_auth()
                .unwrap()
                .is_none()
        );
        let (audience, users) = parse(&[
            "--decide-listen=127.0.0.1:0",
            "--decide-allowed-users=system:serviceaccount:s:ext, system:serviceaccount:s:ctl",
        ])
        .decide_auth()
        .unwrap()
        .unwrap();
        assert_eq!(audience, "steward-decide");
        assert_eq!(
            users,
            ["system:serviceaccount:s:ext", "system:serviceaccount:s:ctl"]
        );
        let (audience, _) = parse(&[
            "--decide-listen=127.0.0.1:0",
            "--decide-authenticate",
            "--decide-allowed-users=u",
            "--decide-token-audience=other",
        ])
        .decide_auth()
        .unwrap()
        .unwrap();
        assert_eq!(audience, "other");
        for (flags, why) in [
            (
                &["--decide-listen=127.0.0.1:0", "--decide-authenticate"][..],
                "needs --decide-allowed-users",
            ),
            (
                &[
                    "--decide-listen=127.0.0.1:0",
                    "--decide-authenticate",
                    "--decide-allowed-users=",
                ][..],
                "needs --decide-allowed-users",
            ),
            (&["--decide-allowed-users=u"][..], "need --decide-listen"),
        ] {
            let err = parse(flags).decide_auth().unwrap_err();
            assert!(err.to_string().contains(why), "{flags:?}: {err}");
        }
    }

    #[test]
    fn an_ipv6_pod_ip_is_bracketed() {
        for (given, want) in [
            ("http://fd00::5:8444", "http://[fd00::5]:8444"),
            ("http://[fd00::5]:8444", "http://[fd00::5]:8444"),
            ("http://10.1.2.3:8444", "http://10.1.2.3:8444"),
            (
                "http://controller.example:8444/",
                "http://controller.example:8444/",
            ),
        ] {
            assert_eq!(advertised_url(given, false).unwrap(), want, "{given}");
        }
        assert_eq!(
            advertised_url("https://fd00::5:8444", true).unwrap(),
            "https://[fd00::5]:8444"
        );
    }

    fn fixture(name: &str) -> String {
        format!(
            "{}/../steward-reservations/tests/fixtures/tls/{name}",
            env!("CARGO_MANIFEST_DIR")
        )
    }

    #[test]
    fn decide_tls_flags_come_together_and_need_decide_listen() {
        let cli = |flags: &[&str]| {
            let mut argv = vec!["steward", "controller", "--identity=controller-0"];
            argv.extend(flags);
            Cli::try_parse_from(argv).map(|_| ())
        };
        // A certificate without its key, or a key without its certificate.
        let err = cli(&["--decide-tls-cert-file=/c"]).unwrap_err();
        assert!(err.to_string().contains("--decide-tls-key-file"), "{err}");
        let err = cli(&["--decide-tls-key-file=/k"]).unwrap_err();
        assert!(err.to_string().contains("--decide-tls-cert-file"), "{err}");
        assert!(cli(&["--decide-tls-cert-file=/c", "--decide-tls-key-file=/k"]).is_ok());
        // Neither: plain HTTP, as before.
        assert!(
            parse(&["--decide-listen=127.0.0.1:0"])
                .decide_tls()
                .unwrap()
                .is_none()
        );
        // Nothing to serve them on.
        let (cert, key) = (
            format!("--decide-tls-cert-file={}", fixture("decide.crt")),
            format!("--decide-tls-key-file={}", fixture("decide.key")),
        );
        let err = parse(&[&cert, &key]).decide_tls().unwrap_err();
        assert!(err.to_string().contains("need --decide-listen"), "{err}");
        // Files that cannot be read are an error at startup, not plain HTTP.
        let err = parse(&[
            "--decide-listen=127.0.0.1:0",
            "--decide-tls-cert-file=/nonexistent/tls.crt",
            "--decide-tls-key-file=/nonexistent/tls.key",
        ])
        .decide_tls()
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("/nonexistent/tls.crt"),
            "{err:#}"
        );
        let listen = "--decide-listen=127.0.0.1:0";
        assert!(
            parse(&[listen, &cert, &key])
                .decide_tls()
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn with_decide_tls_only_https_urls_are_advertised() {
        let (cert, key) = (
            format!("--decide-tls-cert-file={}", fixture("decide.crt")),
            format!("--decide-tls-key-file={}", fixture("decide.key")),
        );
        let d = decide(&[
            "--decide-listen=0.0.0.0:8444",
            "--decide-advertise=https://10.1.2.3:8444",
            &cert,
            &key,
        ])
        .unwrap()
        .unwrap();
        assert_eq!(d.advertise.as_deref(), Some("https://10.1.2.3:8444"));
        let err = decide(&[
            "--decide-listen=0.0.0.0:8444",
            "--decide-advertise=http://10.1.2.3:8444",
            &cert,
            &key,
        ])
        .unwrap_err();
        assert!(
            err.to_string().contains("must start with https://"),
            "{err}"
        );
        let err = decide(&["--decide-listen=0.0.0.0:8444", &cert, &key]).unwrap_err();
        assert!(err.to_string().contains("https://$(POD_IP)"), "{err}");
    }
}
