//! Mirroring of pods and the node into the API server stand-in.

mod common;

use std::time::Duration;

use common::{RESOURCE, WAIT, plugin};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use kube::runtime::wait::await_condition;
use steward_testing_apiserver::ApiServer;
use steward_testing_kubelet::testing::TestPluginConfig;
use steward_testing_kubelet::{
    ContainerSpec, Error, Kubelet, KubeletConfig, Phase, PodSpec, UNEXPECTED_ADMISSION_ERROR,
};

fn pod(name: &str, count: i64) -> PodSpec {
    PodSpec::new("default", name)
        .uid("ignored-when-mirroring")
        .container(ContainerSpec::new("main").limit(RESOURCE, count))
}

fn phase_is(phase: &'static str) -> impl Fn(Option<&Pod>) -> bool {
    move |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some(phase)
    }
}

fn quantity(
    node: Option<&Node>,
    field: fn(
        &k8s_openapi::api::core::v1::NodeStatus,
    ) -> Option<&std::collections::BTreeMap<String, Quantity>>,
) -> Option<String> {
    node.and_then(|n| n.status.as_ref())
        .and_then(field)
        .and_then(|m| m.get(RESOURCE))
        .map(|q| q.0.clone())
}

#[tokio::test]
async fn pods_and_node_are_mirrored() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client();
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(KubeletConfig {
        root_dir: dir.path().to_path_buf(),
        node_name: "node-1".to_string(),
        api: Some(client.clone()),
    })
    .await
    .unwrap();
    let p = plugin(
        &kubelet,
        TestPluginConfig::new(RESOURCE, "p.sock", &["a", "b"]),
    )
    .await;

    // Node: created with the extended resources, updated when health changes.
    kubelet.mirror_node().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get("node-1").await.unwrap();
    let status = node.status.as_ref().unwrap();
    assert_eq!(status.capacity.as_ref().unwrap()[RESOURCE].0, "2");
    assert_eq!(status.allocatable.as_ref().unwrap()[RESOURCE].0, "2");
    p.set_health("a", false);
    let wait = await_condition(nodes.clone(), "node-1", |n: Option<&Node>| {
        quantity(n, |s| s.allocatable.as_ref()).as_deref() == Some("1")
    });
    let node = tokio::time::timeout(WAIT, wait)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        quantity(Some(&node), |s| s.capacity.as_ref()).as_deref(),
        Some("2")
    );
    p.set_health("a", true);
    kubelet
        .wait_for_resource(RESOURCE, |s| s.healthy.len() == 2, WAIT)
        .await
        .unwrap();

    // Pod: created in the API first; the API's UID is the pod's UID.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let admitted = kubelet.add_pod(pod("mirrored", 1)).await.unwrap();
    let obj = pods.get("mirrored").await.unwrap();
    assert_eq!(obj.metadata.uid.as_deref(), Some(admitted.uid.as_str()));
    assert_ne!(admitted.uid, "ignored-when-mirroring");
    let spec = obj.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some("node-1"));
    let limits = spec.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .unwrap();
    assert_eq!(limits[RESOURCE].0, "1");
    assert_eq!(
        obj.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );

    // Rejection is reported like kubelet does.
    let _second = kubelet.add_pod(pod("second", 1)).await.unwrap();
    let err = kubelet.add_pod(pod("rejected", 1)).await.unwrap_err();
    assert!(matches!(err, Error::Admission { .. }), "{err:?}");
    let rejected = pods.get("rejected").await.unwrap();
    let status = rejected.status.as_ref().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some(UNEXPECTED_ADMISSION_ERROR));
    assert!(
        status
            .message
            .as_deref()
            .unwrap()
            .starts_with("Pod was rejected: Allocate failed due to"),
        "{status:?}"
    );

    // Termination writes the phase and terminated container states.
    kubelet
        .terminate_pod(&admitted.uid, Phase::Succeeded)
        .await
        .unwrap();
    let done = pods.get("mirrored").await.unwrap();
    let status = done.status.as_ref().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Succeeded"));
    let terminated = status.container_statuses.as_ref().unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap();
    assert_eq!(terminated.exit_code, 0);
    let wait = await_condition(pods.clone(), "mirrored", phase_is("Succeeded"));
    tokio::time::timeout(WAIT, wait).await.unwrap().unwrap();

    // Deletion removes the object right away.
    kubelet.delete_pod(&admitted.uid).await.unwrap();
    let gone = tokio::time::timeout(
        Duration::from_secs(5),
        await_condition(pods.clone(), "mirrored", |p: Option<&Pod>| p.is_none()),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(gone.is_none());
}
