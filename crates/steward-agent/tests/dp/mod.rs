//! Helpers of the device plugin tests: a real API server stand-in, real
//! kubelet stand-ins (device plugin v1beta1 + podresources v1 over unix
//! sockets), real agents with embedded discovery handlers.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, PostParams};
use steward_agent::deviceplugin::DevicePluginConfig;
use steward_agent::{AgentConfig, AgentError, AgentMetrics, AgentTimings, Mode};
use steward_api::{Configuration, ConfigurationSpec, Instance, SlotClaim};
use steward_core::slots::SlotConfig;
use steward_discovery::DiscoveryHandler;
use steward_testing_apiserver::ApiServer;
use steward_testing_apiserver::client::replace_with_retry;
use steward_testing_kubelet::{ContainerSpec, Kubelet, KubeletConfig, PodSpec};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const NS: &str = "default";
pub const WAIT: Duration = Duration::from_secs(20);

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "steward_agent=info,warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// An API server stand-in with steward's CRDs.
pub async fn api_server() -> ApiServer {
    init_tracing();
    let server = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(server.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    server
}

/// A running agent; dropping or [`Agent::kill`] aborts it without cleanup.
pub struct Agent {
    stop: Option<oneshot::Sender<()>>,
    join: Option<JoinHandle<Result<(), AgentError>>>,
    pub cfg: AgentConfig,
    pub metrics: AgentMetrics,
}

impl Agent {
    pub fn start(mut cfg: AgentConfig) -> Self {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = AgentMetrics::register(&mut registry);
        cfg.metrics = Some(metrics.clone());
        let (tx, rx) = oneshot::channel::<()>();
        let join = tokio::spawn(steward_agent::run(cfg.clone(), async move {
            let _ = rx.await;
        }));
        Self {
            stop: Some(tx),
            join: Some(join),
            cfg,
            metrics,
        }
    }

    /// The in-process kill -9: the task is aborted, nothing runs its
    /// shutdown path; waits until the task is gone.
    pub async fn kill(mut self) -> AgentConfig {
        if let Some(j) = self.join.take() {
            j.abort();
            let _ = j.await;
        }
        self.cfg.clone()
    }

    pub async fn stop(mut self) -> Result<(), AgentError> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.join.take() {
            Some(j) => tokio::time::timeout(Duration::from_secs(15), j)
                .await
                .expect("agent did not stop")
                .expect("agent panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(j) = self.join.take() {
            j.abort();
        }
    }
}

/// One node: a kubelet stand-in and the paths its agent uses.
pub struct Node {
    pub name: String,
    pub kubelet: Kubelet,
    pub root: PathBuf,
    pub cdi: PathBuf,
}

impl Node {
    /// A kubelet stand-in mirroring pods into `api` (when given).
    pub async fn start(dir: &Path, name: &str, api: Option<kube::Client>) -> Self {
        let root = dir.join(format!("{name}-kubelet"));
        let kubelet = Kubelet::start(KubeletConfig {
            root_dir: root.clone(),
            node_name: name.into(),
            api,
        })
        .await
        .unwrap();
        Self {
            name: name.into(),
            kubelet,
            root,
            cdi: dir.join(format!("{name}-cdi")),
        }
    }

    /// An agent configuration serving device plugins to this kubelet.
    pub fn agent_config(
        &self,
        dir: &Path,
        client: kube::Client,
        handlers: Vec<Arc<dyn DiscoveryHandler>>,
    ) -> AgentConfig {
        agent_config_at(&self.name, &self.root, &self.cdi, dir, client, handlers)
    }
}

/// An agent configuration of node `name` serving device plugins to the
/// kubelet rooted at `root` (whatever plays kubelet there), CDI specs in
/// `cdi`.
pub fn agent_config_at(
    name: &str,
    root: &Path,
    cdi: &Path,
    dir: &Path,
    client: kube::Client,
    handlers: Vec<Arc<dyn DiscoveryHandler>>,
) -> AgentConfig {
    let mut cfg = AgentConfig::new(
        name,
        dir.join(format!("{name}-state")),
        dir.join(format!("{name}-agent.sock")),
        Mode::Kubernetes(client),
    );
    cfg.embedded_handlers = handlers;
    cfg.timings = AgentTimings {
        tick_interval: Duration::from_millis(100),
        file_poll_interval: Duration::from_millis(100),
        max_conflict_retries: 8,
    };
    let mut dp = DevicePluginConfig::new(root, Some(cdi.to_path_buf()));
    dp.tick_interval = Duration::from_millis(100);
    dp.poll = Duration::from_millis(50);
    dp.op_timeout = Duration::from_secs(2);
    dp.slots = SlotConfig {
        pending_timeout_ms: 20_000,
        settle_ms: SlotConfig::DEFAULT_SETTLE_MS,
    };
    cfg.device_plugins = Some(dp);
    cfg
}

pub fn echo(shared: bool) -> Vec<Arc<dyn DiscoveryHandler>> {
    vec![Arc::new(
        steward_discovery::handlers::debug_echo::DebugEcho::new(shared),
    )]
}

pub fn configuration(name: &str, handler: &str, details: &str, capacity: u32) -> Configuration {
    let mut c = Configuration::new(name, ConfigurationSpec::new(handler, details));
    c.metadata.namespace = Some(NS.into());
    c.spec.capacity = capacity;
    c.spec
        .broker_properties
        .insert("BROKER_MODE".into(), "fast".into());
    c
}

pub async fn create_configuration(server: &ApiServer, c: &Configuration) {
    let api: Api<Configuration> = Api::namespaced(server.client(), NS);
    api.create(&PostParams::default(), c).await.unwrap();
}

pub fn echo_details(descriptions: &[&str]) -> String {
    format!(
        "descriptions: [{}]\npollInterval: 50ms\n",
        descriptions
            .iter()
            .map(|d| format!("{d:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Sets the `capacity` of Configuration `name`, retrying on 409: the agent
/// writes the status concurrently.
pub async fn set_capacity(server: &ApiServer, name: &str, capacity: u32) {
    let api: Api<Configuration> = Api::namespaced(server.client(), NS);
    replace_with_retry(&api, name, |c| c.spec.capacity = capacity)
        .await
        .unwrap();
}

/// Waits until the Instance of `config` lists `nodes`; returns it.
pub async fn instance_of(server: &ApiServer, config: &str, nodes: &[&str]) -> Instance {
    let api: Api<Instance> = Api::namespaced(server.client(), NS);
    eventually(&format!("instance of {config} on {nodes:?}"), WAIT, || {
        let api = api.clone();
        async move {
            let items = api.list(&ListParams::default()).await.ok()?.items;
            items.into_iter().find(|i| {
                i.spec.configuration_name == config
                    && nodes.iter().all(|n| i.spec.nodes.iter().any(|m| m == n))
            })
        }
    })
    .await
}

pub fn resource(inst: &Instance) -> String {
    format!("steward.dev/{}", inst.metadata.name.clone().unwrap())
}

/// SlotClaim objects by slot id.
pub async fn slot_claims(server: &ApiServer) -> Vec<SlotClaim> {
    let api: Api<SlotClaim> = Api::all(server.client());
    api.list(&ListParams::default()).await.unwrap().items
}

pub async fn claim_of(server: &ApiServer, slot: &str) -> Option<SlotClaim> {
    slot_claims(server)
        .await
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some(slot))
}

pub fn pod(name: &str, resource: &str) -> PodSpec {
    PodSpec::new(NS, name).container(ContainerSpec::new("main").limit(resource, 1))
}

/// Poll `f` until it returns `Some`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The single slot id of a pod's allocation of `resource`.
pub fn slot_of(kubelet: &Kubelet, uid: &str, resource: &str) -> Option<String> {
    let alloc = kubelet.allocated(uid)?;
    alloc
        .values()
        .filter_map(|r| r.get(resource))
        .flatten()
        .next()
        .cloned()
}

/// Waits until the SlotClaim of `slot` names pod `uid`.
pub async fn wait_bound(server: &ApiServer, slot: &str, uid: &str) -> SlotClaim {
    eventually(&format!("claim {slot} bound to {uid}"), WAIT, || async {
        claim_of(server, slot)
            .await
            .filter(|c| c.spec.pod.as_ref().is_some_and(|p| p.uid == uid))
    })
    .await
}

/// Waits until `slot` has no SlotClaim.
pub async fn wait_released(server: &ApiServer, slot: &str) {
    eventually(&format!("claim {slot} released"), WAIT, || async {
        claim_of(server, slot).await.is_none().then_some(())
    })
    .await
}

/// Asserts the SlotClaim of `slot` names pod `uid` for all of `d`.
pub async fn assert_stays_bound(server: &ApiServer, slot: &str, uid: &str, d: Duration) {
    let deadline = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < deadline {
        let claim = claim_of(server, slot).await;
        assert!(
            claim
                .as_ref()
                .is_some_and(|c| c.spec.pod.as_ref().is_some_and(|p| p.uid == uid)),
            "claim {slot} no longer bound to {uid}: {claim:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A single-node setup: one Instance of `capacity` slots, served.
pub struct Single {
    pub server: ApiServer,
    pub dir: tempfile::TempDir,
    pub node: Node,
    pub agent: Option<Agent>,
    pub res: String,
    pub instance: String,
}

impl Single {
    /// An unshared Instance.
    pub async fn start(capacity: u32) -> Self {
        Self::start_with(capacity, false).await
    }

    /// `shared`: the Instance is shared (its slots are claimed in the API).
    pub async fn start_with(capacity: u32, shared: bool) -> Self {
        let server = api_server().await;
        let dir = tempfile::tempdir().unwrap();
        let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
        let agent = Agent::start(node.agent_config(dir.path(), server.client(), echo(shared)));
        create_configuration(
            &server,
            &configuration("cams", "debug-echo", &echo_details(&["cam"]), capacity),
        )
        .await;
        let inst = instance_of(&server, "cams", &["node-a"]).await;
        let res = resource(&inst);
        node.kubelet
            .wait_for_resource(&res, |s| s.healthy.len() == capacity as usize, WAIT)
            .await
            .unwrap();
        Self {
            server,
            dir,
            node,
            agent: Some(agent),
            res,
            instance: inst.metadata.name.clone().unwrap(),
        }
    }

    pub fn slot(&self, n: u32) -> String {
        format!("{}-{n}", self.instance)
    }
}

// ----- DRA ------------------------------------------------------------------

/// An agent configuration with the DRA driver on (ResourceSlices and the
/// kubelet plugin), as `steward agent --dra`.
pub fn dra_agent_config(
    node: &Node,
    dir: &Path,
    client: kube::Client,
    handlers: Vec<Arc<dyn DiscoveryHandler>>,
) -> AgentConfig {
    let mut cfg = node.agent_config(dir, client, handlers);
    cfg.dra_plugin = Some(steward_agent::dra::DraPluginConfig::new(&node.root));
    cfg.dra_slices = true;
    cfg
}

/// The DeviceClass of Configuration `config` in [`NS`] as steward's
/// controller writes it; returns its name.
pub async fn create_device_class(server: &ApiServer, config: &str) -> String {
    let name = format!("{config}.{NS}.steward.dev");
    let class: k8s_openapi::api::resource::v1::DeviceClass =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {
                "expression": steward_core::dra::configuration_selector(NS, config)
            }}]}
        }))
        .unwrap();
    Api::all(server.client())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    name
}

/// A ResourceClaim `name` in [`NS`] asking for one device of `class`.
pub async fn create_claim(client: &kube::Client, name: &str, class: &str) {
    let claim: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "cam", "exactly": {
                "deviceClassName": class
            }}]}}
        }))
        .unwrap();
    Api::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
}

/// The allocation results of a claim as the allocator wrote it (panics
/// when it has none).
pub fn allocation_results(
    claim: k8s_openapi::api::resource::v1::ResourceClaim,
) -> Vec<k8s_openapi::api::resource::v1::DeviceRequestAllocationResult> {
    claim
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .expect("the claim is allocated")
}

/// Waits until kubelet has `slots` healthy devices of `resource` from the
/// device plugin and the DRA driver registered.
pub async fn wait_dp_and_dra(node: &Node, resource: &str, slots: usize) {
    node.kubelet
        .wait_for_resource(resource, |s| s.healthy.len() == slots, WAIT)
        .await
        .unwrap();
    node.kubelet
        .wait_for_dra_driver("steward.dev", WAIT)
        .await
        .unwrap();
}

/// Waits until the ResourceSlices publish `devices` devices.
pub async fn wait_for_devices(server: &ApiServer, devices: usize) {
    let slices: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(server.client());
    eventually(&format!("{devices} published devices"), WAIT, || async {
        let items = slices.list(&ListParams::default()).await.ok()?.items;
        (items
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .count()
            == devices)
            .then_some(())
    })
    .await;
}
