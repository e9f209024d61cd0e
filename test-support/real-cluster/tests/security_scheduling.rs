//! SECURITY.md, "a pod": nobody but kube-scheduler takes or releases
//! scheduling capacity through the extender, and nobody but the extender
//! asks the leading controller directly. Performed from the control plane's
//! network (where kube-scheduler runs, and which reaches Service and pod
//! addresses), with curl, against the chart as installed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use steward_real_cluster::{Cluster, eventually};

/// The control plane's network namespace (scripts/kube-cluster.sh).
const CONTROL_PLANE_NS: &str = "stwk-cp";

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set (scripts/real-cluster up)"))
}

/// `curl ARGS` from the control plane's network: (HTTP status or 0 when no
/// answer came, body, curl's stderr).
fn curl(args: &[&str]) -> (u16, String, String) {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            CONTROL_PLANE_NS,
            "curl",
            "-sS",
            "--max-time",
            "10",
        ])
        .args(["-o", "/dev/stdout", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running curl: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = stdout.rsplit_once('\n').unwrap_or(("", stdout.as_str()));
    (
        code.trim().parse().unwrap_or(0),
        body.to_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts `ns` holds no Reservation: what `who` did wrote none.
fn no_reservation_in(cluster: &Cluster, ns: &str, who: &str) {
    let reservations = cluster.kubectl(&["get", "reservations", "-n", ns, "-o", "json"]);
    let v: Value = serde_json::from_str(&reservations).unwrap();
    assert_eq!(
        v["items"].as_array().map(Vec::len),
        Some(0),
        "{who} wrote a Reservation: {reservations}"
    );
}

/// A Filter body as kube-scheduler sends it (nodeCacheCapable: names only)
/// for a pod asking an exclusive CPU.
fn filter_body(ns: &str, node: &str) -> String {
    json!({
        "Pod": {
            "metadata": {"name": "victim", "namespace": ns, "uid": "uid-forged"},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                "resources": {"limits": {"cpu": "1", "memory": "64Mi",
                    "resmgr.steward.dev/exclusive-cpus": "1"}}}]},
        },
        "NodeNames": [node],
    })
    .to_string()
}

/// Proves: the extender answers only a caller presenting a client
/// certificate of the cluster's CA whose name is kube-scheduler's. Without a
/// certificate, over plain HTTP, or with another client certificate of the
/// same CA (the cluster admin's), a Filter is refused and writes no
/// Reservation; kube-scheduler's own certificate is answered; kubelet's
/// probe path answers without one.
#[tokio::test(flavor = "multi_thread")]
async fn only_kube_scheduler_reaches_the_extender() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("sec-sched").await;
    let pki = env("STEWARD_CLUSTER_PKI");
    let url = env("STEWARD_CLUSTER_EXTENDER_URL");
    assert!(
        url.starts_with("https://"),
        "the extender is reached over {url}"
    );
    let body = filter_body(&ns.name, &cluster.nodes[0]);
    let ca = format!("{pki}/ca.crt");
    let filter = format!("{url}/filter");
    // The Service answers first (its endpoints and kube-proxy's rules may
    // lag the pods' readiness): a refusal below is then the extender's,
    // not an address nobody serves yet.
    eventually(
        "the extender's Service answering /healthz",
        Duration::from_secs(60),
        || async {
            let (code, _, _) = curl(&["--cacert", &ca, &format!("{url}/healthz")]);
            (code == 200).then_some(())
        },
    )
    .await;
    let post = [
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "--data",
    ];

    // A Filter with the client certificate `pki/<name>.crt`.
    let filter_with = |name: &str| {
        let (cert, key) = (format!("{pki}/{name}.crt"), format!("{pki}/{name}.key"));
        curl(
            &[
                &["--cacert", &ca, "--cert", &cert, "--key", &key][..],
                &post[..],
                &[&body, &filter],
            ]
            .concat(),
        )
    };
    let mut refused = Vec::new();
    // No client certificate.
    let (code, body_out, err) = curl(&[&["--cacert", &ca], &post[..], &[&body, &filter]].concat());
    assert!(
        code == 0 || code == 401 || code == 403,
        "a Filter with no client certificate was answered {code}: {body_out} {err}"
    );
    refused.push(format!("no certificate: {code} {}", err.trim()));
    // Plain HTTP to the HTTPS port.
    let plain = filter.replace("https://", "http://");
    let (code, body_out, err) = curl(&[&post[..], &[&body, &plain]].concat());
    assert!(
        !(200..300).contains(&code),
        "a plain-HTTP Filter was answered {code}: {body_out} {err}"
    );
    refused.push(format!("plain HTTP: {code}"));
    // Another client certificate of the same CA: the cluster admin's.
    let (code, body_out, err) = filter_with("admin");
    assert!(
        code == 0 || code == 403,
        "a Filter with the admin's certificate was answered {code}: {body_out} {err}"
    );
    refused.push(format!("admin's certificate: {code}"));
    // None of them wrote a Reservation.
    no_reservation_in(&cluster, &ns.name, "a refused Filter");

    // kube-scheduler's certificate is answered (a Filter result, whatever
    // it decides for this pod).
    let (code, body_out, err) = filter_with("scheduler");
    assert_eq!(code, 200, "kube-scheduler's Filter: {body_out} {err}");
    let answer: Value = serde_json::from_str(&body_out).unwrap();
    assert!(
        answer.get("NodeNames").is_some() || answer.get("FailedNodes").is_some(),
        "not a Filter answer: {body_out}"
    );
    // kubelet's probe: no client certificate needed.
    let (code, _, err) = curl(&["--cacert", &ca, &format!("{url}/healthz")]);
    assert_eq!(code, 200, "/healthz without a certificate: {err}");
    eprintln!("refused: {refused:?}");
}

/// The leading controller's decide endpoint, from the election Lease.
fn decide_endpoint(cluster: &Cluster) -> String {
    let out = cluster.kubectl(&[
        "get",
        "leases",
        "-n",
        &cluster.release_namespace,
        "steward-controller",
        "-o",
        "jsonpath={.metadata.annotations.steward\\.dev/decide-endpoint}",
    ]);
    assert!(
        out.starts_with("http"),
        "no decide endpoint in the Lease: {out:?}"
    );
    out.trim().to_owned()
}

/// The name the leader's decide certificate carries (scripts/kube-cluster.sh
/// `controller-decide`; the chart's `controller.decide.tls.serverName`
/// default).
const DECIDE_NAME: &str = "steward-controller-decide.steward-system.svc";

/// Proves: the leader serves `/v1/decide` over TLS only, with a certificate
/// for its fixed name from the operator's CA (a client that does not trust
/// that CA, or speaks plain HTTP, gets no answer at all); and it takes an
/// ask only from the extender's ServiceAccount, verified by the real API
/// server's TokenReview: no token is 401, a token of another
/// ServiceAccount (the right audience) is 403, a token of the extender's
/// ServiceAccount for another audience is 401, and none of them writes a
/// Reservation.
#[tokio::test(flavor = "multi_thread")]
async fn only_the_extender_asks_the_leader() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("sec-decide-path").await;
    let endpoint = decide_endpoint(&cluster);
    let address = endpoint
        .strip_prefix("https://")
        .unwrap_or_else(|| panic!("the leader advertises {endpoint:?}, not https"));
    let (ip, port) = address.trim_end_matches('/').rsplit_once(':').unwrap();
    let ca = format!("{}/ca.crt", env("STEWARD_CLUSTER_PKI"));
    let resolve = format!("{DECIDE_NAME}:{port}:{ip}");
    let url = format!("https://{DECIDE_NAME}:{port}/v1/decide");
    let trusted = ["--cacert", ca.as_str(), "--resolve", resolve.as_str()];

    // Plain HTTP to the TLS port: no HTTP answer.
    let (code, body, err) = curl(&["-X", "POST", &format!("http://{address}/v1/decide")]);
    assert_eq!(
        code, 0,
        "plain HTTP to the decide port answered: {body} {err}"
    );
    // TLS without trusting the operator's CA: the handshake fails.
    let (code, body, err) = curl(&["--resolve", &resolve, "-X", "POST", &url]);
    assert_eq!(code, 0, "an unverified leader answered: {body} {err}");
    assert!(err.contains("certificate"), "curl says why: {err}");
    // TLS to the pod IP by address: its certificate names no IP.
    let (code, body, err) = curl(&[
        "--cacert",
        &ca,
        "-X",
        "POST",
        &format!("https://{address}/v1/decide"),
    ]);
    assert_eq!(code, 0, "the certificate matched a pod IP: {body} {err}");

    let ask = json!({
        "pod": {"namespace": ns.name, "name": "victim", "uid": "uid-forged"},
        "candidates": [cluster.nodes[0]],
        "slots": {},
        "exclusiveCpus": 1,
    })
    .to_string();
    let post = [
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "--data",
    ];

    // An ask over the verified TLS, with `token` as its bearer (or none).
    let ask_with = |token: Option<&str>| {
        let bearer = token.map(|t| format!("Authorization: Bearer {t}"));
        let auth: Vec<&str> = bearer.iter().flat_map(|b| ["-H", b.as_str()]).collect();
        curl(&[&trusted[..], &auth[..], &post[..], &[&ask, &url]].concat())
    };
    // `kubectl create token SA -n NS ARGS`.
    let token = |sa: &str, ns: &str, args: &[&str]| {
        cluster
            .kubectl(&[&["create", "token", sa, "-n", ns][..], args].concat())
            .trim()
            .to_owned()
    };

    let (code, body, err) = ask_with(None);
    assert_eq!(code, 401, "an ask with no token: {body} {err}");

    let other = token("default", &ns.name, &["--audience", "steward-decide"]);
    let (code, body, err) = ask_with(Some(&other));
    assert_eq!(
        code, 403,
        "an ask with another ServiceAccount's token: {body} {err}"
    );

    let wrong_audience = token("steward-extender", &cluster.release_namespace, &[]);
    let (code, body, err) = ask_with(Some(&wrong_audience));
    assert_eq!(
        code, 401,
        "an ask with the extender's token for the API server's audience: {body} {err}"
    );

    no_reservation_in(&cluster, &ns.name, "a refused ask");
}

/// The leader's `steward_reservation_direct_asks_total{outcome="decided"}`,
/// read from its metrics port (the pod IP its Lease names).
fn decided_directly(ip: &str) -> u64 {
    let (code, body, err) = curl(&[&format!("http://{ip}:9466/metrics")]);
    assert_eq!(code, 200, "the leader's metrics: {err}");
    body.lines()
        .find(|l| l.starts_with("steward_reservation_direct_asks_total{outcome=\"decided\"}"))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, n)| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no direct_asks decided in the leader's metrics:\n{body}"))
}

/// Proves: kube-scheduler's extender reaches the leader over that TLS, with
/// the CA and name the chart gives it: a pod asking an exclusive CPU is
/// scheduled and the leader counts its ask as decided on the direct path
/// (were the handshake refused, the extender would ask through the API
/// and the count would not move).
#[tokio::test(flavor = "multi_thread")]
async fn the_extender_reaches_the_leader_over_tls() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("sec-decide-tls").await;
    let endpoint = decide_endpoint(&cluster);
    let ip = endpoint
        .trim_start_matches("https://")
        .rsplit_once(':')
        .map(|(ip, _)| ip.to_owned())
        .unwrap();
    let before = decided_directly(&ip);
    cluster
        .create_pod(
            &ns.name,
            steward_real_cluster::busybox_pod(
                "pinned",
                "sleep 3600",
                json!({"cpu": "1", "memory": "32Mi", "resmgr.steward.dev/exclusive-cpus": "1"}),
            ),
        )
        .await;
    cluster
        .running(&ns.name, "pinned", Duration::from_secs(120))
        .await;
    assert_eq!(
        decide_endpoint(&cluster),
        endpoint,
        "the leader moved during the test"
    );
    let after = decided_directly(&ip);
    assert!(
        after > before,
        "the leader decided no ask directly ({before} -> {after}): the extender did not reach it over TLS"
    );
}
