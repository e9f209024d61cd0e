//! `pods/<name>/binding`, as a scheduler binds: once, then 409.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use steward_testing_apiserver::ApiServer;

fn binding(pod: &str, node: &str) -> Binding {
    Binding {
        metadata: ObjectMeta {
            name: Some(pod.into()),
            ..ObjectMeta::default()
        },
        target: ObjectReference {
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..ObjectReference::default()
        },
    }
}

#[tokio::test]
async fn a_pod_is_bound_once() {
    let api = ApiServer::start().await.unwrap();
    let pods = Api::<Pod>::namespaced(api.client(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pp = PostParams::default();
    let _: serde_json::Value = pods
        .create_subresource("binding", "web", &pp, &binding("web", "n1"))
        .await
        .unwrap();
    let bound = pods.get("web").await.unwrap();
    assert_eq!(bound.spec.unwrap().node_name.as_deref(), Some("n1"));

    let again = pods
        .create_subresource::<_, serde_json::Value>("binding", "web", &pp, &binding("web", "n2"))
        .await
        .unwrap_err();
    match again {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert!(
                s.message.contains("already assigned to node \"n1\""),
                "{}",
                s.message
            );
        }
        e => panic!("{e}"),
    }
    assert_eq!(
        pods.get("web")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .as_deref(),
        Some("n1")
    );

    let missing = pods
        .create_subresource::<_, serde_json::Value>("binding", "nope", &pp, &binding("nope", "n1"))
        .await
        .unwrap_err();
    assert!(matches!(missing, kube::Error::Api(s) if s.code == 404));
    let no_target = pods
        .create_subresource::<_, serde_json::Value>("binding", "web", &pp, &serde_json::json!({}))
        .await
        .unwrap_err();
    assert!(matches!(no_target, kube::Error::Api(s) if s.code == 400));
}
