//! DRA end to end: the real agent publishes a discovered device as a
//! ResourceSlice and registers its DRA kubelet plugin with the kubelet
//! stand-in's plugin watcher; the stand-in scheduler allocates a
//! ResourceClaim through steward's DeviceClass; the kubelet stand-in
//! prepares it over `v1.DRAPlugin` before the pod starts and the container
//! runs in the real containerd with the CDI device it was handed: on
//! containerd 2.x the stand-in passes it in `ContainerConfig.CDI_devices` and
//! containerd injects it from the spec steward wrote into its CDI spec
//! directory; on 1.6 (no CDI) the stand-in applies the spec's edits itself.
//! The spec's environment, device nodes and mounts are checked from inside
//! the container on both. While prepared, the device plugin refuses the same slot; when
//! the pod ends the claim is unprepared and the device is free again.
//! steward's pod resources show the claim as the container's
//! `dynamic_resources` while it is prepared.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, PostParams};
use steward_agent::deviceplugin::DevicePluginConfig;
use steward_agent::dra::DraPluginConfig;
use steward_agent::pod_resources::PodResourcesConfig;
use steward_agent::{AgentConfig, AgentTimings, Mode};
use steward_api::{Configuration, ConfigurationSpec, Instance, SlotClaim};
use steward_proto::cri::runtime::v1 as cri;
use steward_proto::podresources::v1 as wire;
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use steward_testing_apiserver::ApiServer;
use steward_testing_apiserver::dra_alloc::allocate_claim;
use steward_testing_containerd::{ContainerSpec, Containerd, PodNetwork, cleanup_pod};
use steward_testing_kubelet::cdi::{self, Injection};
use steward_testing_kubelet::{
    ContainerSpec as KubeletContainer, Kubelet, KubeletConfig, Phase, PodSpec,
};

const WAIT: Duration = Duration::from_secs(20);
const NS: &str = "default";

async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    steward_e2e::eventually(what, WAIT, f).await
}

async fn slot_claim(api: &ApiServer, slot: &str) -> Option<SlotClaim> {
    Api::<SlotClaim>::namespaced(api.client(), NS)
        .get_opt(slot)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_a_claim_runs_in_containerd_with_its_cdi_device_and_frees_it_at_the_end() {
    let ctd = Containerd::shared().expect("containerd (needs root and its packages)");
    let dir = tempfile::tempdir().unwrap();
    let api = ApiServer::start().await.unwrap();
    api.serve_dra();
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

    // The agent: device plugins with CDI, and DRA on the same ledger. Its
    // specs go where the runtime reads them when it injects CDI (2.x).
    let (cdi_dir, injection) = steward_e2e::cdi::target(&ctd, &dir.path().join("cdi")).await;
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
    let mut dp = DevicePluginConfig::new(&root, Some(cdi_dir.clone()));
    dp.poll = Duration::from_millis(50);
    cfg.dra_plugin = Some(DraPluginConfig::new(&root));
    cfg.device_plugins = Some(dp);
    cfg.dra_slices = true;
    let agent_pr = dir.path().join("pod-resources.sock");
    cfg.pod_resources = Some(PodResourcesConfig::new(&agent_pr));
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
    c.metadata.namespace = Some(NS.into());
    c.spec.capacity = 1;
    Api::<Configuration>::namespaced(api.client(), NS)
        .create(&PostParams::default(), &c)
        .await
        .unwrap();
    let instances: Api<Instance> = Api::namespaced(api.client(), NS);
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
    let instance = inst.metadata.name.clone().unwrap();
    let resource = format!("steward.dev/{instance}");
    let slot = format!("{instance}-0");

    // kubelet's plugin watcher found the driver; the device is published.
    let plugin = kubelet
        .wait_for_dra_driver("steward.dev", WAIT)
        .await
        .expect("the DRA driver registers with kubelet");
    assert_eq!(plugin.service, "v1.DRAPlugin");
    let slices: Api<ResourceSlice> = Api::all(api.client());
    eventually("the ResourceSlice", || {
        let slices = slices.clone();
        async move {
            let items = slices.list(&ListParams::default()).await.ok()?.items;
            items
                .iter()
                .any(|s| s.spec.devices.as_ref().is_some_and(|d| !d.is_empty()))
                .then_some(())
        }
    })
    .await;
    let class: DeviceClass = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cams.default.steward.dev"},
        "spec": {"selectors": [{"cel": {
            "expression": steward_core::dra::configuration_selector(NS, "cams")
        }}]}
    }))
    .unwrap();
    Api::<DeviceClass>::all(api.client())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cam-claim", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "cam", "exactly": {
            "deviceClassName": "cams.default.steward.dev",
            "selectors": [{"cel": {"expression":
                "device.attributes[\"steward.dev\"].slot == 0"}}]
        }}]}}
    }))
    .unwrap();
    Api::<ResourceClaim>::namespaced(api.client(), NS)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();

    // Scheduled: the pod object, its claim allocated and reserved for it.
    let spec = PodSpec::new(NS, "dra-pod")
        .resource_claim("cam", "cam-claim")
        .container(KubeletContainer::new("main").claim("cam"));
    let uid = kubelet.create_pod_object(&spec).await.unwrap();
    allocate_claim(&api.client(), NS, "cam-claim", "dra-pod", &uid, "node-a")
        .await
        .expect("the claim is allocated to steward's device");
    let admitted = kubelet
        .add_pod(spec.uid(&uid))
        .await
        .expect("prepared and admitted");
    let ids = admitted
        .cdi_devices
        .get("main")
        .cloned()
        .unwrap_or_default();
    assert_eq!(ids, [format!("steward.dev/cams={NS}_{instance}")]);
    // steward's pod resources report the claim under the container using
    // it, as kubelet's DynamicResource.
    let lister = PodResourcesListerClient::new(
        steward_proto::uds::endpoint()
            .connect_with_connector(steward_proto::uds::UnixConnector::new(&agent_pr))
            .await
            .expect("the agent's pod resources socket"),
    );
    let dynamic = eventually("the claim in pod resources", || {
        let mut lister = lister.clone();
        async move {
            let got = lister
                .get(wire::GetPodResourcesRequest {
                    pod_name: "dra-pod".into(),
                    pod_namespace: NS.into(),
                })
                .await
                .ok()?
                .into_inner()
                .pod_resources?;
            let main = got.containers.into_iter().find(|c| c.name == "main")?;
            (!main.dynamic_resources.is_empty()).then_some(main.dynamic_resources)
        }
    })
    .await;
    assert_eq!(dynamic.len(), 1, "{dynamic:?}");
    assert_eq!(dynamic[0].claim_name, "cam-claim");
    assert_eq!(dynamic[0].claim_namespace, NS);
    let device = &dynamic[0].claim_resources[0];
    assert_eq!(device.driver_name, "steward.dev");
    assert_eq!(device.pool_name, "node-a");
    assert_eq!(device.device_name, slot);
    assert_eq!(
        device
            .cdi_devices
            .iter()
            .map(|d| d.name.clone())
            .collect::<Vec<_>>(),
        ids
    );
    let held = slot_claim(&api, &slot).await.expect("the slot is claimed");
    assert_eq!(
        held.spec.resource_claim.as_ref().map(|c| c.name.as_str()),
        Some("cam-claim")
    );

    // The device plugin cannot hand the prepared slot to anyone.
    kubelet
        .wait_for_resource(&resource, |s| s.healthy.is_empty(), WAIT)
        .await
        .expect("the prepared slot is Unhealthy for the device plugin");
    assert!(
        kubelet
            .add_pod(
                PodSpec::new(NS, "dp-pod")
                    .container(KubeletContainer::new("main").limit(&resource, 1))
            )
            .await
            .is_err(),
        "a device-plugin pod got the slot a claim holds"
    );

    // The container runs in containerd with what the CDI device says.
    let edits = cdi::resolve(&[&cdi_dir], &ids).expect("the CDI device resolves");
    assert!(
        !edits.env.is_empty(),
        "the Instance's CDI device sets its env: {edits:?}"
    );
    let (mut rt, _img) = ctd.client().await.expect("CRI client");
    let sandbox = ctd.pod_config("e2e-dra", PodNetwork::Host);
    let sandbox_id = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    let mut config = ContainerSpec::new("main").build(&sandbox);
    let applied = cdi::pass_devices(&mut config, &ids, &[&cdi_dir], injection)
        .expect("the CDI device is passed on");
    assert_eq!(
        (injection == Injection::Runtime, config.cdi_devices.len()),
        (
            applied.is_none(),
            usize::from(injection == Injection::Runtime)
        ),
        "{injection:?}: the runtime gets the ids, or the stand-in applies the edits"
    );
    let run = async {
        let id = rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.clone(),
                config: Some(config),
                sandbox_config: Some(sandbox.clone()),
            })
            .await?
            .into_inner()
            .container_id;
        rt.start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await?;
        Ok::<_, tonic::Status>(id)
    }
    .await;
    match run {
        // What the CDI spec says, from inside: env, device nodes, mounts.
        Ok(id) => steward_e2e::cdi::assert_edits_inside(&mut rt, &id, &edits).await,
        Err(status) => {
            let _ = cleanup_pod(&mut rt, &sandbox_id).await;
            panic!("the container did not run: {status}");
        }
    }
    let _ = cleanup_pod(&mut rt, &sandbox_id).await;

    // The pod ends: kubelet unprepares the claim, the slot is free again
    // and the device plugin hands it out.
    kubelet.terminate_pod(&uid, Phase::Succeeded).await.unwrap();
    eventually("the slot released", || async {
        slot_claim(&api, &slot).await.is_none().then_some(())
    })
    .await;
    eventually("the claim gone from pod resources", || {
        let mut lister = lister.clone();
        async move {
            let pods = lister
                .list(wire::ListPodResourcesRequest {})
                .await
                .ok()?
                .into_inner()
                .pod_resources;
            (!pods
                .iter()
                .flat_map(|p| &p.containers)
                .any(|c| !c.dynamic_resources.is_empty()))
            .then_some(())
        }
    })
    .await;
    let dp = kubelet
        .add_pod(
            PodSpec::new(NS, "dp-pod-2")
                .container(KubeletContainer::new("main").limit(&resource, 1)),
        )
        .await
        .expect("the freed slot goes to a device-plugin pod");
    assert_eq!(
        dp.devices["main"][&resource].iter().collect::<Vec<_>>(),
        [&slot]
    );

    let _ = stop_tx.send(());
    agent.await.unwrap().unwrap();
    // The runtime's spec directory is shared by the tests attached to it.
    if injection == Injection::Runtime {
        let _ = std::fs::remove_file(cdi_dir.join(format!("steward.dev-{NS}_cams.json")));
    }
}
