//! kube-scheduler's side of the extender protocol from Go: the peer
//! `scheduler-extender` (test-support/go-peers) writes its requests with
//! encoding/json, kube-scheduler's own extender types and k8s.io/api's Pod
//! and Node, reads the answers as kube-scheduler's HTTPExtender reads them,
//! and fails on what kube-scheduler would reject (a node outside the input,
//! a non-200, a body it cannot decode, keys it drops). Here it schedules
//! pods through the extender and the controller against the API server
//! stand-in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod go_race;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use steward_api::Reservation;
use steward_core::reservation::{NODE_CPUS_ANNOTATION, reservation_name};
use steward_extender::ExtenderConfig;
use tokio::io::AsyncWriteExt;

use common::{NS, Stand, direct, stand_opts};

/// Longest a peer run may take (each Filter waits for the controller).
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The extender, asking the leader directly, with a decision timeout that
/// holds under load: a slow decision must not read as "no node".
fn ext_cfg() -> ExtenderConfig {
    ExtenderConfig {
        decision_timeout: Duration::from_secs(30),
        ..direct()
    }
}

async fn stand(capacity: u32, annotations: &[(&str, &str, String)]) -> Stand {
    stand_opts(capacity, annotations, true, ext_cfg()).await
}

/// The Go peer, or `None` (skipped outside CI when not built).
fn peer() -> Option<PathBuf> {
    steward_testing_gopeers::binary("scheduler-extender")
}

/// Creates a pending pod whose containers ask what `containers` says (the
/// peer's `{name, requests, limits}` form) and returns the peer's pod case
/// with the uid the stand-in gave it.
async fn pod(s: &Stand, name: &str, containers: Value, candidates: &[&str]) -> Value {
    let spec: Vec<Value> = containers
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            json!({"name": c["name"], "image": "busybox", "resources": {
                "requests": c.get("requests").cloned().unwrap_or(json!({})),
                "limits": c.get("limits").cloned().unwrap_or(json!({})),
            }})
        })
        .collect();
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": spec},
    }))
    .unwrap();
    let p = Api::<Pod>::namespaced(s.api.client(), NS)
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
    json!({
        "namespace": NS, "name": name, "uid": p.metadata.uid.unwrap(),
        "containers": containers, "candidates": candidates,
    })
}

/// One container asking `limits` (requests default to them, as the API
/// server would set).
fn asks(limits: Value) -> Value {
    json!([{"name": "main", "limits": limits}])
}

/// The scenario: one extender as `deploy/scheduler/` configures it (weight
/// 5, not ignorable, steward's managed resources), nodes n1..n4.
fn scenario(s: &Stand, node_cache_capable: bool, pods: Vec<Value>, concurrency: u32) -> Value {
    let nodes: Vec<Value> = ["n1", "n2", "n3", "n4"]
        .iter()
        .map(|n| json!({"name": n, "allocatable": {"steward.dev/cam": "2", "cpu": "8"}}))
        .collect();
    json!({
        "extender": {
            "urlPrefix": format!("http://{}", s.addr),
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "weight": 5,
            "nodeCacheCapable": node_cache_capable,
            "ignorable": false,
            "managedResources": ["steward.dev/cam", "resmgr.steward.dev/exclusive-cpus"],
            "httpTimeoutSeconds": 60,
        },
        "nodes": nodes,
        "pods": pods,
        "concurrency": concurrency,
    })
}

/// What one run of the peer printed.
struct Run {
    code: Option<i32>,
    lines: Vec<Value>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Every line for `pod` (a name in NS) and `call`, in order.
    fn all(&self, pod: &str, call: &str) -> Vec<&Value> {
        let who = format!("{NS}/{pod}");
        self.lines
            .iter()
            .filter(|l| l["pod"] == who.as_str() && l["call"] == call)
            .collect()
    }

    /// The only line for `pod` and `call`.
    fn one(&self, pod: &str, call: &str) -> &Value {
        let all = self.all(pod, call);
        assert_eq!(all.len(), 1, "{pod} {call}: {}", self.dump());
        all[0]
    }

    fn dump(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    /// The peer saw no protocol violation.
    fn assert_clean(&self) {
        let violations = self
            .lines
            .iter()
            .filter(|l| l.get("violation").is_some())
            .count();
        assert!(
            violations == 0 && self.code == Some(0),
            "the extender broke kube-scheduler's protocol ({violations} violations):\n{}",
            self.dump()
        );
    }
}

/// Runs the peer on `scenario` (given on its standard input); killed if
/// the test ends first.
async fn run(bin: &Path, scenario: &Value) -> Run {
    let mut child = tokio::process::Command::new(bin)
        .args(["-scenario", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(&serde_json::to_vec(scenario).unwrap())
        .await
        .unwrap();
    drop(stdin);
    let out = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the peer did not finish within {RUN_TIMEOUT:?}"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    Run {
        code: out.status.code(),
        lines,
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn reservation(s: &Stand, pod: &str) -> Option<Reservation> {
    Api::<Reservation>::namespaced(s.api.client(), NS)
        .get_opt(&reservation_name(NS, pod))
        .await
        .unwrap()
}

/// The Reservation of `pod` is Reserved on `node`.
async fn assert_reserved_on(s: &Stand, pod: &str, node: &str) -> Reservation {
    let r = reservation(s, pod)
        .await
        .unwrap_or_else(|| panic!("{pod} has no Reservation"));
    let st = r.status.clone().unwrap_or_default();
    assert_eq!(
        (st.phase.as_str(), st.node.as_deref()),
        ("Reserved", Some(node)),
        "{pod}: {st:?}"
    );
    r
}

fn names(v: &Value) -> Vec<String> {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

/// Every candidate but the passed ones is failed with a reason, in one map
/// or the other.
fn assert_others_failed(filter: &Value, candidates: &[&str], passed: &[String]) {
    for c in candidates
        .iter()
        .filter(|c| !passed.iter().any(|p| p == *c))
    {
        let why = filter["failedNodes"][c]
            .as_str()
            .or(filter["failedAndUnresolvableNodes"][c].as_str())
            .unwrap_or_default();
        assert!(!why.is_empty(), "{c} neither passed nor failed: {filter}");
    }
}

/// (a) Both request forms: the pod asking one slot of the shared Instance
/// is reserved on the node the scheduler chooses, Prioritize scores that
/// node, and a scheduler plugin's Reserve confirms it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_and_node_objects_place_a_shared_slot_where_the_scheduler_binds() {
    let Some(bin) = peer() else { return };
    let s = stand(2, &[]).await;
    let all = ["n1", "n2", "n3", "n4"];
    for (name, cache_capable) in [("a-names", true), ("a-nodes", false)] {
        let mut p = pod(&s, name, asks(json!({"steward.dev/cam": "1"})), &all).await;
        p["alwaysPrioritize"] = json!(true);
        p["reserve"] = json!(true);
        let r = run(&bin, &scenario(&s, cache_capable, vec![p], 1)).await;
        r.assert_clean();
        let f = r.one(name, "filter");
        let passed = names(&f["passed"]);
        assert_eq!(passed.len(), 1, "{}", r.dump());
        let node = passed[0].clone();
        assert!(["n1", "n2", "n3"].contains(&node.as_str()), "{f}");
        assert_others_failed(f, &all, &passed);
        let pr = r.one(name, "prioritize");
        assert_eq!(pr["totals"][&node], 10 * 5 * 10, "{pr}");
        assert_eq!(r.one(name, "reserve")["status"], 200, "{}", r.dump());
        let sched = r.one(name, "schedule");
        assert_eq!(sched["node"], node.as_str(), "{sched}");
        let res = assert_reserved_on(&s, name, &node).await;
        assert_eq!(res.spec.slots, BTreeMap::from([("cam".to_owned(), 1)]));
        eprintln!(
            "{name}: filter {}ms, prioritize {}ms",
            f["latencyMs"], pr["latencyMs"]
        );
    }
}

/// (b) Quantities in the forms Go writes: "1k" slots and "1e3" exclusive
/// CPUs are 1000 each, next to "500m" CPU and "2Gi" memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quantities_in_gos_forms_are_reserved_as_counted() {
    let Some(bin) = peer() else { return };
    let doc = |free: Value| json!({"free": free, "holders": []}).to_string();
    let s = stand(
        1000,
        &[
            ("n1", NODE_CPUS_ANNOTATION, doc(json!({"0": 2, "1": 2}))),
            ("n2", NODE_CPUS_ANNOTATION, doc(json!({"0": 1000, "1": 4}))),
        ],
    )
    .await;
    let slots = pod(
        &s,
        "q-slots",
        json!([
            {"name": "main", "limits": {"steward.dev/cam": "1k"}},
            {"name": "side", "requests": {"cpu": "500m", "memory": "2Gi"},
                "limits": {"cpu": "500m", "memory": "2Gi"}},
        ]),
        &["n1", "n2", "n3", "n4"],
    )
    .await;
    let cpus = pod(
        &s,
        "q-cpus",
        asks(json!({"cpu": "1e3", "memory": "2Gi", "resmgr.steward.dev/exclusive-cpus": "1e3"})),
        &["n1", "n2", "n3"],
    )
    .await;
    let r = run(&bin, &scenario(&s, true, vec![slots, cpus], 1)).await;
    r.assert_clean();
    let node = r.one("q-slots", "schedule")["node"]
        .as_str()
        .unwrap_or_else(|| panic!("1k slots of 1000 not placed: {}", r.dump()))
        .to_owned();
    assert!(["n1", "n2", "n3"].contains(&node.as_str()), "{}", r.dump());
    let res = assert_reserved_on(&s, "q-slots", &node).await;
    assert_eq!(res.spec.slots, BTreeMap::from([("cam".to_owned(), 1000)]));
    assert_eq!(
        r.one("q-cpus", "schedule")["node"],
        "n2",
        "only n2 has 1e3 CPUs on one NUMA node: {}",
        r.dump()
    );
    let res = assert_reserved_on(&s, "q-cpus", "n2").await;
    assert_eq!(res.spec.exclusive_cpus, 1000);
}

/// (c) A pod reserved on n1 whose binding failed is filtered again with
/// only n2 and n3: the answer names no node outside them (kube-scheduler
/// would fail the whole call), and the reservation follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_pod_filtered_without_its_node_is_answered_within_the_input() {
    let Some(bin) = peer() else { return };
    for cache_capable in [true, false] {
        // One slot shared by n1..n3.
        let s = stand(1, &[]).await;
        let first = pod(&s, "c1", asks(json!({"steward.dev/cam": "1"})), &["n1"]).await;
        let mut again = first.clone();
        again["candidates"] = json!(["n2", "n3"]);
        let r = run(&bin, &scenario(&s, cache_capable, vec![first, again], 1)).await;
        r.assert_clean();
        let scheds = r.all("c1", "schedule");
        assert_eq!(scheds.len(), 2, "{}", r.dump());
        assert_eq!(scheds[0]["node"], "n1", "{}", r.dump());
        let filters = r.all("c1", "filter");
        let passed = names(&filters[1]["passed"]);
        assert!(
            passed.iter().all(|n| n == "n2" || n == "n3"),
            "{}",
            r.dump()
        );
        // What the extender does now: n1's slot is released and the pod
        // reserved on a node it can go to.
        assert_eq!(passed.len(), 1, "{}", r.dump());
        assert_reserved_on(&s, "c1", &passed[0]).await;
    }
}

/// (d) Asks beyond what a Reservation may hold (1,024 exclusive CPUs, 1,024
/// slots per Instance) fail every node with the reason, not an Error
/// (kube-scheduler retries an Error forever); (e) a pod asking for no
/// managed resource is never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asks_beyond_the_bounds_fail_the_nodes_and_unmanaged_pods_are_not_sent() {
    let Some(bin) = peer() else { return };
    let s = stand(2, &[]).await;
    let cands = ["n1", "n2", "n3"];
    let cpus = pod(
        &s,
        "d-cpus",
        asks(json!({"cpu": "5k", "resmgr.steward.dev/exclusive-cpus": "5k"})),
        &cands,
    )
    .await;
    let slots = pod(
        &s,
        "d-slots",
        asks(json!({"steward.dev/cam": "2k"})),
        &cands,
    )
    .await;
    let web = pod(
        &s,
        "web",
        asks(json!({"cpu": "1", "memory": "1Gi"})),
        &cands,
    )
    .await;
    let r = run(&bin, &scenario(&s, true, vec![cpus, slots, web], 1)).await;
    r.assert_clean();
    for (name, ask) in [("d-cpus", "5000"), ("d-slots", "2000")] {
        let f = r.one(name, "filter");
        assert!(f.get("error").is_none(), "an Error is retried forever: {f}");
        assert!(names(&f["passed"]).is_empty(), "{f}");
        assert_others_failed(f, &cands, &[]);
        for c in cands {
            let why = f["failedNodes"][c]
                .as_str()
                .or(f["failedAndUnresolvableNodes"][c].as_str())
                .unwrap_or_default();
            assert!(why.contains(ask), "{name} on {c}: {why}");
        }
        let sched = r.one(name, "schedule");
        assert!(sched.get("node").is_none(), "{sched}");
        assert_eq!(sched["diagnosis"].as_object().unwrap().len(), 3, "{sched}");
    }
    let f = r.one("web", "filter");
    assert!(f.get("sent").is_none(), "an unmanaged pod was sent: {f}");
    assert_eq!(r.one("web", "schedule")["node"], "n1");
    assert!(reservation(&s, "web").await.is_none());
}

/// (f) Eight pods, four at a time, for three slots shared by the two
/// candidate nodes: exactly three are placed, each Reserved where it was
/// placed, the rest told why; no slot counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_pods_than_slots_across_two_nodes_never_overcommit() {
    let Some(bin) = peer() else { return };
    let s = stand(3, &[]).await;
    let mut pods = Vec::new();
    for i in 0..8 {
        let mut p = pod(
            &s,
            &format!("f{i}"),
            asks(json!({"steward.dev/cam": "1"})),
            &["n1", "n2"],
        )
        .await;
        p["reserve"] = json!(true);
        pods.push(p);
    }
    let r = run(&bin, &scenario(&s, true, pods, 4)).await;
    r.assert_clean();
    let mut placed = BTreeSet::new();
    for i in 0..8 {
        let name = format!("f{i}");
        let sched = r.one(&name, "schedule");
        match sched["node"].as_str() {
            Some(node) => {
                assert!(node == "n1" || node == "n2", "{sched}");
                assert_reserved_on(&s, &name, node).await;
                placed.insert(name);
            }
            None => {
                let d = &sched["diagnosis"];
                for n in ["n1", "n2"] {
                    assert!(
                        d[n].as_str().unwrap_or_default().contains("slots free"),
                        "{name}: {sched}"
                    );
                }
            }
        }
    }
    assert_eq!(placed.len(), 3, "{}", r.dump());
    let reserved: BTreeSet<String> = Api::<Reservation>::namespaced(s.api.client(), NS)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|r| r.status.as_ref().is_some_and(|s| s.phase == "Reserved"))
        .map(|r| r.spec.pod.name)
        .collect();
    assert_eq!(reserved, placed, "{}", r.dump());
}

/// (g) Issue 24's race, smaller: 200 pods for 20 slots (10 Instances of 2,
/// each advertised by 3 of 10 nodes), two schedulers through two extender
/// replicas, two controllers, the leader killed once 100 Filters are
/// answered. Nothing is over-committed, every Reservation settles, no
/// Filter fails, and every slot ends up placed. Counts only: the latency
/// figures are the `go_race` benchmark's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_race_of_two_schedulers_across_a_killed_leader_never_overcommits_or_sticks() {
    let Some(bin) = peer() else { return };
    let outcome = go_race::race(
        &bin,
        go_race::Shape {
            pods: 200,
            instances: 10,
            capacity: 2,
            nodes: 10,
            seen_by: 3,
            kill_after: Some(100),
            // Load on the machine must not read as "no node": a decision
            // late by seconds is still a decision.
            decision_timeout: Duration::from_secs(30),
            run_timeout: RUN_TIMEOUT,
        },
    )
    .await;
    for line in outcome.report("test") {
        eprintln!("{line}");
    }
    outcome.assert_bar();
    assert_eq!(
        outcome.placed(),
        outcome.real,
        "a slot was left unused:\n{outcome:?}"
    );
}
