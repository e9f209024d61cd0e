//! The leader removes deleted Nodes from the Instances (the agents do not
//! follow the Nodes where the controller runs): at once for a deletion it
//! sees, after the grace for a node Instances name that has no Node object.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use steward_api::{Instance, InstanceSpec};
use steward_leader::node_gone::NodeGoneConfig;
use steward_leader::{ControllerConfig, run};
use steward_testing_apiserver::ApiServer;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(30);

fn instance(name: &str, nodes: &[&str]) -> Instance {
    let spec = InstanceSpec {
        configuration_name: "cams".into(),
        device_id: name.into(),
        shared: nodes.len() > 1,
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        capacity: 1,
        properties: BTreeMap::new(),
        mounts: Vec::new(),
        device_specs: Vec::new(),
        cdi_name: String::new(),
    };
    Instance::new(name, spec)
}

async fn nodes_of(api: &ApiServer, name: &str) -> Option<Vec<String>> {
    Api::<Instance>::namespaced(api.client(), NS)
        .get_opt(name)
        .await
        .unwrap()
        .map(|i| i.spec.nodes)
}

/// Polls `f` until it gives something, within [`WAIT`].
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_removes_deleted_nodes_from_the_instances() {
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
    let nodes = Api::<Node>::all(api.client());
    for n in ["a", "b"] {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": n}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let instances = Api::<Instance>::namespaced(api.client(), NS);
    for i in [
        instance("shared", &["a", "b"]),
        instance("only-b", &["b"]),
        // A deletion nobody saw: "gone" has no Node object.
        instance("with-gone", &["a", "gone"]),
        instance("only-a", &["a"]),
    ] {
        instances.create(&PostParams::default(), &i).await.unwrap();
    }

    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let mut cfg = ControllerConfig::new("steward-system", "c1");
    cfg.lease.retry_period = Duration::from_millis(100);
    let grace = Duration::from_secs(2);
    cfg.node_gone = Some(NodeGoneConfig {
        grace,
        ..NodeGoneConfig::default()
    });
    let started = tokio::time::Instant::now();
    tokio::spawn(run(api.client(), cfg, stop.clone()));

    // The missed deletion: removed after the grace, not before.
    eventually("the node without a Node object removed", || async {
        (nodes_of(&api, "with-gone").await? == ["a"]).then_some(())
    })
    .await;
    assert!(
        started.elapsed() >= grace,
        "removed before the grace: {:?}",
        started.elapsed()
    );

    // A deletion the leader sees: applied at once.
    nodes.delete("b", &DeleteParams::default()).await.unwrap();
    eventually("b removed from the shared Instance", || async {
        (nodes_of(&api, "shared").await? == ["a"]).then_some(())
    })
    .await;
    eventually("the Instance only b saw deleted", || async {
        nodes_of(&api, "only-b").await.is_none().then_some(())
    })
    .await;
    // Nothing else touched.
    assert_eq!(nodes_of(&api, "only-a").await.unwrap(), ["a"]);
    assert_eq!(nodes_of(&api, "with-gone").await.unwrap(), ["a"]);
    // Each removal says so on its Instance.
    let lost = eventually("DeviceLost Events", || async {
        let events = Api::<Event>::namespaced(api.client(), NS)
            .list(&ListParams::default())
            .await
            .unwrap();
        let lost: Vec<(String, String)> = events
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("DeviceLost"))
            .map(|e| {
                (
                    e.regarding.and_then(|r| r.name).unwrap_or_default(),
                    e.note.unwrap_or_default(),
                )
            })
            .collect();
        (lost.len() >= 3).then_some(lost)
    })
    .await;
    let about = |name: &str| {
        lost.iter()
            .find(|(n, _)| n == name)
            .map(|(_, note)| note.clone())
            .unwrap_or_else(|| panic!("no DeviceLost Event on {name}: {lost:?}"))
    };
    assert!(about("shared").contains("node b was deleted; still seen by a"));
    assert!(about("only-b").contains("the Instance is removed"));
    assert!(about("with-gone").contains("node gone was deleted"));
}
