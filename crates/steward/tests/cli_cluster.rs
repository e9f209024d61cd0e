//! `steward get instances|claims|slots` and `steward describe instance` as an
//! operator runs them: the built binary against the API server stand-in
//! (plain HTTP) through a kubeconfig file, and the failures a script relies
//! on (one line on stderr, exit code 1, bounded time).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Cluster, NS, STEWARD, configuration};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use steward_api::{Instance, InstanceSpec, PodRef, SlotClaim, SlotClaimSpec, cdi_name};
use steward_testing_apiserver::kube_tools::{self, KubeTools};
use steward_testing_apiserver::kubectl::Kubectl;

/// The claim's `since`: 2023-11-14T22:13:20Z.
const SINCE_MS: u64 = 1_700_000_000_000;

fn since_time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_millisecond(SINCE_MS as i64).unwrap())
}

struct Seeded {
    cluster: Cluster,
    dir: tempfile::TempDir,
}

impl Seeded {
    fn kubeconfig(&self) -> &Path {
        &self.cluster.kubeconfig
    }
}

fn instance(ns: &str, name: &str, capacity: u32, nodes: &[&str], shared: bool) -> Instance {
    let mut i = Instance::new(
        name,
        InstanceSpec {
            configuration_name: "cams".into(),
            device_id: format!("dev-{name}"),
            shared,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            capacity,
            properties: [("MODEL", "x1"), ("SERIAL", "42")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            mounts: vec![],
            device_specs: vec![],
            cdi_name: cdi_name("cams", name),
        },
    );
    i.metadata.namespace = Some(ns.into());
    i
}

async fn create_namespace(cluster: &Cluster, name: &str) {
    let api: Api<Namespace> = Api::all(cluster.client());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &ns).await.unwrap();
}

/// The stand-in with: Configuration `cams`; Instances `cam-a` (2 slots,
/// shared, node-a and node-b) and `cam-b` (1 slot, node-a) in `default`,
/// `cam-c` in `lab`; slot `cam-a-1` held by pod apps/web-0 on node-a.
async fn seeded() -> Seeded {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path()).await.unwrap();
    create_namespace(&cluster, "lab").await;
    create_namespace(&cluster, "empty").await;
    cluster
        .create_configuration(&configuration("cams", "debug-echo", ""))
        .await
        .unwrap();
    let pp = PostParams::default();
    for (ns, i) in [
        (NS, instance(NS, "cam-a", 2, &["node-a", "node-b"], true)),
        (NS, instance(NS, "cam-b", 1, &["node-a"], false)),
        ("lab", instance("lab", "cam-c", 1, &[], false)),
    ] {
        Api::<Instance>::namespaced(cluster.client(), ns)
            .create(&pp, &i)
            .await
            .unwrap();
    }
    // What agents would write: cam-a served on node-a only (node-b's kubelet
    // refused), cam-b served; cam-c has no status yet.
    let api = Api::<Instance>::namespaced(cluster.client(), NS);
    for (name, serving) in [
        (
            "cam-a",
            vec![
                ("node-a", (true, None)),
                (
                    "node-b",
                    (
                        false,
                        Some("registration with kubelet failed: dialling kubelet".to_owned()),
                    ),
                ),
            ],
        ),
        ("cam-b", vec![("node-a", (true, None))]),
    ] {
        let mut i = api.get(name).await.unwrap();
        let mut status = i.status.take().unwrap_or_default();
        for (node, entry) in serving {
            status.set_serving(node, Some(entry), &i.spec.nodes, None, since_time());
        }
        i.status = Some(status);
        api.replace_status(name, &pp, &i).await.unwrap();
    }
    let mut claim = SlotClaim::new(
        "cam-a-1",
        SlotClaimSpec {
            instance: "cam-a".into(),
            slot: 1,
            node: "node-a".into(),
            epoch: 3,
            pod: Some(PodRef {
                namespace: "apps".into(),
                name: "web-0".into(),
                uid: "uid-web-0".into(),
            }),
            container: Some("main".into()),
            since: SINCE_MS,
            awaiting: None,
            reservation: None,
            resource_claim: None,
        },
    );
    claim.metadata.namespace = Some(NS.into());
    Api::<SlotClaim>::namespaced(cluster.client(), NS)
        .create(&pp, &claim)
        .await
        .unwrap();
    Seeded { cluster, dir }
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl Run {
    fn ok(&self) -> &str {
        assert_eq!(
            self.code,
            Some(0),
            "stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        &self.stdout
    }

    /// Exit code 1, nothing on stdout, exactly one line on stderr; that line.
    fn failed(&self) -> &str {
        assert_eq!(
            self.code,
            Some(1),
            "stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        assert_eq!(self.stdout, "");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "not one line: {:?}", self.stderr);
        assert!(lines[0].starts_with("steward: "), "{}", lines[0]);
        lines[0]
    }
}

/// Runs `steward ARGS` with `home` as HOME and no cluster in the environment.
async fn steward_in(home: &Path, args: &[&str], envs: &[(&str, &Path)]) -> Run {
    let mut cmd = tokio::process::Command::new(STEWARD);
    cmd.args(args)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env_remove("STEWARD_LOG")
        .env("HOME", home)
        .env("NO_COLOR", "1")
        .kill_on_drop(true);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("steward did not exit within 60 s")
        .unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
        elapsed: start.elapsed(),
    }
}

/// `steward ARGS --kubeconfig <the stand-in's>`.
async fn steward(s: &Seeded, args: &[&str]) -> Run {
    let mut all: Vec<&str> = args.to_vec();
    let kc = s.kubeconfig().to_str().unwrap();
    all.extend(["--kubeconfig", kc]);
    steward_in(s.dir.path(), &all, &[]).await
}

/// kubectl's AGE of something created during this test: `42s`, or on a
/// very slow machine `3m12s` / `12m`.
fn is_fresh_age(age: &str) -> bool {
    fn number_then(s: &str, unit: char) -> Option<&str> {
        let digits = s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        (digits > 0).then_some(())?;
        s[digits..].strip_prefix(unit)
    }
    if number_then(age, 's') == Some("") {
        return true;
    }
    match number_then(age, 'm') {
        Some("") => true,
        Some(rest) => number_then(rest, 's') == Some(""),
        None => false,
    }
}

/// A table's lines with the last column (AGE) cut off and checked; the rest
/// kept exactly, padding included.
fn without_age(table: &str) -> Vec<String> {
    table
        .lines()
        .enumerate()
        .map(|(n, line)| {
            let at = line.rfind(' ').unwrap() + 1;
            let (rest, last) = line.split_at(at);
            if n == 0 {
                assert_eq!(last, "AGE", "{line}");
            } else {
                assert!(is_fresh_age(last), "AGE {last:?} in {line:?}");
            }
            rest.to_string()
        })
        .collect()
}

#[test]
fn fresh_ages() {
    for ok in ["0s", "42s", "119s", "2m", "3m12s", "12m"] {
        assert!(is_fresh_age(ok), "{ok}");
    }
    for bad in ["", "s", "4h", "2d3h", "3m12", "x5s", "<unknown>", "AGE"] {
        assert!(!is_fresh_age(bad), "{bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_instances_prints_a_table_with_held_slots() {
    let s = seeded().await;
    let out = steward(&s, &["get", "instances"]).await;
    assert_eq!(out.stderr, "");
    assert_eq!(
        without_age(out.ok()),
        [
            "NAME    CONFIGURATION   CAPACITY   HELD   NODES           READY   ",
            "cam-a   cams            2          1      node-a,node-b   False   ",
            "cam-b   cams            1          0      node-a          True    ",
        ]
    );

    let all = steward(&s, &["get", "instances", "-A"]).await;
    assert_eq!(
        without_age(all.ok()),
        [
            "NAMESPACE   NAME    CONFIGURATION   CAPACITY   HELD   NODES           READY    ",
            "default     cam-a   cams            2          1      node-a,node-b   False    ",
            "default     cam-b   cams            1          0      node-a          True     ",
            "lab         cam-c   cams            1          0      <none>          <none>   ",
        ]
    );

    let lab = steward(&s, &["get", "instances", "-n", "lab"]).await;
    let lab = without_age(lab.ok());
    assert_eq!(lab.len(), 2);
    assert!(lab[1].starts_with("cam-c "), "{lab:?}");

    let wide = steward(&s, &["get", "instances", "-o", "wide"]).await;
    let rows: Vec<Vec<&str>> = wide
        .ok()
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        [
            "NAME",
            "CONFIGURATION",
            "CAPACITY",
            "HELD",
            "NODES",
            "READY",
            "AGE",
            "SHARED",
            "PROPERTIES",
            "DEVICE"
        ]
    );
    assert_eq!(rows[1][7..], ["true", "2", "dev-cam-a"]);
    assert_eq!(rows[2][7..], ["false", "2", "dev-cam-b"]);
}

/// The cells of column `header` of a table, cut at the header's offsets
/// (cells may hold spaces: kubectl prints a list as `[a b]`); an empty
/// cell (kubectl's for a path with no value) reads `<none>`, as steward
/// prints it.
fn column(table: &str, header: &str) -> Vec<String> {
    let mut lines = table.lines();
    let head = lines.next().unwrap();
    let at = head
        .find(&format!("{header} "))
        .unwrap_or_else(|| panic!("no column {header} in {head:?}"));
    let end = head[at..]
        .find(char::is_whitespace)
        .map(|w| at + w)
        .and_then(|w| head[w..].find(|c: char| !c.is_whitespace()).map(|n| w + n))
        .unwrap_or(usize::MAX);
    lines
        .map(|l| {
            let cell = l.get(at..end.min(l.len())).unwrap_or_default().trim();
            if cell.is_empty() { "<none>" } else { cell }.to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_and_steward_agree_on_every_instance() {
    kube_tools::each(kubectl_and_steward_agree_on_every_instance_with).await;
}

async fn kubectl_and_steward_agree_on_every_instance_with(t: KubeTools) {
    let s = seeded().await;
    let k = Kubectl::of(&s.cluster.server, &t).await;
    // kubectl prints the CRD's printer columns (server-side Table).
    let theirs = k.ok(&["get", "instances.steward.dev", "-A"]).await;
    let ours = steward(&s, &["get", "instances", "-A"]).await;
    let ours = ours.ok();
    for header in ["NAMESPACE", "NAME", "CONFIGURATION", "READY"] {
        assert_eq!(
            column(&theirs, header),
            column(ours, header),
            "column {header}:\nkubectl:\n{theirs}\nsteward:\n{ours}"
        );
    }
    assert_eq!(column(&theirs, "READY"), ["False", "True", "<none>"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_instances_as_json_and_yaml_prints_the_objects() {
    let s = seeded().await;
    let out = steward(&s, &["get", "instances", "-o", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(out.ok()).unwrap();
    assert_eq!(v["kind"], "List");
    let items = v["items"].as_array().unwrap();
    let names: Vec<&str> = items
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cam-a", "cam-b"]);
    assert_eq!(items[0]["apiVersion"], "steward.dev/v1alpha1");
    assert_eq!(items[0]["kind"], "Instance");
    // The objects round-trip into the API type.
    let a: Instance = serde_json::from_value(items[0].clone()).unwrap();
    assert_eq!(a.spec.capacity, 2);
    assert_eq!(a.spec.nodes, ["node-a", "node-b"]);
    assert!(a.metadata.creation_timestamp.is_some());

    let out = steward(&s, &["get", "instances", "-A", "-o", "yaml"]).await;
    let v: serde_json::Value = serde_saphyr::from_str(out.ok()).unwrap();
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 3);
    assert_eq!(items[2]["metadata"]["namespace"].as_str(), Some("lab"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_claims_shows_slot_instance_node_pod_and_state() {
    let s = seeded().await;
    let out = steward(&s, &["get", "claims"]).await;
    assert_eq!(
        without_age(out.ok()),
        [
            "NAME      INSTANCE   NODE     POD          STATE   ",
            "cam-a-1   cam-a      node-a   apps/web-0   Held    ",
        ]
    );
    let json = steward(&s, &["get", "slotclaims", "-o", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(json.ok()).unwrap();
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["metadata"]["name"], "cam-a-1");
    assert_eq!(items[0]["spec"]["pod"]["name"], "web-0");
    assert_eq!(items[0]["spec"]["epoch"], 3);

    // No claims in lab: kubectl's note on stderr, success, nothing on stdout.
    let none = steward(&s, &["get", "claims", "-n", "lab"]).await;
    assert_eq!(none.ok(), "");
    assert_eq!(none.stderr, "No resources found in lab namespace.\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_slots_lists_every_slot_and_its_holder() {
    let s = seeded().await;
    let out = steward(&s, &["get", "slots"]).await;
    assert_eq!(
        out.ok(),
        "SLOT      INSTANCE   HOLDER\n\
         cam-a-0   cam-a      <free>\n\
         cam-a-1   cam-a      apps/web-0@node-a\n\
         cam-b-0   cam-b      <free>\n"
    );
    let json = steward(&s, &["get", "slots", "-o", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(json.ok()).unwrap();
    let slots = v.as_array().unwrap();
    assert_eq!(slots.len(), 3);
    assert_eq!(slots[1]["slot"], "cam-a-1");
    assert_eq!(slots[1]["state"], "Held");
    assert_eq!(slots[1]["node"], "node-a");
    assert_eq!(slots[1]["pod"]["namespace"], "apps");
    assert_eq!(slots[1]["since"], "2023-11-14T22:13:20Z");
    assert_eq!(slots[0]["state"], "Free");
    assert!(slots[0].get("pod").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_instance_shows_who_holds_each_slot() {
    let s = seeded().await;
    let out = steward(&s, &["describe", "instance", "cam-a"]).await;
    let text = out.ok();
    let lines: Vec<&str> = text.lines().collect();
    for want in [
        "Name:           cam-a",
        "Namespace:      default",
        "Configuration:  cams",
        "  Handler:      debug-echo",
        "Device ID:      dev-cam-a",
        "Shared:         true",
        "Capacity:       2",
        "Held:           1/2",
        "Nodes:          node-a, node-b",
        "Conditions:",
        "Served On:",
        "Properties:     MODEL=x1",
        "                SERIAL=42",
        "Slots:",
        "  SLOT      STATE   NODE     POD          CONTAINER   SINCE",
        "  cam-a-0   Free    -        -            -           -",
    ] {
        assert!(lines.contains(&want), "no line {want:?} in:\n{text}");
    }
    let held = lines
        .iter()
        .find(|l| l.starts_with("  cam-a-1 "))
        .unwrap_or_else(|| panic!("no row for cam-a-1 in:\n{text}"));
    assert!(
        held.starts_with(
            "  cam-a-1   Held    node-a   apps/web-0   main        2023-11-14T22:13:20Z ("
        ),
        "{held}"
    );
    assert!(held.ends_with(" ago)"), "{held}");
    let row = |prefix: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no row {prefix:?} in:\n{text}"))
            .to_string()
    };
    // Column widths follow the ages ("3y11d ago"): compare the headers' words.
    let under = |label: &str| -> Vec<&str> {
        let at = lines.iter().position(|l| *l == label).unwrap();
        lines[at + 1].split_whitespace().collect()
    };
    assert_eq!(
        under("Conditions:"),
        ["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"]
    );
    assert_eq!(
        under("Served On:"),
        ["NODE", "REGISTERED", "SINCE", "MESSAGE"]
    );
    let ready = row("  Ready ");
    assert!(
        ready.starts_with("  Ready   False    NotServed   2023-11-14T22:13:20Z ("),
        "{ready}"
    );
    assert!(
        ready.ends_with(" ago)   node node-b: registration with kubelet failed: dialling kubelet"),
        "{ready}"
    );
    assert!(row("  node-a ").starts_with("  node-a   true         2023-11-14T22:13:20Z ("));
    assert!(
        row("  node-b ").ends_with(" ago)   registration with kubelet failed: dialling kubelet")
    );
    assert!(
        lines.iter().any(|l| l.starts_with("Created:        20")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_of_an_unknown_instance_fails_with_one_line() {
    let s = seeded().await;
    let out = steward(&s, &["describe", "instance", "nope"]).await;
    let line = out.failed();
    assert!(line.contains("\"nope\""), "{line}");
    assert!(line.contains("not found"), "{line}");
    assert!(line.contains("default"), "{line}");
    // Found in its own namespace, not in another.
    let other = steward(&s, &["describe", "instance", "cam-c"]).await;
    other.failed();
    let lab = steward(&s, &["describe", "instance", "cam-c", "-n", "lab"]).await;
    assert!(lab.ok().contains("Namespace:      lab\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_without_a_cluster_fails_like_get() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    let m = missing.to_str().unwrap();
    let out = steward_in(
        dir.path(),
        &["describe", "instance", "cam-a", "--kubeconfig", m],
        &[],
    )
    .await;
    let line = out.failed();
    assert!(line.contains(m), "{line}");
    assert!(line.contains("No such file"), "{line}");

    let url = closed_port_url();
    let kc = write(
        dir.path(),
        "kubeconfig",
        &kubeconfig_yaml(&[("gone", &url)], "gone"),
    );
    let out = steward_in(
        dir.path(),
        &[
            "describe",
            "instance",
            "cam-a",
            "--kubeconfig",
            kc.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    let line = out.failed();
    assert!(line.contains("cannot reach the API server"), "{line}");
    assert!(line.contains(&url), "{line}");
    assert!(
        out.elapsed < Duration::from_secs(15),
        "took {:?}",
        out.elapsed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_kubeconfig_fails_with_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    let m = missing.to_str().unwrap();
    for args in [
        vec!["get", "instances", "--kubeconfig", m],
        vec!["get", "claims", "--kubeconfig", m],
        vec!["get", "slots", "--kubeconfig", m],
    ] {
        let out = steward_in(dir.path(), &args, &[]).await;
        let line = out.failed();
        assert!(line.contains(m), "{line}");
        assert!(line.contains("No such file"), "{line}");
    }
    // KUBECONFIG naming a missing file: the same, naming the variable.
    let out = steward_in(
        dir.path(),
        &["get", "instances"],
        &[("KUBECONFIG", missing.as_path())],
    )
    .await;
    let line = out.failed();
    assert!(line.contains("KUBECONFIG"), "{line}");
    assert!(line.contains(m), "{line}");
    // Nothing configured at all (no KUBECONFIG, no ~/.kube/config, not in a pod).
    let out = steward_in(dir.path(), &["get", "instances"], &[]).await;
    let line = out.failed();
    assert!(line.contains("no cluster configured"), "{line}");
}

fn kubeconfig_yaml(contexts: &[(&str, &str)], current: &str) -> String {
    let mut clusters = String::new();
    let mut ctxs = String::new();
    for (name, url) in contexts {
        clusters.push_str(&format!("- name: {name}\n  cluster:\n    server: {url}\n"));
        ctxs.push_str(&format!(
            "- name: {name}\n  context:\n    cluster: {name}\n    user: u\n"
        ));
    }
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n{clusters}users:\n- name: u\n  user: {{}}\ncontexts:\n{ctxs}current-context: {current}\n"
    )
}

/// A URL where nothing listens: a port bound and released.
fn closed_port_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_fails_fast_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let url = closed_port_url();
    let kc = write(
        dir.path(),
        "kubeconfig",
        &kubeconfig_yaml(&[("gone", &url)], "gone"),
    );
    let kc = kc.to_str().unwrap();
    for args in [
        vec!["get", "instances", "--kubeconfig", kc],
        vec!["get", "claims", "-A", "--kubeconfig", kc],
        vec!["get", "slots", "--kubeconfig", kc],
    ] {
        let out = steward_in(dir.path(), &args, &[]).await;
        let line = out.failed();
        assert!(line.contains("cannot reach the API server"), "{line}");
        assert!(line.contains(&url), "{line}");
        assert!(
            out.elapsed < Duration::from_secs(15),
            "{args:?} took {:?}",
            out.elapsed
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_fails_after_the_request_timeout() {
    let dir = tempfile::tempdir().unwrap();
    // Accepts connections and holds them open without a word.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            conns.push(c);
        }
    });
    let kc = write(
        dir.path(),
        "kubeconfig",
        &kubeconfig_yaml(&[("mute", &url)], "mute"),
    );
    let out = steward_in(
        dir.path(),
        &[
            "get",
            "instances",
            "--kubeconfig",
            kc.to_str().unwrap(),
            "--request-timeout",
            "1s",
        ],
        &[],
    )
    .await;
    let line = out.failed();
    assert!(line.contains("did not answer in time"), "{line}");
    assert!(line.contains(&url), "{line}");
    assert!(
        out.elapsed >= Duration::from_millis(900),
        "{:?}",
        out.elapsed
    );
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
    held.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_and_kubeconfig_env_choose_the_cluster() {
    let s = seeded().await;
    let dir = s.dir.path();
    let kc = write(
        dir,
        "two-contexts",
        &kubeconfig_yaml(
            &[
                ("gone", &closed_port_url()),
                ("standin", &s.cluster.server.url()),
            ],
            "gone",
        ),
    );
    let kcs = kc.to_str().unwrap();
    // The current context is unreachable; --context picks the stand-in.
    let out = steward_in(
        dir,
        &["get", "slots", "--kubeconfig", kcs, "--context", "standin"],
        &[],
    )
    .await;
    assert_eq!(out.ok().lines().count(), 4, "{}", out.stdout);
    steward_in(dir, &["get", "slots", "--kubeconfig", kcs], &[])
        .await
        .failed();
    // KUBECONFIG is honoured without --kubeconfig, with --context too.
    let out = steward_in(
        dir,
        &["get", "instances", "--context", "standin"],
        &[("KUBECONFIG", kc.as_path())],
    )
    .await;
    assert_eq!(out.ok().lines().count(), 3, "{}", out.stdout);
    // An unknown context is one line naming it.
    let out = steward_in(
        dir,
        &["get", "instances", "--kubeconfig", kcs, "--context", "nope"],
        &[],
    )
    .await;
    let line = out.failed();
    assert!(line.contains("nope"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_handlers_lists_each_node_and_handler_from_the_status() {
    let s = seeded().await;
    // No handler has reported yet.
    let none = steward(&s, &["get", "handlers"]).await;
    assert_eq!(none.ok(), "");
    assert_eq!(none.stderr, "No resources found in default namespace.\n");
    // Two agents reported their handlers for `cams`.
    let api: Api<steward_api::Configuration> = Api::namespaced(s.cluster.client(), NS);
    let mut c = api.get("cams").await.unwrap();
    c.status = Some(steward_api::ConfigurationStatus {
        handlers: vec![
            steward_api::HandlerStatus {
                node: "node-b".into(),
                name: "debug-echo".into(),
                endpoint: "embedded".into(),
                state: "Active".into(),
            },
            steward_api::HandlerStatus {
                node: "node-a".into(),
                name: "debug-echo".into(),
                endpoint: "unix:///var/lib/steward/debug-echo.sock".into(),
                state: "Offline".into(),
            },
        ],
        ..Default::default()
    });
    api.replace_status("cams", &PostParams::default(), &c)
        .await
        .unwrap();
    let out = steward(&s, &["get", "handlers"]).await;
    assert_eq!(
        out.ok(),
        "CONFIGURATION   NODE     HANDLER      STATE\n\
         cams            node-a   debug-echo   Offline\n\
         cams            node-b   debug-echo   Active\n"
    );
    let wide = steward(&s, &["get", "handlers", "-A", "-o", "wide"]).await;
    let first: Vec<&str> = wide
        .ok()
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        first,
        [
            "default",
            "cams",
            "node-a",
            "debug-echo",
            "Offline",
            "unix:///var/lib/steward/debug-echo.sock"
        ]
    );
    let json = steward(&s, &["get", "handlers", "-o", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(json.ok()).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(v[1]["state"], "Active");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_pod_says_what_it_holds_since_when_and_why() {
    let s = seeded().await;
    create_namespace(&s.cluster, "apps").await;
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-0", "namespace": "apps"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "busybox",
            "resources": {"limits": {"steward.dev/cam-a": "1", "steward.dev/cam-b": "1"}}}]},
    }))
    .unwrap();
    let pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(s.cluster.client(), "apps")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    // The seeded claim names uid-web-0; hold it under the pod's real UID.
    let claims: Api<SlotClaim> = Api::namespaced(s.cluster.client(), NS);
    let mut c = claims.get("cam-a-1").await.unwrap();
    c.spec.pod.as_mut().unwrap().uid = pod.metadata.uid.clone().unwrap();
    claims
        .replace("cam-a-1", &PostParams::default(), &c)
        .await
        .unwrap();

    let out = steward(&s, &["explain", "pod", "apps/web-0"]).await;
    let text = out.ok();
    for line in [
        "Pod:          apps/web-0",
        "Node:         node-a",
        "Requests:     steward.dev/cam-a: 1, steward.dev/cam-b: 1",
        "cam-a-1: node-a's device plugin granted it at Allocate",
        "Not held:     steward.dev/cam-b: asks for 1, holds 0",
        "Reservation:  <none>",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    assert!(text.contains("2023-11-14T22:13:20Z"), "since: {text}");

    let json = steward(&s, &["explain", "pod", "apps/web-0", "-o", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(json.ok()).unwrap();
    assert_eq!(v["slots"][0]["slot"], "cam-a-1");
    assert_eq!(v["short"]["cam-b"], serde_json::json!([1, 0]));

    let missing = steward(&s, &["explain", "pod", "apps/nope"]).await;
    assert_eq!(missing.failed(), "steward: pod apps/nope not found");
    let bad = steward(&s, &["explain", "pod", "a/b/c"]).await;
    assert_eq!(
        bad.failed(),
        "steward: \"a/b/c\" is not NAMESPACE/NAME or NAME"
    );
}
