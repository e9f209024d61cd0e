//! Shared helpers for the agent's integration tests: a real API server
//! stand-in, real unix sockets, real discovery handlers.
#![allow(dead_code)]
// Test-only helpers: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use steward_agent::{AgentConfig, AgentError, AgentMetrics, AgentTimings, Mode};
use steward_api::{Configuration, ConfigurationSpec, Instance};
use steward_core::discovery::registry::RegistryConfig;
use steward_discovery::DiscoveryHandler;
use steward_discovery::client::ClientOptions;
use steward_testing_apiserver::ApiServer;
use steward_testing_apiserver::client::replace_with_retry;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const NS: &str = "default";
/// Offline grace used by the tests (shortened from five minutes).
pub const GRACE: Duration = Duration::from_millis(1500);

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "steward=info,warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A stand-in with steward's CRDs installed and the test namespace present.
pub async fn api_server() -> ApiServer {
    init_tracing();
    let server = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(server.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let namespaces: Api<Namespace> = Api::all(server.client());
    if namespaces.get_opt(NS).await.unwrap().is_none() {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(NS.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    server
}

pub async fn create_node(server: &ApiServer, name: &str) {
    let nodes: Api<Node> = Api::all(server.client());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    nodes.create(&PostParams::default(), &node).await.unwrap();
}

/// A running agent.
pub struct Agent {
    stop: Option<oneshot::Sender<()>>,
    join: Option<JoinHandle<Result<(), AgentError>>>,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub metrics: AgentMetrics,
    pub registry: Arc<std::sync::Mutex<prometheus_client::registry::Registry>>,
}

impl Agent {
    /// Stop the agent and return what `run` returned.
    pub async fn stop(mut self) -> Result<(), AgentError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.join.take() {
            Some(j) => tokio::time::timeout(Duration::from_secs(10), j)
                .await
                .expect("agent did not stop within 10s")
                .expect("agent task panicked"),
            None => Ok(()),
        }
    }

    /// The metrics in text exposition format.
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry.lock().unwrap())
            .unwrap();
        out
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(j) = self.join.take() {
            j.abort();
        }
    }
}

pub fn test_config(node: &str, dir: &Path, mode: Mode) -> AgentConfig {
    let mut cfg = AgentConfig::new(
        node,
        dir.join(format!("{node}-state")),
        dir.join(format!("{node}-agent.sock")),
        mode,
    );
    cfg.registry = RegistryConfig {
        offline_grace_ms: GRACE.as_millis() as u64,
        retry_interval_ms: 200,
    };
    cfg.client = ClientOptions {
        connect_timeout: Duration::from_secs(1),
        open_timeout: Duration::from_secs(2),
    };
    cfg.timings = AgentTimings {
        tick_interval: Duration::from_millis(100),
        file_poll_interval: Duration::from_millis(100),
        max_conflict_retries: 8,
    };
    cfg
}

/// Start an agent with `cfg` (metrics registered into a fresh registry).
pub fn start_agent(mut cfg: AgentConfig) -> Agent {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = AgentMetrics::register(&mut registry);
    cfg.metrics = Some(metrics.clone());
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let socket = cfg.registration_socket.clone();
    let state_dir = cfg.state_dir.clone();
    let join = tokio::spawn(steward_agent::run(cfg, async move {
        let _ = stop_rx.await;
    }));
    Agent {
        stop: Some(stop_tx),
        join: Some(join),
        socket,
        state_dir,
        metrics,
        registry: Arc::new(std::sync::Mutex::new(registry)),
    }
}

/// A discovery handler served on its own unix socket, registered with an
/// agent by `run_external`, stoppable.
pub struct ExternalHandler {
    stop: Option<oneshot::Sender<()>>,
    join: Option<JoinHandle<()>>,
    pub socket: PathBuf,
}

impl ExternalHandler {
    pub fn start(
        handler: Arc<dyn DiscoveryHandler>,
        socket: PathBuf,
        agent_socket: PathBuf,
    ) -> Self {
        let (tx, rx) = oneshot::channel::<()>();
        let listen = socket.clone();
        let join = tokio::spawn(async move {
            if let Err(e) =
                steward_discovery::server::run_external(handler, listen, agent_socket, async move {
                    let _ = rx.await;
                })
                .await
            {
                tracing::error!(error = %e, "external handler failed");
            }
        });
        Self {
            stop: Some(tx),
            join: Some(join),
            socket,
        }
    }

    /// Serve without registering (the caller registers once by hand).
    pub fn serve_only(handler: Arc<dyn DiscoveryHandler>, socket: PathBuf) -> Self {
        let (tx, rx) = oneshot::channel::<()>();
        let listen = socket.clone();
        let join = tokio::spawn(async move {
            if let Err(e) = steward_discovery::server::serve_uds(handler, listen, async move {
                let _ = rx.await;
            })
            .await
            {
                tracing::error!(error = %e, "handler server failed");
            }
        });
        Self {
            stop: Some(tx),
            join: Some(join),
            socket,
        }
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(j) = self.join.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), j).await;
        }
    }
}

impl Drop for ExternalHandler {
    fn drop(&mut self) {
        if let Some(j) = self.join.take() {
            j.abort();
        }
    }
}

pub fn configuration(name: &str, handler: &str, details: &str) -> Configuration {
    let mut c = Configuration::new(name, ConfigurationSpec::new(handler, details));
    c.metadata.namespace = Some(NS.into());
    c
}

pub async fn create_configuration(server: &ApiServer, c: &Configuration) -> Configuration {
    let api: Api<Configuration> = Api::namespaced(server.client(), NS);
    api.create(&PostParams::default(), c).await.unwrap()
}

/// Sets the discovery details of Configuration `name`, retrying on 409:
/// the agent writes the status concurrently.
pub async fn set_details(server: &ApiServer, name: &str, details: &str) {
    let api: Api<Configuration> = Api::namespaced(server.client(), NS);
    replace_with_retry(&api, name, |c| {
        c.spec.discovery_handler.details = details.to_string();
    })
    .await
    .unwrap();
}

pub async fn instances(server: &ApiServer) -> Vec<Instance> {
    let api: Api<Instance> = Api::namespaced(server.client(), NS);
    let mut items = api.list(&ListParams::default()).await.unwrap().items;
    items.sort_by(|a, b| a.spec.device_id.cmp(&b.spec.device_id));
    items
}

pub async fn instances_of(server: &ApiServer, config: &str) -> Vec<Instance> {
    instances(server)
        .await
        .into_iter()
        .filter(|i| i.spec.configuration_name == config)
        .collect()
}

/// Poll `f` until it returns `Some`, failing the test after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// debug-echo details with the given descriptions and availability file.
pub fn echo_details(descriptions: &[&str], availability: Option<&Path>) -> String {
    let mut s = format!(
        "descriptions: [{}]\npollInterval: 50ms\n",
        descriptions
            .iter()
            .map(|d| format!("{d:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(p) = availability {
        s.push_str(&format!(
            "availabilityFile: {:?}\n",
            p.display().to_string()
        ));
    }
    s
}
