//! Discovery benchmarks, end to end through processes: `steward agent`
//! (Kubernetes mode, through a kubeconfig pointing at the API server
//! stand-in) and `steward discovery-handler debug-echo`, both child
//! processes built in the bench profile.
//!
//! - `discovery/appear-to-instance`: a device appears (the debug-echo
//!   availability file flips to available) -> its Instance is seen on a watch
//!   of the stand-in; p50/p99 over many appearances. The disappearance ->
//!   DELETED latency is reported alongside.
//! - `discovery/agent-N-devices`: agent RSS and CPU over a steady window with
//!   N devices (N = 1000), and the time from creating the Configuration until
//!   all N Instances exist.
//! - `discovery/steady-writes-per-minute`: API write requests during that
//!   window (goal: 0).
//!
//! `STEWARD_BENCH_SMOKE=1` runs small sizes briefly (CI).

#[path = "../tests/common/mod.rs"]
mod common;

use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::*;
use futures::{Stream, StreamExt};
use kube::api::{ListParams, WatchEvent, WatchParams};
use steward_api::Instance;

struct Sizes {
    warmup: usize,
    appearances: usize,
    devices: usize,
    window: Duration,
}

fn sizes() -> Sizes {
    if std::env::var("STEWARD_BENCH_SMOKE").is_ok_and(|v| v == "1") {
        Sizes {
            warmup: 2,
            appearances: 20,
            devices: 100,
            window: Duration::from_secs(2),
        }
    } else {
        Sizes {
            warmup: 5,
            appearances: 300,
            devices: 1000,
            window: Duration::from_secs(30),
        }
    }
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("discovery bench: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(sizes())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("discovery bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(sizes: Sizes) -> anyhow::Result<()> {
    appear_to_instance(&sizes).await?;
    agent_with_devices(&sizes, Plugins::Unregistered).await?;
    // The same with a kubelet (stand-in) every plugin registers with and
    // that holds a ListAndWatch stream of each: a node in production.
    agent_with_devices(&sizes, Plugins::Registered).await?;
    // The same without device plugins: what serving them costs.
    agent_with_devices(&sizes, Plugins::Off).await?;
    Ok(())
}

type InstanceEvents = Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<Instance>>> + Send>>;

/// A watch on Instances starting now (after the current resourceVersion).
async fn watch_instances(cluster: &Cluster) -> anyhow::Result<InstanceEvents> {
    let api = cluster.instance_api();
    let list = api.list(&ListParams::default()).await?;
    let rv = list.metadata.resource_version.unwrap_or_default();
    let stream = api
        .watch(&WatchParams::default().timeout(290), &rv)
        .await
        .context("watching Instances")?;
    Ok(stream.boxed())
}

/// What a watch event means for the bench.
enum Seen {
    Added(String),
    Deleted(String),
    Other,
}

async fn next_event(events: &mut InstanceEvents, timeout: Duration) -> anyhow::Result<Seen> {
    let ev = tokio::time::timeout(timeout, events.next())
        .await
        .with_context(|| format!("no Instance event within {timeout:?}"))?
        .context("the Instance watch ended")??;
    Ok(match ev {
        WatchEvent::Added(i) => Seen::Added(i.spec.device_id),
        WatchEvent::Deleted(i) => Seen::Deleted(i.spec.device_id),
        WatchEvent::Error(e) => bail!("watch error: {e:?}"),
        WatchEvent::Modified(_) | WatchEvent::Bookmark(_) => Seen::Other,
    })
}

/// debug-echo's availability-file poll interval in the appearance bench
/// (its minimum): a change is seen 0..POLL_MS after it is made.
const POLL_MS: u64 = 10;

/// xorshift64: uniform pauses without a random-number crate.
struct Jitter(u64);

impl Jitter {
    fn seeded() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Self(u64::from(nanos) | 1)
    }

    /// A pause uniformly spread over `0..2*period_ms` milliseconds.
    fn next_delay(&mut self, period_ms: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_micros(self.0 % (2 * period_ms * 1000))
    }
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn wait_registered(dh: &Proc) -> anyhow::Result<()> {
    eventually("the handler registered", WAIT, || async {
        (dh.log_count(REGISTERED) >= 1).then_some(())
    })
    .await
}

async fn appear_to_instance(sizes: &Sizes) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::start(dir.path()).await?;
    let node = NodeDirs::new(dir.path(), "bench-node");
    let _agent = node.spawn_agent(&cluster, "5m")?.quiet();
    let dh = spawn_echo_handler(
        "debug-echo",
        &node.socket,
        &dir.path().join("echo.sock"),
        None,
        dir.path().join("echo.log"),
    )?
    .quiet();
    wait_registered(&dh).await?;
    let avail = dir.path().join("avail");
    set_available(&avail, false)?;
    let details = format!(
        "descriptions: [dev0]\npollInterval: {POLL_MS}ms\navailabilityFile: {:?}\n",
        avail.display().to_string()
    );
    cluster
        .create_configuration(&configuration("appear", "debug-echo", &details))
        .await?;
    // The stream is open (and has reported "no devices") once the handler is Active.
    eventually("handler Active", WAIT, || async {
        let s = cluster.config_status("appear").await.ok()??;
        s.handlers.iter().any(|h| h.state == "Active").then_some(())
    })
    .await?;

    let mut events = watch_instances(&cluster).await?;
    let mut appear = Vec::with_capacity(sizes.appearances);
    let mut disappear = Vec::with_capacity(sizes.appearances);
    let mut jitter = Jitter::seeded();
    for round in 0..sizes.warmup + sizes.appearances {
        // A random pause so the changes are not phase-locked to the
        // handler's file polling.
        tokio::time::sleep(jitter.next_delay(POLL_MS)).await;
        let t0 = Instant::now();
        set_available(&avail, true)?;
        loop {
            match next_event(&mut events, WAIT).await? {
                Seen::Added(id) if id == "dev0" => break,
                _ => {}
            }
        }
        let up = t0.elapsed();
        tokio::time::sleep(jitter.next_delay(POLL_MS)).await;
        let t1 = Instant::now();
        set_available(&avail, false)?;
        loop {
            match next_event(&mut events, WAIT).await? {
                Seen::Deleted(id) if id == "dev0" => break,
                _ => {}
            }
        }
        let down = t1.elapsed();
        if round >= sizes.warmup {
            appear.push(up);
            disappear.push(down);
        }
    }
    appear.sort();
    disappear.sort();
    println!(
        "discovery/appear-to-instance p50={:.1}ms p99={:.1}ms max={:.1}ms n={} (handler file poll {POLL_MS}ms)",
        ms(percentile(&appear, 0.50)),
        ms(percentile(&appear, 0.99)),
        ms(percentile(&appear, 1.0)),
        appear.len()
    );
    println!(
        "discovery/disappear-to-delete p50={:.1}ms p99={:.1}ms max={:.1}ms n={}",
        ms(percentile(&disappear, 0.50)),
        ms(percentile(&disappear, 0.99)),
        ms(percentile(&disappear, 1.0)),
        disappear.len()
    );
    Ok(())
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after "(comm)": state is field 3, utime 14, stime 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11).context("no utime")?.parse()?;
    let stime: u64 = fields.get(12).context("no stime")?.parse()?;
    Ok(utime + stime)
}

/// A `/proc/PID/status` field in KiB (`VmRSS`, `VmHWM`).
fn status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    let kib = line
        .split_whitespace()
        .nth(1)
        .with_context(|| format!("malformed {line:?}"))?;
    Ok(kib.parse()?)
}

fn clock_ticks_per_second() -> anyhow::Result<u64> {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .context("running getconf CLK_TCK")?;
    let text = String::from_utf8(out.stdout)?;
    text.trim()
        .parse()
        .with_context(|| format!("getconf CLK_TCK printed {text:?}"))
}

async fn wait_all_added(
    events: &mut InstanceEvents,
    want: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < want {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if let Seen::Added(id) = next_event(events, left).await? {
            seen.insert(id);
        }
    }
    Ok(())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// How the agent's device plugins run in [`agent_with_devices`].
#[derive(Clone, Copy, PartialEq)]
enum Plugins {
    /// Served, with no kubelet to register with.
    Unregistered,
    /// Served and registered with the kubelet stand-in.
    Registered,
    /// `--no-device-plugins`.
    Off,
}

async fn agent_with_devices(sizes: &Sizes, plugins: Plugins) -> anyhow::Result<()> {
    let device_plugins = plugins != Plugins::Off;
    let n = sizes.devices;
    let ticks_per_s = clock_ticks_per_second()?;
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::start(dir.path()).await?;
    let node = NodeDirs::new(dir.path(), "bench-node");
    let extra: &[&str] = if device_plugins {
        &[]
    } else {
        &["--no-device-plugins"]
    };
    let kubelet = if plugins == Plugins::Registered {
        Some(
            steward_testing_kubelet::Kubelet::start(steward_testing_kubelet::KubeletConfig::new(
                node.kubelet_dir(),
                node.name.clone(),
            ))
            .await
            .context("starting the kubelet stand-in")?,
        )
    } else {
        None
    };
    let agent = node.spawn_agent_with(&cluster, "5m", extra)?.quiet();
    let pid = agent.pid()?;
    let variant = match plugins {
        Plugins::Unregistered => "",
        Plugins::Registered => "-kubelet",
        Plugins::Off => "-no-device-plugins",
    };
    let dh = spawn_echo_handler(
        "debug-echo",
        &node.socket,
        &dir.path().join("echo.sock"),
        None,
        dir.path().join("echo.log"),
    )?
    .quiet();
    wait_registered(&dh).await?;
    let idle_rss = status_kib(pid, "VmRSS")?;

    let mut events = watch_instances(&cluster).await?;
    let mut cfg = configuration(
        "bulk",
        "debug-echo",
        &format!("count: {n}\nprefix: bench\n"),
    );
    cfg.spec.max_devices = u32::try_from(n)?;
    let t0 = Instant::now();
    cluster.create_configuration(&cfg).await?;
    wait_all_added(&mut events, n, Duration::from_secs(120)).await?;
    let settle = t0.elapsed();
    let listed = cluster.instances_of("bulk").await?.len();
    if listed != n {
        bail!("{listed} Instances listed, {n} expected");
    }
    eventually("status counts every Instance", WAIT, || async {
        let s = cluster.config_status("bulk").await.ok()??;
        (s.instances as usize == n).then_some(())
    })
    .await?;
    if let Some(k) = &kubelet {
        eventually("every plugin registered with kubelet", WAIT * 4, || async {
            let connected = k.resources().values().filter(|r| r.connected).count();
            (connected >= n).then_some(())
        })
        .await?;
    }
    // The burst's follow-up writes (each plugin's registration state in its
    // Instance's status, the Configuration's status) drain first: the
    // window opens after a whole second with no write, and how long the
    // drain took is reported.
    let drain_deadline = Instant::now() + Duration::from_secs(60);
    let drained = loop {
        cluster.server.reset_stats();
        tokio::time::sleep(Duration::from_secs(1)).await;
        if cluster.server.stats().total_writes() == 0 {
            break t0.elapsed().saturating_sub(settle + Duration::from_secs(1));
        }
        if Instant::now() > drain_deadline {
            bail!("the agent still writes 60 s after the last Instance appeared");
        }
    };

    // Steady window.
    cluster.server.reset_stats();
    let cpu0 = cpu_ticks(pid)?;
    let w0 = Instant::now();
    tokio::time::sleep(sizes.window).await;
    let cpu1 = cpu_ticks(pid)?;
    let window = w0.elapsed();
    let stats = cluster.server.stats();
    let rss = status_kib(pid, "VmRSS")?;
    let hwm = status_kib(pid, "VmHWM")?;
    let cpu_pct =
        (cpu1.saturating_sub(cpu0)) as f64 / ticks_per_s as f64 / window.as_secs_f64() * 100.0;
    let per_minute = stats.total_writes() as f64 * 60.0 / window.as_secs_f64();
    let requests_per_minute = stats.total_requests() as f64 * 60.0 / window.as_secs_f64();

    println!(
        "discovery/agent-{n}-devices{variant} rss={:.1}MiB cpu={cpu_pct:.2}% settle={:.2}s writes-drained={:.2}s later (peak rss={:.1}MiB, idle rss={:.1}MiB, window={:.0}s)",
        mib(rss),
        settle.as_secs_f64(),
        drained.as_secs_f64(),
        mib(hwm),
        mib(idle_rss),
        window.as_secs_f64()
    );
    println!(
        "discovery/steady-writes-per-minute{variant}={per_minute:.1} (writes={} requests/min={requests_per_minute:.1} over {:.0}s, {n} Instances)",
        stats.total_writes(),
        window.as_secs_f64()
    );
    if stats.total_writes() > 0 {
        eprintln!("steady-state writes by resource: {:?}", stats.writes);
    }
    Ok(())
}
