//! Availability switch, stats counters, metadata-only requests and registration.

mod common;

use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    WatchParams,
};
use serde_json::json;
use steward_testing_apiserver::ResourceType;

#[tokio::test]
async fn unavailable_answers_503_and_closes_watches() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let mut w = cms
        .watch(&WatchParams::default().disable_bookmarks(), "0")
        .await
        .unwrap()
        .boxed();
    s.set_available(false);
    let e = api_err(cms.list(&ListParams::default()).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (503, "ServiceUnavailable"));
    let ended = tokio::time::timeout(Duration::from_secs(5), w.try_next())
        .await
        .unwrap();
    assert!(
        matches!(ended, Ok(None) | Err(_)),
        "watch must end, got {ended:?}"
    );
    assert_eq!(s.stats().requests_for("unavailable"), 1);
    s.set_available(true);
    assert!(cms.list(&ListParams::default()).await.is_ok());
    s.shutdown().await;
}

#[tokio::test]
async fn a_partition_cuts_off_everyone_but_the_named_users() {
    let s = ApiServer::start().await.unwrap();
    let node: Api<ConfigMap> = Api::default_namespaced(s.client());
    let admin: Api<ConfigMap> = Api::default_namespaced(s.client_as("admin").unwrap());
    s.partition(&["admin"]);
    let e = api_err(node.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(e.code, 503);
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("made-during-the-partition".into());
    admin.create(&PostParams::default(), &cm).await.unwrap();
    s.set_available(true);
    let names: Vec<_> = node
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(names, ["made-during-the-partition"]);
    // Ended: a later outage cuts off the formerly reachable user too.
    s.set_available(false);
    assert_eq!(
        api_err(admin.list(&ListParams::default()).await.unwrap_err()).code,
        503
    );
    s.shutdown().await;
}

#[tokio::test]
async fn a_delay_slows_every_answer() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    s.set_delay(Duration::from_millis(300));
    let t = std::time::Instant::now();
    cms.list(&ListParams::default()).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    s.set_delay(Duration::ZERO);
    s.shutdown().await;
}

#[tokio::test]
async fn stats_count_requests_and_writes() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(s.client());
    pods.create(&PostParams::default(), &pod("a"))
        .await
        .unwrap();
    pods.patch_status(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    pods.get("a").await.unwrap();
    pods.list(&ListParams::default()).await.unwrap();
    let _ = pods.create(&PostParams::default(), &pod("a")).await; // 409 still counts as a write request
    let st = s.stats();
    assert_eq!(st.requests_for("create"), 2);
    assert_eq!(st.requests_for("patch"), 1);
    assert_eq!(st.requests_for("get"), 1);
    assert_eq!(st.requests_for("list"), 1);
    assert_eq!(st.writes_for("pods"), 2);
    assert_eq!(st.writes_for("pods/status"), 1);
    assert_eq!(st.total_writes(), 3);
    s.reset_stats();
    assert_eq!(s.stats().total_requests(), 0);
    s.shutdown().await;
}

#[tokio::test]
async fn metadata_only_requests() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let mut c = ConfigMap::default();
    c.metadata.name = Some("m".into());
    c.data = Some([("k".to_string(), "v".to_string())].into());
    cms.create(&PostParams::default(), &c).await.unwrap();
    let meta = cms.get_metadata("m").await.unwrap();
    assert_eq!(meta.metadata.name.as_deref(), Some("m"));
    let list = cms.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(
        list.items[0].types.as_ref().unwrap().kind,
        "PartialObjectMetadata"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn programmatic_registration_of_a_cluster_scoped_kind() {
    let s = ApiServer::start().await.unwrap();
    s.register(
        ResourceType::new("steward.dev", "v1alpha1", "Gadget", "gadgets", false).with_status(),
    );
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("steward.dev", "v1alpha1", "Gadget"),
        "gadgets",
    );
    let api: Api<DynamicObject> = Api::all_with(s.client(), &ar);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "steward.dev/v1alpha1", "kind": "Gadget", "metadata": {"name": "g"},
        "spec": {"x": 1}, "status": {"ignored": true}
    }))
    .unwrap();
    let made = api.create(&PostParams::default(), &obj).await.unwrap();
    assert!(made.data.get("status").is_none());
    assert_eq!(made.metadata.namespace, None);
    let st = api
        .patch_status(
            "g",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ok": true}})),
        )
        .await
        .unwrap();
    assert_eq!(st.data["status"]["ok"], true);
    // a namespaced URL for a cluster-scoped kind does not exist
    let r = raw(
        &s,
        "GET",
        "/apis/steward.dev/v1alpha1/namespaces/default/gadgets",
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 404);
    s.shutdown().await;
}
