//! `steward nri-plugin`'s resource manager against a real containerd 2.1.9
//! (private instance: the containerd harness's `Containerd2`), pods run by
//! a CRI client of the test's own: an exclusive container is pinned (cgroup
//! `cpuset.cpus` and `Cpus_allowed_list` inside), the shared pool shrinks
//! for another running container and grows back when the exclusive one is
//! removed, a refusal reaches the CRI caller with its reason; assignments
//! are kept across a plugin dropped without shutdown (as kill -9: no
//! goodbye, the cache as last saved) and a containerd restart; a container
//! created while the plugin answered too late (fail-open) is found at the
//! next Synchronize and re-pinned, and the Warning Event
//! `ExclusiveCpusRepinned` on its Pod reaches the API server stand-in.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{container, cpus_inside, create, eventually, init_tracing, read_cgroup, run_pod};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;
use steward_core::cpu::CpuSet;
use steward_proto::cri::runtime::v1 as cri;
use steward_resmgr::nri::{NriConfig, NriPlugin};
use steward_resmgr::{ClusterConfig, ManagerConfig};
use steward_testing_apiserver::ApiServer;
use steward_testing_containerd as harness;

/// The Node the plugin runs on in cluster mode.
const NODE: &str = "n1";

fn online() -> CpuSet {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    CpuSet::parse(s.trim()).unwrap()
}

fn plugin_config(ctrd: &harness::Containerd2, dir: &Path) -> NriConfig {
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join("config.yaml");
    std::fs::write(&file, "policy: { active: static }").unwrap();
    let mut cfg = ManagerConfig::new(dir.join("state"));
    cfg.config_file = Some(file);
    cfg.config_poll = Duration::from_millis(100);
    cfg.verify_interval = Duration::ZERO;
    let mut nri = NriConfig::new(cfg);
    nri.socket = ctrd.nri_sock();
    nri.name = "steward-test".into();
    nri.reconnect = Duration::from_millis(100);
    nri
}

async fn start_plugin(ctrd: &harness::Containerd2, dir: &Path, n: u64) -> NriPlugin {
    start(ctrd, plugin_config(ctrd, dir), n).await
}

/// The API server stand-in with steward's CRDs, the Node [`NODE`] and the
/// test pods' namespace (Events on a Pod go there).
async fn cluster() -> ApiServer {
    let api = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let node: Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NODE}})).unwrap();
    Api::<Node>::all(api.client())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": harness::POD_NAMESPACE}}))
            .unwrap();
    Api::<Namespace>::all(api.client())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    api
}

/// A plugin in cluster mode on `api` (Events on Pods, the Node published).
async fn start_plugin_in(
    ctrd: &harness::Containerd2,
    dir: &Path,
    n: u64,
    api: &ApiServer,
) -> NriPlugin {
    let mut cfg = plugin_config(ctrd, dir);
    let mut cluster = ClusterConfig::new(api.client(), NODE);
    cluster.initial_timeout = Duration::from_secs(1);
    cluster.publish_retry = Duration::from_millis(100);
    cfg.manager.cluster = Some(cluster);
    start(ctrd, cfg, n).await
}

async fn start(ctrd: &harness::Containerd2, cfg: NriConfig, n: u64) -> NriPlugin {
    let plugin = NriPlugin::start(cfg).await.expect("plugin starts");
    assert!(
        plugin.registered(n, Duration::from_secs(20)).await,
        "the plugin did not register:\n{}",
        ctrd.log()
    );
    plugin
}

fn guaranteed(sandbox: &cri::PodSandboxConfig, name: &str, cpus: i64) -> cri::ContainerConfig {
    container(sandbox, name, 1024 * cpus, 100_000 * cpus, 32 << 20)
}

fn report_times(what: &str, times: &[Duration]) {
    let mut t: Vec<u128> = times.iter().map(Duration::as_micros).collect();
    t.sort_unstable();
    if let (Some(p50), Some(max)) = (t.get(t.len() / 2), t.last()) {
        eprintln!(
            "{what}: {} CreateContainer answers, p50 {p50} µs, max {max} µs",
            t.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_containers_are_pinned_and_the_shared_pool_follows() {
    let Some(bin) = harness::bin_dir_or_skip("nri_plugin") else {
        return;
    };
    init_tracing();
    let ctrd = harness::Containerd2::start(bin);
    let dir = tempfile::tempdir().unwrap();
    let plugin = start_plugin(&ctrd, dir.path(), 1).await;
    let (mut rt, _img) = harness::cri_client(ctrd.sock()).await.expect("CRI client");
    let all = online().to_string();

    // Burstable: the whole shared pool.
    let sa = harness::pod_sandbox_config(&ctrd.cgroup_parent, "burst", harness::PodNetwork::Host);
    let (sid_a, a) = run_pod(&mut rt, &sa, container(&sa, "a", 512, 0, 64 << 20)).await;
    assert_eq!(cpus_inside(&mut rt, &a).await, all);
    assert_eq!(read_cgroup("cpuset", &sa, &a, "cpuset.cpus"), all);

    // Guaranteed, 1 CPU: exclusive; the burstable container's pool shrinks.
    let sb = harness::pod_sandbox_config(&ctrd.cgroup_parent, "guar", harness::PodNetwork::Host);
    let (sid_b, b) = run_pod(&mut rt, &sb, guaranteed(&sb, "b", 1)).await;
    let snap = plugin.manager().snapshot().await;
    let asg = snap.containers[&b].assignment.clone().unwrap();
    assert!(asg.exclusive, "{asg:?}");
    let excl = CpuSet::parse(&asg.cpus).unwrap();
    assert_eq!(excl.len(), 1);
    let rest = online().difference(&excl).to_string();
    let excl = excl.to_string();
    assert_eq!(cpus_inside(&mut rt, &b).await, excl);
    assert_eq!(read_cgroup("cpuset", &sb, &b, "cpuset.cpus"), excl);
    assert_eq!(
        cpus_inside(&mut rt, &a).await,
        rest,
        "the shared pool shrank"
    );
    assert_eq!(read_cgroup("cpuset", &sa, &a, "cpuset.cpus"), rest);
    assert_eq!(
        read_cgroup("memory", &sa, &a, "memory.limit_in_bytes"),
        (64u64 << 20).to_string(),
        "the update kept the memory limit"
    );
    // cgroupfs read-back agrees.
    for r in plugin.manager().verify().await {
        assert!(r.drift.is_empty() && r.error.is_none(), "{r:?}");
    }

    // A second exclusive CPU does not exist: refused, with the reason.
    let sc = harness::pod_sandbox_config(&ctrd.cgroup_parent, "big", harness::PodNetwork::Host);
    let sid_c = common::run_sandbox(&mut rt, &sc).await;
    let err = create(&mut rt, &sid_c, &sc, guaranteed(&sc, "c", 2))
        .await
        .expect_err("no room for 2 exclusive CPUs");
    eprintln!(
        "refusal as the CRI caller sees it: {:?}: {}",
        err.code(),
        err.message()
    );
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("needs 2 exclusive CPUs"),
        "{}",
        err.message()
    );
    assert!(plugin.manager().snapshot().await.containers.len() == 2);

    // The exclusive pod goes: the pool grows back.
    harness::cleanup_pod(&mut rt, &sid_b).await.unwrap();
    let want = all.clone();
    eventually(10, "the shared pool grew back", || {
        let sa = sa.clone();
        let a = a.clone();
        let want = want.clone();
        async move { read_cgroup("cpuset", &sa, &a, "cpuset.cpus") == want }
    })
    .await;
    assert_eq!(cpus_inside(&mut rt, &a).await, all);

    // The kubelet resizes the shared container to 1 guaranteed CPU
    // (UpdateContainerResources through the runtime, NRI UpdateContainer):
    // re-placed on an exclusive CPU, as through the proxy.
    rt.update_container_resources(cri::UpdateContainerResourcesRequest {
        container_id: a.clone(),
        linux: Some(cri::LinuxContainerResources {
            cpu_shares: 1024,
            cpu_quota: 100_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 64 << 20,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("UpdateContainerResources");
    let asg = plugin.manager().snapshot().await.containers[&a]
        .assignment
        .clone()
        .unwrap();
    assert!(asg.exclusive, "re-placed: {asg:?}");
    assert_eq!(read_cgroup("cpuset", &sa, &a, "cpuset.cpus"), asg.cpus);
    assert_eq!(cpus_inside(&mut rt, &a).await, asg.cpus);
    harness::cleanup_pod(&mut rt, &sid_a).await.unwrap();
    harness::cleanup_pod(&mut rt, &sid_c).await.unwrap();
    let snap = plugin.manager().snapshot().await;
    assert!(snap.containers.is_empty(), "{:?}", snap.containers.keys());
    assert!(plugin.manager().assignments().await.is_empty());
    report_times("pinning", &plugin.create_times());
    let took = plugin.create_times().into_iter().max().unwrap_or_default();
    assert!(took < Duration::from_millis(200), "{took:?}");
    plugin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assignments_survive_a_plugin_kill_a_runtime_restart_and_fail_open() {
    let Some(bin) = harness::bin_dir_or_skip("nri_plugin") else {
        return;
    };
    init_tracing();
    let mut ctrd = harness::Containerd2::start(bin);
    let dir = tempfile::tempdir().unwrap();
    let plugin = start_plugin(&ctrd, dir.path(), 1).await;
    let (mut rt, _img) = harness::cri_client(ctrd.sock()).await.expect("CRI client");

    let sa = harness::pod_sandbox_config(&ctrd.cgroup_parent, "burst", harness::PodNetwork::Host);
    let (sid_a, a) = run_pod(&mut rt, &sa, container(&sa, "a", 512, 0, 64 << 20)).await;
    let sb = harness::pod_sandbox_config(&ctrd.cgroup_parent, "guar", harness::PodNetwork::Host);
    let (sid_b, b) = run_pod(&mut rt, &sb, guaranteed(&sb, "b", 1)).await;
    let before = plugin.manager().snapshot().await;
    let excl = before.containers[&b].assignment.clone().unwrap().cpus;
    let rest = before.containers[&a].assignment.clone().unwrap().cpus;
    assert_ne!(excl, rest);

    // The plugin dies without a goodbye (as kill -9): a new one on the same
    // cache (in cluster mode, for the Event below) is synchronised and keeps
    // every assignment.
    drop(plugin);
    let api = cluster().await;
    let plugin = start_plugin_in(&ctrd, dir.path(), 1, &api).await;
    let after = plugin.manager().snapshot().await;
    for id in [&a, &b] {
        assert_eq!(
            after.containers[id].assignment, before.containers[id].assignment,
            "{id}"
        );
    }
    assert_eq!(read_cgroup("cpuset", &sb, &b, "cpuset.cpus"), excl);
    assert_eq!(read_cgroup("cpuset", &sa, &a, "cpuset.cpus"), rest);

    // containerd restarts (SIGKILL; its shims live on): the plugin
    // reconnects, is synchronised, keeps the assignments.
    ctrd.restart();
    assert!(
        plugin.registered(2, Duration::from_secs(30)).await,
        "no reconnect after the runtime restarted:\n{}",
        ctrd.log()
    );
    let (mut rt, _img) = harness::cri_client(ctrd.sock()).await.expect("CRI client");
    let after = plugin.manager().snapshot().await;
    for id in [&a, &b] {
        assert_eq!(
            after.containers[id].assignment, before.containers[id].assignment,
            "{id}"
        );
    }
    assert_eq!(cpus_inside(&mut rt, &b).await, excl);
    for r in plugin.manager().verify().await {
        assert!(r.drift.is_empty() && r.error.is_none(), "{r:?}");
    }

    // Fail-open: the exclusive pod goes, another comes while the plugin
    // cannot answer within the runtime's 2 s; the runtime disconnects it and
    // creates the container unadjusted. The next Synchronize finds it
    // running on other CPUs than assigned and re-pins it.
    harness::cleanup_pod(&mut rt, &sid_b).await.unwrap();
    let sc = harness::pod_sandbox_config(&ctrd.cgroup_parent, "late", harness::PodNetwork::Host);
    let sid_c = common::run_sandbox(&mut rt, &sc).await;
    let paused = plugin.manager().pause_pipeline().await;
    let t0 = Instant::now();
    let c = create(&mut rt, &sid_c, &sc, guaranteed(&sc, "c", 1))
        .await
        .expect("created unadjusted (fail-open)");
    eprintln!("fail-open create took {} ms", t0.elapsed().as_millis());
    common::start(&mut rt, &c).await;
    let unpinned = read_cgroup("cpuset", &sc, &c, "cpuset.cpus");
    drop(paused);
    let m = plugin.manager().clone();
    let cid = c.clone();
    eventually(30, "the late decision recorded", || {
        let (m, cid) = (m.clone(), cid.clone());
        async move { m.snapshot().await.containers.contains_key(&cid) }
    })
    .await;
    let snap = plugin.manager().snapshot().await;
    let asg = snap.containers[&c].assignment.clone().unwrap();
    assert!(asg.exclusive, "{asg:?}");
    assert_ne!(unpinned, asg.cpus, "the container started unadjusted");
    let want = asg.cpus.clone();
    eventually(30, "the fail-open container re-pinned", || {
        let (sc, c, want) = (sc.clone(), c.clone(), want.clone());
        async move { read_cgroup("cpuset", &sc, &c, "cpuset.cpus") == want }
    })
    .await;
    assert!(plugin.fail_open_repinned() >= 1, "found as fail-open");
    // ... and said so on the Pod, where the operator looks first.
    let pod = sc.metadata.clone().unwrap();
    let events: Api<Event> = Api::namespaced(api.client(), &pod.namespace);
    let found = |items: Vec<Event>| {
        items.into_iter().find(|e| {
            e.reason.as_deref() == Some("ExclusiveCpusRepinned")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod.name.as_str())
        })
    };
    eventually(
        30,
        "the ExclusiveCpusRepinned Event in the API server",
        || {
            let events = events.clone();
            let found = &found;
            async move {
                events
                    .list(&Default::default())
                    .await
                    .is_ok_and(|l| found(l.items).is_some())
            }
        },
    )
    .await;
    let ev = found(events.list(&Default::default()).await.unwrap().items).unwrap();
    let regarding = ev.regarding.clone().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Pod"), "{ev:?}");
    assert_eq!(regarding.uid.as_deref(), Some(pod.uid.as_str()), "{ev:?}");
    assert_eq!(ev.type_.as_deref(), Some("Warning"), "{ev:?}");
    assert_eq!(
        ev.reporting_controller.as_deref(),
        Some("steward-nri-plugin"),
        "{ev:?}"
    );
    let note = ev.note.clone().unwrap_or_default();
    assert!(
        note.contains(&asg.cpus) && note.contains("re-pinned") && !note.contains("CPUs  "),
        "{note}"
    );
    eprintln!(
        "Event ExclusiveCpusRepinned on {}/{}: {note}",
        pod.namespace, pod.name
    );
    let rest_now = online()
        .difference(&CpuSet::parse(&want).unwrap())
        .to_string();
    eventually(10, "the shared pool shrank again", || {
        let (sa, a, r) = (sa.clone(), a.clone(), rest_now.clone());
        async move { read_cgroup("cpuset", &sa, &a, "cpuset.cpus") == r }
    })
    .await;
    assert_eq!(cpus_inside(&mut rt, &c).await, want);
    eprintln!("fail-open: ran on {unpinned}, re-pinned to {want}");

    harness::cleanup_pod(&mut rt, &sid_c).await.unwrap();
    harness::cleanup_pod(&mut rt, &sid_a).await.unwrap();
    plugin.shutdown().await;
}
