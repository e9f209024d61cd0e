//! The stand the extender tests run against: the API server stand-in with
//! steward's CRDs, four Nodes, one shared camera Instance, the controller
//! and the extender's HTTP endpoint.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use steward_api::{Instance, InstanceSpec};
use steward_extender::{Extender, ExtenderConfig, LeaderLease, server};
use steward_leader::{ControllerConfig, DecideConfig, run};
use steward_testing_apiserver::ApiServer;
use tokio_util::sync::CancellationToken;

pub const NS: &str = "default";

/// The running stand; dropping it stops the controller and the extender.
pub struct Stand {
    pub api: ApiServer,
    /// The extender's address.
    pub addr: SocketAddr,
    pub extender: Arc<Extender>,
    /// The controller's metrics.
    pub metrics: steward_leader::ControllerMetrics,
    pub stop: CancellationToken,
}

/// The User-Agent components the stand's controller and extender name
/// themselves with (the stand-in counts their requests apart).
pub const CONTROLLER_AGENT: &str = "steward-controller";
pub const EXTENDER_AGENT: &str = "steward-extender";

/// The extender's configuration for the direct path to the stand's
/// controller.
pub fn direct() -> ExtenderConfig {
    ExtenderConfig {
        leader: Some(LeaderLease {
            namespace: "steward-system".into(),
            name: "steward-controller".into(),
        }),
        ..ExtenderConfig::default()
    }
}

impl Drop for Stand {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Nodes n1..n4 (each with its `annotations`, in place before the
/// controller starts), the Instance `cam` shared by n1..n3 with `capacity`
/// slots (n4 does not see it), the controller if `controller`, and the
/// extender configured with `ext_cfg`.
pub async fn stand_opts(
    capacity: u32,
    annotations: &[(&str, &str, String)],
    controller: bool,
    ext_cfg: ExtenderConfig,
) -> Stand {
    stand_full(capacity, annotations, controller, ext_cfg, |_| {}).await
}

/// [`stand_opts`] with the controller's configuration changed by `tweak`
/// before it starts.
pub async fn stand_full(
    capacity: u32,
    annotations: &[(&str, &str, String)],
    controller: bool,
    ext_cfg: ExtenderConfig,
    tweak: impl FnOnce(&mut ControllerConfig),
) -> Stand {
    let api = ApiServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "steward-system"}})).unwrap();
    Api::<Namespace>::all(api.client())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    for n in ["n1", "n2", "n3", "n4"] {
        let mine: serde_json::Map<String, Value> = annotations
            .iter()
            .filter(|(node, _, _)| *node == n)
            .map(|(_, k, v)| (k.to_string(), Value::String(v.clone())))
            .collect();
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": n, "annotations": mine}})).unwrap();
        Api::<Node>::all(api.client())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }
    let spec = InstanceSpec {
        configuration_name: "cams".into(),
        device_id: "cam".into(),
        shared: true,
        nodes: vec!["n1".into(), "n2".into(), "n3".into()],
        capacity,
        properties: BTreeMap::new(),
        mounts: Vec::new(),
        device_specs: Vec::new(),
        cdi_name: String::new(),
    };
    Api::<Instance>::namespaced(api.client(), NS)
        .create(&PostParams::default(), &Instance::new("cam", spec))
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let mut cfg = ControllerConfig::new("steward-system", "c1");
    cfg.resync = Duration::from_millis(100);
    cfg.lease.retry_period = Duration::from_millis(100);
    cfg.decide = Some(DecideConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        advertise: None,
    });
    tweak(&mut cfg);
    let direct = controller && ext_cfg.leader.is_some();
    let metrics = cfg.metrics.clone();
    if controller {
        let client = api
            .client_with_user_agent(&format!("{CONTROLLER_AGENT}/test (c1)"))
            .unwrap();
        tokio::spawn(run(client, cfg, stop.clone()));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client = api
        .client_with_user_agent(&format!("{EXTENDER_AGENT}/test"))
        .unwrap();
    let extender = Arc::new(Extender::new(client, ext_cfg));
    tokio::spawn(server::serve(listener, extender.clone(), stop.clone()));
    if direct {
        // The tests of the direct path start once the extender knows the
        // leader (before that, Filter takes the API path).
        until("the extender learns where the leader decides", || {
            extender.leader_endpoint().is_some()
        })
        .await;
    }
    Stand {
        api,
        addr,
        extender,
        metrics,
        stop,
    }
}

/// Polls `done` every 20 ms; panics naming `what` after 20 s.
#[allow(dead_code)] // not every test binary including this module waits
pub async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
