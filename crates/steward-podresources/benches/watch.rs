//! Pod resources server figures (BENCHMARKS.md), side by side in one run:
//!
//! 1. `List` with 250 pods × 4 containers, against an empty `List` (the
//!    gRPC round trip over the socket: the floor).
//! 2. Assignment change → event at 100 concurrent watchers, against
//!    consumers polling `List` every 1 s and every 60 s (NFD's default):
//!    how stale each consumer's view is after a change.
//! 3. The server's RSS with no watcher and with 100, per watcher.
//!
//! The server runs in a child process (this binary re-executed), so its
//! memory is its own and the clients cross a real unix socket.
//! `STEWARD_BENCH_SMOKE=1` shrinks every phase to prove the bench still runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use steward_core::cpu::CpuSet;
use steward_core::ledger::{PodAssignments, PodRef, Source};
use steward_nodeio::AuthorityMode;
use steward_podresources::serve::{ServeOptions, serve_with_authority};
use steward_podresources::{Hub, PodResourcesMetrics, WatchLimits};
use steward_proto::podresources::v1 as wire;
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tonic::transport::Channel;

const CHILD: &str = "STEWARD_BENCH_PODRESOURCES_SERVER";

/// Set in a server child's environment: serve with the `:authority` fix off.
const AUTHORITY_OFF: &str = "STEWARD_BENCH_AUTHORITY_FIX_OFF";

fn smoke() -> bool {
    std::env::var_os("STEWARD_BENCH_SMOKE").is_some()
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn pod(i: usize, containers: usize) -> PodAssignments {
    let mut p = PodAssignments::new(PodRef::new(format!("uid-{i}"), "bench", format!("pod-{i}")));
    for c in 0..containers {
        let cont = p.container_mut(&format!("c{c}"));
        cont.add_devices(
            "steward.dev/cam",
            [format!("cam-{i}-{c}")],
            &BTreeSet::from([(i % 2) as i64]),
        );
        cont.cpus = CpuSet::from_iter([(i * containers + c) as u32 % 16_000]);
        cont.exclusive_cpus = true;
    }
    p
}

/// The child: serves a hub on the socket and takes commands on stdin:
/// `fill N` (N pods × 4 containers), `clear`, `change I` (pod I changes,
/// stamped with the wall clock in the pod's name), `rss`.
async fn child(socket: PathBuf) {
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let hub = Hub::new(
        WatchLimits {
            max_watchers: 1024,
            buffer: 1024,
        },
        PodResourcesMetrics::default(),
    );
    let cancel = tokio_util::sync::CancellationToken::new();
    let authority = AuthorityMode::fix_if(std::env::var_os(AUTHORITY_OFF).is_none());
    tokio::spawn(serve_with_authority(
        hub.clone(),
        listener,
        ServeOptions { qps: 0.0, burst: 1 },
        authority,
        cancel.clone(),
    ));
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    out.write_all(b"ready\n").await.unwrap();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut words = line.split_whitespace();
        let reply = match (
            words.next(),
            words.next().and_then(|n| n.parse::<usize>().ok()),
        ) {
            (Some("fill"), Some(n)) => {
                hub.replace(Source::Slots, (0..n).map(|i| pod(i, 4)).collect());
                "ok".to_string()
            }
            (Some("clear"), _) => {
                hub.replace(Source::Slots, Vec::new());
                "ok".to_string()
            }
            (Some("change"), Some(i)) => {
                // A shared CPU unique to this pod: no eviction of another
                // pod's record, so every event is this change's own.
                let mut p = pod(i, 1);
                let c = p.container_mut("c0");
                c.cpus = CpuSet::from_iter([(i % 16_000) as u32]);
                c.exclusive_cpus = false;
                p.pod.namespace = format!("t{}", now_micros());
                hub.upsert(Source::Cri, p);
                "ok".to_string()
            }
            (Some("rss"), _) => rss_kib(std::process::id()).to_string(),
            _ => "?".to_string(),
        };
        out.write_all(format!("{reply}\n").as_bytes())
            .await
            .unwrap();
    }
    cancel.cancel();
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

struct Child {
    proc: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Child {
    async fn ask(&mut self, cmd: &str) -> String {
        self.stdin
            .write_all(format!("{cmd}\n").as_bytes())
            .await
            .unwrap();
        self.stdout.next_line().await.unwrap().unwrap()
    }
}

async fn client(socket: &Path) -> PodResourcesListerClient<Channel> {
    let channel = steward_proto::uds::endpoint()
        .connect_with_connector(steward_proto::uds::UnixConnector::new(socket))
        .await
        .unwrap();
    PodResourcesListerClient::new(channel).max_decoding_message_size(64 << 20)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (pct(&v, 0.5), pct(&v, 0.99), *v.last().unwrap_or(&f64::NAN))
}

async fn time_lists(c: &mut PodResourcesListerClient<Channel>, n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = c
            .list(wire::ListPodResourcesRequest {})
            .await
            .unwrap()
            .into_inner();
        std::hint::black_box(r.pod_resources.len());
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out
}

/// Starts the server child on `socket` (`:authority` fix on or off).
async fn spawn_child(socket: &Path, fix: bool) -> Child {
    let mut cmd = tokio::process::Command::new(std::env::current_exe().unwrap());
    cmd.env(CHILD, socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    if !fix {
        cmd.env(AUTHORITY_OFF, "1");
    }
    let mut proc = cmd.spawn().unwrap();
    let stdin = proc.stdin.take().unwrap();
    let stdout = BufReader::new(proc.stdout.take().unwrap()).lines();
    let mut child = Child {
        proc,
        stdin,
        stdout,
    };
    assert_eq!(child.stdout.next_line().await.unwrap().unwrap(), "ready");
    child
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Some(socket) = std::env::var_os(CHILD) {
        child(PathBuf::from(socket)).await;
        return;
    }
    let smoke = smoke();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("pr.sock");
    let mut child = spawn_child(&socket, true).await;
    // The same server with the `:authority` fix off, side by side.
    let socket_off = dir.path().join("pr-off.sock");
    let mut child_off = spawn_child(&socket_off, false).await;

    // 1. List: empty (floor) and 250 pods × 4 containers, alternating
    // blocks, on both servers.
    let (rounds, per) = if smoke { (1, 20) } else { (5, 400) };
    let mut c = client(&socket).await;
    let mut c_off = client(&socket_off).await;
    let (mut empty, mut full) = (Vec::new(), Vec::new());
    let (mut empty_off, mut full_off) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        child.ask("clear").await;
        child_off.ask("clear").await;
        empty.extend(time_lists(&mut c, per).await);
        empty_off.extend(time_lists(&mut c_off, per).await);
        child.ask("fill 250").await;
        child_off.ask("fill 250").await;
        full.extend(time_lists(&mut c, per).await);
        full_off.extend(time_lists(&mut c_off, per).await);
    }
    let (e50, e99, _) = summary(empty);
    let (f50, f99, fmax) = summary(full);
    println!(
        "list/250x4 p50={f50:.0}us p99={f99:.0}us max={fmax:.0}us | empty list (floor) p50={e50:.0}us p99={e99:.0}us | ratio p50={:.2} p99={:.2}",
        f50 / e50,
        f99 / e99
    );
    let (oe50, oe99, _) = summary(empty_off);
    let (of50, of99, ofmax) = summary(full_off);
    println!(
        "list/250x4 authority-fix-off p50={of50:.0}us p99={of99:.0}us max={ofmax:.0}us | empty list p50={oe50:.0}us p99={oe99:.0}us | fix on/off p50: full {:.2}, empty {:.2}",
        f50 / of50,
        e50 / oe50
    );
    drop(child_off);

    // 3a. RSS with no watcher (250 pods held).
    let rss0: u64 = child.ask("rss").await.parse().unwrap();

    // 2. Change → event at 100 watchers.
    let watchers = if smoke { 5 } else { 100 };
    let changes = if smoke { 10 } else { 300 };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<f64>();
    let mut ready = Vec::new();
    for _ in 0..watchers {
        let mut c = client(&socket).await;
        let mut s = c
            .list_and_watch(wire::ListAndWatchPodResourcesRequest {})
            .await
            .unwrap()
            .into_inner();
        let tx = tx.clone();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        ready.push(ready_rx);
        tokio::spawn(async move {
            let _keep = c;
            let mut ready_tx = Some(ready_tx);
            let mut initial = 250;
            while let Some(Ok(e)) = s.next().await {
                if initial > 0 {
                    initial -= 1;
                    if initial == 0 {
                        ready_tx.take().map(|t| t.send(()));
                    }
                    continue;
                }
                let stamp: u64 = e.pod_resources[0]
                    .namespace
                    .trim_start_matches('t')
                    .parse()
                    .unwrap_or(0);
                if stamp > 0 {
                    let _ = tx.send(now_micros().saturating_sub(stamp) as f64);
                }
            }
        });
    }
    for r in ready {
        r.await.unwrap();
    }
    let rss100: u64 = child.ask("rss").await.parse().unwrap();
    // Pollers: every 1 s and every 60 s, recording when each change first shows.
    let poll_window = if smoke {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(150)
    };
    let pollers: Vec<(u64, tokio::task::JoinHandle<Vec<f64>>)> = [1u64, 60]
        .into_iter()
        .map(|secs| {
            let socket = socket.clone();
            (
                secs,
                tokio::spawn(async move {
                    let interval = if smoke {
                        Duration::from_millis(50 * secs.min(2))
                    } else {
                        Duration::from_secs(secs)
                    };
                    let mut c = client(&socket).await;
                    let mut seen: std::collections::BTreeMap<String, u64> = Default::default();
                    let mut staleness = Vec::new();
                    let start = Instant::now();
                    // Start at a random phase, as a poller started at any time would.
                    tokio::time::sleep(interval.mul_f64(fastrand_phase())).await;
                    while start.elapsed() < poll_window + interval {
                        let list = c
                            .list(wire::ListPodResourcesRequest {})
                            .await
                            .unwrap()
                            .into_inner();
                        let at = now_micros();
                        for p in list.pod_resources {
                            if let Some(stamp) = p
                                .namespace
                                .strip_prefix('t')
                                .and_then(|s| s.parse::<u64>().ok())
                                && seen.insert(p.name.clone(), stamp) != Some(stamp)
                            {
                                staleness.push(at.saturating_sub(stamp) as f64);
                            }
                        }
                        tokio::time::sleep(interval).await;
                    }
                    staleness
                }),
            )
        })
        .collect();
    let gap = poll_window / (changes as u32);
    for i in 0..changes {
        child.ask(&format!("change {}", 100_000 + i)).await;
        tokio::time::sleep(gap).await;
    }
    let mut lat = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while lat.len() < watchers * changes && Instant::now() < deadline {
        if let Ok(Some(v)) = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await {
            lat.push(v);
        }
    }
    let received = lat.len();
    let (w50, w99, wmax) = summary(lat);
    println!(
        "watch/{watchers} watchers change->event p50={w50:.0}us p99={w99:.0}us max={wmax:.0}us ({received} of {} events)",
        watchers * changes
    );
    for (secs, h) in pollers {
        let (p50, p99, max) = summary(h.await.unwrap());
        println!(
            "poll/List every {secs}s staleness p50={:.3}s p99={:.3}s max={:.3}s | ratio to watch p50={:.0}x",
            p50 / 1e6,
            p99 / 1e6,
            max / 1e6,
            p50 / w50
        );
    }
    println!(
        "memory/server RSS {rss0} KiB with 0 watchers, {rss100} KiB with {watchers}: {:.1} KiB per watcher",
        (rss100 as f64 - rss0 as f64) / watchers as f64
    );
    let _ = child.proc.start_kill();
}

/// A phase in [0, 1) from the clock (no RNG dependency for one number).
fn fastrand_phase() -> f64 {
    (now_micros() % 1000) as f64 / 1000.0
}
