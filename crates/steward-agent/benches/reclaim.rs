//! Reclaim and Allocate latency of the device plugins, through the real
//! wires: two agents (node-a, node-b) sharing one device with one slot, two
//! kubelet stand-ins, one API server stand-in.
//!
//! * `reclaim/event-driven`: a pod on node-a holding the slot is deleted
//!   (or reaches Succeeded) → the slot is Healthy again on node-b's
//!   ListAndWatch stream, as node-b's kubelet stand-in sees it.
//! * `reclaim/poll-baseline`: the periodic reconciliation this replaces
//!   (a 10 s poll that frees a slot once it has been seen unused for a 20 s
//!   grace), computed analytically on the very deletion instants of the run:
//!   freed at the first tick after `deleted + grace` counted from the first
//!   tick that saw the slot unused.
//! * `allocate`: Allocate rpc as node-a's kubelet stand-in times it while
//!   admitting pods onto fresh slots of a shared Instance with 1,024 slots
//!   (local fsync'd claim + cluster claim, both before the answer); every
//!   pod stays Running, so each claim is bound to its pod and kept. Also
//!   SlotClaim writes per allocation (create + bind).
//!
//! `STEWARD_BENCH_SMOKE=1` runs 20 pods instead of 1,000.
//! `STEWARD_BENCH_POD_RESOURCES=slots` also runs each agent's pod resources
//! server fed by its slot ledger; `=all` adds kubelet's report (polled every
//! second, pods resolved through a second pod watch) — to measure what the
//! node view costs the Allocate and reclaim paths.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, PostParams};
use steward_agent::deviceplugin::DevicePluginConfig;
use steward_agent::{AgentConfig, AgentTimings, Mode};
use steward_api::{Configuration, ConfigurationSpec, Instance};
use steward_discovery::DiscoveryHandler;
use steward_discovery::handlers::debug_echo::DebugEcho;
use steward_testing_apiserver::ApiServer;
use steward_testing_kubelet::{ContainerSpec, Kubelet, KubeletConfig, Phase, PodSpec};

const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(30);
const POLL: f64 = 10.0;
const GRACE: f64 = 20.0;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn summary(name: &str, mut v: Vec<f64>, unit: &str, extra: &str) {
    v.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{name} p50={:.3}{unit} p99={:.3}{unit} max={:.3}{unit} n={}{extra}",
        percentile(&v, 50.0),
        percentile(&v, 99.0),
        v.last().copied().unwrap_or(f64::NAN),
        v.len()
    );
}

fn agent_config(
    node: &str,
    dir: &Path,
    client: kube::Client,
    handlers: Vec<Arc<dyn DiscoveryHandler>>,
) -> AgentConfig {
    let mut cfg = AgentConfig::new(
        node,
        dir.join(format!("{node}-state")),
        dir.join(format!("{node}-agent.sock")),
        Mode::Kubernetes(client),
    );
    cfg.embedded_handlers = handlers;
    cfg.timings = AgentTimings {
        tick_interval: Duration::from_millis(200),
        file_poll_interval: Duration::from_millis(200),
        max_conflict_retries: 8,
    };
    let mut dp = DevicePluginConfig::new(dir.join(format!("{node}-kubelet")), None);
    dp.poll = Duration::from_millis(100);
    cfg.device_plugins = Some(dp);
    if let Ok(view) = std::env::var("STEWARD_BENCH_POD_RESOURCES") {
        let mut pr = steward_agent::pod_resources::PodResourcesConfig::new(
            dir.join(format!("{node}-pod-resources.sock")),
        );
        if view == "all" {
            pr.kubelet_socket = Some(
                dir.join(format!("{node}-kubelet"))
                    .join("pod-resources")
                    .join("kubelet.sock"),
            );
            pr.kubelet_poll = Duration::from_secs(1);
        }
        cfg.pod_resources = Some(pr);
    }
    cfg
}

async fn instance_named(server: &ApiServer, config: &str, nodes: usize) -> Instance {
    let api: Api<Instance> = Api::namespaced(server.client(), NS);
    let deadline = Instant::now() + WAIT;
    loop {
        let items = api.list(&ListParams::default()).await.unwrap().items;
        if let Some(i) = items
            .into_iter()
            .find(|i| i.spec.configuration_name == config && i.spec.nodes.len() == nodes)
        {
            return i;
        }
        assert!(Instant::now() < deadline, "no instance of {config}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn configure(server: &ApiServer, name: &str, capacity: u32) {
    let mut c = Configuration::new(
        name,
        ConfigurationSpec::new("debug-echo", format!("descriptions: [{name}-dev]\n")),
    );
    c.metadata.namespace = Some(NS.into());
    c.spec.capacity = capacity;
    Api::<Configuration>::namespaced(server.client(), NS)
        .create(&PostParams::default(), &c)
        .await
        .unwrap();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Ok(filter) = std::env::var("STEWARD_BENCH_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .try_init();
    }
    let smoke = std::env::var_os("STEWARD_BENCH_SMOKE").is_some();
    let pods = std::env::var("STEWARD_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 20 } else { 1000 });
    let server = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(server.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let mut kubelets = Vec::new();
    let mut agents = Vec::new();
    let shared = DebugEcho::new(true);
    for node in ["node-a", "node-b"] {
        kubelets.push(
            Kubelet::start(KubeletConfig {
                root_dir: dir.path().join(format!("{node}-kubelet")),
                node_name: node.into(),
                api: Some(server.client()),
            })
            .await
            .unwrap(),
        );
        let cfg = agent_config(
            node,
            dir.path(),
            server.client(),
            vec![Arc::new(shared.clone())],
        );
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        agents.push((
            tx,
            tokio::spawn(steward_agent::run(cfg, async move {
                let _ = rx.await;
            })),
        ));
    }
    configure(&server, "bench", 1).await;
    let inst = instance_named(&server, "bench", 2).await;
    let name = inst.metadata.name.clone().unwrap();
    let res = format!("steward.dev/{name}");
    let slot = format!("{name}-0");
    for k in &kubelets {
        k.wait_for_resource(&res, |s| s.healthy.contains(&slot), WAIT)
            .await
            .unwrap();
    }
    let (a, b) = (&kubelets[0], &kubelets[1]);
    let claims: Api<steward_api::SlotClaim> = Api::namespaced(server.client(), NS);

    // --- reclaim ---------------------------------------------------------
    let origin = Instant::now();
    let mut deleted = Vec::new();
    let mut terminated = Vec::new();
    let mut poll_model = Vec::new();
    for i in 0..pods {
        let admitted = a
            .add_pod(
                PodSpec::new(NS, format!("p{i}"))
                    .container(ContainerSpec::new("main").limit(&res, 1)),
            )
            .await
            .unwrap_or_else(|e| panic!("pod {i} refused: {e}"));
        b.wait_for_resource(&res, |s| s.unhealthy.contains(&slot), WAIT)
            .await
            .unwrap();
        // A running pod: kubelet's pod resources have attributed the slot
        // to it (a pod deleted before that is reclaimed by the pending
        // timeout instead, see the crate docs).
        let deadline = Instant::now() + WAIT;
        loop {
            let claim = claims.get_opt(&slot).await.unwrap();
            if claim.is_some_and(|c| c.spec.pod.is_some_and(|p| p.uid == admitted.uid)) {
                break;
            }
            assert!(Instant::now() < deadline, "pod {i} never attributed");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let t0 = Instant::now();
        let terminate = i % 2 == 1;
        if terminate {
            a.terminate_pod(&admitted.uid, Phase::Succeeded)
                .await
                .unwrap();
        } else {
            a.delete_pod(&admitted.uid).await.unwrap();
        }
        b.wait_for_resource(&res, |s| s.healthy.contains(&slot), WAIT)
            .await
            .unwrap_or_else(|e| {
                panic!("pod {i} (terminated: {terminate}): slot not Healthy on node-b: {e}")
            });
        let took = t0.elapsed().as_secs_f64() * 1e3;
        if terminate {
            terminated.push(took);
            a.delete_pod(&admitted.uid).await.unwrap();
        } else {
            deleted.push(took);
        }
        // Poll baseline on the same instant: ticks every POLL seconds from
        // the origin; the first tick after the delete sees the slot unused,
        // it is freed at the first tick GRACE seconds later.
        let t = t0.duration_since(origin).as_secs_f64();
        let first_seen = (t / POLL).floor() * POLL + POLL;
        let freed = first_seen + (GRACE / POLL).ceil() * POLL;
        poll_model.push((freed - t) * 1e3);
    }
    let all: Vec<f64> = deleted.iter().chain(&terminated).copied().collect();
    summary("reclaim/event-driven", all, "ms", "");
    summary("reclaim/event-driven/deleted", deleted, "ms", "");
    summary("reclaim/event-driven/terminated", terminated, "ms", "");
    summary(
        "reclaim/poll-baseline",
        poll_model,
        "ms",
        " (analytic: 10 s poll + 20 s grace on this run's deletion instants)",
    );

    // --- allocate --------------------------------------------------------
    // Pods behind the Allocates: node-a's kubelet stand-in admits each pod
    // (Allocate over the plugin socket) and keeps it Running, so its slot is
    // attributed and stays held. The figure is the Allocate rpc as kubelet
    // itself times it (its device_plugin_alloc_duration_seconds).
    let allocs = pods.min(1000);
    configure(&server, "alloc", 1024).await;
    let inst = instance_named(&server, "alloc", 2).await;
    let alloc_name = inst.metadata.name.clone().unwrap();
    let alloc_res = format!("steward.dev/{alloc_name}");
    a.wait_for_resource(&alloc_res, |s| s.healthy.len() == 1024, WAIT)
        .await
        .unwrap();
    let before = server.stats();
    let mut uids = Vec::with_capacity(allocs);
    for n in 0..allocs {
        let admitted = a
            .add_pod(
                PodSpec::new(NS, format!("alloc-{n}"))
                    .container(ContainerSpec::new("main").limit(&alloc_res, 1)),
            )
            .await
            .unwrap_or_else(|e| panic!("pod alloc-{n} refused: {e}"));
        uids.push(admitted.uid);
    }
    // Every claim bound to its pod: the writes below are the whole cost.
    let deadline = Instant::now() + WAIT;
    loop {
        let bound = claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|c| c.spec.pod.as_ref().is_some_and(|p| uids.contains(&p.uid)))
            .count();
        if bound == allocs {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{bound} of {allocs} claims bound to their pods"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = server.stats();
    let claim_writes =
        after.writes_for("slotclaims.steward.dev") - before.writes_for("slotclaims.steward.dev");
    let lat: Vec<f64> = a
        .allocate_durations(&alloc_res)
        .iter()
        .map(|d| d.as_secs_f64() * 1e3)
        .collect();
    assert_eq!(lat.len(), allocs, "one Allocate per admitted pod");
    summary(
        "allocate",
        lat,
        "ms",
        &format!(
            " claim-writes/alloc={:.2} (pods Running behind every Allocate)",
            claim_writes as f64 / allocs as f64
        ),
    );
    for (tx, join) in agents {
        let _ = tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), join).await;
    }
}
