//! Pods run through the proxy into a real containerd: pass-through,
//! intercepted lifecycle, policy cpusets seen from inside the containers
//! and in cgroupfs, bad input, drift repair, adoption, configuration
//! reload, proxy restart and the out-of-band controllers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use steward_core::cpu::{CpuSet, PolicyKind};
use steward_proto::cri::runtime::v1 as cri;
use steward_testing_containerd::{
    BUSYBOX_IMAGE, ContainerSpec, Containerd, POD_LABEL, PodNetwork, cleanup_pod,
    run_pod_with_container,
};

fn online() -> CpuSet {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    CpuSet::parse(s.trim()).unwrap()
}

/// The exclusive CPU a guaranteed 1-CPU container got and the shared pool
/// left for the others.
fn split(exclusive: &str) -> (String, String) {
    let ex = CpuSet::parse(exclusive).unwrap();
    assert_eq!(ex.len(), 1, "one exclusive CPU: {exclusive}");
    (ex.to_string(), online().difference(&ex).to_string())
}

async fn unary_raw(sock: &std::path::Path, path: &'static str) -> tonic::Status {
    let channel = {
        let ep = tonic::transport::Endpoint::try_from("http://[::]:50051").unwrap();
        let p = sock.to_path_buf();
        ep.connect_with_connector(tower::service_fn(move |_| {
            let p = p.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
        .unwrap()
    };
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<cri::VersionRequest, cri::VersionResponse>::default();
    grpc.unary(
        tonic::Request::new(cri::VersionRequest::default()),
        http::uri::PathAndQuery::from_static(path),
        codec,
    )
    .await
    .expect_err("no runtime implements this")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_and_unknown_methods_relay_untouched() {
    init_tracing();
    let _serial = SERIAL.lock().await;
    let ctd = Containerd::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (proxy, mut rt, mut img) = start_proxy(proxy_config(
        ctd.sock(),
        dir.path(),
        "policy: { active: static }",
    ))
    .await;
    let (mut direct, mut direct_img) = ctd.client().await.unwrap();

    let via = rt
        .version(cri::VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let dir_v = direct
        .version(cri::VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(via, dir_v);
    assert_eq!(via.runtime_name, "containerd");

    let mut images = img
        .list_images(cri::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut direct_images = direct_img
        .list_images(cri::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner();
    images.images.sort_by(|a, b| a.id.cmp(&b.id));
    direct_images.images.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(images, direct_images);
    assert!(
        images
            .images
            .iter()
            .any(|i| i.repo_tags.iter().any(|t| t == BUSYBOX_IMAGE)),
        "{images:?}"
    );
    let status = rt
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    assert!(status.status.is_some());

    // Methods the runtime does not know (a newer kubelet's) are relayed,
    // not dropped: the answer is the runtime's own.
    for path in [
        "/runtime.v1.RuntimeService/SomeRpcFromTheFuture",
        "/runtime.v1.ImageService/AlsoFromTheFuture",
        "/runtime.v2.RuntimeService/Version",
    ] {
        let through = unary_raw(proxy.socket(), path).await;
        let straight = unary_raw(ctd.sock(), path).await;
        assert_eq!(through.code(), straight.code(), "{path}");
        assert_eq!(through.message(), straight.message(), "{path}");
        assert_eq!(
            through.code(),
            tonic::Code::Unimplemented,
            "{path}: {through:?}"
        );
    }
    // The streaming GetContainerEvents. containerd 1.6 does not serve it:
    // same answer through the proxy as directly. containerd 2.x does, and
    // sends its response headers only with the first event (the call does
    // not return before one), and every subscriber takes events from one
    // shared queue (events of earlier pods may still wait in it): so the
    // relayed stream is checked alone, with a pod run to make sure of one.
    let major = ctd.runtime_version().await.unwrap().major();
    if major.is_some_and(|m| m >= 2) {
        let mut through = rt.clone();
        let events = tokio::spawn(async move {
            let mut stream = through
                .get_container_events(cri::GetEventsRequest::default())
                .await?
                .into_inner();
            stream.message().await
        });
        let sandbox = ctd.pod_config("events", PodNetwork::Host);
        let sid = run_sandbox(&mut direct, &sandbox).await;
        let event = tokio::time::timeout(Duration::from_secs(10), events)
            .await
            .expect("an event relayed within 10 s")
            .unwrap()
            .expect("the relayed stream")
            .expect("one event");
        // The queue may still hold events of earlier pods: any event will do.
        assert!(!event.container_id.is_empty(), "{event:?}");
        cleanup_pod(&mut direct, &sid).await.unwrap();
    } else {
        let through = rt
            .get_container_events(cri::GetEventsRequest::default())
            .await;
        let straight = direct
            .get_container_events(cri::GetEventsRequest::default())
            .await;
        match (through, straight) {
            (Err(a), Err(b)) => {
                assert_eq!(a.code(), b.code());
                assert_eq!(a.message(), b.message());
            }
            (Ok(_), Ok(_)) => {}
            (a, b) => panic!("proxy and runtime disagree: {:?} vs {:?}", a.err(), b.err()),
        }
    }
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_does_not_wait_on_the_pipeline_lock() {
    init_tracing();
    let _serial = SERIAL.lock().await;
    let ctd = Containerd::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (proxy, mut rt, _) = start_proxy(proxy_config(
        ctd.sock(),
        dir.path(),
        "policy: { active: static }",
    ))
    .await;
    let sandbox = ctd.pod_config("locked", PodNetwork::Host);
    let sid = run_sandbox(&mut rt, &sandbox).await;

    let guard = proxy.manager().pause_pipeline().await;
    // Intercepted: waits for the lock.
    let mut rt2 = rt.clone();
    let sb = sandbox.clone();
    let sid2 = sid.clone();
    let create = tokio::spawn(async move {
        create(&mut rt2, &sid2, &sb, container(&sb, "w", 512, 0, 32 << 20)).await
    });
    // Relayed: answers while the lock is held.
    for _ in 0..20 {
        tokio::time::timeout(
            Duration::from_secs(2),
            rt.version(cri::VersionRequest::default()),
        )
        .await
        .expect("Version must not wait on the pipeline lock")
        .unwrap();
        tokio::time::timeout(
            Duration::from_secs(2),
            rt.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: sid.clone(),
                verbose: false,
            }),
        )
        .await
        .expect("PodSandboxStatus must not wait on the pipeline lock")
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !create.is_finished(),
        "CreateContainer ran although the pipeline was locked"
    );
    drop(guard);
    let cid = tokio::time::timeout(Duration::from_secs(30), create)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        proxy
            .manager()
            .snapshot()
            .await
            .containers
            .contains_key(&cid)
    );
    cleanup_pod(&mut rt, &sid).await.unwrap();
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_cpusets_are_applied_seen_inside_and_read_back() {
    init_tracing();
    let _serial = SERIAL.lock().await;
    let ctd = Containerd::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (proxy, mut rt, _) = start_proxy(proxy_config(
        ctd.sock(),
        dir.path(),
        "policy: { active: static }",
    ))
    .await;
    let all = online().to_string();

    // Burstable: 0.5 CPU, 64 MiB: the whole shared pool.
    let sa = ctd.pod_config("burst", PodNetwork::Host);
    let (sid_a, a) = run_pod(&mut rt, &sa, container(&sa, "a", 512, 0, 64 << 20)).await;
    assert_eq!(cpus_inside(&mut rt, &a).await, all);
    assert_eq!(read_cgroup("cpuset", &sa, &a, "cpuset.cpus"), all);
    assert_eq!(memory_inside(&mut rt, &a).await, 64 << 20);
    assert_eq!(
        read_cgroup("memory", &sa, &a, "memory.limit_in_bytes"),
        (64u64 << 20).to_string()
    );

    // Guaranteed, 1 CPU: an exclusive CPU; the shared pool shrinks and the
    // burstable container is updated.
    let sb = ctd.pod_config("guar", PodNetwork::Host);
    let (sid_b, b) = run_pod(&mut rt, &sb, container(&sb, "b", 1024, 100_000, 32 << 20)).await;
    let snap = proxy.manager().snapshot().await;
    let asg = snap.containers[&b].assignment.clone().unwrap();
    assert!(asg.exclusive, "{asg:?}");
    let (excl, rest) = split(&asg.cpus);
    assert_eq!(cpus_inside(&mut rt, &b).await, excl);
    assert_eq!(read_cgroup("cpuset", &sb, &b, "cpuset.cpus"), excl);
    assert_eq!(memory_inside(&mut rt, &b).await, 32 << 20);
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
    assert_eq!(snap.containers[&a].assignment.clone().unwrap().cpus, rest);

    // Read-back from cgroupfs agrees with the policy.
    let reports = proxy.manager().verify().await;
    assert_eq!(reports.len(), 2, "{reports:?}");
    for r in &reports {
        assert!(r.drift.is_empty() && r.error.is_none(), "{r:?}");
    }
    let rb = reports.iter().find(|r| r.container_id == b).unwrap();
    assert_eq!(rb.actual_memory, Some(32 << 20));
    assert_eq!(rb.actual_cpus.as_deref(), Some(excl.as_str()));

    // The guaranteed pod goes: the pool grows back.
    cleanup_pod(&mut rt, &sid_b).await.unwrap();
    assert_eq!(
        cpus_inside(&mut rt, &a).await,
        all,
        "the shared pool grew back"
    );
    cleanup_pod(&mut rt, &sid_a).await.unwrap();
    let snap = proxy.manager().snapshot().await;
    for id in [&a, &b] {
        assert!(!snap.containers.contains_key(id));
    }
    for id in [&sid_a, &sid_b] {
        assert!(!snap.pods.contains_key(id));
    }
    assert!(proxy.manager().assignments().await.is_empty());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_before_the_runtime() {
    init_tracing();
    let _serial = SERIAL.lock().await;
    let ctd = Containerd::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (proxy, mut rt, _) = start_proxy(proxy_config(
        ctd.sock(),
        dir.path(),
        "policy: { active: static }\nblockio: { classes: { slow: { weight: 100 } } }\n",
    ))
    .await;
    let (mut direct, _) = ctd.client().await.unwrap();

    // A sandbox with an unknown annotation of our domain never reaches the runtime.
    let mut bad_pod = ctd.pod_config("badpod", PodNetwork::Host);
    bad_pod
        .annotations
        .insert("frobnicate.resmgr.steward.dev/x".into(), "1".into());
    let e = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(bad_pod.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("frobnicate"), "{e:?}");
    let name = bad_pod.metadata.clone().unwrap().name;
    let listed = direct
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: [(POD_LABEL.to_owned(), name)].into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed.items.is_empty(),
        "the runtime got the refused sandbox"
    );

    let s = ctd.pod_config("bad", PodNetwork::Host);
    let sid = run_sandbox(&mut rt, &s).await;
    let with = |f: &dyn Fn(&mut cri::LinuxContainerResources)| {
        let mut c = container(&s, "w", 512, 0, 32 << 20);
        f(c.linux.as_mut().unwrap().resources.as_mut().unwrap());
        c
    };
    let annotated = |k: &str, v: &str| {
        let mut sc = s.clone();
        sc.annotations.insert(k.into(), v.into());
        sc
    };
    let cases: Vec<(
        cri::ContainerConfig,
        cri::PodSandboxConfig,
        tonic::Code,
        &str,
    )> = vec![
        (
            with(&|r| r.cpuset_cpus = "0-".into()),
            s.clone(),
            tonic::Code::InvalidArgument,
            "cpuset_cpus",
        ),
        (
            with(&|r| r.cpuset_mems = "zero".into()),
            s.clone(),
            tonic::Code::InvalidArgument,
            "cpuset_mems",
        ),
        (
            with(&|r| r.memory_limit_in_bytes = -5),
            s.clone(),
            tonic::Code::InvalidArgument,
            "memory_limit",
        ),
        (
            with(&|r| r.cpu_shares = 1 << 40),
            s.clone(),
            tonic::Code::InvalidArgument,
            "cpu_shares",
        ),
        (
            with(&|r| {
                r.cpu_quota = 1 << 40;
                r.cpu_period = 100_000;
            }),
            s.clone(),
            tonic::Code::InvalidArgument,
            "millicores",
        ),
        // 64 exclusive CPUs: more than the node has.
        (
            container(&s, "w", 65536, 6_400_000, 32 << 20),
            s.clone(),
            tonic::Code::ResourceExhausted,
            "",
        ),
        (
            container(&s, "w", 512, 0, 32 << 20),
            annotated("cpu.steward.dev/prefer-shared", "maybe"),
            tonic::Code::InvalidArgument,
            "prefer-shared",
        ),
        (
            container(&s, "w", 512, 0, 32 << 20),
            annotated("resources.resmgr.steward.dev/spec.container.w", "{nope"),
            tonic::Code::InvalidArgument,
            "resources",
        ),
        (
            container(&s, "w", 512, 0, 32 << 20),
            annotated("blockio.resmgr.steward.dev/class", "no-such-class"),
            tonic::Code::InvalidArgument,
            "no-such-class",
        ),
    ];
    for (cfg, sc, code, needle) in cases {
        let e = create(&mut rt, &sid, &sc, cfg).await.unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().contains(needle), "{needle}: {e:?}");
        assert!(
            runtime_containers(&mut direct, &sid).await.is_empty(),
            "runtime touched: {e:?}"
        );
        assert!(proxy.manager().snapshot().await.containers.is_empty());
        assert!(
            proxy.manager().assignments().await.is_empty(),
            "allocation leaked: {e:?}"
        );
    }
    // Still healthy: a good container goes through.
    let cid = create(&mut rt, &sid, &s, container(&s, "w", 512, 0, 32 << 20))
        .await
        .unwrap();
    start(&mut rt, &cid).await;
    assert_eq!(proxy.manager().assignments().await.len(), 1);
    cleanup_pod(&mut rt, &sid).await.unwrap();
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_detects_and_repairs_cgroup_drift() {
    init_tracing();
    let _serial = SERIAL.lock().await;
    let ctd = Containerd::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (proxy, mut rt, _) = start_proxy(proxy_config(
        ctd.sock(),
        dir.path(),
        "policy: { active: static }",
    ))
    .await;
    let all = online();
    let s = ctd.pod_config("drift", PodNetwork::Host);
    let (sid, cid) = run_pod(&mut rt, &s, container(&s, "w", 512, 0, 48 << 20)).await;
    assert_eq!(
        read_cgroup("cpuset", &s, &cid, "cpuset.cpus"),
        all.to_string()
    );

    // Somebody else narrows the container's cpuset behind our back.
    let one = all.first().unwrap().to_string();
    std::fs::write(cgroup_file("cpuset", &s, &cid, "cpuset.cpus"), &one).unwrap();
    assert_eq!(cpus_inside(&mut rt, &cid).await, one);

    let reports = proxy.manager().verify().await;
    let r = reports.iter().find(|r| r.container_id == cid).unwrap();
    assert_eq!(r.actual_cpus.as_deref(), Some(one.as_str()));
    assert_eq!(r.drift.len(), 1, "{r:?}");
    assert!(r.drift[0].contains("cpuset.cpus"), "{r:?}");
    assert!(r.repaired, "{r:?}");
    assert_eq!(proxy.manager().metrics().drift_count("cpuset"), 1);
    assert_eq!(
        read_cgroup("cpuset", &s, &cid, "cpuset.cpus"),
        all.to_string()
    );
    assert_eq!(cpus_inside(&mut rt, &cid).await, all.to_string());
    let again = proxy.manager().verify().await;
    assert!(again.iter().all(|r| r.drift.is_empty()), "{again:?}");
    cleanup_pod(&mut rt, &sid).await.unwrap();
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_created_behind_the_proxys_back_are_adopted() {
    init_tracing();
    let _serial = SERIAL.lock().await;
    let ctd = Containerd::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (proxy, mut rt, _) = start_proxy(proxy_config(
        ctd.sock(),
        dir.path(),
        "policy: { active: static }",
    ))
    .await;
    let (mut direct, _) = ctd.client().await.unwrap();

    let sb = ctd.pod_config("owner", PodNetwork::Host);
    let (sid_b, b) = run_pod(&mut rt, &sb, container(&sb, "b", 1024, 100_000, 32 << 20)).await;
    let asg = proxy.manager().snapshot().await.containers[&b]
        .assignment
        .clone()
        .unwrap();
    let (_, rest) = split(&asg.cpus);

    // Straight into containerd, on every CPU: the proxy does not know it.
    let sx = ctd.pod_config("stray", PodNetwork::Host);
    let spec = ContainerSpec::new("x").cpuset(online().to_string());
    let (sid_x, x) = run_pod_with_container(&mut direct, &sx, &spec)
        .await
        .unwrap();
    assert_eq!(cpus_inside(&mut rt, &x).await, online().to_string());

    // The kubelet's periodic relist through the proxy reveals it.
    rt.list_containers(cri::ListContainersRequest::default())
        .await
        .unwrap();
    let m = proxy.manager().clone();
    let xid = x.clone();
    eventually(20, "stray container adopted", || {
        let m = m.clone();
        let xid = xid.clone();
        async move { m.snapshot().await.containers.contains_key(&xid) }
    })
    .await;
    let snap = proxy.manager().snapshot().await;
    assert_eq!(snap.containers[&x].assignment.clone().unwrap().cpus, rest);
    assert!(snap.pods.contains_key(&sid_x));
    assert!(proxy.manager().metrics().drift_count("container-adopted") >= 1);
    assert_eq!(
        cpus_inside(&mut rt, &x).await,
        rest,
        "repaired into the shared pool"
    );

    cleanup_pod(&mut rt, &sid_x).await.unwrap();
    cleanup_pod(&mut rt, &sid_b).await.unwrap();
    assert!(proxy.manager().assignments().await.is_empty());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_reload_is_live_and_policy_switch_needs_the_flag() {
    init_tracing();
    let _serial = SERIAL.lock().await;
    let ctd = Containerd::shared().unwrap();
    let all = online();
    if all.len() < 2 {
        eprintln!("skipping: needs 2 CPUs");
        return;
    }
    let first = all.first().unwrap().to_string();
    let rest = all.difference(&CpuSet::parse(&first).unwrap()).to_string();
    let dir = tempfile::tempdir().unwrap();
    let cfg = proxy_config(ctd.sock(), dir.path(), "policy: { active: static }");
    let file = cfg.manager.config_file.clone().unwrap();
    let (proxy, mut rt, _) = start_proxy(cfg).await;
    let s = ctd.pod_config("cfg", PodNetwork::Host);
    let (sid, cid) = run_pod(&mut rt, &s, container(&s, "w", 512, 0, 32 << 20)).await;
    assert_eq!(cpus_inside(&mut rt, &cid).await, all.to_string());

    // A policy parameter changes live: reserving a CPU moves the container.
    std::fs::write(
        &file,
        format!("policy: {{ active: static, config: {{ reserved_cpus: \"{first}\" }} }}"),
    )
    .unwrap();
    let m = proxy.manager().clone();
    let want = rest.clone();
    eventually(20, "reconfigured assignment", || {
        let m = m.clone();
        let want = want.clone();
        async move {
            m.snapshot()
                .await
                .containers
                .values()
                .any(|c| c.assignment.as_ref().is_some_and(|a| a.cpus == want))
        }
    })
    .await;
    assert_eq!(cpus_inside(&mut rt, &cid).await, rest);

    // Switching the policy is refused without the flag.
    std::fs::write(&file, "policy: { active: none }").unwrap();
    let m2 = proxy.manager().clone();
    eventually(20, "switch refused", || {
        let m = m2.clone();
        async move { m.metrics().event_count("policy-switch-refused") >= 1 }
    })
    .await;
    assert_eq!(proxy.manager().policy_kind().await, PolicyKind::Static);
    assert_eq!(cpus_inside(&mut rt, &cid).await, rest);

    // A broken file is ignored.
    std::fs::write(&file, "policy: [").unwrap();
    let m3 = proxy.manager().clone();
    eventually(20, "broken config rejected", || {
        let m = m3.clone();
        async move { m.metrics().event_count("config-rejected") >= 1 }
    })
    .await;
    assert_eq!(proxy.manager().policy_kind().await, PolicyKind::Static);
    cleanup_pod(&mut rt, &sid).await.unwrap();
    proxy.shutdown().await;

    // With the flag the switch happens and containers follow.
    let dir2 = tempfile::tempdir().unwrap();
    let mut cfg2 = proxy_config(
        ctd.sock(),
        dir2.path(),
        &format!("policy: {{ active: static, config: {{ reserved_cpus: \"{first}\" }} }}"),
    );
    cfg2.manager.allow_policy_switch = true;
    let file2 = cfg2.manager.config_file.clone().unwrap();
    let (proxy2, mut rt2, _) = start_proxy(cfg2).await;
    let s2 = ctd.pod_config("switch", PodNetwork::Host);
    let (sid2, cid2) = run_pod(&mut rt2, &s2, container(&s2, "w", 512, 0, 32 << 20)).await;
    assert_eq!(cpus_inside(&mut rt2, &cid2).await, rest);
    std::fs::write(&file2, "policy: { active: none }").unwrap();
    let m4 = proxy2.manager().clone();
    eventually(20, "policy switched", || {
        let m = m4.clone();
        async move { m.policy_kind().await == PolicyKind::None }
    })
    .await;
    assert_eq!(cpus_inside(&mut rt2, &cid2).await, all.to_string());
    assert_eq!(proxy2.manager().snapshot().await.policy, "none");
    cleanup_pod(&mut rt2, &sid2).await.unwrap();
    proxy2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_restart_restores_cache_and_policy_and_resyncs() {
    init_tracing();
    let _serial = SERIAL.lock().await;
    let ctd = Containerd::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = proxy_config(ctd.sock(), dir.path(), "policy: { active: static }");
    let (proxy, mut rt, _) = start_proxy(cfg.clone()).await;
    let (mut direct, _) = ctd.client().await.unwrap();

    let sa = ctd.pod_config("ra", PodNetwork::Host);
    let (sid_a, a) = run_pod(&mut rt, &sa, container(&sa, "a", 512, 0, 32 << 20)).await;
    let sb = ctd.pod_config("rb", PodNetwork::Host);
    let (sid_b, b) = run_pod(&mut rt, &sb, container(&sb, "b", 1024, 100_000, 32 << 20)).await;
    let sd = ctd.pod_config("rd", PodNetwork::Host);
    let (sid_d, d) = run_pod(&mut rt, &sd, container(&sd, "d", 256, 0, 32 << 20)).await;
    let before = proxy.manager().snapshot().await;
    let assigned = proxy.manager().assignments().await;
    assert_eq!(assigned.len(), 3);
    proxy.shutdown().await;
    drop(rt);

    // While the proxy is down a pod goes away behind its back.
    cleanup_pod(&mut direct, &sid_d).await.unwrap();

    let (proxy2, mut rt2, _) = start_proxy(cfg).await;
    let after = proxy2.manager().snapshot().await;
    assert!(!after.containers.contains_key(&d) && !after.pods.contains_key(&sid_d));
    for id in [&a, &b] {
        assert_eq!(after.containers[id], before.containers[id], "restored {id}");
    }
    let restored = proxy2.manager().assignments().await;
    assert_eq!(restored.len(), 2);
    for (k, v) in &restored {
        assert_eq!(assigned.get(k), Some(v), "policy restored {k}");
    }
    assert!(proxy2.manager().metrics().drift_count("container-vanished") >= 1);

    // The restored policy still drives updates: the exclusive pod goes, the
    // shared one gets every CPU back.
    cleanup_pod(&mut rt2, &sid_b).await.unwrap();
    assert_eq!(cpus_inside(&mut rt2, &a).await, online().to_string());
    cleanup_pod(&mut rt2, &sid_a).await.unwrap();
    assert!(proxy2.manager().assignments().await.is_empty());
    proxy2.shutdown().await;
}

fn a_block_device() -> Option<String> {
    let mut names: Vec<_> = std::fs::read_dir("/sys/block").ok()?.flatten().collect();
    names.sort_by_key(|e| e.file_name());
    names.into_iter().find_map(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with("loop") || n.starts_with("zram") || n.starts_with("ram") {
            return None;
        }
        std::fs::read_to_string(e.path().join("dev"))
            .ok()
            .map(|s| s.trim().to_owned())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blockio_classes_apply_and_missing_rdt_is_a_reported_no_op() {
    init_tracing();
    let _serial = SERIAL.lock().await;
    let Some(dev) = a_block_device() else {
        eprintln!("skipping: no block device");
        return;
    };
    let ctd = Containerd::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "policy: {{ active: static }}\n\
         blockio: {{ classes: {{ slow: {{ weight: 200, devices: [ {{ device: \"{dev}\", read_bps: 1048576, write_iops: 100 }} ] }} }} }}\n\
         rdt: {{ classes: {{ gold: {{ schemata: [\"L3:0=f\"] }} }} }}\n"
    );
    let mut cfg = proxy_config(ctd.sock(), dir.path(), &config);
    // A resctrl root that does not exist stands for a host without RDT.
    let resctrl = dir.path().join("no-resctrl");
    cfg.manager.resctrl_root = resctrl.clone();
    let (proxy, mut rt, _) = start_proxy(cfg).await;
    let mut s = ctd.pod_config("bio", PodNetwork::Host);
    s.annotations
        .insert("blockio.resmgr.steward.dev/class".into(), "slow".into());
    s.annotations
        .insert("rdt.resmgr.steward.dev/class".into(), "gold".into());
    let (sid, cid) = run_pod(&mut rt, &s, container(&s, "w", 512, 0, 32 << 20)).await;

    assert_eq!(
        read_cgroup("blkio", &s, &cid, "blkio.throttle.read_bps_device"),
        format!("{dev} 1048576")
    );
    assert_eq!(
        read_cgroup("blkio", &s, &cid, "blkio.throttle.write_iops_device"),
        format!("{dev} 100")
    );
    let reports = proxy.manager().control_reports();
    let bio = reports
        .iter()
        .find(|r| r.container_id == cid && r.controller == "blockio")
        .unwrap();
    assert!(bio.applied, "{bio:?}");
    let weight_file = cgroup_file("blkio", &s, &cid, "blkio.weight");
    let bfq_file = cgroup_file("blkio", &s, &cid, "blkio.bfq.weight");
    if weight_file.exists() || bfq_file.exists() {
        assert!(!bio.detail.contains("weight: no"), "{bio:?}");
    } else {
        assert!(bio.detail.contains("weight: no blkio.weight"), "{bio:?}");
    }
    let rdt = reports
        .iter()
        .find(|r| r.container_id == cid && r.controller == "rdt")
        .unwrap();
    assert!(!rdt.applied, "{rdt:?}");
    assert!(rdt.detail.contains("no resctrl"), "{rdt:?}");
    assert!(!resctrl.exists());
    // The container runs regardless.
    assert_eq!(cpus_inside(&mut rt, &cid).await, online().to_string());
    cleanup_pod(&mut rt, &sid).await.unwrap();
    proxy.shutdown().await;
}

/// A CRI message past kubelet's 16 MiB limit is refused by the proxy
/// (OUT_OF_RANGE) before any of it reaches the runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_cri_message_is_refused_and_nothing_is_created() {
    init_tracing();
    let _serial = SERIAL.lock().await;
    let ctd = Containerd::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = proxy_config(ctd.sock(), dir.path(), "policy: { active: static }");
    let (proxy, mut rt, _) = start_proxy(cfg).await;
    let (mut direct, _) = ctd.client().await.unwrap();
    let mut sb = ctd.pod_config("huge", PodNetwork::Host);
    sb.annotations
        .insert("example.com/blob".into(), "x".repeat(17 << 20));
    let name = sb.metadata.as_ref().unwrap().name.clone();
    let e = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sb),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
    let boxes = direct
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(
        !boxes
            .iter()
            .any(|b| b.metadata.as_ref().is_some_and(|m| m.name == name)),
        "the runtime got the oversized sandbox"
    );
    // Just under the limit is decoded (the default gRPC limit of 4 MiB
    // would refuse it): an update for an unknown container, answered as such.
    let e = rt
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: "no-such-container".into(),
            linux: Some(cri::LinuxContainerResources {
                unified: [("x".to_owned(), "y".repeat(15 << 20))].into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_ne!(e.code(), tonic::Code::OutOfRange, "{e:?}");
    // The proxy still serves after both.
    rt.version(cri::VersionRequest::default()).await.unwrap();
    proxy.shutdown().await;
}
