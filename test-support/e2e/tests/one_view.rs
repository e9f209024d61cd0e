//! Issue 9's end to end: one watch stream over the whole node. A device
//! plugin Allocate through the kubelet stand-in (real device-plugin gRPC)
//! and a pod run through the CRI proxy into real containerd both appear on
//! the agent's pod resources watch — the slot from the agent's own ledger,
//! the CPUs and memory from the CRI proxy's socket, which the agent follows.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, PostParams};
use steward_agent::deviceplugin::DevicePluginConfig;
use steward_agent::pod_resources::PodResourcesConfig;
use steward_agent::{AgentConfig, AgentTimings, Mode};
use steward_api::{Configuration, ConfigurationSpec, Instance};
use steward_proto::podresources::v1 as wire;
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use steward_resmgr::{Proxy, ProxyConfig};
use steward_testing_apiserver::ApiServer;
use steward_testing_containerd::{ContainerSpec, Containerd, PodNetwork, cleanup_pod, cri_client};
use steward_testing_kubelet::{ContainerSpec as KubeletContainer, Kubelet, KubeletConfig, PodSpec};

const WAIT: Duration = Duration::from_secs(30);

async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    steward_e2e::eventually(what, WAIT, f).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_plugin_slot_and_a_pinned_pod_on_one_watch_stream() {
    let ctd = Containerd::shared().expect("containerd (needs root and its packages)");
    let dir = tempfile::tempdir().unwrap();

    // The CRI proxy in front of the real containerd, serving its assignments.
    let proxy_pr = dir.path().join("cri-pod-resources.sock");
    let config_file = dir.path().join("resmgr.yaml");
    std::fs::write(&config_file, "policy: { active: static }").unwrap();
    let mut pcfg = ProxyConfig::new(
        dir.path().join("cri.sock"),
        ctd.sock(),
        dir.path().join("resmgr"),
    );
    pcfg.manager.config_file = Some(config_file);
    pcfg.manager.verify_interval = Duration::ZERO;
    pcfg.manager.pod_resources_socket = Some(proxy_pr.clone());
    let proxy = Proxy::start(pcfg).await.expect("CRI proxy starts");

    // The API server and kubelet stand-ins, and the agent following the proxy.
    let api = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let root = dir.path().join("kubelet");
    let kubelet = Kubelet::start(KubeletConfig {
        root_dir: root.clone(),
        node_name: "node-a".into(),
        api: Some(api.client()),
    })
    .await
    .unwrap();
    let mut cfg = AgentConfig::new(
        "node-a",
        dir.path().join("agent-state"),
        dir.path().join("agent.sock"),
        Mode::Kubernetes(api.client()),
    );
    cfg.embedded_handlers = vec![Arc::new(
        steward_discovery::handlers::debug_echo::DebugEcho::new(false),
    )];
    cfg.timings = AgentTimings {
        tick_interval: Duration::from_millis(100),
        file_poll_interval: Duration::from_millis(100),
        max_conflict_retries: 8,
    };
    let mut dp = DevicePluginConfig::new(&root, None);
    dp.poll = Duration::from_millis(50);
    cfg.device_plugins = Some(dp);
    let agent_pr = dir.path().join("pod-resources.sock");
    let mut pr = PodResourcesConfig::new(&agent_pr);
    pr.cri_socket = Some(proxy_pr);
    cfg.pod_resources = Some(pr);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(steward_agent::run(cfg, async move {
        let _ = stop_rx.await;
    }));

    let mut c = Configuration::new(
        "cams",
        ConfigurationSpec::new(
            "debug-echo",
            "descriptions: [\"cam\"]\npollInterval: 50ms\n",
        ),
    );
    c.metadata.namespace = Some("default".into());
    c.spec.capacity = 1;
    Api::<Configuration>::namespaced(api.client(), "default")
        .create(&PostParams::default(), &c)
        .await
        .unwrap();
    let instances: Api<Instance> = Api::namespaced(api.client(), "default");
    let inst = eventually("the Instance", || {
        let instances = instances.clone();
        async move {
            instances
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .next()
        }
    })
    .await;
    let res = format!("steward.dev/{}", inst.metadata.name.clone().unwrap());
    kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 1, WAIT)
        .await
        .unwrap();

    // One watch on the agent's socket.
    let channel = eventually("the agent's pod resources socket", || {
        let p = agent_pr.clone();
        async move {
            steward_proto::uds::endpoint()
                .connect_with_connector(steward_proto::uds::UnixConnector::new(&p))
                .await
                .ok()
        }
    })
    .await;
    let mut client = PodResourcesListerClient::new(channel);
    let mut watch = client
        .list_and_watch(wire::ListAndWatchPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();

    // A pod admitted by kubelet gets the slot (Allocate over the wire) ...
    let admitted = kubelet
        .add_pod(
            PodSpec::new("default", "with-device")
                .container(KubeletContainer::new("main").limit(&res, 1)),
        )
        .await
        .unwrap();
    // ... and a guaranteed pod runs through the CRI proxy into containerd.
    let (mut rt, _) = cri_client(proxy.socket()).await.unwrap();
    let sandbox = ctd.pod_config("pinned", PodNetwork::Host);
    let mut container = ContainerSpec::new("main").build(&sandbox);
    container
        .linux
        .get_or_insert_with(Default::default)
        .resources = Some(steward_proto::cri::runtime::v1::LinuxContainerResources {
        cpu_shares: 1024,
        cpu_quota: 100_000,
        cpu_period: 100_000,
        memory_limit_in_bytes: 32 << 20,
        ..Default::default()
    });
    let sid = rt
        .run_pod_sandbox(steward_proto::cri::runtime::v1::RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let cid = rt
        .create_container(steward_proto::cri::runtime::v1::CreateContainerRequest {
            pod_sandbox_id: sid.clone(),
            config: Some(container),
            sandbox_config: Some(sandbox.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    rt.start_container(steward_proto::cri::runtime::v1::StartContainerRequest {
        container_id: cid,
    })
    .await
    .unwrap();
    let pinned_name = sandbox.metadata.as_ref().unwrap().name.clone();

    // Both on the one stream.
    let mut view: BTreeMap<String, wire::PodResources> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    let (dev, cpus) = loop {
        let e = tokio::time::timeout_at(deadline, watch.next())
            .await
            .expect("both pods on the watch in time")
            .unwrap()
            .unwrap();
        view.insert(e.uid.clone(), e.pod_resources[0].clone());
        let dev = view.get(&admitted.uid).and_then(|p| {
            p.containers
                .iter()
                .flat_map(|c| c.devices.iter())
                .find(|d| d.resource_name == res)
                .cloned()
        });
        let cpus = view
            .values()
            .find(|p| p.name == pinned_name)
            .and_then(|p| p.containers.first())
            .filter(|c| !c.cpu_ids.is_empty())
            .cloned();
        if let (Some(d), Some(c)) = (dev, cpus) {
            break (d, c);
        }
    };
    assert_eq!(
        dev.device_ids,
        [format!("{}-0", inst.metadata.name.clone().unwrap())]
    );
    assert_eq!(cpus.cpu_ids.len(), 1, "one exclusive CPU: {cpus:?}");
    assert_eq!(cpus.memory[0].size, 32 << 20);

    cleanup_pod(&mut rt, &sid).await.unwrap();
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(15), agent).await;
    proxy.shutdown().await;
}
