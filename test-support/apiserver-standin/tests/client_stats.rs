//! Per-client attribution (by `User-Agent` component): requests, response
//! and list bytes, watch traffic, the open-watch gauge, and stored sizes.
// Test code: panicking on unexpected responses is the point.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use steward_testing_apiserver::{ClientResource, Options, Stats, client_component};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const AGENT: &str = "steward-agent";
const AGENT_UA: &str = "steward-agent/n1";
const CONTROLLER: &str = "steward-controller";
const CONTROLLER_UA: &str = "steward-controller/c1";

/// No periodic bookmarks during a test: the event counts are exact.
async fn start() -> ApiServer {
    ApiServer::start_with(Options {
        bookmark_interval: Duration::from_secs(3600),
        ..Options::default()
    })
    .await
    .unwrap()
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"app": "stats"}},
        "data": {"k": name}
    }))
    .unwrap()
}

/// A watch read line by line over HTTP/1.0 (the body is close-delimited,
/// so each line read is exactly one event as sent).
struct RawWatch {
    lines: tokio::io::Lines<BufReader<TcpStream>>,
    /// Bytes of the event lines read, newlines included.
    bytes: u64,
}

impl RawWatch {
    async fn open(server: &ApiServer, user_agent: &str, query: &str) -> RawWatch {
        let addr = server.url().trim_start_matches("http://").to_string();
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let req = format!(
            "GET /api/v1/namespaces/default/configmaps?watch=true&{query} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: {user_agent}\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut lines = BufReader::new(s).lines();
        let status = lines.next_line().await.unwrap().unwrap();
        assert!(status.contains(" 200 "), "{status}");
        while !lines.next_line().await.unwrap().unwrap().is_empty() {}
        RawWatch { lines, bytes: 0 }
    }

    /// The next event (fails after 5 s).
    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(5), self.lines.next_line())
            .await
            .expect("a watch event within 5 s")
            .unwrap()
            .expect("the watch stream ended");
        self.bytes += line.len() as u64 + 1;
        serde_json::from_str(&line).unwrap()
    }

    /// The types of the next `n` events.
    async fn types(&mut self, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.next().await["type"].as_str().unwrap().to_string());
        }
        out
    }
}

/// Polls the stats until `f` holds, for up to 5 s.
async fn stats_until(server: &ApiServer, f: impl Fn(&Stats) -> bool) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let st = server.stats();
        if f(&st) || Instant::now() > deadline {
            return st;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn open_of(server: &ApiServer, component: &str) -> u64 {
    server
        .open_watches()
        .get(&ClientResource {
            component: component.into(),
            resource: "configmaps".into(),
        })
        .copied()
        .unwrap_or(0)
}

/// Polls the open-watch gauge of `component` on configmaps until it is `n`.
async fn open_watches_become(server: &ApiServer, component: &str, n: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if open_of(server, component) == n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[test]
fn component_is_the_user_agent_up_to_the_first_slash() {
    assert_eq!(client_component("steward-agent/node-7"), "steward-agent");
    assert_eq!(client_component("kubectl/v1.34.0 (linux/amd64)"), "kubectl");
    assert_eq!(client_component("curl"), "curl");
    assert_eq!(client_component(""), "");
}

#[tokio::test]
async fn requests_lists_and_watch_traffic_are_attributed_per_component() {
    let s = start().await;
    let ctl: Api<ConfigMap> =
        Api::default_namespaced(s.client_with_user_agent(CONTROLLER_UA).unwrap());
    let pp = PostParams::default();
    for n in ["a", "b"] {
        ctl.create(&pp, &cm(n)).await.unwrap();
    }
    s.reset_stats();

    // the agent lists (raw, to know the body size) and watches
    let list = raw_with(
        &s,
        "GET",
        "/api/v1/namespaces/default/configmaps?labelSelector=app%3Dstats",
        &[("User-Agent", AGENT_UA)],
        b"",
    )
    .await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(list.json()["items"].as_array().unwrap().len(), 2);
    let mut w = RawWatch::open(
        &s,
        AGENT_UA,
        "labelSelector=app%3Dstats&allowWatchBookmarks=true",
    )
    .await;
    assert!(
        open_watches_become(&s, AGENT, 1).await,
        "{:?}",
        s.open_watches()
    );
    // initial state: 2 ADDED, then the bookmark ending it
    assert_eq!(w.types(3).await, ["ADDED", "ADDED", "BOOKMARK"]);

    // the controller writes: 3 creates, 2 patches, 1 delete
    for n in ["c", "d", "e"] {
        ctl.create(&pp, &cm(n)).await.unwrap();
    }
    for n in ["a", "c"] {
        ctl.patch(
            n,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "changed"}})),
        )
        .await
        .unwrap();
    }
    ctl.delete("b", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        w.types(6).await,
        ["ADDED", "ADDED", "ADDED", "MODIFIED", "MODIFIED", "DELETED"]
    );

    let st = s.stats();
    // requests, per component and verb
    assert_eq!(st.requests_by(AGENT), 2, "{:?}", st.by_client);
    assert_eq!(st.requests_by_verb(AGENT, "list"), 1);
    assert_eq!(st.requests_by_verb(AGENT, "watch"), 1);
    assert_eq!(st.requests_by(CONTROLLER), 6, "{:?}", st.by_client);
    assert_eq!(st.client(CONTROLLER, "create", "configmaps").requests, 3);
    assert_eq!(st.client(CONTROLLER, "patch", "configmaps").requests, 2);
    assert_eq!(st.client(CONTROLLER, "delete", "configmaps").requests, 1);
    assert_eq!(st.client(AGENT, "create", "configmaps").requests, 0);
    assert_eq!(st.user_agents.get(AGENT_UA), Some(&2));
    assert_eq!(st.user_agents.get(CONTROLLER_UA), Some(&6));
    assert_eq!(st.total_requests(), 8);
    assert!(st.response_bytes_by(CONTROLLER) > 0);

    // the list: 2 objects and its body's bytes
    assert_eq!(st.listed_objects_by(AGENT), 2, "{:?}", st.lists);
    assert_eq!(st.list_bytes_by(AGENT), list.body.len() as u64);
    assert_eq!(
        st.client(AGENT, "list", "configmaps").response_bytes,
        list.body.len() as u64
    );
    assert_eq!(st.listed_objects_by(CONTROLLER), 0);

    // watch traffic: every line the agent read, and nothing for the controller
    let of = |t: &str| st.watch_events_of(AGENT, "configmaps", t).events;
    assert_eq!(
        (of("ADDED"), of("MODIFIED"), of("DELETED"), of("BOOKMARK")),
        (5, 2, 1, 1),
        "{:?}",
        st.watch_events
    );
    assert_eq!(st.watch_events_by(AGENT), 9);
    assert_eq!(st.watch_bytes_by(AGENT), w.bytes);
    assert_eq!(st.watch_events_by(CONTROLLER), 0);
    assert_eq!(st.watch_bytes_by(CONTROLLER), 0);
    assert_eq!(st.open_watches_by(AGENT), 1);
    assert_eq!(
        st.components(),
        [AGENT.to_string(), CONTROLLER.to_string()].into()
    );

    // one more write: one more MODIFIED of its exact size
    let before = st.watch_bytes_by(AGENT);
    ctl.patch(
        "d",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "again"}})),
    )
    .await
    .unwrap();
    assert_eq!(w.types(1).await, ["MODIFIED"]);
    let st = stats_until(&s, |st| st.watch_events_by(AGENT) == 10).await;
    assert_eq!(
        st.watch_events_of(AGENT, "configmaps", "MODIFIED").events,
        3
    );
    assert_eq!(st.watch_bytes_by(AGENT), w.bytes);
    assert!(st.watch_bytes_by(AGENT) > before);

    // the watch ends with its connection: the gauge goes back to 0
    drop(w);
    assert!(
        open_watches_become(&s, AGENT, 0).await,
        "{:?}",
        s.open_watches()
    );
    assert_eq!(s.stats().open_watches_by(AGENT), 0);
    s.shutdown().await;
}

#[tokio::test]
async fn kube_watch_is_counted_and_reset_keeps_the_open_watch_gauge() {
    use futures::StreamExt;
    let s = start().await;
    let agent: Api<ConfigMap> =
        Api::default_namespaced(s.client_with_user_agent(AGENT_UA).unwrap());
    let ctl: Api<ConfigMap> =
        Api::default_namespaced(s.client_with_user_agent(CONTROLLER_UA).unwrap());
    let rv = s.resource_version().to_string();
    let wp = kube::api::WatchParams::default()
        .labels("app=stats")
        .disable_bookmarks();
    let mut stream = agent.watch(&wp, &rv).await.unwrap().boxed();
    assert!(
        open_watches_become(&s, AGENT, 1).await,
        "{:?}",
        s.open_watches()
    );
    ctl.create(&PostParams::default(), &cm("x")).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
        Ok(Some(Ok(kube::api::WatchEvent::Added(c)))) => {
            assert_eq!(c.metadata.name.as_deref(), Some("x"));
        }
        other => panic!("expected ADDED x, got {other:?}"),
    }
    let st = stats_until(&s, |st| st.watch_events_by(AGENT) == 1).await;
    assert_eq!(st.watch_events_of(AGENT, "configmaps", "ADDED").events, 1);
    assert!(st.watch_bytes_by(AGENT) > 0);
    assert_eq!(st.requests_by_verb(AGENT, "watch"), 1);
    assert_eq!(st.requests_by(CONTROLLER), 1);

    // counters are zeroed, the gauge (live state) is not
    s.reset_stats();
    let st = s.stats();
    assert_eq!(st.watch_events_by(AGENT), 0);
    assert_eq!(st.requests_by(CONTROLLER), 0);
    assert!(st.by_client.is_empty() && st.user_agents.is_empty());
    assert_eq!(st.open_watches_by(AGENT), 1);

    drop(stream);
    assert!(
        open_watches_become(&s, AGENT, 0).await,
        "{:?}",
        s.open_watches()
    );
    s.shutdown().await;
}

#[tokio::test]
async fn unattributed_requests_have_the_empty_component() {
    let s = start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    s.reset_stats();
    cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    cms.get("a").await.unwrap();
    let st = s.stats();
    assert_eq!(st.requests_by(""), 2, "{:?}", st.by_client);
    assert_eq!(st.client("", "get", "configmaps").requests, 1);
    assert_eq!(st.user_agents.get(""), Some(&2));
    s.shutdown().await;
}

#[tokio::test]
async fn stored_counts_objects_and_their_json_bytes() {
    let s = start().await;
    let before = s.stored();
    let (n0, b0) = before.get("configmaps").copied().unwrap_or((0, 0));
    let mut created_bytes = 0u64;
    for n in ["a", "b", "c"] {
        let body = serde_json::to_string(&cm(n)).unwrap();
        let r = raw(
            &s,
            "POST",
            "/api/v1/namespaces/default/configmaps",
            Some("application/json"),
            &body,
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.body);
        // the answer is the stored object, serialized the same way
        created_bytes += serde_json::to_vec(&r.json()).unwrap().len() as u64;
    }
    let after = s.stored();
    assert_eq!(after.get("configmaps"), Some(&(n0 + 3, b0 + created_bytes)));
    // other resources are unchanged
    for (k, v) in &before {
        if k != "configmaps" {
            assert_eq!(after.get(k), Some(v), "{k}");
        }
    }
    assert!(after.contains_key("namespaces"), "{after:?}");

    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    for n in ["a", "b", "c"] {
        cms.delete(n, &DeleteParams::default()).await.unwrap();
    }
    assert_eq!(
        s.stored().get("configmaps").copied().unwrap_or((0, 0)),
        (n0, b0)
    );
    s.shutdown().await;
}
