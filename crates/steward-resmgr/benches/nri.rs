//! The NRI transport against direct containerd and the CRI proxy, side by
//! side in one run on containerd 2.1.9.
//!
//! `cargo bench -p steward-resmgr --bench nri`; `STEWARD_BENCH_SMOKE=1` runs
//! a few iterations only. Needs root and the extracted containerd 2.1.9
//! (`scripts/containerd2.sh`). Two private containerd 2.1.9 instances: `A`
//! with no NRI plugin, `B` with `steward nri-plugin`'s resource manager
//! attached (static policy); the CRI proxy (static policy) serves in front
//! of `A`. Each iteration starts one pod with one container (RunPodSandbox,
//! CreateContainer, StartContainer) directly on `A`, on `B` (through the
//! plugin) and through the proxy, in a rotating order so all three see the
//! same machine noise; the pods are removed outside the timing. Then a
//! pass-through call (Version) directly on `A`, on `B` (it never reaches the
//! plugin) and through the proxy, interleaved. The plugin and the proxy run
//! on tokio runtimes of their own (as in their own processes), the clients
//! on another. Last, Version again on `A` and `B` with the plugin detached:
//! the difference left is the two instances'.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use steward_proto::cri::runtime::v1 as cri;
use steward_resmgr::nri::{NriConfig, NriPlugin};
use steward_resmgr::{ManagerConfig, Proxy, ProxyConfig};
use steward_testing_containerd::{
    ContainerSpec, Containerd2, PodNetwork, bin_dir_or_skip, cleanup_pod, cri_client,
    pod_sandbox_config, run_pod_with_container,
};

type Rt = cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>;

fn runtime(name: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .enable_all()
        .build()
        .unwrap()
}

fn manager(dir: &std::path::Path, name: &str) -> ManagerConfig {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, "policy: { active: static }\n").unwrap();
    let mut cfg = ManagerConfig::new(dir.join(format!("state-{name}")));
    cfg.config_file = Some(file);
    cfg.verify_interval = Duration::ZERO;
    cfg
}

/// Median and 90th percentile, in µs.
fn stats(v: &mut [Duration]) -> (f64, f64) {
    v.sort_unstable();
    let at = |q: f64| {
        let i = ((v.len() as f64 - 1.0) * q).round() as usize;
        v.get(i).map(|d| d.as_secs_f64() * 1e6).unwrap_or(0.0)
    };
    (at(0.5), at(0.9))
}

fn report(what: &str, rows: &mut [(&str, Vec<Duration>)]) {
    let base = stats(&mut rows[0].1).0;
    println!("{what}");
    for (name, v) in rows.iter_mut() {
        let n = v.len();
        let (p50, p90) = stats(v);
        println!(
            "  {name:<28} n={n:<4} p50 {:>9.0} µs  p90 {:>9.0} µs  p50/direct {:.2}",
            p50,
            p90,
            if base > 0.0 { p50 / base } else { 0.0 }
        );
    }
}

async fn start_pod(rt: &mut Rt, parent: &str, tag: &str) -> (Duration, String) {
    let sandbox = pod_sandbox_config(parent, tag, PodNetwork::Host);
    let spec = ContainerSpec::new("c");
    let t0 = Instant::now();
    let (sid, _cid) = run_pod_with_container(rt, &sandbox, &spec)
        .await
        .unwrap_or_else(|e| panic!("{tag}: {e}"));
    (t0.elapsed(), sid)
}

fn main() {
    let smoke = std::env::var_os("STEWARD_BENCH_SMOKE").is_some();
    let Some(bin) = bin_dir_or_skip("bench nri") else {
        return;
    };
    let (pods, versions) = if smoke { (2, 20) } else { (40, 2000) };
    let client = runtime("client");
    let a = Containerd2::start(bin.clone());
    let b = Containerd2::start(bin);
    let dir = tempfile::tempdir().unwrap();

    let plugin_rt = runtime("nri-plugin");
    let mut nri = NriConfig::new(manager(dir.path(), "nri"));
    nri.socket = b.nri_sock();
    nri.name = "steward-bench".into();
    let plugin = plugin_rt.block_on(async {
        let p = NriPlugin::start(nri).await.expect("plugin starts");
        assert!(
            p.registered(1, Duration::from_secs(20)).await,
            "the plugin did not register"
        );
        p
    });
    let proxy_rt = runtime("proxy");
    let mut pcfg = ProxyConfig::new(dir.path().join("proxy.sock"), a.sock(), "unused");
    pcfg.manager = manager(dir.path(), "proxy");
    let proxy = proxy_rt.block_on(Proxy::start(pcfg)).expect("proxy starts");

    client.block_on(async {
        let (mut direct, _) = cri_client(a.sock()).await.unwrap();
        let (mut with_nri, _) = cri_client(b.sock()).await.unwrap();
        let (mut proxied, _) = cri_client(dir.path().join("proxy.sock")).await.unwrap();

        // Warm-up: images, shims, the first pod of each path.
        for (rt, parent) in [
            (&mut direct, &a.cgroup_parent),
            (&mut with_nri, &b.cgroup_parent),
            (&mut proxied, &a.cgroup_parent),
        ] {
            let (_, sid) = start_pod(rt, parent, "warm").await;
            cleanup_pod(rt, &sid).await.unwrap();
        }

        let (mut t_direct, mut t_nri, mut t_proxy) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..pods {
            for k in 0..3 {
                match (i + k) % 3 {
                    0 => {
                        let (t, sid) = start_pod(&mut direct, &a.cgroup_parent, "direct").await;
                        t_direct.push(t);
                        cleanup_pod(&mut direct, &sid).await.unwrap();
                    }
                    1 => {
                        let (t, sid) = start_pod(&mut with_nri, &b.cgroup_parent, "nri").await;
                        t_nri.push(t);
                        cleanup_pod(&mut with_nri, &sid).await.unwrap();
                    }
                    _ => {
                        let (t, sid) = start_pod(&mut proxied, &a.cgroup_parent, "proxy").await;
                        t_proxy.push(t);
                        cleanup_pod(&mut proxied, &sid).await.unwrap();
                    }
                }
            }
        }
        report(
            "pod + container start (RunPodSandbox, CreateContainer, StartContainer), containerd 2.1.9",
            &mut [
                ("direct (no plugin)", t_direct),
                ("NRI plugin attached", t_nri),
                ("through the CRI proxy", t_proxy),
            ],
        );

        let (mut v_direct, mut v_nri, mut v_proxy) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..versions {
            for k in 0..3 {
                let (rt, out) = match (i + k) % 3 {
                    0 => (&mut direct, &mut v_direct),
                    1 => (&mut with_nri, &mut v_nri),
                    _ => (&mut proxied, &mut v_proxy),
                };
                let t0 = Instant::now();
                rt.version(cri::VersionRequest::default()).await.unwrap();
                out.push(t0.elapsed());
            }
        }
        report(
            "pass-through call (Version)",
            &mut [
                ("direct (no plugin)", v_direct),
                ("NRI plugin attached", v_nri),
                ("through the CRI proxy", v_proxy),
            ],
        );
    });
    let times = plugin.create_times();
    plugin_rt.block_on(plugin.shutdown());

    // The same Version calls with the plugin detached from `B`: what is
    // left between `A` and `B` is the two instances, not the plugin.
    client.block_on(async {
        let (mut direct, _) = cri_client(a.sock()).await.unwrap();
        let (mut detached, _) = cri_client(b.sock()).await.unwrap();
        let (mut v_direct, mut v_b) = (Vec::new(), Vec::new());
        for i in 0..versions {
            for k in 0..2 {
                let (rt, out) = match (i + k) % 2 {
                    0 => (&mut direct, &mut v_direct),
                    _ => (&mut detached, &mut v_b),
                };
                let t0 = Instant::now();
                rt.version(cri::VersionRequest::default()).await.unwrap();
                out.push(t0.elapsed());
            }
        }
        report(
            "pass-through call (Version), the plugin detached",
            &mut [
                ("direct (no plugin)", v_direct),
                ("B, the plugin detached", v_b),
            ],
        );
    });
    let mut t: Vec<Duration> = times.clone();
    let (p50, p90) = stats(&mut t);
    println!(
        "the plugin's CreateContainer answers: n={} p50 {p50:.0} µs p90 {p90:.0} µs",
        times.len()
    );
    drop(proxy);
}
