//! Faults mid-storm for `steward nri-plugin`: the real process attached to
//! a private containerd 2.1.9 (the containerd harness's `Containerd2`)
//! while a CRI client of the test's own (straight to containerd, as the
//! kubelet) creates, starts and removes pods, half of them asking for an
//! exclusive CPU. Each round injects one fault at a random moment of the storm:
//!
//! * even rounds: the plugin gets SIGKILL; the storm goes on without it
//!   (the runtime then creates containers unadjusted, fail-open) and pods
//!   are removed while it is down; it is started again on the same state
//!   directory and the runtime's Synchronize reconciles;
//! * odd rounds: containerd is killed and started again (its shims live
//!   on); the storm's calls fail meanwhile and resume; the plugin
//!   reconnects and is synchronised.
//!
//! After each round, once the plugin has been synchronised, what is
//! asserted comes from the runtime and cgroupfs, against the plugin's saved
//! cache:
//!
//! * no assignment lost: every container the runtime runs has an
//!   assignment, and its cgroup `cpuset.cpus` is that assignment;
//! * no exclusive CPU held twice: an exclusive assignment's CPUs are in no
//!   other running container's cgroup cpuset;
//! * what the runtime no longer has is counted when still cached: a pod or
//!   container whose removal overlaps a Synchronize can be in the runtime's
//!   listing while its Remove event never reaches the plugin (seen after a
//!   containerd restart); the next Synchronize forgets it, which the end of
//!   the test checks (a last kill -9 and restart, the cache then empty).
//!
//! Rounds: `STEWARD_FAULT_ROUNDS` (default 4; RELIABILITY.md has a longer
//! run).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use steward_core::cpu::CpuSet;
use steward_proto::cri::runtime::v1 as cri;
use steward_resmgr::cache::{CACHE_FILE, CacheData};
use steward_testing_containerd as harness;
use tokio::process::Child;

/// Every runtime call is bounded: a call cut by a containerd restart must
/// not hang the storm.
const CALL: Duration = Duration::from_secs(15);

/// At most this many pods live at once (the storm removes one instead).
const MAX_PODS: usize = 10;

type Rt = cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>;

async fn bounded<T, E>(f: impl std::future::Future<Output = Result<T, E>>) -> Option<T> {
    match tokio::time::timeout(CALL, f).await {
        Ok(Ok(v)) => Some(v),
        _ => None,
    }
}

struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

fn start(dir: &Path, nri: &Path, log: &Path) -> Child {
    common::spawn_logging(common::nri_plugin(dir, nri, "steward-storm"), log).unwrap()
}

fn container(sandbox: &cri::PodSandboxConfig, exclusive: bool) -> cri::ContainerConfig {
    let mut c = harness::ContainerSpec::new("c").build(sandbox);
    c.linux.get_or_insert_with(Default::default).resources = Some(cri::LinuxContainerResources {
        cpu_shares: if exclusive { 1024 } else { 256 },
        cpu_quota: if exclusive { 100_000 } else { 0 },
        cpu_period: if exclusive { 100_000 } else { 0 },
        memory_limit_in_bytes: 32 << 20,
        ..Default::default()
    });
    c
}

#[derive(Default)]
struct StormCounts {
    started: AtomicUsize,
    removed: AtomicUsize,
    refused: AtomicUsize,
    failed_calls: AtomicUsize,
}

/// Creates, starts and removes pods straight on the runtime until `stop`;
/// a failed call (the runtime restarting) is counted and the client made
/// anew.
async fn storm(
    sock: PathBuf,
    cgroup_parent: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    counts: Arc<StormCounts>,
) {
    let mut rng = Lcg(seed);
    let mut rt: Option<Rt> = None;
    let mut live: Vec<String> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let Some(client) = rt.as_mut() else {
            match harness::cri_client(&sock).await {
                Ok((c, _)) => rt = Some(c),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
            continue;
        };
        let ok = if !live.is_empty() && (live.len() >= MAX_PODS || rng.next(3) == 0) {
            let sid = live.swap_remove(rng.next(live.len() as u64) as usize);
            let ok = bounded(harness::cleanup_pod(client, &sid)).await.is_some();
            if ok {
                counts.removed.fetch_add(1, Ordering::Relaxed);
            }
            ok
        } else {
            let exclusive = rng.next(2) == 0;
            let sb =
                harness::pod_sandbox_config(&cgroup_parent, "storm", harness::PodNetwork::Host);
            match bounded(client.run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(sb.clone()),
                runtime_handler: String::new(),
            }))
            .await
            {
                None => false,
                Some(r) => {
                    let sid = r.into_inner().pod_sandbox_id;
                    live.push(sid.clone());
                    let created = tokio::time::timeout(
                        CALL,
                        client.create_container(cri::CreateContainerRequest {
                            pod_sandbox_id: sid,
                            config: Some(container(&sb, exclusive)),
                            sandbox_config: Some(sb),
                        }),
                    )
                    .await;
                    match created {
                        Ok(Ok(c)) => {
                            let id = c.into_inner().container_id;
                            let ok =
                                bounded(client.start_container(cri::StartContainerRequest {
                                    container_id: id,
                                }))
                                .await
                                .is_some();
                            if ok {
                                counts.started.fetch_add(1, Ordering::Relaxed);
                            }
                            ok
                        }
                        // A second exclusive CPU does not exist on a small
                        // machine: refused with the reason.
                        Ok(Err(s)) if s.code() == tonic::Code::ResourceExhausted => {
                            counts.refused.fetch_add(1, Ordering::Relaxed);
                            true
                        }
                        _ => false,
                    }
                }
            }
        };
        if !ok {
            counts.failed_calls.fetch_add(1, Ordering::Relaxed);
            rt = None;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// What one check found.
#[derive(Debug, Default)]
struct Check {
    running: usize,
    exclusive: usize,
    problems: Vec<String>,
    /// Pods and containers the runtime no longer has, still cached.
    stale: Vec<String>,
}

fn cgroup_cpus(parent: &str, name: &str, cid: &str) -> Option<CpuSet> {
    let pod_parent = format!("{}/{name}", parent.trim_end_matches('/'));
    let p = harness::host_cgroup_dir("cpuset", &pod_parent, cid).join("cpuset.cpus");
    let s = std::fs::read_to_string(p).ok()?;
    CpuSet::parse(s.trim()).ok()
}

/// The runtime's containers and pods, cgroupfs and the plugin's cache,
/// side by side.
async fn check(rt: &mut Rt, parent: &str, state: &Path) -> Check {
    let mut out = Check::default();
    let Some(pods) =
        bounded(rt.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })).await
    else {
        out.problems.push("ListPodSandbox failed".into());
        return out;
    };
    let pods: BTreeMap<String, String> = pods
        .into_inner()
        .items
        .into_iter()
        .map(|p| (p.id, p.metadata.map(|m| m.name).unwrap_or_default()))
        .collect();
    let Some(ctrs) = bounded(rt.list_containers(cri::ListContainersRequest { filter: None })).await
    else {
        out.problems.push("ListContainers failed".into());
        return out;
    };
    let ctrs = ctrs.into_inner().containers;
    let Ok(text) = std::fs::read_to_string(state.join(CACHE_FILE)) else {
        out.problems.push("no cache file yet".into());
        return out;
    };
    let cache: CacheData = serde_json::from_str(&text).unwrap();

    let mut cpusets: BTreeMap<String, CpuSet> = BTreeMap::new();
    for c in &ctrs {
        if c.state != cri::ContainerState::ContainerRunning as i32 {
            continue;
        }
        out.running += 1;
        let name = pods.get(&c.pod_sandbox_id).cloned().unwrap_or_default();
        let Some(applied) = cgroup_cpus(parent, &name, &c.id) else {
            out.problems.push(format!("{}: no cgroup cpuset", c.id));
            continue;
        };
        cpusets.insert(c.id.clone(), applied.clone());
        let Some(asg) = cache
            .containers
            .get(&c.id)
            .and_then(|r| r.assignment.clone())
        else {
            out.problems
                .push(format!("{}: runs without an assignment (lost)", c.id));
            continue;
        };
        if CpuSet::parse(&asg.cpus).ok() != Some(applied.clone()) {
            out.problems.push(format!(
                "{}: assigned {} ({}), cgroupfs has {applied}",
                c.id,
                asg.cpus,
                if asg.exclusive { "exclusive" } else { "shared" }
            ));
        }
    }
    for (id, rec) in &cache.containers {
        let Some(asg) = rec.assignment.as_ref().filter(|a| a.exclusive) else {
            continue;
        };
        if !cpusets.contains_key(id) {
            continue;
        }
        out.exclusive += 1;
        let mine = CpuSet::parse(&asg.cpus).unwrap_or_default();
        for (other, cpus) in &cpusets {
            if other != id && !mine.intersection(cpus).is_empty() {
                out.problems.push(format!(
                    "exclusive CPU {mine} of {id} also in {other}'s cpuset {cpus} (held twice)"
                ));
            }
        }
    }
    let known: std::collections::BTreeSet<&str> = ctrs.iter().map(|c| c.id.as_str()).collect();
    for id in cache.containers.keys() {
        if !known.contains(id.as_str()) {
            out.stale.push(format!("container {id}"));
        }
    }
    for id in cache.pods.keys() {
        if !pods.contains_key(id) {
            out.stale.push(format!("pod {id}"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_kill_9_and_containerd_restart_mid_storm_lose_nothing() {
    let Some(bin) = harness::bin_dir_or_skip("nri_plugin_storm") else {
        return;
    };
    let rounds: u64 = std::env::var("STEWARD_FAULT_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let mut ctrd = harness::Containerd2::start(bin);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        "policy: { active: static }\n",
    )
    .unwrap();
    let state = dir.path().join("state");
    let mut starts = 0usize;
    let mut log = dir.path().join("plugin0.log");
    let mut plugin = start(dir.path(), &ctrd.nri_sock(), &log);
    harness::wait_log(&log, "synchronized with the runtime", 1).await;

    let mut rng = Lcg(0x5eed_0022);
    let counts = Arc::new(StormCounts::default());
    let (mut checked, mut exclusive_seen, mut kills, mut restarts, mut stale_seen) =
        (0, 0, 0, 0, 0);
    for round in 0..rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(storm(
            ctrd.sock(),
            ctrd.cgroup_parent.clone(),
            round * 7919 + 1,
            stop.clone(),
            counts.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(200 + rng.next(600))).await;
        if round % 2 == 0 {
            // SIGKILL: no goodbye, the cache as last saved. The storm goes
            // on without a plugin for a while.
            plugin.kill().await.unwrap();
            kills += 1;
            tokio::time::sleep(Duration::from_millis(300 + rng.next(500))).await;
            starts += 1;
            log = dir.path().join(format!("plugin{starts}.log"));
            plugin = start(dir.path(), &ctrd.nri_sock(), &log);
            harness::wait_log(&log, "synchronized with the runtime", 1).await;
        } else {
            let before = harness::count_in_log(&log, "synchronized with the runtime");
            tokio::task::block_in_place(|| ctrd.restart());
            restarts += 1;
            harness::wait_log(&log, "synchronized with the runtime", before + 1).await;
        }
        // The storm meets the reconnected plugin for a while.
        tokio::time::sleep(Duration::from_millis(300 + rng.next(300))).await;
        stop.store(true, Ordering::Relaxed);
        task.await.unwrap();

        let (mut rt, _) = harness::cri_client(ctrd.sock()).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let found = loop {
            let c = check(&mut rt, &ctrd.cgroup_parent, &state).await;
            if c.problems.is_empty() || tokio::time::Instant::now() >= deadline {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            found.problems.is_empty(),
            "round {round}: {:#?}\nplugin log:\n{}\ncontainerd log (tail):\n{}",
            found.problems,
            std::fs::read_to_string(&log).unwrap_or_default(),
            ctrd.log()
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .join("\n")
        );
        eprintln!(
            "round {round} ({}): {} running containers checked, {} exclusive",
            if round % 2 == 0 {
                "plugin kill -9"
            } else {
                "containerd restart"
            },
            found.running,
            found.exclusive
        );
        if !found.stale.is_empty() {
            eprintln!(
                "round {round}: still cached, gone from the runtime: {:?}",
                found.stale
            );
        }
        checked += found.running;
        exclusive_seen += found.exclusive;
        stale_seen += found.stale.len();
    }
    let fail_open = (0..=starts)
        .map(|i| {
            harness::count_in_log(
                &dir.path().join(format!("plugin{i}.log")),
                "an exclusive container runs without its CPUs",
            )
        })
        .sum::<usize>();
    // Everything goes; a last plugin kill -9 and restart: its Synchronize
    // forgets whatever removal was missed, and the cache ends empty.
    let (mut rt, _) = harness::cri_client(ctrd.sock()).await.unwrap();
    if let Some(boxes) =
        bounded(rt.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })).await
    {
        for b in boxes.into_inner().items {
            let _ = bounded(harness::cleanup_pod(&mut rt, &b.id)).await;
        }
    }
    plugin.kill().await.unwrap();
    starts += 1;
    log = dir.path().join(format!("plugin{starts}.log"));
    plugin = start(dir.path(), &ctrd.nri_sock(), &log);
    harness::wait_log(&log, "synchronized with the runtime", 1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let c = check(&mut rt, &ctrd.cgroup_parent, &state).await;
        if c.problems.is_empty() && c.stale.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after removing every pod and a Synchronize: {:#?} {:#?}",
            c.problems,
            c.stale
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = plugin.kill().await;
    eprintln!(
        "nri-plugin storm: {rounds} rounds ({kills} plugin kill -9, {restarts} containerd restarts); \
         {} containers started, {} pods removed, {} exclusive refusals, {} calls failed during restarts; \
         {checked} running containers checked after the faults ({exclusive_seen} exclusive), \
         {fail_open} found fail-open and re-pinned; 0 assignments lost, 0 exclusive CPUs held twice; \
         {stale_seen} records of pods or containers removed around a Synchronize kept until the next one",
        counts.started.load(Ordering::Relaxed),
        counts.removed.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed),
        counts.failed_calls.load(Ordering::Relaxed),
    );
    assert!(checked > 0, "the storm never got a container running");
}
