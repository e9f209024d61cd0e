//! Slot-claim write models against the API server stand-in, through the real
//! kube client:
//!
//! * `per-slot-object` — one `SlotClaim` per slot ([`KubeClaimStore`]);
//! * `instance-status` — usage entries in `Instance.status.slots`, updated
//!   read-modify-write under `resourceVersion` ([`InstanceStatusClaimStore`];
//!   the stand-in has no server-side apply, so SSA is not measured).
//!
//! For each: (a) single-node claim latency of Allocate (pending claim), bind
//! (holder known) and release; (b) API write requests per allocation cycle
//! (allocate + bind + release) from the stand-in's counters, and the Instance
//! watch events the cycle causes; (c) 100 nodes racing for the 10 slots of
//! one shared device: grants (verified by listing), settle time, 409s.
//!
//! `cargo bench -p steward-agent --bench claims`; `STEWARD_BENCH_SMOKE=1`
//! runs a few iterations only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
#[path = "support/instance_status.rs"]
mod instance_status;
use instance_status::InstanceStatusClaimStore;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::watcher;
use steward_agent::claims::{
    ClaimError, ClaimStore, ClaimStoreStats, ClaimWrite, InstanceDirectory, KubeClaimStore,
};
use steward_api::{Instance, InstanceSpec, SlotClaim};
use steward_core::Millis;
use steward_core::ledger::{Holder, Holding, PodRef};
use steward_core::slots::Claim;
use steward_testing_apiserver::ApiServer;

const NS: &str = "default";
const RACE_NODES: usize = 100;
const RACE_SLOTS: u32 = 10;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Model {
    PerSlotObject,
    InstanceStatus,
}

impl Model {
    fn name(self) -> &'static str {
        match self {
            Model::PerSlotObject => "per-slot-object",
            Model::InstanceStatus => "instance-status",
        }
    }
}

/// One node's store of either model.
#[derive(Clone)]
enum Store {
    Object(KubeClaimStore),
    Status(InstanceStatusClaimStore),
}

impl Store {
    fn new(model: Model, client: kube::Client, dir: InstanceDirectory) -> Self {
        match model {
            Model::PerSlotObject => Store::Object(KubeClaimStore::new(client, dir)),
            Model::InstanceStatus => Store::Status(InstanceStatusClaimStore::new(client, dir)),
        }
    }

    async fn write(&self, c: &Claim) -> Result<ClaimWrite, ClaimError> {
        match self {
            Store::Object(s) => s.write(c).await,
            Store::Status(s) => s.write(c).await,
        }
    }

    async fn delete(&self, slot: &str, node: &str, epoch: u64) -> Result<(), ClaimError> {
        match self {
            Store::Object(s) => s.delete(slot, node, epoch).await,
            Store::Status(s) => s.delete(slot, node, epoch).await,
        }
    }

    async fn list(&self) -> Result<Vec<Claim>, ClaimError> {
        match self {
            Store::Object(s) => s.list().await,
            Store::Status(s) => s.list().await,
        }
    }

    fn stats(&self) -> ClaimStoreStats {
        match self {
            Store::Object(s) => s.stats(),
            Store::Status(s) => s.stats(),
        }
    }
}

async fn server_with_instance(name: &str, capacity: u32) -> (ApiServer, Instance) {
    let server = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(server.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let inst = Instance {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: InstanceSpec {
            configuration_name: "cfg".into(),
            device_id: format!("dev-{name}"),
            shared: true,
            nodes: (0..RACE_NODES).map(|n| format!("node-{n:03}")).collect(),
            capacity,
            properties: BTreeMap::new(),
            mounts: Vec::new(),
            device_specs: Vec::new(),
            cdi_name: format!("steward.dev/cfg={name}"),
        },
        status: None,
    };
    let inst = Api::<Instance>::namespaced(server.client(), NS)
        .create(&PostParams::default(), &inst)
        .await
        .unwrap();
    (server, inst)
}

fn pending(node: &str, slot: &str, epoch: u64) -> Claim {
    Claim {
        node: node.into(),
        epoch,
        holding: Holding::pending(slot, Millis(epoch)),
        awaiting: Some(Millis(epoch)),
    }
}

fn held(node: &str, slot: &str, epoch: u64, i: usize) -> Claim {
    let pod = PodRef::new(format!("uid-{i}"), "apps", format!("pod-{i}"));
    Claim {
        node: node.into(),
        epoch,
        holding: Holding::held(slot, Holder::new(pod, Some("main".into())), Millis(epoch)),
        awaiting: None,
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx]
}

fn ms(d: Duration) -> String {
    format!("{:.3}ms", d.as_secs_f64() * 1e3)
}

/// Counts Instance watch events (what every Instance watcher, e.g. each
/// node's discovery, receives) until dropped.
fn count_instance_events(client: kube::Client) -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let n = Arc::new(AtomicU64::new(0));
    let counter = n.clone();
    let task = tokio::spawn(async move {
        let api = Api::<Instance>::all(client);
        let mut s = Box::pin(watcher::watcher(api, watcher::Config::default()));
        while let Some(ev) = s.next().await {
            if let Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) = ev {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    (n, task)
}

/// (a) + (b): one node, `iters` cycles of allocate → bind → release.
async fn single_node(model: Model, iters: usize) {
    let (server, _inst) = server_with_instance("cam", 8).await;
    let store = Store::new(model, server.client(), InstanceDirectory::new());
    // Warm up (connection, Instance lookup).
    store.write(&pending("node-a", "cam-7", 1)).await.unwrap();
    store.delete("cam-7", "node-a", 1).await.unwrap();
    let (events, watch) = count_instance_events(server.client());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let events_before = events.load(Ordering::Relaxed);
    server.reset_stats();

    let mut alloc = Vec::with_capacity(iters);
    let mut bind = Vec::with_capacity(iters);
    let mut release = Vec::with_capacity(iters);
    let mut epoch = 10;
    for i in 0..iters {
        let slot = format!("cam-{}", i % 4);
        epoch += 1;
        let t = Instant::now();
        assert_eq!(
            store.write(&pending("node-a", &slot, epoch)).await.unwrap(),
            ClaimWrite::Written
        );
        alloc.push(t.elapsed());
        epoch += 1;
        let t = Instant::now();
        assert_eq!(
            store.write(&held("node-a", &slot, epoch, i)).await.unwrap(),
            ClaimWrite::Written
        );
        bind.push(t.elapsed());
        let t = Instant::now();
        store.delete(&slot, "node-a", epoch).await.unwrap();
        release.push(t.elapsed());
    }
    let stats = server.stats();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let instance_events = events.load(Ordering::Relaxed) - events_before;
    watch.abort();
    assert!(store.list().await.unwrap().is_empty());

    for v in [&mut alloc, &mut bind, &mut release] {
        v.sort();
    }
    let n = iters as f64;
    let per_resource: Vec<String> = stats
        .writes
        .iter()
        .map(|(r, w)| format!("{r}:{:.2}", *w as f64 / n))
        .collect();
    println!(
        "claims/{} allocate p50={} p99={} max={} bind p50={} p99={} release p50={} p99={} \
         writes/alloc={:.2} (allocate+bind+release; {}) requests/alloc={:.2} instance-watch-events/alloc={:.2} iters={iters}",
        model.name(),
        ms(pct(&alloc, 0.50)),
        ms(pct(&alloc, 0.99)),
        ms(pct(&alloc, 1.0)),
        ms(pct(&bind, 0.50)),
        ms(pct(&bind, 0.99)),
        ms(pct(&release, 0.50)),
        ms(pct(&release, 0.99)),
        stats.total_writes() as f64 / n,
        per_resource.join(" "),
        stats.total_requests() as f64 / n,
        instance_events as f64 / n,
    );
    server.shutdown().await;
}

struct RaceOutcome {
    settle: Duration,
    grants: usize,
    errors: u64,
    conflicts: u64,
    requests: u64,
    writes: u64,
    instance_bytes: usize,
    claim_bytes: usize,
}

/// (c): `RACE_NODES` nodes, each with its own store (and claim cache),
/// race for the `RACE_SLOTS` slots of one shared device. A node tries the
/// slots from its own starting point (as kubelets seeing all slots healthy
/// would pick different devices), stops at its first grant or when every
/// slot is held by another node; a failed write (conflicts exhausted) is
/// retried.
async fn race(model: Model) -> RaceOutcome {
    let (server, _inst) = server_with_instance("shared", RACE_SLOTS).await;
    let dir = InstanceDirectory::new();
    // Resolve the Instance once (every node's agent knows it from its
    // watch) and open the connection.
    {
        let probe = KubeClaimStore::new(server.client(), dir.clone());
        probe.write(&pending("probe", "shared-0", 1)).await.unwrap();
        probe.delete("shared-0", "probe", 1).await.unwrap();
    }
    let stores: Vec<Store> = (0..RACE_NODES)
        .map(|_| Store::new(model, server.client(), dir.clone()))
        .collect();
    server.reset_stats();
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_NODES + 1));
    let mut tasks = Vec::new();
    for (n, store) in stores.iter().cloned().enumerate() {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let node = format!("node-{n:03}");
            let mut errors = 0u64;
            barrier.wait().await;
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut k = 0u32;
            let mut refused = BTreeSet::new();
            while refused.len() < RACE_SLOTS as usize && Instant::now() < deadline {
                let slot = format!("shared-{}", (n as u32 + k) % RACE_SLOTS);
                match store.write(&pending(&node, &slot, 1)).await {
                    Ok(ClaimWrite::Written) => return (node, Some(slot), errors, Instant::now()),
                    Ok(ClaimWrite::HeldByOtherNode { .. }) => {
                        refused.insert(slot);
                        k += 1;
                    }
                    Err(_) => errors += 1,
                }
            }
            (node, None, errors, Instant::now())
        }));
    }
    barrier.wait().await;
    let start = Instant::now();
    let mut granted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut errors = 0;
    let mut last = start;
    for t in tasks {
        let (node, slot, e, done) = t.await.unwrap();
        errors += e;
        last = last.max(done);
        if let Some(slot) = slot {
            granted.entry(slot).or_default().push(node);
        }
    }
    let settle = last - start;
    let stats = server.stats();
    let conflicts: u64 = stores.iter().map(|s| s.stats().all_conflicts()).sum();

    // Verify by listing: one holder per slot, the one that was told Written.
    let listed = stores[0].list().await.unwrap();
    let grants: usize = granted.values().map(Vec::len).sum();
    for (slot, nodes) in &granted {
        assert_eq!(nodes.len(), 1, "double grant of {slot}: {nodes:?}");
        let holder = listed.iter().find(|c| c.slot() == slot).map(|c| &c.node);
        assert_eq!(holder, Some(&nodes[0]), "listed holder of {slot}");
    }
    assert_eq!(listed.len(), RACE_SLOTS as usize);
    assert_eq!(grants, RACE_SLOTS as usize);

    let inst: Instance = Api::namespaced(server.client(), NS)
        .get("shared")
        .await
        .unwrap();
    let claim: Option<SlotClaim> = Api::namespaced(server.client(), NS)
        .get_opt("shared-0")
        .await
        .unwrap();
    let out = RaceOutcome {
        settle,
        grants,
        errors,
        conflicts,
        requests: stats.total_requests(),
        writes: stats.total_writes(),
        instance_bytes: serde_json::to_vec(&inst).map(|v| v.len()).unwrap_or(0),
        claim_bytes: claim
            .and_then(|c| serde_json::to_vec(&c).ok())
            .map(|v| v.len())
            .unwrap_or(0),
    };
    server.shutdown().await;
    out
}

async fn run(smoke: bool) {
    let iters = if smoke { 20 } else { 1000 };
    let rounds = if smoke { 1 } else { 5 };
    for model in [Model::PerSlotObject, Model::InstanceStatus] {
        single_node(model, iters).await;
    }
    for model in [Model::PerSlotObject, Model::InstanceStatus] {
        let mut settles = Vec::new();
        let (mut conflicts, mut errors, mut requests, mut writes) = (0, 0, 0, 0);
        let mut last = None;
        for _ in 0..rounds {
            let o = race(model).await;
            settles.push(o.settle);
            conflicts += o.conflicts;
            errors += o.errors;
            requests += o.requests;
            writes += o.writes;
            last = Some(o);
        }
        let Some(o) = last else { continue };
        settles.sort();
        let r = rounds as u64;
        println!(
            "claims/{} race nodes={RACE_NODES} slots={RACE_SLOTS} grants={} double-grants=0 \
             settle max={} median={} 409s/round={} gave-up-writes/round={} requests/round={} writes/round={} \
             rounds={rounds} (object bytes: instance={} slotclaim={})",
            model.name(),
            o.grants,
            ms(pct(&settles, 1.0)),
            ms(pct(&settles, 0.5)),
            conflicts / r,
            errors / r,
            requests / r,
            writes / r,
            o.instance_bytes,
            o.claim_bytes,
        );
    }
}

fn main() {
    let smoke = std::env::var_os("STEWARD_BENCH_SMOKE").is_some();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(smoke));
}
