//! Deletion: finalizers, pod graceful deletion, preconditions, deletecollection,
//! garbage collection (background, orphan, foreground) and namespace termination.

mod common;

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use serde_json::json;

fn cm(name: &str) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c
}

fn owned_by(mut c: ConfigMap, kind: &str, api_version: &str, name: &str, uid: &str) -> ConfigMap {
    c.metadata.owner_references = Some(vec![OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        ..Default::default()
    }]);
    c
}

#[tokio::test]
async fn finalizers_keep_the_object_until_removed() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let mut c = cm("f");
    c.metadata.finalizers = Some(vec!["steward.dev/cleanup".into()]);
    cms.create(&PostParams::default(), &c).await.unwrap();
    let rv = s.resource_version().to_string();
    let mut w = cms
        .watch(&WatchParams::default().disable_bookmarks().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    let res = cms.delete("f", &DeleteParams::default()).await.unwrap();
    let pending = res.left().expect("the pending object");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(pending.metadata.deletion_grace_period_seconds, Some(0));
    match w.try_next().await.unwrap() {
        Some(WatchEvent::Modified(o)) => assert!(o.metadata.deletion_timestamp.is_some()),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    assert!(cms.get_opt("f").await.unwrap().is_some());
    // no new finalizers while deleting
    let e = api_err(
        cms.patch(
            "f",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["steward.dev/cleanup", "x/y"]}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    cms.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    match w.try_next().await.unwrap() {
        Some(WatchEvent::Deleted(o)) => assert_eq!(o.metadata.name.as_deref(), Some("f")),
        other => panic!("expected DELETED, got {other:?}"),
    }
    assert!(cms.get_opt("f").await.unwrap().is_none());
    s.shutdown().await;
}

#[tokio::test]
async fn pods_are_deleted_gracefully_when_scheduled() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(s.client());
    pods.create(&PostParams::default(), &pod_on_node("p", "n1"))
        .await
        .unwrap();
    let res = pods.delete("p", &DeleteParams::default()).await.unwrap();
    let p = res.left().unwrap();
    assert_eq!(p.metadata.deletion_grace_period_seconds, Some(30));
    assert!(p.metadata.deletion_timestamp.is_some());
    assert!(
        pods.get_opt("p").await.unwrap().is_some(),
        "waits for the kubelet"
    );
    // a longer grace period does not extend it; a shorter one shortens it
    let p = pods
        .delete(
            "p",
            &DeleteParams {
                grace_period_seconds: Some(60),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(p.metadata.deletion_grace_period_seconds, Some(30));
    let p = pods
        .delete(
            "p",
            &DeleteParams {
                grace_period_seconds: Some(5),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(p.metadata.deletion_grace_period_seconds, Some(5));
    // what the kubelet does once containers stopped
    pods.delete("p", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(pods.get_opt("p").await.unwrap().is_none());
    // the pod spec's terminationGracePeriodSeconds is the default
    let mut q = pod_on_node("q", "n1");
    q.spec.as_mut().unwrap().termination_grace_period_seconds = Some(7);
    pods.create(&PostParams::default(), &q).await.unwrap();
    let q = pods
        .delete("q", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(q.metadata.deletion_grace_period_seconds, Some(7));
    // unscheduled pods go at once
    pods.create(&PostParams::default(), &pod("u"))
        .await
        .unwrap();
    pods.delete("u", &DeleteParams::default()).await.unwrap();
    assert!(pods.get_opt("u").await.unwrap().is_none());
    s.shutdown().await;
}

#[tokio::test]
async fn preconditions_and_missing_objects() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let c = cms.create(&PostParams::default(), &cm("p")).await.unwrap();
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("wrong".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let e = api_err(cms.delete("p", &dp).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message
            .contains("Precondition failed: UID in precondition: wrong"),
        "{}",
        e.message
    );
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..Default::default()
    };
    assert_eq!(api_err(cms.delete("p", &dp).await.unwrap_err()).code, 409);
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: c.metadata.uid.clone(),
            resource_version: c.metadata.resource_version.clone(),
        }),
        ..Default::default()
    };
    let st = cms
        .delete("p", &dp)
        .await
        .unwrap()
        .right()
        .expect("configmaps answer a Status on immediate deletion");
    assert_eq!(st.details.unwrap().name, "p");
    let e = api_err(cms.delete("p", &DeleteParams::default()).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.details.unwrap().name, "p");
    s.shutdown().await;
}

#[tokio::test]
async fn delete_collection_with_label_selector() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    for (n, app) in [("a", "x"), ("b", "x"), ("c", "y")] {
        let mut c = cm(n);
        c.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        cms.create(&PostParams::default(), &c).await.unwrap();
    }
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("app=x"),
    )
    .await
    .unwrap();
    let left: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect();
    assert_eq!(left, vec!["c"]);
    s.shutdown().await;
}

#[tokio::test]
async fn garbage_collection_background_orphan_and_foreground() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let nodes: Api<Node> = Api::all(s.client());
    // namespaced dependent of a namespaced owner
    let owner = cms
        .create(&PostParams::default(), &cm("owner"))
        .await
        .unwrap();
    let ouid = owner.metadata.uid.clone().unwrap();
    cms.create(
        &PostParams::default(),
        &owned_by(cm("dep"), "ConfigMap", "v1", "owner", &ouid),
    )
    .await
    .unwrap();
    // namespaced dependent of a cluster-scoped owner
    let mut node = Node::default();
    node.metadata.name = Some("n1".into());
    let node = nodes.create(&PostParams::default(), &node).await.unwrap();
    let nuid = node.metadata.uid.clone().unwrap();
    cms.create(
        &PostParams::default(),
        &owned_by(cm("node-dep"), "Node", "v1", "n1", &nuid),
    )
    .await
    .unwrap();
    // a dependent with a second, live owner survives
    let other = cms
        .create(&PostParams::default(), &cm("other"))
        .await
        .unwrap();
    let mut two = owned_by(cm("two-owners"), "ConfigMap", "v1", "owner", &ouid);
    two.metadata
        .owner_references
        .as_mut()
        .unwrap()
        .push(OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "other".into(),
            uid: other.metadata.uid.clone().unwrap(),
            ..Default::default()
        });
    cms.create(&PostParams::default(), &two).await.unwrap();

    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    assert!(eventually(|| async { cms.get_opt("dep").await.unwrap().is_none() }).await);
    assert!(eventually(|| async { cms.get_opt("node-dep").await.unwrap().is_none() }).await);
    assert!(cms.get_opt("two-owners").await.unwrap().is_some());

    // orphan: the dependent loses the reference and stays
    let o2 = cms
        .create(&PostParams::default(), &cm("owner2"))
        .await
        .unwrap();
    cms.create(
        &PostParams::default(),
        &owned_by(
            cm("orphan"),
            "ConfigMap",
            "v1",
            "owner2",
            &o2.metadata.uid.unwrap(),
        ),
    )
    .await
    .unwrap();
    cms.delete("owner2", &DeleteParams::orphan()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    let orphan = cms.get("orphan").await.unwrap();
    assert!(
        orphan
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );

    // foreground: the owner waits (foregroundDeletion finalizer) until dependents are gone
    let o3 = cms
        .create(&PostParams::default(), &cm("owner3"))
        .await
        .unwrap();
    let mut dep3 = owned_by(
        cm("dep3"),
        "ConfigMap",
        "v1",
        "owner3",
        &o3.metadata.uid.unwrap(),
    );
    dep3.metadata.finalizers = Some(vec!["x/block".into()]);
    cms.create(&PostParams::default(), &dep3).await.unwrap();
    let pending = cms
        .delete("owner3", &DeleteParams::foreground())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(
        pending
            .metadata
            .finalizers
            .unwrap()
            .contains(&"foregroundDeletion".to_string())
    );
    assert!(
        eventually(|| async {
            cms.get("dep3")
                .await
                .unwrap()
                .metadata
                .deletion_timestamp
                .is_some()
        })
        .await
    );
    assert!(
        cms.get_opt("owner3").await.unwrap().is_some(),
        "owner waits for its dependent"
    );
    cms.patch(
        "dep3",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(eventually(|| async { cms.get_opt("owner3").await.unwrap().is_none() }).await);
    s.shutdown().await;
}

#[tokio::test]
async fn namespace_deletion_cleans_up_content() {
    let s = ApiServer::start().await.unwrap();
    let nss: Api<Namespace> = Api::all(s.client());
    let mut ns = Namespace::default();
    ns.metadata.name = Some("tmp".into());
    let created = nss.create(&PostParams::default(), &ns).await.unwrap();
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Active"));
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "tmp");
    let mut inside = cm("inside");
    inside.metadata.finalizers = Some(vec!["x/hold".into()]);
    cms.create(&PostParams::default(), &inside).await.unwrap();
    let pending = nss
        .delete("tmp", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(
        pending.status.unwrap().phase.as_deref(),
        Some("Terminating")
    );
    let e = api_err(
        cms.create(&PostParams::default(), &cm("late"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 403);
    // content is being deleted; the namespace waits for it
    assert!(
        eventually(|| async {
            cms.get("inside")
                .await
                .unwrap()
                .metadata
                .deletion_timestamp
                .is_some()
        })
        .await
    );
    assert!(nss.get_opt("tmp").await.unwrap().is_some());
    cms.patch(
        "inside",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(eventually(|| async { nss.get_opt("tmp").await.unwrap().is_none() }).await);
    let all: Api<ConfigMap> = Api::all(s.client());
    assert!(
        all.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|c| c.metadata.namespace.as_deref() != Some("tmp"))
    );
    s.shutdown().await;
}
