//! Create / get / list / update / patch / status semantics and error shapes.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn create_sets_system_fields_and_conflicts_on_duplicates() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(s.client());
    let created = pods
        .create(&PostParams::default(), &pod("a"))
        .await
        .unwrap();
    let m = &created.metadata;
    assert_eq!(m.namespace.as_deref(), Some("default"));
    assert!(!m.uid.as_deref().unwrap_or("").is_empty());
    assert!(m.creation_timestamp.is_some());
    assert_eq!(m.generation, Some(1));
    let rv: u64 = m.resource_version.as_deref().unwrap().parse().unwrap();
    assert!(rv > 0);
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));

    let err = api_err(
        pods.create(&PostParams::default(), &pod("a"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert_eq!(err.reason, "AlreadyExists");
    assert_eq!(err.message, "pods \"a\" already exists");

    // raw check: 201 Created
    let body =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "raw"}}).to_string();
    let r = raw(
        &s,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some("application/json"),
        &body,
    )
    .await;
    assert_eq!(r.status, 201);
    s.shutdown().await;
}

#[tokio::test]
async fn generate_name_produces_unique_names() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let mut cm = ConfigMap::default();
    cm.metadata.generate_name = Some("gen-".into());
    let a = cms.create(&PostParams::default(), &cm).await.unwrap();
    let b = cms.create(&PostParams::default(), &cm).await.unwrap();
    let (na, nb) = (a.metadata.name.unwrap(), b.metadata.name.unwrap());
    assert!(na.starts_with("gen-") && na.len() == 9, "{na}");
    assert_ne!(na, nb);
    s.shutdown().await;
}

#[tokio::test]
async fn namespace_mismatch_and_missing_namespace_are_rejected() {
    let s = ApiServer::start().await.unwrap();
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "other"}}).to_string();
    let r = raw(
        &s,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some("application/json"),
        &body,
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["reason"], "BadRequest");
    assert_eq!(r.json()["kind"], "Status");
    // the namespace must exist (NamespaceLifecycle)
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "nope");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("x".into());
    let e = api_err(cms.create(&PostParams::default(), &cm).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.message, "namespaces \"nope\" not found");
    s.shutdown().await;
}

#[tokio::test]
async fn invalid_names_are_422() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(s.client());
    let e = api_err(
        pods.create(&PostParams::default(), &pod("Bad_Name"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message
            .starts_with("Pod \"Bad_Name\" is invalid: metadata.name: Invalid value"),
        "{}",
        e.message
    );
    let causes = e.details.unwrap().causes;
    assert_eq!(causes[0].field, "metadata.name");
    // namespaces must be DNS labels (no dots)
    let nss: Api<Namespace> = Api::all(s.client());
    let mut ns = Namespace::default();
    ns.metadata.name = Some("a.b".into());
    let e = api_err(nss.create(&PostParams::default(), &ns).await.unwrap_err());
    assert_eq!(e.code, 422);
    // neither name nor generateName
    let e = api_err(
        pods.create(&PostParams::default(), &pod(""))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("name or generateName is required"),
        "{}",
        e.message
    );
    // pods need containers with images
    let body = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}).to_string();
    let r = raw(
        &s,
        "POST",
        "/api/v1/namespaces/default/pods",
        Some("application/json"),
        &body,
    )
    .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.json()["details"]["causes"][0]["field"],
        "spec.containers[0].image"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn get_list_and_list_resource_version() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(s.client());
    pods.create(&PostParams::default(), &pod("a"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("b"))
        .await
        .unwrap();
    let other: Api<Pod> = Api::namespaced(s.client(), "kube-system");
    other
        .create(&PostParams::default(), &pod("c"))
        .await
        .unwrap();
    let got = pods.get("a").await.unwrap();
    assert_eq!(got.metadata.name.as_deref(), Some("a"));
    let list = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 2);
    assert_eq!(
        list.metadata.resource_version,
        Some(s.resource_version().to_string())
    );
    // all namespaces
    let all: Api<Pod> = Api::all(s.client());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        3
    );
    // limit is accepted and everything is returned without a continue token
    let limited = all.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(limited.items.len(), 3);
    assert!(limited.metadata.continue_.unwrap_or_default().is_empty());
    let e = api_err(pods.get("zzz").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.message, "pods \"zzz\" not found");
    s.shutdown().await;
}

#[tokio::test]
async fn list_exact_resource_version_rewinds_history() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("one".into());
    let first = cms.create(&PostParams::default(), &cm).await.unwrap();
    let rv1 = first.metadata.resource_version.clone().unwrap();
    cm.metadata.name = Some("two".into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let r = raw(
        &s,
        "GET",
        &format!(
            "/api/v1/namespaces/default/configmaps?resourceVersion={rv1}&resourceVersionMatch=Exact"
        ),
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    let names: Vec<String> = r.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, vec!["one"]);
    assert_eq!(r.json()["metadata"]["resourceVersion"], rv1.as_str());
    s.compact();
    let r = raw(
        &s,
        "GET",
        &format!(
            "/api/v1/namespaces/default/configmaps?resourceVersion={rv1}&resourceVersionMatch=Exact"
        ),
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 410);
    assert_eq!(r.json()["reason"], "Expired");
    // a resourceVersion from the future
    let r = raw(
        &s,
        "GET",
        "/api/v1/namespaces/default/configmaps?resourceVersion=999999",
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 504);
    s.shutdown().await;
}

#[tokio::test]
async fn update_with_stale_rv_conflicts_and_without_rv_is_unconditional() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("c".into());
    cm.data = Some([("k".to_string(), "1".to_string())].into());
    let v1 = cms.create(&PostParams::default(), &cm).await.unwrap();
    let mut v2 = v1.clone();
    v2.data = Some([("k".to_string(), "2".to_string())].into());
    let v2 = cms.replace("c", &PostParams::default(), &v2).await.unwrap();
    assert_ne!(v2.metadata.resource_version, v1.metadata.resource_version);
    // stale
    let e = api_err(
        cms.replace("c", &PostParams::default(), &v1)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.contains("the object has been modified"),
        "{}",
        e.message
    );
    // unconditional
    let mut v3 = v1.clone();
    v3.metadata.resource_version = None;
    v3.data = Some([("k".to_string(), "3".to_string())].into());
    let v3 = cms.replace("c", &PostParams::default(), &v3).await.unwrap();
    assert_eq!(v3.data.unwrap()["k"], "3");
    // no-op update keeps the resourceVersion and writes nothing
    let cur = cms.get("c").await.unwrap();
    let same = cms
        .replace("c", &PostParams::default(), &cur)
        .await
        .unwrap();
    assert_eq!(
        same.metadata.resource_version,
        cur.metadata.resource_version
    );
    // name mismatch
    let e = api_err(
        cms.replace("other", &PostParams::default(), &cur)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    // missing object
    let mut ghost = cur.clone();
    ghost.metadata.name = Some("ghost".into());
    let e = api_err(
        cms.replace("ghost", &PostParams::default(), &ghost)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);
    s.shutdown().await;
}

#[tokio::test]
async fn status_subresource_splits_spec_and_status() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(s.client());
    let p = pods
        .create(&PostParams::default(), &pod("p"))
        .await
        .unwrap();
    // main resource ignores status changes
    let mut changed = p.clone();
    changed.status.as_mut().unwrap().phase = Some("Running".into());
    changed.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
    let after = pods
        .replace("p", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_eq!(
        after.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    assert_eq!(after.metadata.labels.as_ref().unwrap()["a"], "b");
    assert_eq!(after.metadata.generation, Some(1), "labels are not spec");
    // status ignores everything else
    let mut st = after.clone();
    st.status.as_mut().unwrap().phase = Some("Running".into());
    st.metadata.labels = Some([("a".to_string(), "changed".to_string())].into());
    let after = pods
        .replace_status("p", &PostParams::default(), &st)
        .await
        .unwrap();
    assert_eq!(
        after.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    assert_eq!(after.metadata.labels.as_ref().unwrap()["a"], "b");
    let got = pods.get_status("p").await.unwrap();
    assert_eq!(got.status.unwrap().phase.as_deref(), Some("Running"));
    // status patch
    let after = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .unwrap();
    assert_eq!(after.status.unwrap().phase.as_deref(), Some("Succeeded"));
    // pod spec is immutable apart from images
    let mut img = pods.get("p").await.unwrap();
    img.spec.as_mut().unwrap().containers[0].image = Some("busybox:2".into());
    let after = pods
        .replace("p", &PostParams::default(), &img)
        .await
        .unwrap();
    assert_eq!(
        after.metadata.generation,
        Some(2),
        "spec change bumps generation"
    );
    let mut bad = after.clone();
    bad.spec.as_mut().unwrap().containers[0].name = "renamed".into();
    let e = api_err(
        pods.replace("p", &PostParams::default(), &bad)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    // ConfigMaps have no status subresource
    let r = raw(
        &s,
        "GET",
        "/api/v1/namespaces/default/configmaps/x/status",
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 404);
    s.shutdown().await;
}

#[tokio::test]
async fn patches_merge_json_strategic_and_apply() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("c".into());
    cm.data = Some(
        [
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "2".to_string()),
        ]
        .into(),
    );
    let created = cms.create(&PostParams::default(), &cm).await.unwrap();
    let p = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": null, "c": "3"}})),
        )
        .await
        .unwrap();
    let d = p.data.unwrap();
    assert!(!d.contains_key("a"));
    assert_eq!(d["c"], "3");
    // JSON patch (raw: the kube client needs its jsonpatch feature for Patch::Json)
    let path = "/api/v1/namespaces/default/configmaps/c";
    let ops = json!([{"op": "test", "path": "/data/b", "value": "2"}, {"op": "replace", "path": "/data/b", "value": "20"}]).to_string();
    let r = raw(&s, "PATCH", path, Some("application/json-patch+json"), &ops).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["data"]["b"], "20");
    let failing = json!([{"op": "test", "path": "/data/b", "value": "nope"}]).to_string();
    let r = raw(
        &s,
        "PATCH",
        path,
        Some("application/json-patch+json"),
        &failing,
    )
    .await;
    assert_eq!(r.status, 422);
    assert_eq!(r.json()["reason"], "Invalid");
    assert_eq!(
        cms.get("c").await.unwrap().data.unwrap()["b"],
        "20",
        "failed patch changed nothing"
    );
    // stale resourceVersion inside a patch
    let stale = json!({"metadata": {"resourceVersion": created.metadata.resource_version}, "data": {"x": "y"}});
    let e = api_err(
        cms.patch("c", &PatchParams::default(), &Patch::Merge(stale))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 409);
    // strategic merge on a built-in: finalizers merge as a set
    let pods: Api<Pod> = Api::default_namespaced(s.client());
    pods.create(&PostParams::default(), &pod("p"))
        .await
        .unwrap();
    pods.patch(
        "p",
        &PatchParams::default(),
        &Patch::Strategic(json!({"metadata": {"finalizers": ["a/x"]}})),
    )
    .await
    .unwrap();
    let p = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"finalizers": ["a/y"]}})),
        )
        .await
        .unwrap();
    assert_eq!(
        p.metadata.finalizers.unwrap(),
        vec!["a/x".to_string(), "a/y".to_string()]
    );
    // server-side apply is answered with an explicit 415
    let e = api_err(
        cms.patch(
            "c",
            &PatchParams::apply("t"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap"})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 415);
    assert!(
        e.message
            .contains("not implemented by the steward API server stand-in"),
        "{}",
        e.message
    );
    // patch of a missing object
    let e = api_err(
        cms.patch("ghost", &PatchParams::default(), &Patch::Merge(json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);
    s.shutdown().await;
}

#[tokio::test]
async fn malformed_requests_get_status_errors() {
    let s = ApiServer::start().await.unwrap();
    let path = "/api/v1/namespaces/default/configmaps";
    let r = raw(&s, "POST", path, Some("application/json"), "{not json").await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["reason"], "BadRequest");
    assert_eq!(r.json()["status"], "Failure");
    assert_eq!(r.json()["apiVersion"], "v1");
    let r = raw(&s, "POST", path, Some("text/plain"), "{}").await;
    assert_eq!(r.status, 415);
    assert_eq!(r.json()["reason"], "UnsupportedMediaType");
    let body = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}}).to_string();
    let r = raw(&s, "POST", path, Some("application/json"), &body).await;
    assert_eq!(r.status, 400, "kind mismatch");
    let body = json!({"apiVersion": "apps/v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
        .to_string();
    let r = raw(&s, "POST", path, Some("application/json"), &body).await;
    assert_eq!(r.status, 400, "apiVersion mismatch");
    let r = raw(&s, "GET", "/api/v1/namespaces/default/widgets", None, "").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["reason"], "NotFound");
    let r = raw(&s, "GET", "/apis/nope.example.com/v1/things", None, "").await;
    assert_eq!(r.status, 404);
    let r = raw(
        &s,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/x",
        Some("text/plain"),
        "{}",
    )
    .await;
    assert_eq!(r.status, 415);
    let r = raw(&s, "GET", "/api/v1/namespaces/default/pods/x/log", None, "").await;
    assert_eq!(r.status, 501);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("not implemented by the steward API server stand-in")
    );
    s.shutdown().await;
}

#[tokio::test]
async fn secrets_fold_string_data_and_dry_run_persists_nothing() {
    let s = ApiServer::start().await.unwrap();
    let secrets: Api<Secret> = Api::default_namespaced(s.client());
    let mut sec = Secret::default();
    sec.metadata.name = Some("s".into());
    sec.string_data = Some([("k".to_string(), "foo".to_string())].into());
    let dry = secrets
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &sec,
        )
        .await
        .unwrap();
    assert_eq!(dry.metadata.name.as_deref(), Some("s"));
    assert!(secrets.get_opt("s").await.unwrap().is_none());
    let created = secrets.create(&PostParams::default(), &sec).await.unwrap();
    assert!(created.string_data.is_none());
    assert_eq!(created.data.unwrap()["k"].0, b"foo".to_vec());
    assert_eq!(created.type_.as_deref(), Some("Opaque"));
    s.shutdown().await;
}

/// `client::replace_with_retry` starts a new round on 409 and keeps both
/// writes; it gives up with the 409 once its rounds are spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_with_retry_rereads_on_conflict_and_keeps_the_other_write() {
    use std::collections::BTreeMap;
    use steward_testing_apiserver::client::{CONFLICT_ATTEMPTS, replace_with_retry};
    use tokio::runtime::Handle;

    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("cm".into());
    cms.create(&PostParams::default(), &cm).await.unwrap();

    // Another writer changes the object after our first read.
    let other = |key: &'static str, value: String| {
        let cms = cms.clone();
        tokio::task::block_in_place(move || {
            Handle::current().block_on(async move {
                let patch = json!({"data": {key: value}});
                cms.patch("cm", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
            })
        })
    };
    let mut rounds = 0;
    let out = replace_with_retry(&cms, "cm", |c| {
        rounds += 1;
        if rounds == 1 {
            other("other", "theirs".into());
        }
        c.data
            .get_or_insert_with(BTreeMap::new)
            .insert("mine".into(), "ours".into());
    })
    .await
    .unwrap();
    assert_eq!(rounds, 2, "the conflicting round must be retried once");
    let data = out.data.unwrap();
    assert_eq!(data.get("mine").map(String::as_str), Some("ours"));
    assert_eq!(data.get("other").map(String::as_str), Some("theirs"));

    // A writer that wins every round: the last 409 comes back.
    let mut rounds = 0;
    let err = replace_with_retry(&cms, "cm", |_| {
        rounds += 1;
        other("always", rounds.to_string());
    })
    .await
    .unwrap_err();
    assert_eq!(api_err(err).code, 409);
    assert_eq!(rounds, CONFLICT_ATTEMPTS);
}
