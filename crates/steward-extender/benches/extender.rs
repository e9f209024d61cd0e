//! Reservations at scheduling time, measured against the API server
//! stand-in with the real controller and extender over HTTP.
//!
//! * `filter/<n> nodes`: the latency Filter adds per scheduling cycle for a
//!   pod asking for a slot, with `n` candidate nodes: asking the leading
//!   controller directly (the direct path), against the baseline of the
//!   API path (the extender writes the Reservation and waits for the
//!   decision on its shared watch) in the same run, and the floor of the
//!   same HTTP call for a pod steward does not manage (no Reservation, no
//!   wait).
//! * `race`: shared Instances, two "schedulers" (concurrent Filter + bind
//!   loops, each with its own extender) and two controller replicas, on the
//!   API path (the baseline) and then on the direct path; every
//!   pod is filtered until it gets a node or the round ends. Counts
//!   over-commit (more pods bound to an Instance's slots than it has) and
//!   stuck reservations (Reserved for a pod that was never bound), both
//!   must be 0; reports pods placed per second and, as the baseline, how
//!   many pods a scheduler that trusts each node's advertised slots would
//!   have placed that then fail admission.
//!
//! `cargo bench -p steward-extender --bench extender`;
//! `STEWARD_BENCH_SMOKE=1` for a short run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use steward_api::{Instance, InstanceSpec, Reservation};
use steward_extender::{Extender, ExtenderConfig, LeaderLease, server};
use steward_leader::{ControllerConfig, DecideConfig, run};
use steward_testing_apiserver::ApiServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const NS: &str = "default";

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn http(addr: SocketAddr, path: &str, body: &[u8]) -> Value {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    serde_json::from_slice(&out[at..]).unwrap()
}

struct Stand {
    api: ApiServer,
    extenders: Vec<SocketAddr>,
    /// The controllers by identity: aborting one is its process dying
    /// (endpoint closed, Lease not released).
    controllers: std::sync::Mutex<BTreeMap<String, tokio::task::JoinHandle<()>>>,
    stop: CancellationToken,
}

/// The extender's configuration: the direct path to the controllers'
/// leader, or (`direct` false) the API path alone.
fn ext_cfg(direct: bool) -> ExtenderConfig {
    ExtenderConfig {
        leader: direct.then(|| LeaderLease {
            namespace: "steward-system".into(),
            name: "steward-controller".into(),
        }),
        ..ExtenderConfig::default()
    }
}

async fn stand(nodes: usize, instances: &[(String, u32, Vec<String>)], replicas: usize) -> Stand {
    stand_path(nodes, instances, replicas, true).await
}

/// [`stand`] with the extenders on the direct path or (`direct` false) the
/// API path alone.
async fn stand_path(
    nodes: usize,
    instances: &[(String, u32, Vec<String>)],
    replicas: usize,
    direct: bool,
) -> Stand {
    let api = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "steward-system"}})).unwrap();
    Api::<Namespace>::all(api.client())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    for i in 0..nodes {
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": format!("n{i}")}})).unwrap();
        Api::<Node>::all(api.client())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }
    for (name, capacity, seen_by) in instances {
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
    for r in 0..replicas {
        let mut cfg = ControllerConfig::new("steward-system", &format!("c{r}"));
        cfg.resync = Duration::from_millis(200);
        cfg.lease.retry_period = Duration::from_millis(200);
        cfg.decide = Some(DecideConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            advertise: None,
        });
        // Each component names itself, as the binaries do, so the
        // stand-in's counters tell them apart.
        let ua = steward_kube::client::user_agent("controller", Some(&format!("c{r}")));
        let client = api.client_with_user_agent(&ua).unwrap();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let _ = run(client, cfg, stop).await;
            }
        });
        controllers.insert(format!("c{r}"), task);
    }
    let mut extenders = Vec::new();
    for r in 0..replicas {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        extenders.push(listener.local_addr().unwrap());
        let ua = steward_kube::client::user_agent("extender", Some(&format!("e{r}")));
        let client = api.client_with_user_agent(&ua).unwrap();
        let ext = Arc::new(Extender::new(client, ext_cfg(direct)));
        tokio::spawn(server::serve(listener, ext.clone(), stop.clone()));
        // Wait for a leader the extender knows: the first Filter would
        // otherwise measure the election.
        let until = Instant::now() + Duration::from_secs(30);
        while direct && ext.leader_endpoint().is_none() {
            assert!(Instant::now() < until, "no leader said where it decides");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    if !direct {
        // No leader to wait for through the extender: wait for the Lease.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Stand {
        api,
        extenders,
        controllers: std::sync::Mutex::new(controllers),
        stop,
    }
}

async fn pod(api: &ApiServer, name: &str, resource: Option<&str>) -> Pod {
    let limits = match resource {
        Some(r) => json!({ r: "1" }),
        None => json!({}),
    };
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(api.client(), NS)
        .create(&PostParams::default(), &p)
        .await
        .unwrap()
}

/// Filter latency with `nodes` candidates for a managed pod, asking the
/// leader directly and, as the baseline, on the API path (the extender
/// writes the Reservation and waits on its shared watch), interleaved pod
/// by pod against one controller; and the floor, the same call for an
/// unmanaged pod.
async fn filter_latency(nodes: usize, pods: usize) -> Duration {
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
    // One Instance seen by every node, with a slot per managed pod.
    let s = stand(nodes, &[("cam".into(), 2 * pods as u32, names.clone())], 1).await;
    let direct = s.extenders[0];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_path = listener.local_addr().unwrap();
    let ua = steward_kube::client::user_agent("extender", Some("api-path"));
    tokio::spawn(server::serve(
        listener,
        Arc::new(Extender::new(
            s.api.client_with_user_agent(&ua).unwrap(),
            ext_cfg(false),
        )),
        s.stop.clone(),
    ));
    let (mut watch, mut poll, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..pods {
        for (addr, name, out) in [
            (direct, format!("d{i}"), &mut watch),
            (api_path, format!("a{i}"), &mut poll),
        ] {
            let p = pod(&s.api, &name, Some("steward.dev/cam")).await;
            let body =
                serde_json::to_vec(&json!({"Pod": p, "Nodes": null, "NodeNames": names})).unwrap();
            let t = Instant::now();
            let r = http(addr, "/filter", &body).await;
            out.push(t.elapsed());
            assert_eq!(
                r["NodeNames"].as_array().map(Vec::len),
                Some(1),
                "{name}: {r}"
            );
        }
        let q = pod(&s.api, &format!("q{i}"), None).await;
        let body =
            serde_json::to_vec(&json!({"Pod": q, "Nodes": null, "NodeNames": names})).unwrap();
        let t = Instant::now();
        let _ = http(direct, "/filter", &body).await;
        floor.push(t.elapsed());
    }
    for v in [&mut watch, &mut poll, &mut floor] {
        v.sort();
    }
    let p50 = |v: &[Duration]| pct(v, 0.5).as_secs_f64().max(1e-9);
    let p99 = |v: &[Duration]| pct(v, 0.99).as_secs_f64().max(1e-9);
    let decided_per_s = pods as f64 / watch.iter().sum::<Duration>().as_secs_f64();
    println!(
        "filter/{nodes} nodes n={pods} direct p50={:.2?} p99={:.2?} | baseline API path p50={:.2?} p99={:.2?} | floor (unmanaged pod) p50={:.2?} p99={:.2?} | direct/floor p50={:.1}x p99={:.1}x, API path/floor p50={:.1}x p99={:.1}x; {decided_per_s:.0} reservations decided/s (sequential)",
        pct(&watch, 0.5),
        pct(&watch, 0.99),
        pct(&poll, 0.5),
        pct(&poll, 0.99),
        pct(&floor, 0.5),
        pct(&floor, 0.99),
        p50(&watch) / p50(&floor),
        p99(&watch) / p99(&floor),
        p50(&poll) / p50(&floor),
        p99(&poll) / p99(&floor),
    );
    s.stop.cancel();
    pct(&floor, 0.99)
}

/// The API write no decision can avoid, measured alone: `count`
/// Reservations (one candidate each) created on the stand-in at `rate` per
/// second, every create its own request in flight, with `watchers` watches
/// of all Reservations open (two controllers and two extenders watch them).
/// Reports the create's latency and the echo (create sent → the first
/// watcher has the object), beside `floor_p99`, the unmanaged Filter's p99
/// measured in the same run: if one write alone is near 3× the floor, no
/// protocol that persists a decision before answering can meet 3×.
async fn write_probe(count: usize, rate: u32, watchers: usize, floor_p99: Duration) {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::StreamExt;
    use kube::runtime::watcher;
    use steward_api::ReservationSpec;

    let s = stand(1, &[], 0).await;
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let echoes: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let seen: Arc<Vec<AtomicUsize>> =
        Arc::new((0..watchers).map(|_| AtomicUsize::new(0)).collect());
    let mut watches = Vec::new();
    for w in 0..watchers {
        let (sent, echoes, seen) = (sent.clone(), echoes.clone(), seen.clone());
        let mut stream = steward_kube::follow(
            Api::<Reservation>::all(s.api.client()),
            watcher::Config::default(),
        )
        .boxed();
        watches.push(tokio::spawn(async move {
            while let Some(c) = stream.next().await {
                if let steward_kube::Change::Applied(r) = c {
                    seen[w].fetch_add(1, Ordering::Relaxed);
                    if w == 0
                        && let Some(at) = sent.lock().unwrap().get(&r.spec.pod.name)
                    {
                        echoes.lock().unwrap().push(at.elapsed());
                    }
                }
            }
        }));
    }
    // Every watch listed before the first write.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    let started = Instant::now();
    let mut creates = Vec::new();
    for i in 0..count {
        tick.tick().await;
        let name = format!("probe{i}");
        let spec = ReservationSpec {
            pod: steward_api::PodRef {
                namespace: NS.into(),
                name: name.clone(),
                uid: format!("uid-{i}"),
            },
            slots: BTreeMap::from([("cam".to_owned(), 1)]),
            exclusive_cpus: 0,
            candidates: vec!["n0".into()],
            cancel: None,
        };
        let api = Api::<Reservation>::namespaced(s.api.client(), NS);
        let sent = sent.clone();
        creates.push(tokio::spawn(async move {
            let t = Instant::now();
            sent.lock().unwrap().insert(name.clone(), t);
            api.create(&PostParams::default(), &Reservation::new(&name, spec))
                .await
                .unwrap();
            t.elapsed()
        }));
    }
    let mut lat = Vec::new();
    for c in creates {
        lat.push(c.await.unwrap());
    }
    let offered = started.elapsed();
    let until = Instant::now() + Duration::from_secs(30);
    while seen.iter().any(|n| n.load(Ordering::Relaxed) < count) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let delivered: Vec<usize> = seen.iter().map(|n| n.load(Ordering::Relaxed)).collect();
    for w in watches {
        w.abort();
    }
    lat.sort();
    let mut echo = echoes.lock().unwrap().clone();
    echo.sort();
    let ratio = |d: Duration| d.as_secs_f64() / floor_p99.as_secs_f64().max(1e-9);
    println!(
        "write-probe creates={count} at {rate}/s (offered in {offered:.2?}) watchers={watchers} (events each {delivered:?}): create p50={:.2?} p99={:.2?} | echo to a watcher p50={:.2?} p99={:.2?} | unmanaged Filter p99 (floor) {floor_p99:.2?}: create p99 = {:.1}x floor, create+echo p99 = {:.1}x floor",
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&echo, 0.5),
        pct(&echo, 0.99),
        ratio(pct(&lat, 0.99)),
        ratio(pct(&echo, 0.99)),
    );
    assert!(
        delivered.iter().all(|n| *n >= count),
        "a watcher missed a write: {delivered:?}"
    );
    s.stop.cancel();
}

/// Two schedulers, two controllers, shared Instances; see the module docs.
/// `direct`: the extenders ask the leader directly (else the API path).
async fn race(
    pods: usize,
    instances: usize,
    capacity: u32,
    nodes: usize,
    seen_by: usize,
    direct: bool,
    kill: bool,
) {
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
    let insts: Vec<(String, u32, Vec<String>)> = (0..instances)
        .map(|i| {
            let seen = (0..seen_by)
                .map(|k| names[(i * seen_by + k) % nodes].clone())
                .collect();
            (format!("cam{i}"), capacity, seen)
        })
        .collect();
    let s = Arc::new(stand_path(nodes, &insts, 2, direct).await);
    let advertised: u64 = insts
        .iter()
        .map(|(_, c, n)| u64::from(*c) * n.len() as u64)
        .sum();
    let real: u64 = insts.iter().map(|(_, c, _)| u64::from(*c)).sum();
    let mut all = Vec::new();
    for i in 0..pods {
        let inst = &insts[i % instances].0;
        all.push(
            pod(
                &s.api,
                &format!("r{i}"),
                Some(&format!("steward.dev/{inst}")),
            )
            .await,
        );
    }
    // The floor, under the race's load: an unmanaged pod filtered over and
    // over beside the schedulers (steward writes nothing for it).
    let unmanaged = pod(&s.api, "floor", None).await;
    s.api.reset_stats();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(if pods > 200 { 120 } else { 30 });
    let racing = CancellationToken::new();
    // With `kill`: the leading controller dies once half the pods are
    // filtered.
    let filtered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let killer = kill.then(|| {
        let (s, filtered) = (s.clone(), filtered.clone());
        tokio::spawn(async move {
            while filtered.load(std::sync::atomic::Ordering::Relaxed) < pods / 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
                s.api.client(),
                "steward-system",
            )
            .get("steward-controller")
            .await
            .unwrap();
            let holder = lease.spec.unwrap().holder_identity.unwrap();
            s.controllers
                .lock()
                .unwrap()
                .remove(&holder)
                .unwrap()
                .abort();
            Instant::now()
        })
    });
    let floor_task = {
        let (s, names, racing) = (s.clone(), names.clone(), racing.clone());
        tokio::spawn(async move {
            let body =
                serde_json::to_vec(&json!({"Pod": unmanaged, "Nodes": null, "NodeNames": names}))
                    .unwrap();
            let mut lat = Vec::new();
            while !racing.is_cancelled() {
                let t = Instant::now();
                let r = http(s.extenders[0], "/filter", &body).await;
                lat.push(t.elapsed());
                assert_eq!(r["NodeNames"].as_array().map(Vec::len), Some(names.len()));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            lat
        })
    };
    // Each scheduler takes every other pod; both run at once.
    let mut tasks = Vec::new();
    for sched in 0..2 {
        let s = s.clone();
        let mine: Vec<Pod> = all.iter().skip(sched).step_by(2).cloned().collect();
        let names = names.clone();
        let filtered = filtered.clone();
        tasks.push(tokio::spawn(async move {
            let addr = s.extenders[sched];
            let mut done = Vec::new();
            let (mut placed, mut answered) = (0usize, 0usize);
            let (mut lat, mut errors, mut undecided) = (Vec::new(), 0usize, 0usize);
            // One pass: each Filter awaits its decision, so afterwards every
            // pod is Reserved (and bound here) or Rejected.
            for p in mine {
                if Instant::now() >= deadline {
                    break;
                }
                let body =
                    serde_json::to_vec(&json!({"Pod": p, "Nodes": null, "NodeNames": names}))
                        .unwrap();
                let t = Instant::now();
                let r = http(addr, "/filter", &body).await;
                lat.push(t.elapsed());
                done.push(Instant::now());
                filtered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                answered += 1;
                if r["Error"].as_str().is_some_and(|e| !e.is_empty()) {
                    errors += 1;
                }
                if r.to_string().contains("did not decide within") {
                    undecided += 1;
                }
                if let Some(node) = r["NodeNames"]
                    .as_array()
                    .and_then(|a| a.first())
                    .and_then(Value::as_str)
                {
                    let name = p.metadata.name.clone().unwrap();
                    let binding = json!({"apiVersion": "v1", "kind": "Binding",
                        "metadata": {"name": name}, "target": {"kind": "Node", "name": node}});
                    let _: Value = Api::<Pod>::namespaced(s.api.client(), NS)
                        .create_subresource("binding", &name, &PostParams::default(), &binding)
                        .await
                        .unwrap();
                    placed += 1;
                }
            }
            (placed, answered, lat, errors, undecided, done)
        }));
    }
    let (mut placed, mut answered) = (0, 0);
    let (mut lat, mut errors, mut undecided, mut done) = (Vec::new(), 0, 0, Vec::new());
    for t in tasks {
        let (p, a, l, e, u, d) = t.await.unwrap();
        placed += p;
        answered += a;
        lat.extend(l);
        errors += e;
        undecided += u;
        done.extend(d);
    }
    let killed = match killer {
        Some(k) => Some(k.await.unwrap()),
        None => None,
    };
    let elapsed = started.elapsed();
    racing.cancel();
    let mut floor = floor_task.await.unwrap();
    lat.sort();
    floor.sort();
    let p99 = |v: &[Duration]| pct(v, 0.99).as_secs_f64().max(1e-9);
    let label = match (direct, kill) {
        (true, true) => "direct, leader killed",
        (true, false) => "direct",
        (false, true) => "API path, leader killed",
        (false, false) => "API path",
    };
    if let Some(at) = killed {
        // The decision gap: the longest pause between two answered
        // Filters around the kill.
        done.sort();
        let gap = done
            .windows(2)
            .filter(|w| w[1] >= at)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        let after = done.iter().find(|d| **d >= at).map(|d| *d - at);
        println!(
            "race ({label}) the leader died after {} Filters: longest pause between answered Filters from then on {gap:.2?}, first Filter answered {after:.2?} after the kill; longest Filter {:.2?}",
            pods / 2,
            lat.last().copied().unwrap_or_default(),
        );
    }
    println!(
        "race ({}) Filter latency: managed p50={:.2?} p99={:.2?} | floor (unmanaged pod, filtered beside the race, n={}) p50={:.2?} p99={:.2?} | managed/floor p99={:.1}x; Filter errors {errors}, not decided in time {undecided}",
        label,
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        floor.len(),
        pct(&floor, 0.5),
        pct(&floor, 0.99),
        p99(&lat) / p99(&floor),
    );
    let stats = s.api.stats();
    // Over-commit: reserved slots per Instance against its capacity, and
    // every slot reserved once.
    let rs = Api::<Reservation>::namespaced(s.api.client(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut per_slot: BTreeMap<String, usize> = BTreeMap::new();
    let mut stuck = 0;
    let bound: BTreeMap<String, Option<String>> = Api::<Pod>::namespaced(s.api.client(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.spec.and_then(|s| s.node_name),
            )
        })
        .collect();
    for r in &rs {
        if let Some(st) = &r.status
            && st.phase == "Reserved"
        {
            for slot in &st.slots {
                *per_slot.entry(slot.clone()).or_default() += 1;
            }
            if bound.get(&r.spec.pod.name).is_none_or(Option::is_none) {
                stuck += 1;
            }
        }
    }
    let over_commit: usize = per_slot.values().map(|n| n.saturating_sub(1)).sum();
    let bound_count = bound.values().filter(|n| n.is_some()).count();
    let trusting = (pods as u64).min(advertised);
    let would_fail = trusting.saturating_sub(real);
    println!(
        "race ({label}) pods={pods} instances={instances}x{capacity} slots seen by {seen_by} of {nodes} nodes (advertised {advertised}, real {real}): placed {placed} (bound {bound_count}) in {:.2?} = {:.0} pods/s; {answered} Filters answered = {:.0} decisions/s; API writes: {} Reservation, {} Reservation status, {} in all; over-commit {over_commit}; stuck {stuck}; baseline without the extender: {trusting} pods placed on advertised slots, {would_fail} of them would fail admission",
        elapsed,
        placed as f64 / elapsed.as_secs_f64(),
        answered as f64 / elapsed.as_secs_f64(),
        stats.writes_for("reservations.steward.dev"),
        stats.writes_for("reservations.steward.dev/status"),
        stats.total_writes(),
    );
    // What the race cost the API server, per pod filtered (the controllers
    // and extenders of both replicas together).
    let per_pod = |n: u64| n as f64 / pods as f64;
    let mut cost = Vec::new();
    for c in ["steward-controller", "steward-extender"] {
        cost.push(format!(
            "{c} {:.1} requests ({:.1} writes), {:.1} watch events ({:.1} KB)",
            per_pod(stats.requests_by(c)),
            per_pod(
                ["create", "update", "patch", "delete"]
                    .iter()
                    .map(|v| stats.requests_by_verb(c, v))
                    .sum()
            ),
            per_pod(stats.watch_events_by(c)),
            per_pod(stats.watch_bytes_by(c)) / 1000.0,
        ));
    }
    println!(
        "race api cost per pod filtered ({pods} pods, 2 replicas each): {}",
        cost.join("; ")
    );
    assert!(
        stats.requests_by("steward-controller") > 0,
        "the controllers named themselves"
    );
    assert_eq!(over_commit, 0, "a slot reserved twice");
    assert_eq!(
        stuck, 0,
        "a reservation held for a pod that was never bound"
    );
    assert!(placed as u64 <= real, "more pods placed than slots exist");
    s.stop.cancel();
}

fn main() {
    if std::env::var_os("STEWARD_BENCH_TRACE").is_some() {
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::stderr)
            .init();
    }
    let smoke = std::env::var_os("STEWARD_BENCH_SMOKE").is_some();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if smoke {
            let floor = filter_latency(50, 5).await;
            write_probe(20, 300, 4, floor).await;
            race(20, 2, 2, 6, 3, false, false).await;
            race(20, 2, 2, 6, 3, true, false).await;
            race(20, 2, 2, 6, 3, true, true).await;
        } else if std::env::var("STEWARD_BENCH_ONLY").as_deref() == Ok("race") {
            // One section alone, e.g. to profile it.
            race(1000, 50, 2, 50, 3, false, false).await;
            race(1000, 50, 2, 50, 3, true, false).await;
            race(1000, 50, 2, 50, 3, true, true).await;
        } else {
            filter_latency(50, 200).await;
            let floor = filter_latency(500, 200).await;
            write_probe(3000, 300, 4, floor).await;
            filter_latency(5000, 100).await;
            race(1000, 50, 2, 50, 3, false, false).await;
            race(1000, 50, 2, 50, 3, true, false).await;
            race(1000, 50, 2, 50, 3, true, true).await;
        }
    });
}
