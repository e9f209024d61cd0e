//! The race of issue 24's bar, scheduled by the Go peer `scheduler-extender`
//! (kube-scheduler's own extender types through encoding/json): the API
//! server stand-in, two controller replicas deciding on the direct path
//! (`/v1/decide`, the leader on the election Lease), two extender replicas
//! following that Lease, shared Instances over-subscribed by their nodes'
//! advertised slots, and the peer's race mode: two schedulers at once, each
//! through its own extender replica, binding what they place, an unmanaged
//! "floor" pod filtered beside them, and (optionally) a call midway to this
//! driver's kill hook, on which it kills the leading controller before
//! answering: its task aborted, its decide endpoint closed, its Lease not
//! released (a process killed with SIGKILL).
//!
//! Afterwards everything is judged from the API's objects: no slot held by
//! two Reserved Reservations, no Instance with more Reserved slots or more
//! bound pods than it has, every Reservation decided, no Reserved
//! Reservation whose pod was never bound, no pod bound where its
//! Reservation does not hold. Used by `tests/go_scheduler_peer.rs` (a small
//! race, counts only) and `benches/go_race.rs` (the bar's 1,000 pods, with
//! the figures).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use steward_api::{Instance, InstanceSpec, Reservation};
use steward_extender::{Extender, ExtenderConfig, LeaderLease, server};
use steward_leader::{ControllerConfig, ControllerMetrics, DecideConfig, run};
use steward_testing_apiserver::ApiServer;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

const NS: &str = "default";
const LEASE_NS: &str = "steward-system";
const LEASE: &str = "steward-controller";
/// Replicas of the controller, of the extender, and schedulers.
const REPLICAS: usize = 2;

/// The race's shape.
#[derive(Debug, Clone)]
pub struct Shape {
    pub pods: usize,
    /// Instances `cam0..`, each with `capacity` slots, seen by `seen_by`
    /// of the `nodes` nodes (each advertising every slot: over-subscribed
    /// `seen_by` times).
    pub instances: usize,
    pub capacity: u32,
    pub nodes: usize,
    pub seen_by: usize,
    /// Kill the leading controller once this many managed Filters are
    /// answered.
    pub kill_after: Option<usize>,
    /// The extenders' bound on one Filter's wait for a decision.
    pub decision_timeout: Duration,
    /// The whole peer run's bound.
    pub run_timeout: Duration,
}

/// What a race left: the peer's lines and the API's verdict.
pub struct Outcome {
    pub shape: Shape,
    /// The peer's exit code.
    pub exit: Option<i32>,
    /// The peer's summary line.
    pub summary: Value,
    /// The peer's other lines (failed calls, the kill event).
    pub lines: Vec<Value>,
    pub stderr: String,
    /// The controller killed (its identity), when the kill line came.
    pub killed: Option<String>,
    /// Slots held by more than one Reserved Reservation (each extra
    /// holder counted).
    pub slot_twice: usize,
    /// Instances' Reserved slots beyond their capacity (summed).
    pub reserved_over: u64,
    /// Instances' bound pods beyond their capacity (summed).
    pub bound_over: u64,
    /// Reservations still undecided after the settling wait.
    pub undecided: usize,
    /// Reserved Reservations whose pod was never bound.
    pub reserved_unbound: usize,
    /// Bound pods whose Reservation does not hold on the node they are
    /// bound to.
    pub bound_unreserved: usize,
    /// Pods bound, from the API.
    pub bound: usize,
    /// Reservations in the API by phase.
    pub phases: BTreeMap<String, usize>,
    /// Writes the stand-in counted during the race: Reservations, their
    /// status, everything.
    pub writes: (u64, u64, u64),
    pub advertised: u64,
    pub real: u64,
}

impl Outcome {
    pub fn over_commit(&self) -> u64 {
        self.slot_twice as u64 + self.reserved_over + self.bound_over
    }

    pub fn stuck(&self) -> usize {
        self.undecided + self.reserved_unbound
    }

    /// Managed Filters that failed, as the peer counted them, and floor
    /// Filters that failed or did not pass every node.
    pub fn filter_errors(&self) -> u64 {
        ["filterErrors", "floorErrors", "floorShort"]
            .iter()
            .map(|k| self.summary[*k].as_u64().unwrap_or(0))
            .sum()
    }

    /// Pods the peer placed.
    pub fn placed(&self) -> u64 {
        self.summary["placed"].as_u64().unwrap_or(0)
    }

    /// Checks what the bar asks of every run: the peer ran through (no
    /// protocol violation, every placed pod bound, the kill seen when one
    /// was asked for), 0 over-commit, 0 stuck, 0 Filter errors, no more
    /// pods placed than slots exist.
    pub fn assert_bar(&self) {
        assert_eq!(self.exit, Some(0), "the peer failed:\n{self:?}");
        assert!(
            self.summary["event"] == "summary",
            "no summary line:\n{self:?}"
        );
        if self.shape.kill_after.is_some() {
            assert!(self.killed.is_some(), "no controller was killed:\n{self:?}");
            assert!(
                self.summary["kill"]["filtersAfter"].as_u64() > Some(0),
                "no Filter answered after the kill:\n{self:?}"
            );
        }
        assert_eq!(self.over_commit(), 0, "over-commit:\n{self:?}");
        assert_eq!(self.stuck(), 0, "stuck reservations:\n{self:?}");
        assert_eq!(self.filter_errors(), 0, "Filter errors:\n{self:?}");
        assert_eq!(
            self.bound_unreserved, 0,
            "pods bound without a Reservation holding there:\n{self:?}"
        );
        assert_eq!(
            self.summary["bindErrors"].as_u64(),
            Some(0),
            "binding failed:\n{self:?}"
        );
        assert_eq!(
            self.placed(),
            self.bound as u64,
            "the peer placed pods the API does not show bound:\n{self:?}"
        );
        assert!(
            self.placed() <= self.real,
            "more pods placed than slots exist:\n{self:?}"
        );
    }

    /// The figures, as lines for a benchmark's output.
    pub fn report(&self, label: &str) -> Vec<String> {
        let s = &self.summary;
        let sh = &self.shape;
        let mut out = Vec::new();
        if let Some(k) = s.get("kill").filter(|k| !k.is_null()) {
            out.push(format!(
                "go race ({label}) leader {} killed after {} Filters answered: longest pause between answered Filters from then on {} ms, first Filter answered {} ms after the kill, {} Filters answered after it; longest Filter {} ms",
                self.killed.as_deref().unwrap_or("?"),
                k["afterFilters"],
                k["longestPauseMs"],
                k["firstAnswerMs"],
                k["filtersAfter"],
                s["managedMaxMs"],
            ));
        }
        out.push(format!(
            "go race ({label}) Filter latency: managed p50={} ms p99={} ms (of them passing a node, n={}: p50={} ms p99={} ms) | floor (unmanaged pod, filtered beside the race, n={}) p50={} ms p99={} ms | managed/floor p99={}x; Filter errors {} {}, floor errors {}, floor answers short of a node {}",
            s["managedP50Ms"],
            s["managedP99Ms"],
            s["passing"],
            s["passingP50Ms"],
            s["passingP99Ms"],
            s["floorSamples"],
            s["floorP50Ms"],
            s["floorP99Ms"],
            s["p99Ratio"],
            s["filterErrors"],
            s["filterErrorsByKind"],
            s["floorErrors"],
            s["floorShort"],
        ));
        out.push(format!(
            "go race ({label}) pods={} instances={}x{} slots seen by {} of {} nodes (advertised {}, real {}), {} schedulers, {} extenders, 2 controllers: placed {} (bound {}) in {} ms = {} pods/s; {} Filters = {} decisions/s; API writes: {} Reservation, {} Reservation status, {} in all; over-commit {} (slot twice {}, reserved over capacity {}, bound over capacity {}); stuck {} (undecided {}, Reserved unbound {}); bound without a holding Reservation {}; Reservations by phase {:?}",
            sh.pods,
            sh.instances,
            sh.capacity,
            sh.seen_by,
            sh.nodes,
            self.advertised,
            self.real,
            s["schedulers"],
            s["extenders"],
            s["placed"],
            self.bound,
            s["elapsedMs"],
            s["placedPerSec"],
            s["filters"],
            s["decisionsPerSec"],
            self.writes.0,
            self.writes.1,
            self.writes.2,
            self.over_commit(),
            self.slot_twice,
            self.reserved_over,
            self.bound_over,
            self.stuck(),
            self.undecided,
            self.reserved_unbound,
            self.bound_unreserved,
            self.phases,
        ));
        out
    }
}

impl fmt::Debug for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for l in self.report("debug") {
            writeln!(f, "{l}")?;
        }
        writeln!(f, "peer exit {:?}", self.exit)?;
        writeln!(f, "--- peer lines")?;
        for l in &self.lines {
            writeln!(f, "{l}")?;
        }
        writeln!(f, "--- summary\n{}", self.summary)?;
        write!(f, "--- peer stderr\n{}", self.stderr)
    }
}

/// The running stand. Dropping it stops the controllers and extenders (the
/// stand-in stops with its last handle).
struct Stand {
    api: ApiServer,
    extenders: Vec<String>,
    /// The controllers by identity; aborting one is its process dying.
    controllers: Mutex<BTreeMap<String, tokio::task::JoinHandle<()>>>,
    /// Each controller's metrics.
    metrics: Vec<ControllerMetrics>,
    stop: CancellationToken,
}

impl Drop for Stand {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Ok(c) = self.controllers.lock() {
            for task in c.values() {
                task.abort();
            }
        }
    }
}

/// The Instances of `shape`: name, capacity, the nodes that see it.
fn instances(shape: &Shape) -> Vec<(String, u32, Vec<String>)> {
    (0..shape.instances)
        .map(|i| {
            let seen = (0..shape.seen_by)
                .map(|k| format!("n{}", (i * shape.seen_by + k) % shape.nodes))
                .collect();
            (format!("cam{i}"), shape.capacity, seen)
        })
        .collect()
}

async fn stand(shape: &Shape, insts: &[(String, u32, Vec<String>)]) -> Stand {
    let api = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": LEASE_NS}})).unwrap();
    Api::<Namespace>::all(api.client())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    for i in 0..shape.nodes {
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": format!("n{i}")}})).unwrap();
        Api::<Node>::all(api.client())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }
    for (name, capacity, seen_by) in insts {
        let spec = InstanceSpec {
            configuration_name: "cams".into(),
            device_id: name.clone(),
            shared: seen_by.len() > 1,
            nodes: seen_by.clone(),
            capacity: *capacity,
            properties: BTreeMap::new(),
            mounts: Vec::new(),
            device_specs: Vec::new(),
            cdi_name: String::new(),
        };
        Api::<Instance>::namespaced(api.client(), NS)
            .create(&PostParams::default(), &Instance::new(name, spec))
            .await
            .unwrap();
    }
    let stop = CancellationToken::new();
    let mut controllers = BTreeMap::new();
    let mut metrics = Vec::new();
    for r in 0..REPLICAS {
        let id = format!("c{r}");
        let mut cfg = ControllerConfig::new(LEASE_NS, &id);
        cfg.resync = Duration::from_millis(200);
        cfg.lease.retry_period = Duration::from_millis(200);
        // Longer than any race: a bound pod's Reservation stays Reserved
        // (no agent here consumes it).
        cfg.ttl = Duration::from_secs(600);
        cfg.decide = Some(DecideConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            advertise: None,
        });
        metrics.push(cfg.metrics.clone());
        let ua = steward_kube::client::user_agent("controller", Some(&id));
        let client = api.client_with_user_agent(&ua).unwrap();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let _ = run(client, cfg, stop).await;
            }
        });
        controllers.insert(id, task);
    }
    let mut extenders = Vec::new();
    for r in 0..REPLICAS {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        extenders.push(format!("http://{}", listener.local_addr().unwrap()));
        let ua = steward_kube::client::user_agent("extender", Some(&format!("e{r}")));
        let client = api.client_with_user_agent(&ua).unwrap();
        let cfg = ExtenderConfig {
            decision_timeout: shape.decision_timeout,
            leader: Some(LeaderLease {
                namespace: LEASE_NS.into(),
                name: LEASE.into(),
            }),
            ..ExtenderConfig::default()
        };
        let ext = Arc::new(Extender::new(client, cfg));
        tokio::spawn(server::serve(listener, ext.clone(), stop.clone()));
        // The race starts once each extender knows where the leader
        // decides (before that its Filters take the API path).
        let until = Instant::now() + Duration::from_secs(60);
        while ext.leader_endpoint().is_none() {
            assert!(Instant::now() < until, "no leader said where it decides");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Stand {
        api,
        extenders,
        controllers: Mutex::new(controllers),
        metrics,
        stop,
    }
}

/// Waits until a controller has built its ledger from the cluster (a new
/// leader first waits out its takeover horizon, then lists): the race
/// measures deciding, not taking the lead.
async fn leader_ready(s: &Stand) {
    let until = Instant::now() + Duration::from_secs(60);
    while s.metrics.iter().all(|m| m.ledger_rebuilds.get() == 0) {
        assert!(Instant::now() < until, "no controller built its ledger");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creates a pending pod asking one slot of `resource` (none: an
/// unmanaged pod) and returns the peer's pod case for it.
async fn pod(api: &ApiServer, name: &str, resource: Option<&str>) -> Value {
    let limits = match resource {
        Some(r) => json!({ r: "1" }),
        None => json!({}),
    };
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]},
    }))
    .unwrap();
    let p = Api::<Pod>::namespaced(api.client(), NS)
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
    json!({
        "namespace": NS, "name": name, "uid": p.metadata.uid.unwrap(),
        "containers": [{"name": "main", "limits": limits}],
    })
}

/// Kills the controller holding the Lease: its task aborted (its decide
/// endpoint closes with it), the Lease left as it is. Returns its identity.
async fn kill_leader(s: &Stand) -> String {
    let lease = Api::<Lease>::namespaced(s.api.client(), LEASE_NS)
        .get(LEASE)
        .await
        .unwrap();
    let holder = lease.spec.and_then(|l| l.holder_identity).unwrap();
    s.controllers
        .lock()
        .unwrap()
        .remove(&holder)
        .unwrap_or_else(|| panic!("the Lease names {holder}, not a running controller"))
        .abort();
    holder
}

/// Runs the race of `shape` with the peer `bin`; see the module docs.
pub async fn race(bin: &Path, shape: Shape) -> Outcome {
    let insts = instances(&shape);
    let s = stand(&shape, &insts).await;
    let advertised: u64 = insts
        .iter()
        .map(|(_, c, n)| u64::from(*c) * n.len() as u64)
        .sum();
    let real: u64 = insts.iter().map(|(_, c, _)| u64::from(*c)).sum();
    let mut pods = Vec::new();
    for i in 0..shape.pods {
        let inst = &insts[i % shape.instances].0;
        pods.push(
            pod(
                &s.api,
                &format!("r{i}"),
                Some(&format!("steward.dev/{inst}")),
            )
            .await,
        );
    }
    let floor = pod(&s.api, "floor", None).await;
    let nodes: Vec<Value> = (0..shape.nodes)
        .map(|i| json!({"name": format!("n{i}")}))
        .collect();
    let managed: Vec<String> = insts
        .iter()
        .map(|(name, _, _)| format!("steward.dev/{name}"))
        .collect();
    // Where the peer asks for the kill.
    let hook = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    // The extender as deploy/scheduler configures it; the peer makes each
    // scheduler call its own replica.
    let scenario = json!({
        "extender": {
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "weight": 5,
            "nodeCacheCapable": true,
            "ignorable": false,
            "managedResources": managed,
            "httpTimeoutSeconds": shape.decision_timeout.as_secs() + 30,
        },
        "nodes": nodes,
        "pods": pods,
        "concurrency": REPLICAS,
        "race": {
            "urlPrefixes": s.extenders,
            "floor": floor,
            "floorIntervalMs": 2,
            "killAfter": shape.kill_after.unwrap_or(0),
            "killHook": format!("http://{}/kill", hook.local_addr().unwrap()),
            "bindUrl": s.api.url(),
        },
    });

    leader_ready(&s).await;
    s.api.reset_stats();
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
        .write_all(&serde_json::to_vec(&scenario).unwrap())
        .await
        .unwrap();
    drop(stdin);
    let mut stderr = child.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut out = String::new();
        let _ = stderr.read_to_string(&mut out).await;
        out
    });
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut lines, mut summary, mut killed) = (Vec::new(), Value::Null, None);
    let read = async {
        let mut hook = Some(hook);
        loop {
            tokio::select! {
                line = stdout.next_line() => {
                    let Some(line) = line.unwrap() else { break };
                    let v: Value =
                        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
                    match v["event"].as_str() {
                        Some("summary") => summary = v,
                        _ => lines.push(v),
                    }
                }
                conn = async { hook.as_ref().unwrap().accept().await }, if hook.is_some() => {
                    // The peer's kill hook: kill, then answer (the answer
                    // is the kill's time for the peer).
                    let (mut conn, _) = conn.unwrap();
                    let mut head = Vec::new();
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        let mut buf = [0u8; 1024];
                        let n = conn.read(&mut buf).await.unwrap();
                        assert!(n > 0, "the kill hook's request ended early");
                        head.extend_from_slice(&buf[..n]);
                    }
                    killed = Some(kill_leader(&s).await);
                    conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                        .await
                        .unwrap();
                    hook = None;
                }
            }
        }
        child.wait().await.unwrap()
    };
    let status = tokio::time::timeout(shape.run_timeout, read)
        .await
        .unwrap_or_else(|_| panic!("the peer did not finish within {:?}", shape.run_timeout));
    let stderr = stderr.await.unwrap_or_default();
    let stats = s.api.stats();

    // Every Reservation settles: wait (bounded) until none is undecided.
    let rs_api = Api::<Reservation>::namespaced(s.api.client(), NS);
    let undecided = |rs: &[Reservation]| {
        rs.iter()
            .filter(|r| {
                r.status
                    .as_ref()
                    .is_none_or(|st| st.phase.is_empty() || st.phase == "Requested")
            })
            .count()
    };
    let settle = Instant::now() + Duration::from_secs(30);
    let rs = loop {
        let rs = rs_api.list(&ListParams::default()).await.unwrap().items;
        if undecided(&rs) == 0 || Instant::now() >= settle {
            break rs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let bound: BTreeMap<String, String> = Api::<Pod>::namespaced(s.api.client(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| Some((p.metadata.name?, p.spec?.node_name?)))
        .collect();

    let capacity: BTreeMap<&str, u64> = insts
        .iter()
        .map(|(n, c, _)| (n.as_str(), u64::from(*c)))
        .collect();
    let mut holders: BTreeMap<&str, usize> = BTreeMap::new();
    let mut reserved: BTreeMap<&str, u64> = BTreeMap::new();
    let mut holds: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut phases: BTreeMap<String, usize> = BTreeMap::new();
    let mut reserved_unbound = 0;
    for r in &rs {
        let phase = r.status.as_ref().map(|st| st.phase.as_str()).unwrap_or("");
        *phases.entry(phase.to_owned()).or_default() += 1;
        let Some(st) = r.status.as_ref().filter(|st| st.phase == "Reserved") else {
            continue;
        };
        for slot in &st.slots {
            *holders.entry(slot).or_default() += 1;
        }
        for (inst, n) in &r.spec.slots {
            *reserved.entry(inst).or_default() += u64::from(*n);
        }
        if let Some(node) = &st.node {
            holds.insert((r.spec.pod.name.as_str(), node.as_str()));
        }
        if !bound.contains_key(&r.spec.pod.name) {
            reserved_unbound += 1;
        }
    }
    let slot_twice = holders.values().map(|n| n.saturating_sub(1)).sum();
    let over = |per: &BTreeMap<&str, u64>| -> u64 {
        per.iter()
            .map(|(inst, n)| n.saturating_sub(capacity.get(inst).copied().unwrap_or(0)))
            .sum()
    };
    // Each pod r<i> asks one slot of cam<i % instances>.
    let mut bound_per: BTreeMap<&str, u64> = BTreeMap::new();
    let mut bound_unreserved = 0;
    for (name, node) in &bound {
        let Some(i) = name.strip_prefix('r').and_then(|i| i.parse::<usize>().ok()) else {
            continue;
        };
        *bound_per.entry(&insts[i % shape.instances].0).or_default() += 1;
        if !holds.contains(&(name.as_str(), node.as_str())) {
            bound_unreserved += 1;
        }
    }
    Outcome {
        exit: status.code(),
        summary,
        lines,
        stderr,
        killed,
        slot_twice,
        reserved_over: over(&reserved),
        bound_over: over(&bound_per),
        undecided: undecided(&rs),
        reserved_unbound,
        bound_unreserved,
        bound: bound.len(),
        phases,
        writes: (
            stats.writes_for("reservations.steward.dev"),
            stats.writes_for("reservations.steward.dev/status"),
            stats.total_writes(),
        ),
        advertised,
        real,
        shape,
    }
}
