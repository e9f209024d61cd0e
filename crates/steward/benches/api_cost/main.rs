//! steward's cost to the API server, with many simulated nodes on one
//! API server stand-in (design: reservations-at-speed §5.2).
//!
//! For each size N: one stand-in; N nodes, each running the real agent and
//! the resource manager's cluster side with a client of its own
//! (`node.rs`: what runs, and what is left out: no kubelet, no runtime);
//! two controller replicas and two extenders (`stand.rs`); a scheduler
//! driver and a kubelet simulator (`workload.rs`). Each node sees one
//! local device and three shared devices (each shared one is seen by three
//! nodes), two slots each; 3·N pods ask one slot each: one per local
//! device (one of its two slots), two per shared device (both slots, so
//! two nodes' claims on one Instance may be written at the same time).
//!
//! Phases, each in its own window of the stand-in's counters:
//! 1. setup (start, discovery, until quiet);
//! 2. at rest (`STEWARD_BENCH_REST_SECS`, 300 s by default: one renewal
//!    of every watch, whose timeout is 290 s);
//! 3. admit: create the pods, Filter, bind, run them (claims written);
//! 4. pods running (`STEWARD_BENCH_RUN_SECS`, 120 s);
//! 5. delete: the pods deleted, ended, their slots released.
//!
//! Printed per N: requests, writes, watch events and bytes per pod
//! lifecycle and per node per hour, by component and resource; objects
//! per node; open watches, in all and per process by kind (each agent,
//! the leader, the standby, each extender and resource manager); Akri's
//! model from the same run. Then each
//! counter fitted across the sizes and extrapolated to 5,000 nodes and
//! 150,000 pods (`fit.rs`).
//!
//! `cargo bench -p steward --bench api_cost`; sizes with
//! `STEWARD_BENCH_AGENT_WATCHES=all` runs the agents following every
//! Instance, SlotClaim, Reservation and Node (before node labels), for a
//! baseline from the same build.
//! `STEWARD_BENCH_NODES=25,50,100`; `STEWARD_BENCH_DRA=1` adds the agents'
//! ResourceSlices (`steward agent --dra`); `STEWARD_BENCH_SMOKE=1` for a
//! short run (5 and 8 nodes, 1 s windows).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fit;
mod node;
mod report;
mod stand;
mod workload;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use steward_agent::claims::InstanceRef;

use report::{Measured, Phase};
use stand::{SEEN_BY, Stand};
use workload::{Ask, Timeline};

struct Sizes {
    nodes: Vec<usize>,
    /// The agents publish ResourceSlices (`--dra`).
    dra: bool,
    rest: Duration,
    run: Duration,
    /// Longest wait for the setup to go quiet.
    settle_cap: Duration,
    /// How long steward must make no request (but Lease renewals and
    /// watches) for a phase to be over.
    quiet: Duration,
}

fn env_secs(name: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

fn sizes() -> Sizes {
    let smoke = std::env::var_os("STEWARD_BENCH_SMOKE").is_some();
    let nodes = std::env::var("STEWARD_BENCH_NODES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| if smoke { vec![5, 8] } else { vec![25, 50, 100] });
    Sizes {
        nodes,
        dra: std::env::var("STEWARD_BENCH_DRA").is_ok_and(|v| v == "1"),
        rest: env_secs("STEWARD_BENCH_REST_SECS", if smoke { 1 } else { 300 }),
        run: env_secs("STEWARD_BENCH_RUN_SECS", if smoke { 1 } else { 120 }),
        settle_cap: Duration::from_secs(if smoke { 30 } else { 600 }),
        quiet: Duration::from_secs(if smoke { 1 } else { 3 }),
    }
}

/// Open file descriptors of this process (sockets included).
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

/// Peak and current resident memory of this process, KiB.
fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// The counters of a window that ends now.
fn close(stand: &Stand, started: Instant) -> Phase {
    Phase {
        window: started.elapsed(),
        stats: stand.api.stats(),
    }
}

async fn measure(n: usize, sizes: &Sizes) -> Measured {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = node::write_sysfs(dir.path());
    let t = Instant::now();
    let stand = Stand::start(n, sizes.dra).await;
    let mut nodes = Vec::new();
    for i in 0..n {
        nodes.push(node::SimNode::start(&stand.api, i, n, dir.path(), &sysfs, sizes.dra).await);
    }
    let nodes = Arc::new(nodes);
    // Discovery done: every device an Instance, shared ones on their nodes.
    let until = Instant::now() + sizes.settle_cap;
    let instances = loop {
        let found = stand::instances(&stand.api).await;
        let complete = found.len() == 2 * n
            && found
                .values()
                .all(|(_, nodes)| nodes.len() == 1 || nodes.len() == SEEN_BY.min(n));
        if complete {
            break found;
        }
        assert!(
            Instant::now() < until,
            "discovery did not finish: {} of {} Instances",
            found.len(),
            2 * n
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    workload::settle(&stand.api, sizes.quiet, sizes.settle_cap).await;
    let setup = close(&stand, t);

    // The claim stores resolve Instances as the agent's does (from its watch).
    let refs: Vec<InstanceRef> = {
        let client = stand.client(stand::PROBE);
        kube::Api::<steward_api::Instance>::all(client)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter_map(InstanceRef::of)
            .collect()
    };
    for node in nodes.iter() {
        node.know(&refs);
    }
    let mut asks = Vec::new();
    for i in 0..n {
        let (local, _) = stand::devices_of(i, n);
        let (name, seen) = &instances[&local[0]];
        asks.push(Ask {
            pod: format!("l{i}"),
            instance: name.clone(),
            nodes: seen.clone(),
        });
    }
    for k in 0..n {
        let (name, seen) = &instances[&stand::shared_device(k)];
        for p in 0..stand::CAPACITY {
            asks.push(Ask {
                pod: format!("s{k}-{p}"),
                instance: name.clone(),
                nodes: seen.clone(),
            });
        }
    }

    stand.api.reset_stats();
    let t = Instant::now();
    tokio::time::sleep(sizes.rest).await;
    let rest = close(&stand, t);

    stand.api.reset_stats();
    let t = Instant::now();
    let timeline = Arc::new(Mutex::new(Timeline::default()));
    let (placed, scheduling) = workload::admit(&stand, &nodes, &asks, &timeline).await;
    workload::settle(&stand.api, sizes.quiet, Duration::from_secs(60)).await;
    let admit = close(&stand, t);
    let pods = placed.len();

    stand.api.reset_stats();
    let t = Instant::now();
    tokio::time::sleep(sizes.run).await;
    let stored = stand.api.stored();
    let open = stand.api.open_watches();
    let open_by_process = stand.api.open_watches_by_agent();
    let leader = stand::leader(&stand.api).await;
    let run = close(&stand, t);
    let fds = fds();

    stand.api.reset_stats();
    let t = Instant::now();
    workload::delete(&stand, &nodes, placed, &scheduling.unplaced, &timeline).await;
    workload::settle(&stand.api, sizes.quiet, Duration::from_secs(60)).await;
    let delete = close(&stand, t);
    let rss = rss();
    let akri = timeline.lock().unwrap().conflicts();

    // Teardown: every node, then the cluster side and the stand-in.
    let nodes = Arc::try_unwrap(nodes).ok().unwrap();
    futures::future::join_all(nodes.into_iter().map(node::SimNode::shutdown)).await;
    stand.shutdown().await;
    Measured {
        n,
        dra: sizes.dra,
        pods,
        scheduling,
        setup,
        rest,
        admit,
        run,
        delete,
        stored,
        open,
        open_by_process,
        leader,
        akri,
        rss,
        fds,
    }
}

fn main() {
    if std::env::var_os("STEWARD_BENCH_TRACE").is_some() {
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::stderr)
            .init();
    }
    let sizes = sizes();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut runs = Vec::new();
        for &n in &sizes.nodes {
            let m = measure(n, &sizes).await;
            m.print();
            runs.push(m);
        }
        fit::print(&runs);
    });
}
