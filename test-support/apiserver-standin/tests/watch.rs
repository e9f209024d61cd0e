//! Watch semantics: replay, bookmarks, timeouts, 410 Gone, selector transitions,
//! and kube-runtime's watcher against the stand-in.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;

fn cm(name: &str) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c
}

#[tokio::test]
async fn watch_replays_from_resource_version_and_honours_timeout() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let start = s.resource_version();
    cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await
    .unwrap();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    let t0 = Instant::now();
    let r = raw(
        &s,
        "GET",
        &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={start}&timeoutSeconds=1&allowWatchBookmarks=true"),
        None,
        "",
    )
    .await;
    let elapsed = t0.elapsed();
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(4),
        "{elapsed:?}"
    );
    assert_eq!(r.status, 200);
    let evs = r.events();
    let types: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(&types[..3], &["ADDED", "MODIFIED", "DELETED"], "{types:?}");
    assert!(types.contains(&"BOOKMARK"));
    let bm = evs.iter().find(|e| e["type"] == "BOOKMARK").unwrap();
    assert_eq!(
        bm["object"]["metadata"]["resourceVersion"],
        s.resource_version().to_string()
    );
    assert_eq!(evs[1]["object"]["data"]["k"], "v");
    // resourceVersions strictly increase
    let rvs: Vec<u64> = evs[..3]
        .iter()
        .map(|e| {
            e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(rvs[0] < rvs[1] && rvs[1] < rvs[2]);
    s.shutdown().await;
}

#[tokio::test]
async fn watch_from_compacted_rv_gets_410_expired_event() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let old = s.resource_version();
    cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    s.compact();
    let r = raw(
        &s,
        "GET",
        &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={old}"),
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    let evs = r.events();
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0]["type"], "ERROR");
    assert_eq!(evs[0]["object"]["code"], 410);
    assert_eq!(evs[0]["object"]["reason"], "Expired");
    assert_eq!(evs[0]["object"]["kind"], "Status");
    // the kube client surfaces it as WatchEvent::Error
    let mut stream = cms
        .watch(&WatchParams::default(), &old.to_string())
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 error event, got {other:?}"),
    }
    s.shutdown().await;
}

#[tokio::test]
async fn live_watch_via_kube_client() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.create(&PostParams::default(), &cm("pre"))
        .await
        .unwrap();
    let rv = s.resource_version().to_string();
    let mut stream = cms
        .watch(&WatchParams::default().disable_bookmarks().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    cms.create(&PostParams::default(), &cm("live"))
        .await
        .unwrap();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Added(o)) => assert_eq!(o.metadata.name.as_deref(), Some("live")),
        other => panic!("unexpected {other:?}"),
    }
    // resourceVersion "0": synthetic ADDED for current state first
    let mut from0 = cms
        .watch(&WatchParams::default().disable_bookmarks().timeout(10), "0")
        .await
        .unwrap()
        .boxed();
    let mut names = Vec::new();
    for _ in 0..2 {
        if let Some(WatchEvent::Added(o)) = from0.try_next().await.unwrap() {
            names.push(o.metadata.name.unwrap());
        }
    }
    names.sort();
    assert_eq!(names, vec!["live", "pre"]);
    s.shutdown().await;
}

#[tokio::test]
async fn label_selector_transitions_are_added_and_deleted() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let mut c = cm("t");
    c.metadata.labels = Some([("app".to_string(), "y".to_string())].into());
    cms.create(&PostParams::default(), &c).await.unwrap();
    let rv = s.resource_version().to_string();
    let mut stream = cms
        .watch(
            &WatchParams::default()
                .disable_bookmarks()
                .labels("app=x")
                .timeout(10),
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    let relabel = |v: &'static str| {
        let cms = cms.clone();
        async move {
            cms.patch(
                "t",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"app": v}}})),
            )
            .await
            .unwrap()
        }
    };
    relabel("x").await;
    relabel("x2").await;
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Added(o)) => assert_eq!(o.metadata.labels.unwrap()["app"], "x"),
        other => panic!("expected ADDED, got {other:?}"),
    }
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Deleted(o)) => {
            // previous content with the new resourceVersion, like kube-apiserver
            assert_eq!(o.metadata.labels.unwrap()["app"], "x");
            assert_eq!(
                o.metadata.resource_version,
                Some(s.resource_version().to_string())
            );
        }
        other => panic!("expected DELETED, got {other:?}"),
    }
    s.shutdown().await;
}

#[tokio::test]
async fn runtime_watcher_sees_changes_and_relists_after_410() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.create(&PostParams::default(), &cm("before"))
        .await
        .unwrap();
    let mut w = watcher::watcher(cms.clone(), watcher::Config::default()).boxed();
    // initial list
    let mut init = Vec::new();
    loop {
        match w.try_next().await.unwrap().unwrap() {
            Event::Init => {}
            Event::InitApply(o) => init.push(o.metadata.name.unwrap()),
            Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(init, vec!["before"]);
    // live add / modify / delete
    cms.create(&PostParams::default(), &cm("x")).await.unwrap();
    cms.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "b"}})),
    )
    .await
    .unwrap();
    cms.delete("x", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(5), w.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            Event::Apply(o) => seen.push(format!(
                "apply:{}:{}",
                o.metadata.name.unwrap(),
                o.data.map(|d| d.len()).unwrap_or(0)
            )),
            Event::Delete(o) => seen.push(format!("delete:{}", o.metadata.name.unwrap())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, vec!["apply:x:0", "apply:x:1", "delete:x"]);
    // The watcher stream is lazy: while nobody polls it, drop its connection, change
    // state and compact. Its re-watch from the old resourceVersion must get 410 and
    // the watcher must re-list.
    s.close_watches();
    cms.create(&PostParams::default(), &cm("after"))
        .await
        .unwrap();
    s.compact();
    let mut got_410 = false;
    let mut relisted = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), w.next())
            .await
            .unwrap()
            .unwrap()
        {
            Err(watcher::Error::WatchError(e)) => {
                assert_eq!(e.code, 410);
                got_410 = true;
            }
            Err(other) => panic!("unexpected watcher error {other:?}"),
            Ok(Event::Init) => {}
            Ok(Event::InitApply(o)) => relisted.push(o.metadata.name.unwrap()),
            Ok(Event::InitDone) => break,
            Ok(other) => panic!("unexpected {other:?}"),
        }
    }
    assert!(got_410);
    relisted.sort();
    assert_eq!(relisted, vec!["after", "before"]);
    s.shutdown().await;
}

#[tokio::test]
async fn runtime_watcher_streaming_list_uses_initial_events_end_bookmark() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.create(&PostParams::default(), &cm("one"))
        .await
        .unwrap();
    let mut w = watcher::watcher(cms.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut init = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), w.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            Event::Init => {}
            Event::InitApply(o) => init.push(o.metadata.name.unwrap()),
            Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(init, vec!["one"]);
    cms.create(&PostParams::default(), &cm("two"))
        .await
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), w.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        Event::Apply(o) => assert_eq!(o.metadata.name.as_deref(), Some("two")),
        other => panic!("unexpected {other:?}"),
    }
    s.shutdown().await;
}

#[tokio::test]
async fn all_namespaces_watch_and_periodic_bookmarks() {
    let s = ApiServer::start_with(steward_testing_apiserver::Options {
        bookmark_interval: Duration::from_millis(200),
        ..Default::default()
    })
    .await
    .unwrap();
    let rv = s.resource_version();
    let srv = s.clone();
    let watch = tokio::spawn(async move {
        raw(&srv, "GET", &format!("/api/v1/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=1&allowWatchBookmarks=true"), None, "").await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    for ns in ["default", "kube-system"] {
        let api: Api<ConfigMap> = Api::namespaced(s.client(), ns);
        api.create(&PostParams::default(), &cm("c")).await.unwrap();
    }
    let r = watch.await.unwrap();
    let evs = r.events();
    let added: Vec<&str> = evs
        .iter()
        .filter(|e| e["type"] == "ADDED")
        .map(|e| e["object"]["metadata"]["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(added, vec!["default", "kube-system"]);
    let bookmarks = evs.iter().filter(|e| e["type"] == "BOOKMARK").count();
    assert!(
        bookmarks >= 3,
        "expected the initial and periodic bookmarks, got {bookmarks}"
    );
    s.shutdown().await;
}
