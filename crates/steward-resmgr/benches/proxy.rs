//! Proxy overhead against direct containerd, side by side in one run.
//!
//! `cargo bench -p steward-resmgr --bench proxy`; `STEWARD_BENCH_SMOKE=1`
//! runs a few iterations only. Needs root (starts a private containerd
//! unless `STEWARD_CONTAINERD_SOCK` names one). Direct and proxied calls
//! are interleaved so both see the same machine noise. The proxy runs on
//! its own tokio runtime (as it would in its own process), the clients on
//! another. A third runtime serves a byte pipe to containerd (no HTTP/2
//! parsing at all): the floor any user-space proxy pays for the extra hop
//! on this machine; a fourth, with one blocking OS thread per direction
//! and no event loop at all, checks that floor. A second proxy, identical
//! but serving its socket without the `:authority` fix (`authority_fix =
//! false`), runs on a runtime of its own, so fix on and fix off compare in
//! the same run. Finally the CPU time the proxies' and the pipe's threads
//! spend per call is read from `/proc/self/task/*/schedstat`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use steward_proto::cri::runtime::v1 as cri;
use steward_resmgr::{Proxy, ProxyConfig};
use steward_testing_containerd::{ContainerSpec, Containerd, PodNetwork, cleanup_pod, cri_client};

type Rt = steward_proto::cri::runtime::v1::runtime_service_client::RuntimeServiceClient<
    tonic::transport::Channel,
>;

/// Prototype: pass-through only, both HTTP/2 connections and every stream
/// driven from one task per client connection (no task hops).
mod h2relay {
    use std::path::PathBuf;

    use bytes::Bytes;
    use futures::StreamExt;
    use futures::stream::FuturesUnordered;
    use h2::{RecvStream, SendStream};
    use tokio::net::{UnixListener, UnixStream};

    pub async fn serve(listener: UnixListener, upstream: PathBuf) {
        loop {
            let (down, _) = listener.accept().await.unwrap();
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let _ = conn(down, upstream).await;
            });
        }
    }

    async fn conn(down: UnixStream, upstream: PathBuf) -> Result<(), h2::Error> {
        let mut server = h2::server::handshake(down).await?;
        let up = UnixStream::connect(&upstream).await.unwrap();
        let (send, up_conn) = h2::client::handshake(up).await?;
        let mut up_conn = std::pin::pin!(up_conn);
        let mut streams = FuturesUnordered::new();
        loop {
            tokio::select! {
                req = server.accept() => match req {
                    Some(Ok((req, respond))) => streams.push(relay(send.clone(), req, respond)),
                    _ => break,
                },
                _ = &mut up_conn => break,
                Some(_) = streams.next(), if !streams.is_empty() => {}
            }
        }
        Ok(())
    }

    async fn relay(
        send: h2::client::SendRequest<Bytes>,
        req: http::Request<RecvStream>,
        mut respond: h2::server::SendResponse<Bytes>,
    ) -> Result<(), h2::Error> {
        let (parts, mut body) = req.into_parts();
        let mut send = send.ready().await?;
        let end = body.is_end_stream();
        let (resp, mut up_tx) = send.send_request(http::Request::from_parts(parts, ()), end)?;
        let req_pump = async {
            if end {
                Ok(())
            } else {
                pump(&mut body, &mut up_tx).await
            }
        };
        let resp_pump = async {
            let (parts, mut rbody) = resp.await?.into_parts();
            let end = rbody.is_end_stream();
            let mut down_tx = respond.send_response(http::Response::from_parts(parts, ()), end)?;
            if !end {
                pump(&mut rbody, &mut down_tx).await?;
            }
            Ok::<_, h2::Error>(())
        };
        let (a, b) = tokio::join!(req_pump, resp_pump);
        a?;
        b
    }

    async fn pump(rx: &mut RecvStream, tx: &mut SendStream<Bytes>) -> Result<(), h2::Error> {
        while let Some(chunk) = rx.data().await {
            let chunk = chunk?;
            let n = chunk.len();
            let eos = rx.is_end_stream();
            tx.send_data(chunk, eos)?;
            rx.flow_control().release_capacity(n)?;
            if eos {
                return Ok(());
            }
        }
        match rx.trailers().await? {
            Some(t) => tx.send_trailers(t),
            None => tx.send_data(Bytes::new(), true),
        }
    }
}

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
    cfg.manager.verify_interval = Duration::ZERO;
    cfg.authority_fix = true;
    let mut asis_cfg = cfg.clone();
    asis_cfg.listen = dir.path().join("proxy-asis.sock");
    asis_cfg.manager.state_dir = dir.path().join("state-asis");
    asis_cfg.authority_fix = false;
    let proxy = proxy_runtime.block_on(Proxy::start(cfg)).unwrap();
    let asis_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("proxy-asis")
        .enable_all()
        .build()
        .unwrap();
    let asis = asis_runtime.block_on(Proxy::start(asis_cfg)).unwrap();
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
    // A second floor without any event loop: one blocking OS thread per
    // direction, read then write, the least a user-space hop can do.
    let thread_sock = dir.path().join("threadpipe.sock");
    let thread_listener = std::os::unix::net::UnixListener::bind(&thread_sock).unwrap();
    let upstream = ctd.sock().to_path_buf();
    std::thread::Builder::new()
        .name("threadpipe".into())
        .spawn(move || {
            for a in thread_listener.incoming() {
                let a = a.unwrap();
                let b = std::os::unix::net::UnixStream::connect(&upstream).unwrap();
                for (mut from, mut to) in [(a.try_clone().unwrap(), b.try_clone().unwrap()), (b, a)]
                {
                    std::thread::Builder::new()
                        .name("threadpipe".into())
                        .spawn(move || {
                            use std::io::{Read, Write};
                            let mut buf = vec![0u8; 64 * 1024];
                            while let Ok(n) = from.read(&mut buf) {
                                if n == 0 || to.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                            let _ = to.shutdown(std::net::Shutdown::Write);
                        })
                        .unwrap();
                }
            }
        })
        .unwrap();
    let h2_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("h2relay")
        .enable_all()
        .build()
        .unwrap();
    let h2_sock = dir.path().join("h2relay.sock");
    let h2_listener = h2_runtime
        .block_on(async { tokio::net::UnixListener::bind(&h2_sock) })
        .unwrap();
    h2_runtime.spawn(h2relay::serve(h2_listener, ctd.sock().to_path_buf()));
    runtime.block_on(async {
        let (mut direct, mut direct_img) = ctd.client().await.unwrap();
        let (mut proxied, mut proxied_img) = cri_client(proxy.socket()).await.unwrap();
        let (mut asis_client, mut asis_img) = cri_client(asis.socket()).await.unwrap();
        let (mut piped, _) = cri_client(&pipe_sock).await.unwrap();
        let (mut threaded, _) = cri_client(&thread_sock).await.unwrap();
        let (mut h2r, _) = cri_client(&h2_sock).await.unwrap();

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
            asis_client
                .version(cri::VersionRequest::default())
                .await
                .unwrap();
            piped.version(cri::VersionRequest::default()).await.unwrap();
            threaded
                .version(cri::VersionRequest::default())
                .await
                .unwrap();
            h2r.version(cri::VersionRequest::default()).await.unwrap();
        }
        let (mut d, mut p, mut a, mut f, mut t2, mut hr) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
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
            asis_client
                .version(cri::VersionRequest::default())
                .await
                .unwrap();
            a.push(t.elapsed());
            let t = Instant::now();
            piped.version(cri::VersionRequest::default()).await.unwrap();
            f.push(t.elapsed());
            let t = Instant::now();
            threaded
                .version(cri::VersionRequest::default())
                .await
                .unwrap();
            t2.push(t.elapsed());
            let t = Instant::now();
            h2r.version(cri::VersionRequest::default()).await.unwrap();
            hr.push(t.elapsed());
        }
        report("version-h2relay", d.clone(), hr);
        report("version-bytepipe-floor", d.clone(), f);
        report("version-threadpipe-floor", d.clone(), t2);
        report("version-authority-fix-off", d.clone(), a);
        report("version", d, p);

        let k = if smoke { 20 } else { 2000 };
        for (name, thread, client) in [
            ("proxy", "proxy", &mut proxied),
            ("proxy-authority-fix-off", "proxy-asis", &mut asis_client),
            ("bytepipe", "bytepipe", &mut piped),
            ("threadpipe", "threadpipe", &mut threaded),
            ("h2relay", "h2relay", &mut h2r),
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
        let (mut d, mut p, mut a) = (Vec::new(), Vec::new(), Vec::new());
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
            let t = Instant::now();
            asis_img
                .list_images(cri::ListImagesRequest::default())
                .await
                .unwrap();
            a.push(t.elapsed());
        }
        report("list_images-authority-fix-off", d.clone(), a);
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
    asis_runtime.block_on(asis.shutdown());
    drop(pipe_runtime);
    drop(ctd);
}
