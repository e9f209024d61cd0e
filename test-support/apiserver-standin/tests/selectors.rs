//! Label and field selectors on list (watch transitions are in watch.rs).

mod common;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, PostParams};

fn names<K: kube::Resource>(items: Vec<K>) -> Vec<String> {
    let mut v: Vec<String> = items
        .iter()
        .map(|i| i.meta().name.clone().unwrap_or_default())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn label_selector_syntax_on_list() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    for (n, labels) in [
        ("a", vec![("app", "web"), ("tier", "fe")]),
        ("b", vec![("app", "db")]),
        ("c", vec![]),
    ] {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(n.into());
        c.metadata.labels = Some(
            labels
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        cms.create(&PostParams::default(), &c).await.unwrap();
    }
    let q = |sel: &'static str| {
        let cms = cms.clone();
        async move {
            names(
                cms.list(&ListParams::default().labels(sel))
                    .await
                    .unwrap()
                    .items,
            )
        }
    };
    assert_eq!(q("app=web").await, vec!["a"]);
    assert_eq!(q("app==web").await, vec!["a"]);
    assert_eq!(q("app!=web").await, vec!["b", "c"]);
    assert_eq!(q("app in (web,db)").await, vec!["a", "b"]);
    assert_eq!(q("app notin (web)").await, vec!["b", "c"]);
    assert_eq!(q("tier").await, vec!["a"]);
    assert_eq!(q("!app").await, vec!["c"]);
    assert_eq!(q("app,!tier").await, vec!["b"]);
    let e = api_err(
        cms.list(&ListParams::default().labels("app in ("))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
    s.shutdown().await;
}

#[tokio::test]
async fn field_selectors_on_list() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(s.client());
    pods.create(&PostParams::default(), &pod_on_node("on-n1", "n1"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod_on_node("on-n2", "n2"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("unscheduled"))
        .await
        .unwrap();
    let q = |sel: &'static str| {
        let pods = pods.clone();
        async move {
            names(
                pods.list(&ListParams::default().fields(sel))
                    .await
                    .unwrap()
                    .items,
            )
        }
    };
    assert_eq!(q("spec.nodeName=n1").await, vec!["on-n1"]);
    assert_eq!(q("spec.nodeName!=n1").await, vec!["on-n2", "unscheduled"]);
    assert_eq!(q("spec.nodeName=").await, vec!["unscheduled"]);
    assert_eq!(
        q("status.phase=Pending,metadata.name=on-n2").await,
        vec!["on-n2"]
    );
    assert_eq!(q("metadata.namespace=default").await.len(), 3);
    let all: Api<Pod> = Api::all(s.client());
    assert_eq!(
        names(
            all.list(&ListParams::default().fields("spec.nodeName=n2"))
                .await
                .unwrap()
                .items
        ),
        vec!["on-n2"]
    );
    let e = api_err(
        pods.list(&ListParams::default().fields("spec.hostname=x"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
    assert_eq!(e.message, "field label not supported: spec.hostname");
    // spec.nodeName is a pod field, not a configmap one
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    assert_eq!(
        api_err(
            cms.list(&ListParams::default().fields("spec.nodeName=n1"))
                .await
                .unwrap_err()
        )
        .code,
        400
    );
    s.shutdown().await;
}
