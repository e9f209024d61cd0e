//! Monitoring that is tested. The alerts (`deploy/helm/steward/files/alerts.yaml`)
//! pass their unit tests (`alerts.test.yaml`) under a real promtool, every
//! alert is tested and has a runbook section, and a broken alert fails its
//! test; the chart ships exactly that file and the dashboard
//! (`files/dashboard.json`), and kubectl 1.35 and 1.37 (each with its helm)
//! accepts the rendered PodMonitors, PrometheusRule and dashboard ConfigMap
//! on the API server stand-in with the Prometheus Operator's kinds; the real binaries' `/metrics` pass
//! `promtool check metrics`, and export every metric name the alerts and
//! the dashboard use.
//!
//! promtool is `STEWARD_PROMTOOL` (scripts/test sets it through
//! scripts/promtool.sh). Without it the promtool tests say SKIPPED, except
//! under CI, where a missing promtool fails them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "monitoring/exposition.rs"]
mod exposition;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Cluster, NS, Proc, configuration, echo_details, eventually};
use serde_json::Value;
use steward_e2e::chart::{NAMESPACE as CHART_NS, chart_dir, documents, template, template_with};
use steward_testing_apiserver::ApiServer;
use steward_testing_apiserver::kube_tools::{self, KubeTools};
use steward_testing_apiserver::kubectl::Kubectl;

use exposition::{Exported, free_addr, lint, scrape};

const PROMTOOL_ENV: &str = "STEWARD_PROMTOOL";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn files() -> PathBuf {
    chart_dir().join("files")
}

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
}

/// promtool, or `None` (loudly) outside CI when `STEWARD_PROMTOOL` is not
/// set. Under CI a missing promtool is a failure, never a skip.
fn promtool() -> Option<PathBuf> {
    let found = std::env::var_os(PROMTOOL_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    match found {
        Some(p) if p.is_file() => Some(p),
        Some(p) => panic!("{PROMTOOL_ENV}={} is not a file", p.display()),
        None if in_ci() => panic!(
            "{PROMTOOL_ENV} is not set: scripts/test sets it (eval \"$(scripts/promtool.sh)\")"
        ),
        None => {
            eprintln!(
                "SKIPPED: {PROMTOOL_ENV} not set; run `eval \"$(scripts/promtool.sh)\"` and export {PROMTOOL_ENV}"
            );
            None
        }
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn yaml(path: &Path) -> Value {
    let s = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_str(&s).unwrap()
}

/// Every alerting rule of the rule file `rules`.
fn alert_rules(rules: &Value) -> Vec<&Value> {
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

fn alert_names(rules: &Value) -> BTreeSet<String> {
    alert_rules(rules)
        .iter()
        .map(|r| r["alert"].as_str().unwrap().to_owned())
        .collect()
}

/// `promtool test rules alerts.test.yaml` in `dir`.
fn test_rules(promtool: &Path, dir: &Path) -> Output {
    run(Command::new(promtool)
        .args(["test", "rules", "alerts.test.yaml"])
        .current_dir(dir))
}

#[test]
fn every_alert_is_unit_tested_firing_and_passes() {
    let Some(promtool) = promtool() else { return };
    let check = run(Command::new(&promtool)
        .args(["check", "rules", "alerts.yaml"])
        .current_dir(files()));
    assert!(check.status.success(), "{}", text(&check));
    let out = test_rules(&promtool, &files());
    assert!(
        out.status.success(),
        "promtool test rules failed:\n{}",
        text(&out)
    );

    // Every alert has a test case in which it fires (and so is checked
    // with its labels and annotations).
    let alerts = alert_names(&yaml(&files().join("alerts.yaml")));
    let tests = yaml(&files().join("alerts.test.yaml"));
    let firing: BTreeSet<String> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .filter(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .map(|c| c["alertname"].as_str().unwrap().to_owned())
        .collect();
    let untested: Vec<&String> = alerts.difference(&firing).collect();
    assert!(
        untested.is_empty(),
        "alerts never tested firing: {untested:?}"
    );
    assert!(alerts.len() >= 10, "only {} alerts", alerts.len());
}

/// A copy of the rule file with `edit` applied to alert `name`, beside the
/// unmodified tests; `promtool test rules` on it.
fn test_with_broken(promtool: &Path, name: &str, edit: &dyn Fn(&mut Value)) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut rules = yaml(&files().join("alerts.yaml"));
    let mut found = false;
    for g in rules["groups"].as_array_mut().unwrap() {
        for r in g["rules"].as_array_mut().unwrap() {
            if r["alert"] == name {
                edit(r);
                found = true;
            }
        }
    }
    assert!(found, "no alert {name}");
    // JSON is YAML: promtool reads it as a rule file.
    std::fs::write(dir.path().join("alerts.yaml"), rules.to_string()).unwrap();
    std::fs::copy(
        files().join("alerts.test.yaml"),
        dir.path().join("alerts.test.yaml"),
    )
    .unwrap();
    test_rules(promtool, dir.path())
}

#[test]
fn a_broken_alert_fails_its_unit_test() {
    let Some(promtool) = promtool() else { return };
    // The copy itself passes: what fails below is the edit.
    let same = test_with_broken(&promtool, "StewardSlotsUnhealthy", &|_| {});
    assert!(same.status.success(), "{}", text(&same));

    let rules = yaml(&files().join("alerts.yaml"));
    for rule in alert_rules(&rules) {
        let name = rule["alert"].as_str().unwrap();
        // An alert that can never fire.
        let out = test_with_broken(&promtool, name, &|r| {
            r["expr"] = Value::from("vector(0) > 1");
        });
        assert!(!out.status.success(), "{name} never firing still passed");
        assert!(text(&out).contains(name), "{name}: {}", text(&out));
        // An alert that fires at once: every `for` is tested too.
        if rule.get("for").is_some() {
            let out = test_with_broken(&promtool, name, &|r| {
                r.as_object_mut().unwrap().remove("for");
            });
            assert!(
                !out.status.success(),
                "{name} without its `for` still passed"
            );
        }
    }
    // A threshold moved.
    let out = test_with_broken(&promtool, "StewardReservationsStuckRequested", &|r| {
        let expr = r["expr"].as_str().unwrap().replace("> 120", "> 600");
        r["expr"] = Value::from(expr);
    });
    assert!(!out.status.success(), "a moved threshold still passed");
}

#[test]
fn every_alert_has_a_runbook_section() {
    let page = std::fs::read_to_string(root().join("docs/TROUBLESHOOTING.md")).unwrap();
    let headings: BTreeSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("### Alert: "))
        .map(|h| format!("alert-{}", h.trim().to_lowercase()))
        .collect();
    let rules = yaml(&files().join("alerts.yaml"));
    for rule in alert_rules(&rules) {
        let name = rule["alert"].as_str().unwrap();
        let url = rule["annotations"]["runbook_url"].as_str().unwrap();
        let anchor = url
            .strip_prefix("docs/TROUBLESHOOTING.md#")
            .unwrap_or_else(|| panic!("{name}: runbook_url {url}"));
        assert_eq!(anchor, format!("alert-{}", name.to_lowercase()), "{name}");
        assert!(
            headings.contains(anchor),
            "{name}: no `### Alert: {name}` section in docs/TROUBLESHOOTING.md"
        );
        for key in ["summary", "description"] {
            assert!(rule["annotations"][key].is_string(), "{name}: no {key}");
        }
        assert!(
            matches!(
                rule["labels"]["severity"].as_str(),
                Some("warning" | "critical")
            ),
            "{name}: severity"
        );
    }
}

const MONITORING: [&str; 3] = [
    "monitoring.podMonitors.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.dashboard.enabled=true",
];

fn everything_on() -> Vec<&'static str> {
    let mut sets = MONITORING.to_vec();
    sets.extend([
        "controller.enabled=true",
        "extender.enabled=true",
        "resourceManager.enabled=true",
        // The API server stand-in serves no admissionregistration.k8s.io:
        // the chart's admission policies are applied, and proven, on the
        // real cluster (test-support/real-cluster).
        "rbac.admissionPolicies=false",
    ]);
    sets
}

#[test]
fn monitoring_is_off_by_default() {
    let docs = documents(&template(&[], false));
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert!(!kinds.contains(&"PodMonitor"), "{kinds:?}");
    assert!(!kinds.contains(&"PrometheusRule"), "{kinds:?}");
}

#[test]
fn the_chart_ships_the_tested_rules_the_dashboard_and_a_monitor_per_metrics_endpoint() {
    for transport in ["nri", "cri-proxy"] {
        let mut sets = everything_on();
        let t = format!("resourceManager.transport={transport}");
        sets.push(&t);
        sets.push("monitoring.prometheusRule.runbookBaseUrl=https://runbooks.example/steward.html");
        sets.push("monitoring.podMonitors.labels.release=prom");
        let docs = documents(&template(&sets, false));

        // The PrometheusRule is files/alerts.yaml, the runbook base swapped.
        let rule = docs.iter().find(|d| d["kind"] == "PrometheusRule").unwrap();
        let shipped = files().join("alerts.yaml");
        let want = std::fs::read_to_string(&shipped).unwrap().replace(
            "docs/TROUBLESHOOTING.md#",
            "https://runbooks.example/steward.html#",
        );
        let want: Value = serde_saphyr::from_str(&want).unwrap();
        assert_eq!(rule["spec"]["groups"], want["groups"], "{transport}");

        // The dashboard ConfigMap carries files/dashboard.json, for the sidecar.
        let cm = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "t-steward-dashboard")
            .unwrap();
        assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
        let shipped: Value =
            serde_json::from_str(&std::fs::read_to_string(files().join("dashboard.json")).unwrap())
                .unwrap();
        let data: Value =
            serde_json::from_str(cm["data"]["steward.json"].as_str().unwrap()).unwrap();
        assert_eq!(data, shipped);

        // One PodMonitor per workload serving metrics (the extender serves
        // none), selecting exactly that workload's pods and a port of theirs.
        let monitors: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "PodMonitor").collect();
        let workloads: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"] == "DaemonSet" || d["kind"] == "Deployment")
            .collect();
        let serving: Vec<&&Value> = workloads
            .iter()
            .filter(|w| {
                w["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|c| {
                        c["args"].as_array().is_some_and(|a| {
                            a.iter()
                                .any(|s| s.as_str().unwrap().starts_with("--metrics-address="))
                        })
                    })
            })
            .collect();
        assert_eq!(monitors.len(), serving.len(), "{transport}");
        assert_eq!(
            serving.len(),
            3,
            "{transport}: agent, resource manager, controller"
        );
        for m in &monitors {
            assert_eq!(m["metadata"]["labels"]["release"], "prom");
            let selector = m["spec"]["selector"]["matchLabels"].as_object().unwrap();
            let matched: Vec<&&&Value> = serving
                .iter()
                .filter(|w| {
                    let labels = &w["spec"]["template"]["metadata"]["labels"];
                    selector.iter().all(|(k, v)| &labels[k] == v)
                })
                .collect();
            assert_eq!(matched.len(), 1, "{}: {selector:?}", m["metadata"]["name"]);
            let ports: Vec<&Value> = matched[0]["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|c| c["ports"].as_array())
                .flatten()
                .map(|p| &p["name"])
                .collect();
            for ep in m["spec"]["podMetricsEndpoints"].as_array().unwrap() {
                assert!(
                    ports.contains(&&ep["port"]),
                    "{}: {ports:?}",
                    m["metadata"]["name"]
                );
                assert_eq!(ep["path"], "/metrics");
            }
            assert_eq!(m["spec"]["namespaceSelector"]["matchNames"][0], CHART_NS);
        }
    }
}

/// The bar: kubectl 1.35 and 1.37 (each with the helm shipped
/// beside it) accept every monitoring object the chart renders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_135_and_137_accept_the_rendered_monitoring_objects() {
    kube_tools::each(|t| async move {
        let server = ApiServer::start().await.unwrap();
        server.serve_workloads();
        let k = Kubectl::of(&server, &t).await;
        apply_monitoring(&k, &t).await;
        server.shutdown().await;
    })
    .await;
}

/// Applies the chart with every component and all monitoring on (after the
/// Prometheus Operator's CRDs) with `k`, and checks what was stored.
async fn apply_monitoring(k: &Kubectl, t: &KubeTools) {
    k.ok(&["create", "namespace", CHART_NS]).await;
    // The Prometheus Operator's CRDs first (kubectl validates a custom
    // resource against the OpenAPI it read when it started).
    let crds = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/prometheus-operator-crds.yaml");
    let out = k.ok(&["apply", "-f", crds.to_str().unwrap()]).await;
    assert_eq!(out.lines().count(), 2, "{out}");
    let text = template_with(&t.helm, &everything_on(), true);
    let file = k.dir().join("rendered.yaml");
    std::fs::write(&file, &text).unwrap();
    let applied = k.ok(&["apply", "-f", file.to_str().unwrap()]).await;
    let docs = documents(&text);
    assert_eq!(applied.lines().count(), docs.len(), "{applied}");
    for line in applied.lines() {
        assert!(line.ends_with(" created"), "{line}");
    }
    // Stored as rendered: nothing pruned.
    for d in docs
        .iter()
        .filter(|d| d["kind"] == "PodMonitor" || d["kind"] == "PrometheusRule")
    {
        let kind = d["kind"].as_str().unwrap().to_lowercase();
        let name = d["metadata"]["name"].as_str().unwrap();
        let stored = k
            .ok(&["get", &kind, name, "-n", CHART_NS, "-o", "json"])
            .await;
        let stored: Value = serde_json::from_str(&stored).unwrap();
        assert_eq!(stored["spec"], d["spec"], "{kind}/{name}");
    }
    let got = k
        .ok(&[
            "get",
            "podmonitors,prometheusrules",
            "-n",
            CHART_NS,
            "-o",
            "name",
        ])
        .await;
    assert_eq!(got.lines().count(), 4, "{got}");
    // Applying again leaves the monitoring objects unchanged (the other
    // kinds are chart_kubectl's business).
    let again = k.ok(&["apply", "-f", file.to_str().unwrap()]).await;
    let ours: Vec<&str> = again
        .lines()
        .filter(|l| l.contains(".monitoring.coreos.com/") || l.contains("/t-steward-dashboard "))
        .collect();
    assert_eq!(ours.len(), 5, "{again}");
    for line in ours {
        assert!(line.ends_with(" unchanged"), "{line}");
    }

    // The schema is exercised: a misspelt field is refused.
    let mut monitor = docs
        .iter()
        .find(|d| d["kind"] == "PodMonitor")
        .unwrap()
        .clone();
    let endpoints = monitor["spec"]["podMetricsEndpoints"].take();
    monitor["spec"]["podMetricEndpoints"] = endpoints;
    monitor["metadata"]["name"] = Value::from("typo");
    let typo = k.write("typo.json", &monitor);
    let out = k.output(&["apply", "-f", typo.to_str().unwrap()]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the typo was accepted");
    assert!(stderr.contains("podMetricEndpoints"), "{stderr}");
}

/// Every PromQL expression of the alerts and the dashboard, with where it is.
fn used_queries() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for rule in alert_rules(&yaml(&files().join("alerts.yaml"))) {
        out.push((
            format!("alert {}", rule["alert"].as_str().unwrap()),
            rule["expr"].as_str().unwrap().to_owned(),
        ));
    }
    let dash: Value =
        serde_json::from_str(&std::fs::read_to_string(files().join("dashboard.json")).unwrap())
            .unwrap();
    fn walk(v: &Value, path: &str, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    if (k == "expr" || k == "query" || k == "definition") && v.is_string() {
                        out.push((path.to_owned(), v.as_str().unwrap().to_owned()));
                    } else {
                        let title = m.get("title").and_then(Value::as_str).unwrap_or(path);
                        walk(v, title, out);
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, path, out)),
            _ => {}
        }
    }
    walk(&dash, "dashboard", &mut out);
    out
}

#[test]
fn the_metric_name_check_catches_a_name_not_exported() {
    let mut e = Exported::default();
    e.add("# TYPE steward_a counter\nsteward_a_total{steward_instance=\"x\"} 1\n# TYPE steward_h histogram\nsteward_h_count 0\n# EOF\n");
    assert!(
        e.missing("rate(steward_a_total[5m]) by (steward_instance)")
            .is_empty()
    );
    assert!(
        e.missing("histogram_quantile(0.9, rate(steward_h_bucket[5m]))")
            .is_empty()
    );
    assert_eq!(
        e.missing("steward_a > 0 or steward_made_up_total"),
        BTreeSet::from(["steward_a".to_owned(), "steward_made_up_total".to_owned()])
    );
    assert!(used_queries().len() >= 25, "{:?}", used_queries().len());
}

/// Scrapes `addr` until every name in `want` is exported (or 30 s pass),
/// then returns the last scrape.
async fn scrape_until(component: &str, addr: SocketAddr, want: &[&str]) -> String {
    let got = eventually(
        &format!("{component} exporting {want:?}"),
        common::WAIT,
        || async {
            let body = scrape(addr).await?;
            let mut e = Exported::default();
            e.add(&body);
            want.iter().all(|w| e.names.contains(*w)).then_some(body)
        },
    )
    .await;
    match got {
        Ok(body) => body,
        Err(err) => panic!(
            "{err}; last scrape:\n{}",
            scrape(addr).await.unwrap_or_default()
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binaries_export_every_metric_the_alerts_and_dashboard_use_and_promtool_lints_them() {
    let promtool = promtool();
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path()).await.unwrap();
    cluster.create_node("node-a").await.unwrap();
    let mut cam = configuration(
        "cam",
        "debug-echo",
        &echo_details(&["cam-0", "cam-1"], None),
    );
    cam.spec.capacity = 2;
    cluster.create_configuration(&cam).await.unwrap();
    let kubeconfig: OsString = cluster.kubeconfig.clone().into();
    let p = |name: &str| -> OsString { dir.path().join(name).into() };

    // The agent in Kubernetes mode: discovery, Instances, device plugins
    // (no kubelet here: served, not registered), pod resources.
    std::fs::create_dir_all(dir.path().join("kubelet/device-plugins")).unwrap();
    let agent_addr = free_addr();
    let agent_args: Vec<OsString> = vec![
        "agent".into(),
        "--node-name".into(),
        "node-a".into(),
        "--state-dir".into(),
        p("agent-state"),
        "--registration-socket".into(),
        p("registration.sock"),
        "--embedded".into(),
        "debug-echo".into(),
        "--kubelet-dir".into(),
        p("kubelet"),
        "--cdi-dir".into(),
        "".into(),
        "--pod-resources-socket".into(),
        p("agent-pod-resources.sock"),
        "--metrics-address".into(),
        agent_addr.to_string().into(),
    ];
    let _agent = Proc::spawn(
        "agent",
        &agent_args,
        &[("KUBECONFIG", kubeconfig.clone())],
        dir.path().join("agent.log"),
    )
    .unwrap();

    // The controller, leading alone.
    let controller_addr = free_addr();
    let controller_args: Vec<OsString> = vec![
        "controller".into(),
        "--identity".into(),
        "controller-0".into(),
        "--lease-namespace".into(),
        NS.into(),
        "--metrics-address".into(),
        controller_addr.to_string().into(),
    ];
    let _controller = Proc::spawn(
        "controller",
        &controller_args,
        &[("KUBECONFIG", kubeconfig.clone())],
        dir.path().join("controller.log"),
    )
    .unwrap();

    // The resource manager under both transports; no runtime here, so it
    // serves its metrics while it waits for one.
    let nri_addr = free_addr();
    let nri_args: Vec<OsString> = vec![
        "nri-plugin".into(),
        "--nri-socket".into(),
        p("nri.sock"),
        "--state-dir".into(),
        p("nri-state"),
        "--verify-interval".into(),
        "0s".into(),
        "--pod-resources-socket".into(),
        p("nri-pod-resources.sock"),
        "--metrics-address".into(),
        nri_addr.to_string().into(),
    ];
    let _nri = Proc::spawn("nri-plugin", &nri_args, &[], dir.path().join("nri.log")).unwrap();
    let proxy_addr = free_addr();
    let proxy_args: Vec<OsString> = vec![
        "cri-proxy".into(),
        "--listen".into(),
        p("cri.sock"),
        "--runtime".into(),
        p("no-runtime.sock"),
        "--state-dir".into(),
        p("proxy-state"),
        "--verify-interval".into(),
        "0s".into(),
        "--pod-resources-socket".into(),
        p("proxy-pod-resources.sock"),
        "--metrics-address".into(),
        proxy_addr.to_string().into(),
    ];
    let _proxy = Proc::spawn("cri-proxy", &proxy_args, &[], dir.path().join("proxy.log")).unwrap();

    let agent = scrape_until(
        "agent",
        agent_addr,
        &[
            "steward_discovery_handlers",
            "steward_discovery_instances",
            "steward_discovery_instance_writes_total",
            "steward_deviceplugin_slots",
            "steward_deviceplugin_plugins",
            "steward_pod_resources_watchers",
        ],
    )
    .await;
    let controller = scrape_until(
        "controller",
        controller_addr,
        &["steward_controller_leading", "steward_reservations"],
    )
    .await;
    let resmgr_names = ["steward_resmgr_events_total", "steward_resmgr_drift_total"];
    let nri = scrape_until("nri-plugin", nri_addr, &resmgr_names).await;
    let proxy = scrape_until("cri-proxy", proxy_addr, &resmgr_names).await;

    // Each binary names itself to the API server.
    let version = env!("CARGO_PKG_VERSION");
    let agents = cluster.server.stats().user_agents;
    for ua in [
        format!("steward-agent/{version} (node-a)"),
        format!("steward-controller/{version} (controller-0)"),
    ] {
        assert!(
            agents.get(&ua).is_some_and(|n| *n > 0),
            "no request from {ua}: {agents:?}"
        );
    }

    let mut exported = Exported::default();
    for body in [&agent, &controller, &nri, &proxy] {
        exported.add(body);
    }
    let mut missing = Vec::new();
    for (where_, q) in used_queries() {
        for name in exported.missing(&q) {
            missing.push(format!("{name} (in {where_}: {q})"));
        }
    }
    assert!(
        missing.is_empty(),
        "used by the alerts or the dashboard but exported by no binary:\n{}",
        missing.join("\n")
    );

    if let Some(promtool) = promtool {
        for (component, body) in [
            ("agent", &agent),
            ("controller", &controller),
            ("nri-plugin", &nri),
            ("cri-proxy", &proxy),
        ] {
            lint(&promtool, component, body);
        }
    }
}
