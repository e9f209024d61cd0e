//! Proxy overhead against direct containerd, side by side in one run.
//!
//! `cargo bench -p steward-resmgr --bench proxy`; `STEWARD_BENCH_SMOKE=1`
//! runs a few iterations only. Needs root (starts a private containerd
//! unless `STEWARD_CONTAINERD_SOCK` names one). Direct and proxied calls
//! are interleaved so both see the same machine noise. The proxy runs on
//! its own tokio runtime (as it would in its own process), the clients on
//! another. A third runtime serves a byte pipe to containerd (no HTTP/2
//! parsing at all): the floor any user-space proxy pays for the extra hop
//! on this machine. Finally the CPU time the proxy's and the pipe's threads
//! spend per call is read from `/proc/self/task/*/schedstat`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use steward_proto::cri::runtime::v1 as cri;
use steward_resmgr::{Proxy, ProxyConfig};
use steward_testing_containerd::{ContainerSpec, Containerd, PodNetwork, cleanup_pod, cri_client};

type Rt = steward_proto::cri::runtime::v1::runtime_service_client::RuntimeServiceClient<
    tonic::transport::Channel,
>;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn us(d: Duration) -> String {
    format!("{:.1}µs", d.as_secs_f64() * 1e6)
}

fn report(name: &str, mut direct: Vec<Duration>, mut proxied: Vec<Duration>) {
    direct.sort();
    proxied.sort();
    let (d50, d99, p50, p99) = (
        pct(&direct, 0.5),
        pct(&direct, 0.99),
        pct(&proxied, 0.5),
        pct(&proxied, 0.99),
    );
    println!(
        "proxy/{name} n={} direct p50={} p99={} proxied p50={} p99={} added p50={} p99={}",
        direct.len(),
        us(d50),
        us(d99),
        us(p50),
        us(p99),
        us(p50.saturating_sub(d50)),
        us(p99.saturating_sub(d99)),
    );
}

/// CPU time (ns) spent so far by this process's threads named `name`.
fn threads_cpu_ns(name: &str) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
        total += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

async fn run_sandbox(rt: &mut Rt, cfg: &cri::PodSandboxConfig) -> String {
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(cfg.clone()),
        runtime_handler: String::new(),
    })
    .await
    .unwrap()
    .into_inner()
    .pod_sandbox_id
}

async fn timed_create(
    rt: &mut Rt,
    sid: &str,
    sandbox: &cri::PodSandboxConfig,
    name: &str,
) -> Duration {
    let mut config = ContainerSpec::new(name).build(sandbox);
    if let Some(linux) = config.linux.as_mut() {
        linux.resources = Some(cri::LinuxContainerResources {
            cpu_shares: 256,
            memory_limit_in_bytes: 32 << 20,
            ..Default::default()
        });
    }
    let t = Instant::now();
    let id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sid.to_owned(),
            config: Some(config),
            sandbox_config: Some(sandbox.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    let took = t.elapsed();
    rt.remove_container(cri::RemoveContainerRequest { container_id: id })
        .await
        .unwrap();
    took
}

fn main() {
    let smoke = std::env::var("STEWARD_BENCH_SMOKE").is_ok_and(|v| v == "1");
    // The same logging set-up as `steward cri-proxy` (info and above).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let proxy_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("proxy")
        .enable_all()
        .build()
        .unwrap();
    let ctd = Containerd::from_env_or_start().expect("containerd (root needed)");
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ProxyConfig::new(
        dir.path().join("proxy.sock"),
        ctd.sock(),
        dir.path().join("state"),
    );
    cfg.verify_interval = Duration::ZERO;
    let proxy = proxy_runtime.block_on(Proxy::start(cfg)).unwrap();
    let pipe_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bytepipe")
        .enable_all()
        .build()
        .unwrap();
    let pipe_sock = dir.path().join("pipe.sock");
    let listener = pipe_runtime
        .block_on(async { tokio::net::UnixListener::bind(&pipe_sock) })
        .unwrap();
    let upstream = ctd.sock().to_path_buf();
    pipe_runtime.spawn(async move {
        loop {
            let (mut a, _) = listener.accept().await.unwrap();
            let mut b = tokio::net::UnixStream::connect(&upstream).await.unwrap();
            tokio::spawn(async move {
                let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
            });
        }
    });
    runtime.block_on(async {
        let (mut direct, mut direct_img) = ctd.client().await.unwrap();
        let (mut proxied, mut proxied_img) = cri_client(proxy.socket()).await.unwrap();
        let (mut piped, _) = cri_client(&pipe_sock).await.unwrap();

        let n = if smoke { 20 } else { 3000 };
        for _ in 0..(n / 10).max(5) {
            direct
                .version(cri::VersionRequest::default())
                .await
                .unwrap();
            proxied
                .version(cri::VersionRequest::default())
                .await
                .unwrap();
            piped.version(cri::VersionRequest::default()).await.unwrap();
        }
        let (mut d, mut p, mut f) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for _ in 0..n {
            let t = Instant::now();
            direct
                .version(cri::VersionRequest::default())
                .await
                .unwrap();
            d.push(t.elapsed());
            let t = Instant::now();
            proxied
                .version(cri::VersionRequest::default())
                .await
                .unwrap();
            p.push(t.elapsed());
            let t = Instant::now();
            piped.version(cri::VersionRequest::default()).await.unwrap();
            f.push(t.elapsed());
        }
        report("version-bytepipe-floor", d.clone(), f);
        report("version", d, p);

        let k = if smoke { 20 } else { 2000 };
        for (name, thread, client) in [
            ("proxy", "proxy", &mut proxied),
            ("bytepipe", "bytepipe", &mut piped),
        ] {
            let c0 = threads_cpu_ns(thread);
            for _ in 0..k {
                client
                    .version(cri::VersionRequest::default())
                    .await
                    .unwrap();
            }
            let per_call = (threads_cpu_ns(thread) - c0) / k as u64;
            println!(
                "proxy/version-cpu {name} threads cpu per call={:.1}µs n={k}",
                per_call as f64 / 1e3
            );
        }

        let n_img = if smoke { 10 } else { 1000 };
        let (mut d, mut p) = (Vec::new(), Vec::new());
        for _ in 0..n_img {
            let t = Instant::now();
            direct_img
                .list_images(cri::ListImagesRequest::default())
                .await
                .unwrap();
            d.push(t.elapsed());
            let t = Instant::now();
            proxied_img
                .list_images(cri::ListImagesRequest::default())
                .await
                .unwrap();
            p.push(t.elapsed());
        }
        report("list_images", d, p);

        let sd = ctd.pod_config("bench-direct", PodNetwork::Host);
        let sp = ctd.pod_config("bench-proxied", PodNetwork::Host);
        let sid_d = run_sandbox(&mut direct, &sd).await;
        let sid_p = run_sandbox(&mut proxied, &sp).await;
        let m = if smoke { 3 } else { 60 };
        let (mut d, mut p) = (Vec::new(), Vec::new());
        for i in 0..m {
            d.push(timed_create(&mut direct, &sid_d, &sd, &format!("c{i}")).await);
            p.push(timed_create(&mut proxied, &sid_p, &sp, &format!("c{i}")).await);
        }
        report("create_container", d, p);

        cleanup_pod(&mut direct, &sid_d).await.unwrap();
        cleanup_pod(&mut proxied, &sid_p).await.unwrap();
    });
    proxy_runtime.block_on(proxy.shutdown());
    drop(pipe_runtime);
    drop(ctd);
}
