//! The scheduler extender over HTTP, driven the way kube-scheduler drives
//! it (Filter with the candidate nodes, Prioritize, then a Binding), with
//! the controller deciding against the API server stand-in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use steward_api::Reservation;
use steward_extender::ExtenderConfig;
use steward_testing_apiserver::ApiServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

use common::{CONTROLLER_AGENT, EXTENDER_AGENT, NS, Stand, direct, stand_opts};

async fn stand(capacity: u32) -> Stand {
    stand_with(capacity, &[]).await
}

/// [`stand`] with Node annotations in place before the controller starts
/// (its first list sees them: no race with a later patch).
async fn stand_with(capacity: u32, annotations: &[(&str, &str, String)]) -> Stand {
    stand_opts(capacity, annotations, true, direct()).await
}

/// [`stand`] with the extender on the API path only (no direct asks).
async fn stand_api_path(capacity: u32) -> Stand {
    stand_opts(capacity, &[], true, ExtenderConfig::default()).await
}

/// One HTTP/1.1 exchange, as a plain client writes it.
async fn http(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let status: u16 = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body_at = text.find("\r\n\r\n").unwrap() + 4;
    (status, out[body_at..].to_vec())
}

async fn pending_pod(api: &ApiServer, name: &str, cams: u32) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "main", "image": "busybox",
            "resources": {"limits": {"steward.dev/cam": cams.to_string()}}}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(api.client(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

async fn filter(addr: SocketAddr, pod: &Pod, nodes: &[&str]) -> Value {
    // Go's field names (ExtenderArgs has no json tags).
    let args = json!({"Pod": pod, "Nodes": null, "NodeNames": nodes});
    let (status, body) = http(addr, "POST", "/filter", &serde_json::to_vec(&args).unwrap()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

async fn bind(api: &ApiServer, pod: &str, node: &str) {
    let binding = json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": pod}, "target": {"kind": "Node", "name": node}});
    let _: Value = Api::<Pod>::namespaced(api.client(), NS)
        .create_subresource("binding", pod, &PostParams::default(), &binding)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_shared_device_is_placed_once_per_slot_and_a_retry_asks_anew() {
    placed_once_per_slot(stand(2).await).await;
    let s = stand_api_path(2).await;
    assert_eq!(s.extender.leader_endpoint(), None);
    placed_once_per_slot(s).await;
}

/// The extender asks the leader: it writes no Reservation itself, and the
/// leader writes each new pod's ask and its decision in one create.
#[tokio::test]
async fn the_direct_path_leaves_every_reservation_write_to_the_leader() {
    let s = stand(2).await;
    let before = s.api.stats();
    let pod = pending_pod(&s.api, "p1", 1).await;
    let r = filter(s.addr, &pod, &["n1", "n2", "n3", "n4"]).await;
    let nodes: Vec<String> = serde_json::from_value(r["NodeNames"].clone()).unwrap();
    assert_eq!(nodes.len(), 1, "{r}");
    // Asked again with the same candidates: answered, nothing written.
    let again = filter(s.addr, &pod, &["n4", "n3", "n2", "n1"]).await;
    assert_eq!(again["NodeNames"], r["NodeNames"], "{again}");
    let after = s.api.stats();
    // Writes of anything but the election Lease (its renewals come when
    // they come, and a loaded machine stretches the test over one).
    let writes = |stats: &steward_testing_apiserver::Stats, who: &str| {
        stats
            .by_client
            .iter()
            .filter(|(k, _)| {
                k.component == who
                    && ["create", "update", "patch", "delete"].contains(&k.verb.as_str())
                    && k.resource != "leases.coordination.k8s.io"
            })
            .map(|(_, c)| c.requests)
            .sum::<u64>()
    };
    assert_eq!(
        writes(&after, EXTENDER_AGENT) - writes(&before, EXTENDER_AGENT),
        0,
        "the extender wrote"
    );
    let leader = |v: &str| {
        after.requests_by_verb(CONTROLLER_AGENT, v) - before.requests_by_verb(CONTROLLER_AGENT, v)
    };
    // The ask and its decision: one create, no status write (the Event is
    // a create too, of another resource).
    assert!(leader("create") >= 1, "the leader created no Reservation");
    let reservation_writes = |stats: &steward_testing_apiserver::Stats| {
        (
            stats.writes_for("reservations.steward.dev"),
            stats.writes_for("reservations.steward.dev/status"),
        )
    };
    let (objects, statuses) = reservation_writes(&after);
    let (objects0, statuses0) = reservation_writes(&before);
    assert_eq!(
        (objects - objects0, statuses - statuses0),
        (1, 0),
        "the ask and its decision are one write"
    );
    let written = Api::<Reservation>::namespaced(s.api.client(), NS)
        .get("p1")
        .await
        .unwrap();
    let status = written.status.unwrap();
    assert_eq!(status.phase, "Reserved");
    assert_eq!(Some(status.node.unwrap()), nodes.first().cloned());
    assert_eq!(status.observed_generation, written.metadata.generation);
    let asks = |outcome| {
        s.metrics
            .direct_asks
            .get_or_create(&steward_leader::metrics::AskLabels { outcome })
            .get()
    };
    assert_eq!(asks("decided"), 2, "both Filters asked the leader");
    assert_eq!(asks("not_leading") + asks("busy") + asks("failed"), 0);

    // A pod that cannot fit (2 slots asked, 1 free) is refused with the
    // reason, from the leader's ledger: nothing is written for it.
    let before = s.api.stats();
    let big = pending_pod(&s.api, "p2", 2).await;
    let r = filter(s.addr, &big, &["n1", "n2", "n3", "n4"]).await;
    assert_eq!(r["NodeNames"], json!([]), "{r}");
    assert!(r.to_string().contains("1 of 2 slots free"), "{r}");
    assert_eq!(asks("rejected_unwritten"), 1);
    let after = s.api.stats();
    for who in [EXTENDER_AGENT, CONTROLLER_AGENT] {
        assert_eq!(writes(&after, who) - writes(&before, who), 0, "{who} wrote");
    }
    assert!(
        Api::<Reservation>::namespaced(s.api.client(), NS)
            .get_opt("p2")
            .await
            .unwrap()
            .is_none()
    );
}

/// With CRDs older than the controller (the Reservation CRD without the
/// version a decided create goes through), the leader writes the ask and
/// its decision apart, and the Filter is answered all the same.
#[tokio::test]
async fn with_older_crds_the_leader_writes_the_ask_and_the_decision_apart() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;

    let s = stand(2).await;
    let crds = Api::<CustomResourceDefinition>::all(s.api.client());
    let name = "reservations.steward.dev";
    let mut older = Reservation::crd();
    assert_eq!(older.spec.versions.len(), 1, "v1alpha1 alone");
    older.metadata.resource_version = crds.get(name).await.unwrap().metadata.resource_version;
    crds.replace(name, &PostParams::default(), &older)
        .await
        .unwrap();
    // Creates and status writes (the leader's node-label patch after the
    // status write is neither).
    let writes = |stats: &steward_testing_apiserver::Stats| {
        let creates = stats
            .components()
            .iter()
            .map(|c| {
                stats
                    .client(c, "create", "reservations.steward.dev")
                    .requests
            })
            .sum::<u64>();
        (creates, stats.writes_for("reservations.steward.dev/status"))
    };
    for (i, pod) in ["p1", "p2"].into_iter().enumerate() {
        let before = writes(&s.api.stats());
        let p = pending_pod(&s.api, pod, 1).await;
        let r = filter(s.addr, &p, &["n1", "n2", "n3", "n4"]).await;
        let nodes: Vec<String> = serde_json::from_value(r["NodeNames"].clone()).unwrap();
        assert_eq!(nodes.len(), 1, "{pod}: {r}");
        let written = Api::<Reservation>::namespaced(s.api.client(), NS)
            .get(pod)
            .await
            .unwrap();
        let status = written.status.unwrap();
        assert_eq!(status.phase, "Reserved", "{pod}");
        assert_eq!(status.observed_generation, written.metadata.generation);
        let after = writes(&s.api.stats());
        // The first ask's decided create is refused; the next, within the
        // minute, is not tried: the ask's create and its status, each time.
        assert_eq!(after.1 - before.1, 1, "{pod}: one status write");
        if i == 1 {
            assert_eq!(after.0 - before.0, 1, "{pod}: one create");
        }
        // Written the two-write way, it gets its node labels just after
        // (the nodes that see "cam": n1..n3).
        let want: Vec<String> = ["n1", "n2", "n3"]
            .iter()
            .map(|n| steward_api::node_label_key(n))
            .collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let r = Api::<Reservation>::namespaced(s.api.client(), NS)
                .get(pod)
                .await
                .unwrap();
            let labels = r.metadata.labels.unwrap_or_default();
            if want.iter().all(|k| labels.contains_key(k)) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{pod}: never labeled for the nodes that see its Instance: {labels:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn placed_once_per_slot(s: Stand) {
    let mut chosen = Vec::new();
    for name in ["p1", "p2"] {
        let pod = pending_pod(&s.api, name, 1).await;
        let started = std::time::Instant::now();
        let r = filter(s.addr, &pod, &["n1", "n2", "n3", "n4"]).await;
        eprintln!("Filter of {name} answered in {:?}", started.elapsed());
        let nodes: Vec<String> = serde_json::from_value(r["NodeNames"].clone()).unwrap();
        assert_eq!(nodes.len(), 1, "{r}");
        let node = nodes[0].clone();
        assert!(["n1", "n2", "n3"].contains(&node.as_str()), "{r}");
        // Every other candidate is told where the slots are held.
        assert!(
            r["FailedNodes"]["n4"]
                .as_str()
                .unwrap_or_default()
                .contains(&format!("reserved on {node}")),
            "{r}"
        );
        // Prioritize puts the reserved node first.
        let args = json!({"Pod": pod, "Nodes": null, "NodeNames": ["n1", "n2", "n3"]});
        let (st, body) = http(
            s.addr,
            "POST",
            "/prioritize",
            &serde_json::to_vec(&args).unwrap(),
        )
        .await;
        assert_eq!(st, 200);
        let scores: Vec<Value> = serde_json::from_slice(&body).unwrap();
        for h in &scores {
            let want = if h["Host"] == node.as_str() { 10 } else { 0 };
            assert_eq!(h["Score"], want, "{scores:?}");
        }
        bind(&s.api, name, &node).await;
        chosen.push(node);
    }
    // The scheduler believes 6 slots exist (2 per node); only 2 do.
    let p3 = pending_pod(&s.api, "p3", 1).await;
    let r = filter(s.addr, &p3, &["n1", "n2", "n3", "n4"]).await;
    let nodes: Vec<String> = serde_json::from_value(r["NodeNames"].clone()).unwrap();
    assert!(nodes.is_empty(), "{r}");
    // n4 does not see the device: no preemption can change that.
    assert!(
        r["FailedAndUnresolvableNodes"]["n4"]
            .as_str()
            .unwrap_or_default()
            .contains("not seen by n4"),
        "{r}"
    );
    for n in ["n1", "n2", "n3"] {
        let why = r["FailedNodes"][n]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"));
        assert!(why.contains("0 of 2 slots free"), "{n}: {why}");
    }
    // p1 goes away; the scheduler retries p3, which now fits.
    Api::<Pod>::namespaced(s.api.client(), NS)
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let placed = loop {
        let r = filter(s.addr, &p3, &["n1", "n2", "n3"]).await;
        let nodes: Vec<String> = serde_json::from_value(r["NodeNames"].clone()).unwrap();
        if let Some(n) = nodes.first() {
            break n.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "p3 never placed: {r}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(["n1", "n2", "n3"].contains(&placed.as_str()));
    let r = Api::<Reservation>::namespaced(s.api.client(), NS)
        .get("p3")
        .await
        .unwrap();
    let owner = &r.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Pod", p3.metadata.uid.as_deref().unwrap())
    );
}

#[tokio::test]
async fn whole_node_objects_come_back_filtered_and_other_pods_pass_untouched() {
    let s = stand(1).await;
    let pod = pending_pod(&s.api, "p1", 1).await;
    let nodes: Vec<Value> = ["n1", "n2"]
        .iter()
        .map(|n| json!({"metadata": {"name": n}}))
        .collect();
    let args =
        json!({"pod": pod, "nodes": {"apiVersion": "v1", "kind": "NodeList", "items": nodes}});
    let (status, body) = http(
        s.addr,
        "POST",
        "/filter",
        &serde_json::to_vec(&args).unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    let r: Value = serde_json::from_slice(&body).unwrap();
    let items = r["Nodes"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{r}");
    assert!(r.get("NodeNames").is_none(), "{r}");
    // A pod asking for no steward resource is not steward's business.
    let plain: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": NS, "uid": "u-web"},
        "spec": {"containers": [{"name": "main", "image": "nginx"}]},
    }))
    .unwrap();
    let r = filter(s.addr, &plain, &["n1", "n4"]).await;
    assert_eq!(r["NodeNames"], json!(["n1", "n4"]));
    assert!(
        Api::<Reservation>::namespaced(s.api.client(), NS)
            .get_opt("web")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn bad_requests_get_clear_http_errors() {
    let s = stand(1).await;
    let (st, body) = http(s.addr, "POST", "/filter", b"{not json").await;
    assert_eq!(st, 400);
    assert!(String::from_utf8_lossy(&body).contains("not kube-scheduler's ExtenderArgs"));
    let (st, _) = http(s.addr, "POST", "/filter", b"{\"nodenames\": []}").await;
    assert_eq!(st, 400, "a body without the pod");
    let (st, _) = http(s.addr, "GET", "/filter", b"").await;
    assert_eq!(st, 405);
    let (st, _) = http(s.addr, "POST", "/bind", b"{}").await;
    assert_eq!(st, 404);
    let (st, _) = http(s.addr, "GET", "/healthz", b"").await;
    assert_eq!(st, 200);
    // A pod without a UID cannot own a Reservation: an extender error, which
    // the scheduler logs and retries.
    let no_uid = json!({"pod": {"metadata": {"name": "x", "namespace": NS},
        "spec": {"containers": [{"name": "m", "resources": {"limits": {"steward.dev/cam": "1"}}}]}},
        "nodenames": ["n1"]});
    let (st, body) = http(
        s.addr,
        "POST",
        "/filter",
        &serde_json::to_vec(&no_uid).unwrap(),
    )
    .await;
    assert_eq!(st, 200);
    let r: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        r["Error"]
            .as_str()
            .unwrap()
            .contains("no name, namespace or uid"),
        "{r}"
    );
}

#[test]
fn the_scheduler_configuration_calls_what_the_extender_serves() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/scheduler/kube-scheduler-config.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    for line in [
        "kind: KubeSchedulerConfiguration",
        "filterVerb: filter",
        "prioritizeVerb: prioritize",
        "nodeCacheCapable: true",
        "- name: steward.dev/",
    ] {
        assert!(text.contains(line), "{} lacks {line:?}", path.display());
    }
    // The Service the chart makes, on the chart's default port.
    assert!(text.contains("steward-extender.steward-system.svc:8888"));
    let values = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/helm/steward/values.yaml"),
    )
    .unwrap();
    assert!(
        values.contains("  port: 8888"),
        "chart default port changed"
    );
}

#[tokio::test]
async fn filter_keeps_only_nodes_with_a_numa_node_that_holds_the_exclusive_cpus() {
    // n1: 2 + 2 CPUs free (no NUMA node holds 3); n2: 4 on NUMA 1; n3 runs
    // no resource manager.
    let key = steward_core::reservation::NODE_CPUS_ANNOTATION;
    let doc = |free: Value| json!({"free": free, "holders": []}).to_string();
    let s = stand_with(
        1,
        &[
            ("n1", key, doc(json!({"0": 2, "1": 2}))),
            ("n2", key, doc(json!({"0": 1, "1": 4}))),
        ],
    )
    .await;
    let pinned = |name: &str, cpus: u32| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                "resources": {"limits": {"cpu": cpus.to_string(), "memory": "1Gi",
                    "resmgr.steward.dev/exclusive-cpus": cpus.to_string()}}}]},
        }))
        .unwrap()
    };
    let pods = Api::<Pod>::namespaced(s.api.client(), NS);
    // 5 fit no NUMA node anywhere: each node says why.
    let big = pods
        .create(&PostParams::default(), &pinned("big", 5))
        .await
        .unwrap();
    let r = filter(s.addr, &big, &["n1", "n2", "n3"]).await;
    assert_eq!(r["NodeNames"], json!([]), "{r}");
    let failed = &r["FailedNodes"];
    assert!(
        failed["n1"]
            .as_str()
            .unwrap_or("")
            .contains("at most 2 free on any")
            && failed["n2"]
                .as_str()
                .unwrap_or("")
                .contains("at most 4 free on any"),
        "{r}"
    );
    let unresolvable = &r["FailedAndUnresolvableNodes"];
    let n3 = failed["n3"]
        .as_str()
        .or(unresolvable["n3"].as_str())
        .unwrap_or("");
    assert!(n3.contains("no CRI resource manager"), "{r}");
    // 3 fit only n2's NUMA node 1.
    let pod = pods
        .create(&PostParams::default(), &pinned("pinned", 3))
        .await
        .unwrap();
    let r = filter(s.addr, &pod, &["n1", "n2", "n3"]).await;
    assert_eq!(r["NodeNames"], json!(["n2"]), "{r}");
    assert!(
        r["FailedNodes"]["n1"]
            .as_str()
            .unwrap_or("")
            .contains("reserved on n2"),
        "{r}"
    );
    let res = Api::<Reservation>::namespaced(s.api.client(), NS)
        .get("pinned")
        .await
        .unwrap();
    assert_eq!(res.spec.exclusive_cpus, 3);
    let st = res.status.unwrap();
    assert_eq!((st.node.as_deref(), st.numa_node), (Some("n2"), Some(1)));
}

#[tokio::test]
async fn reserve_and_unreserve_follow_the_scheduler_framework() {
    let s = stand(2).await;
    let pod = pending_pod(&s.api, "p1", 1).await;
    let uid = pod.metadata.uid.clone().unwrap();
    let r = filter(s.addr, &pod, &["n1", "n2"]).await;
    let node = r["NodeNames"][0].as_str().unwrap().to_owned();
    let other = if node == "n1" { "n2" } else { "n1" };
    let verb = |path: &'static str, body: Value| {
        let addr = s.addr;
        async move {
            let (status, text) = http(addr, "POST", path, body.to_string().as_bytes()).await;
            (status, String::from_utf8_lossy(&text).to_string())
        }
    };
    let p1 = |extra: Value| {
        let mut v = json!({"namespace": NS, "name": "p1", "uid": uid});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    // Reserve on the reserved node: confirmed, as often as asked.
    for _ in 0..2 {
        let (st, m) = verb("/reserve", p1(json!({"node": node}))).await;
        assert_eq!(
            (st, m.trim()),
            (200, format!("reserved on {node}").as_str())
        );
    }
    let (st, m) = verb("/reserve", p1(json!({"node": other}))).await;
    assert_eq!(st, 409, "{m}");
    assert!(
        m.contains(&format!("reserved on {node}, not {other}")),
        "{m}"
    );
    // Unreserve without a Reservation, or for another pod of that name.
    let (st, m) = verb(
        "/unreserve",
        json!({"namespace": NS, "name": "ghost", "uid": "u-ghost"}),
    )
    .await;
    assert_eq!(st, 200, "{m}");
    assert!(m.contains("nothing to release"), "{m}");
    let (st, m) = verb(
        "/unreserve",
        json!({"namespace": NS, "name": "p1", "uid": "an-older-p1"}),
    )
    .await;
    assert_eq!(st, 200, "{m}");
    assert!(m.contains("another pod's"), "{m}");
    assert_eq!(
        Api::<Reservation>::namespaced(s.api.client(), NS)
            .get("p1")
            .await
            .unwrap()
            .spec
            .cancel,
        None
    );
    // Unreserve: the controller cancels it; again changes nothing.
    let (st, m) = verb("/unreserve", p1(json!({"reason": "permit timed out"}))).await;
    assert_eq!(st, 200, "{m}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = Api::<Reservation>::namespaced(s.api.client(), NS)
            .get("p1")
            .await
            .unwrap();
        let st = r.status.unwrap_or_default();
        if st.phase == "Canceled" {
            assert_eq!(st.reason.as_deref(), Some("unreserved: permit timed out"));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never canceled: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (st, m) = verb("/unreserve", p1(json!({}))).await;
    assert_eq!((st, m.trim()), (200, "already released"));
    let (st, m) = verb("/reserve", p1(json!({"node": node}))).await;
    assert_eq!(st, 409, "{m}");
    assert!(m.contains("Canceled: unreserved: permit timed out"), "{m}");
    // A reason of any length is kept to 256 characters.
    let p2 = pending_pod(&s.api, "p2", 1).await;
    filter(s.addr, &p2, &["n1", "n2"]).await;
    let long = "x".repeat(5000);
    let (st, m) = verb(
        "/unreserve",
        json!({"namespace": NS, "name": "p2", "uid": p2.metadata.uid, "reason": long}),
    )
    .await;
    assert_eq!(st, 200, "{m}");
    let cancel = Api::<Reservation>::namespaced(s.api.client(), NS)
        .get("p2")
        .await
        .unwrap()
        .spec
        .cancel
        .unwrap();
    assert_eq!(cancel.len(), 256);
    // Bad bodies.
    let (st, m) = verb("/reserve", p1(json!({}))).await;
    assert_eq!((st, m.trim()), (400, "reserve needs the node"));
    let (st, m) = verb("/unreserve", json!({"pod": "p1"})).await;
    assert_eq!(st, 400, "{m}");
    assert!(m.contains("unknown field"), "{m}");
}

// ---- The wire as Go writes it (fixtures: tests/fixtures/kube-scheduler) ----

/// A request body of `tests/fixtures/kube-scheduler/`, as Go wrote it.
fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kube-scheduler")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Creates the fixture's pod in the stand-in (without the server-set
/// fields) and returns the fixture's bytes with the pod's real uid.
async fn go_args(api: &ApiServer, name: &str) -> (Pod, String) {
    let text = fixture(name);
    let v: Value = serde_json::from_str(&text).unwrap();
    let mut pod = v["Pod"].clone();
    let fixture_uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    for k in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
    ] {
        pod["metadata"].as_object_mut().unwrap().remove(k);
    }
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let pod = Api::<Pod>::namespaced(api.client(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    (pod, text.replace(&fixture_uid, &uid))
}

/// The keys Go's `ExtenderFilterResult` has (no json tags): anything else
/// would be dropped by kube-scheduler's decoder.
fn assert_go_filter_result(r: &Value) {
    for k in r.as_object().unwrap().keys() {
        assert!(
            [
                "Nodes",
                "NodeNames",
                "FailedNodes",
                "FailedAndUnresolvableNodes",
                "Error"
            ]
            .contains(&k.as_str()),
            "{k} is not a field of ExtenderFilterResult: {r}"
        );
    }
}

async fn post(addr: SocketAddr, path: &str, body: &str) -> Value {
    let (status, out) = http(addr, "POST", path, body.as_bytes()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
    serde_json::from_slice(&out).unwrap()
}

#[tokio::test]
async fn go_written_args_are_read_and_answered_with_go_names() {
    let s = stand(2).await;
    let (_, body) = go_args(&s.api, "args-nodenames.json").await;
    let r = post(s.addr, "/filter", &body).await;
    assert_go_filter_result(&r);
    assert_eq!(r["Error"], Value::Null, "{r}");
    let nodes: Vec<String> = serde_json::from_value(r["NodeNames"].clone()).unwrap();
    assert_eq!(nodes.len(), 1, "{r}");
    let node = nodes[0].clone();
    assert!(
        r["FailedNodes"]["n4"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("reserved on {node}")),
        "{r}"
    );
    let res = Api::<Reservation>::namespaced(s.api.client(), NS)
        .get("cam-1")
        .await
        .unwrap();
    assert_eq!(res.spec.slots, BTreeMap::from([("cam".to_owned(), 1)]));
    // Prioritize with the same bytes: HostPriorityList with Go's names.
    let scores = post(s.addr, "/prioritize", &body).await;
    let scores = scores.as_array().unwrap();
    assert_eq!(scores.len(), 4, "{scores:?}");
    for h in scores {
        let keys: Vec<&String> = h.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["Host", "Score"], "{h}");
        let want = if h["Host"] == node.as_str() { 10 } else { 0 };
        assert_eq!(h["Score"], want, "{scores:?}");
    }
    // Go reads keys case-insensitively: so do we.
    let lower = body
        .replacen("{\"Pod\":", "{\"pod\":", 1)
        .replace("\"NodeNames\":", "\"nodenames\":");
    let r = post(s.addr, "/filter", &lower).await;
    assert_eq!(r["NodeNames"], json!([node]), "{r}");
}

#[tokio::test]
async fn go_written_node_objects_come_back_as_a_node_list() {
    let s = stand(2).await;
    let (_, body) = go_args(&s.api, "args-nodes.json").await;
    let r = post(s.addr, "/filter", &body).await;
    assert_go_filter_result(&r);
    assert!(r.get("NodeNames").is_none(), "{r}");
    let items = r["Nodes"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{r}");
    let name = items[0]["metadata"]["name"].as_str().unwrap();
    assert!(["n1", "n2"].contains(&name), "{r}");
    // The Node comes back as it came (Go's tags, quantities untouched).
    assert_eq!(
        items[0]["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
        10250
    );
    assert_eq!(items[0]["status"]["allocatable"]["cpu"], "3900m");
}

#[tokio::test]
async fn quantities_in_the_forms_go_writes_are_read() {
    // On the API path the extender writes the Reservation: its spec is
    // the extender's reading of the quantities (the direct path writes
    // no rejection).
    let s = stand_api_path(2).await;
    let (_, body) = go_args(&s.api, "args-quantities.json").await;
    let r = post(s.addr, "/filter", &body).await;
    assert_go_filter_result(&r);
    let res = Api::<Reservation>::namespaced(s.api.client(), NS)
        .get_opt("qty")
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no Reservation for a pod asking 1k slots: {r}"));
    assert_eq!(res.spec.slots, BTreeMap::from([("cam".to_owned(), 1000)]));
    assert_eq!(res.spec.exclusive_cpus, 1000);
    assert_eq!(r["NodeNames"], json!([]), "1000 slots fit nowhere: {r}");
}

#[tokio::test]
async fn asks_beyond_what_a_reservation_holds_fail_the_nodes_with_the_reason() {
    let s = stand(2).await;
    let (_, body) = go_args(&s.api, "args-too-many-cpus.json").await;
    let r = post(s.addr, "/filter", &body).await;
    assert_go_filter_result(&r);
    assert_eq!(r["Error"], Value::Null, "an Error is retried forever: {r}");
    assert_eq!(r["NodeNames"], json!([]), "{r}");
    for n in ["n1", "n2"] {
        let why = r["FailedAndUnresolvableNodes"][n]
            .as_str()
            .unwrap_or_default();
        assert!(
            why.contains("5000 exclusive CPUs") && why.contains("1024"),
            "{r}"
        );
    }
    // 10,000 candidates: the Reservation holds at most 5,000; the first
    // 5,000 are asked, the rest fail for now.
    let (_, body) = go_args(&s.api, "args-nodenames.json").await;
    let mut names: Vec<String> = vec!["n1".into(), "n2".into(), "n3".into()];
    names.extend((3..10_000).map(|i| format!("x{i:05}")));
    let list = names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(",");
    let body = body.replace(
        "\"NodeNames\":[\"n1\",\"n2\",\"n3\",\"n4\"]",
        &format!("\"NodeNames\":[{list}]"),
    );
    let r = post(s.addr, "/filter", &body).await;
    assert_eq!(r["Error"], Value::Null, "{}", r["Error"]);
    let passed: Vec<String> = serde_json::from_value(r["NodeNames"].clone()).unwrap();
    assert_eq!(passed.len(), 1);
    assert!(["n1", "n2", "n3"].contains(&passed[0].as_str()));
    let failed = r["FailedNodes"].as_object().map_or(0, |m| m.len())
        + r["FailedAndUnresolvableNodes"]
            .as_object()
            .map_or(0, |m| m.len());
    assert_eq!(failed, 9_999);
    assert!(
        r["FailedNodes"]["x09999"]
            .as_str()
            .unwrap_or_default()
            .contains("at most 5000 candidate nodes"),
        "{}",
        r["FailedNodes"]["x09999"]
    );
}

#[tokio::test]
async fn a_reserved_pod_filtered_without_its_node_is_answered_only_with_nodes_it_sent() {
    // One slot shared by n1..n3: reserved on n1 first.
    let s = stand(1).await;
    let (_, body) = go_args(&s.api, "args-nodenames.json").await;
    let only_n1 = body.replace(
        "\"NodeNames\":[\"n1\",\"n2\",\"n3\",\"n4\"]",
        "\"NodeNames\":[\"n1\"]",
    );
    let r = post(s.addr, "/filter", &only_n1).await;
    assert_eq!(r["NodeNames"], json!(["n1"]), "{r}");
    // The bind failed; n1 is no longer feasible for the scheduler.
    let others = body.replace(
        "\"NodeNames\":[\"n1\",\"n2\",\"n3\",\"n4\"]",
        "\"NodeNames\":[\"n2\",\"n3\"]",
    );
    let r = post(s.addr, "/filter", &others).await;
    assert_go_filter_result(&r);
    let passed: Vec<String> = serde_json::from_value(r["NodeNames"].clone()).unwrap();
    assert!(
        passed.iter().all(|n| n == "n2" || n == "n3"),
        "answered a node it was not sent: {r}"
    );
    // The reservation moves: n1's slot is released and the pod is
    // reserved on a node it can go to now.
    assert_eq!(passed, ["n2"], "{r}");
    let res = Api::<Reservation>::namespaced(s.api.client(), NS)
        .get("cam-1")
        .await
        .unwrap();
    let st = res.status.unwrap();
    assert_eq!(
        (st.phase.as_str(), st.node.as_deref()),
        ("Reserved", Some("n2"))
    );
}

#[tokio::test]
async fn renewing_compares_candidates_as_a_set_and_survives_write_races() {
    // No controller: the Reservation stays undecided and every Filter
    // renews it.
    let cfg = ExtenderConfig {
        decision_timeout: Duration::from_millis(200),
        poll: Duration::from_millis(50),
        shared_watch: true,
        leader: None,
        decide_token: None,
        decide_trust: None,
    };
    let s = stand_opts(1, &[], false, cfg).await;
    let (_, body) = go_args(&s.api, "args-nodenames.json").await;
    let api = Api::<Reservation>::namespaced(s.api.client(), NS);
    let r = post(s.addr, "/filter", &body).await;
    assert_eq!(r["Error"], Value::Null, "{r}");
    let first = api.get("cam-1").await.unwrap();
    // kube-scheduler reorders the candidates every cycle: no rewrite.
    let reordered = body.replace(
        "\"NodeNames\":[\"n1\",\"n2\",\"n3\",\"n4\"]",
        "\"NodeNames\":[\"n3\",\"n1\",\"n4\",\"n2\"]",
    );
    let r = post(s.addr, "/filter", &reordered).await;
    assert_eq!(r["Error"], Value::Null, "{r}");
    let again = api.get("cam-1").await.unwrap();
    assert_eq!(
        again.metadata.resource_version, first.metadata.resource_version,
        "a reordered candidate list rewrote the Reservation"
    );
    // Someone else keeps writing the object (the controller's status, a
    // label): a renewal that loses the race retries instead of answering
    // an Error.
    let writer = {
        let api = api.clone();
        let stop = s.stop.clone();
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.is_cancelled() {
                i += 1;
                let patch = json!({"metadata": {"labels": {"touch": i.to_string()}}});
                let _ = api
                    .patch(
                        "cam-1",
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await;
                // Paced, not synchronising: a write every few ms.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let sets = [
        "\"NodeNames\":[\"n1\",\"n2\"]",
        "\"NodeNames\":[\"n2\",\"n3\"]",
    ];
    let mut errors = Vec::new();
    for i in 0..30 {
        let b = body.replace("\"NodeNames\":[\"n1\",\"n2\",\"n3\",\"n4\"]", sets[i % 2]);
        let r = post(s.addr, "/filter", &b).await;
        if r["Error"] != Value::Null {
            errors.push(r["Error"].clone());
        }
    }
    writer.abort();
    assert!(
        errors.is_empty(),
        "{} of 30 renewals answered an Error: {errors:?}",
        errors.len()
    );
    let last = api.get("cam-1").await.unwrap();
    let mut c = last.spec.candidates.clone();
    c.sort();
    assert_eq!(c, ["n2", "n3"]);
}

#[test]
fn the_extenders_bounds_are_the_reservation_crds() {
    use steward_extender::{MAX_CANDIDATES, MAX_EXCLUSIVE_CPUS, MAX_SLOTS_PER_INSTANCE};
    let crd = steward_api::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == "Reservation")
        .unwrap();
    let v = serde_json::to_value(&crd).unwrap();
    let spec =
        &v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(
        spec["exclusiveCpus"]["maximum"].as_f64(),
        Some(f64::from(MAX_EXCLUSIVE_CPUS))
    );
    assert_eq!(
        spec["candidates"]["maxItems"].as_u64(),
        Some(MAX_CANDIDATES as u64)
    );
    let rule = spec["slots"]["x-kubernetes-validations"][0]["rule"]
        .as_str()
        .unwrap();
    assert!(
        rule.contains(&format!("<= {MAX_SLOTS_PER_INSTANCE}")),
        "{rule}"
    );
}

/// The leader dies (its process gone: endpoint closed, Lease not
/// released) between two Filters: the standby finds the leader's endpoint
/// refusing connections and takes the 15 s Lease at once; the next Filter,
/// finding nobody at the leader's address, asks through the API and is
/// answered within the default 2 s; then the extender asks the new leader
/// directly. No Filter errs or times out and no slot is given twice.
#[tokio::test]
async fn a_dead_leaders_filters_go_through_the_api_until_the_standby_leads() {
    use k8s_openapi::api::coordination::v1::Lease;
    use steward_leader::{ControllerConfig, DecideConfig, run};
    use tokio_util::sync::CancellationToken;

    let s = stand_opts(2, &[], false, direct()).await;
    let stop = CancellationToken::new();
    let mut replicas = BTreeMap::new();
    for id in ["c1", "c2"] {
        let mut c = ControllerConfig::new("steward-system", id);
        c.resync = Duration::from_millis(100);
        // The default 15 s Lease: waiting it out would fail the Filter.
        c.lease.retry_period = Duration::from_millis(100);
        c.decide = Some(DecideConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            advertise: None,
        });
        let client = s
            .api
            .client_with_user_agent(&format!("{CONTROLLER_AGENT}/test ({id})"))
            .unwrap();
        replicas.insert(id, tokio::spawn(run(client, c, stop.clone())));
    }
    let _stop = stop.drop_guard();
    let known = |s: &Stand| s.extender.leader_endpoint();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while known(&s).is_none() {
        assert!(tokio::time::Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = known(&s).unwrap();
    let reserved = |r: &Value| -> String {
        assert_eq!(r["Error"], Value::Null, "{r}");
        let nodes: Vec<String> = serde_json::from_value(r["NodeNames"].clone()).unwrap();
        assert_eq!(nodes.len(), 1, "{r}");
        nodes[0].clone()
    };
    let p1 = pending_pod(&s.api, "p1", 1).await;
    reserved(&filter(s.addr, &p1, &["n1", "n2", "n3"]).await);

    // Kill the leader: its task goes with its endpoint and election, and
    // nothing releases the Lease.
    let holder = Api::<Lease>::namespaced(s.api.client(), "steward-system")
        .get("steward-controller")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    replicas.remove(holder.as_str()).unwrap().abort();
    let p2 = pending_pod(&s.api, "p2", 1).await;
    let started = std::time::Instant::now();
    reserved(&filter(s.addr, &p2, &["n1", "n2", "n3"]).await);
    eprintln!(
        "the Filter across the leader's death answered in {:?}",
        started.elapsed()
    );

    // The extender learns where the new leader decides and asks it there:
    // no slot is left, every node fails with the reason, and no error.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while known(&s).as_ref().is_none_or(|e| *e == first) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new leader never advertised"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let p3 = pending_pod(&s.api, "p3", 1).await;
    let r = filter(s.addr, &p3, &["n1", "n2", "n3"]).await;
    assert_eq!(r["Error"], Value::Null, "{r}");
    assert_eq!(r["NodeNames"], json!([]), "{r}");
    assert!(r.to_string().contains("0 of 2 slots free"), "{r}");

    // Two slots, two Reserved pods, never the same slot.
    let rs = Api::<Reservation>::namespaced(s.api.client(), NS)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let mut slots = Vec::new();
    for r in &rs {
        if let Some(st) = r.status.as_ref().filter(|st| st.phase == "Reserved") {
            slots.extend(st.slots.clone());
        }
    }
    slots.sort();
    let n = slots.len();
    slots.dedup();
    assert_eq!((n, slots.len()), (2, 2), "{rs:?}");
}

/// The attack: an ask naming an existing pod with a wrong uid — through
/// Filter (the extender asking the leader, or on the API path), and
/// straight to the leader's `/v1/decide` — trying to take the pod's
/// Reservation and move it to other nodes. It is refused on every node,
/// and the pod's Reservation is the same object, unchanged, still holding
/// its node; the pod itself is still answered from it.
#[tokio::test]
async fn an_ask_with_another_pods_name_and_a_wrong_uid_changes_nothing() {
    for (path, s) in [("direct", stand(2).await), ("api", stand_api_path(2).await)] {
        let victim = pending_pod(&s.api, "victim", 1).await;
        let r = filter(s.addr, &victim, &["n1"]).await;
        assert_eq!(r["NodeNames"], json!(["n1"]), "{path}: {r}");
        let api = Api::<Reservation>::namespaced(s.api.client(), NS);
        let before = api.get("victim").await.unwrap();
        let mut forged = victim.clone();
        forged.metadata.uid = Some("forged-uid".into());
        // The same ask, and one moving it to other nodes.
        for nodes in [&["n1"][..], &["n2", "n3"][..]] {
            let r = filter(s.addr, &forged, nodes).await;
            assert_eq!(r["Error"], Value::Null, "{path}: {r}");
            assert_eq!(r["NodeNames"], json!([]), "{path}: {r}");
            for n in nodes {
                let why = r["FailedAndUnresolvableNodes"][n]
                    .as_str()
                    .unwrap_or_default();
                assert!(why.contains("cannot replace"), "{path}: {n}: {r}");
            }
        }
        if path == "direct" {
            let endpoint = s.extender.leader_endpoint().unwrap();
            let leader: SocketAddr = endpoint.trim_start_matches("http://").parse().unwrap();
            let ask = json!({"spec": {
                "pod": {"namespace": NS, "name": "victim", "uid": "forged-uid"},
                "slots": {"cam": 1}, "candidates": ["n2"]}, "timeoutMs": 2000});
            let (st, body) = http(
                leader,
                "POST",
                "/v1/decide",
                &serde_json::to_vec(&ask).unwrap(),
            )
            .await;
            let body = String::from_utf8_lossy(&body);
            assert_eq!(st, 422, "{body}");
            assert!(body.contains("cannot replace"), "{body}");
        }
        let after = api.get("victim").await.unwrap();
        assert_eq!(after.metadata.uid, before.metadata.uid, "{path}: replaced");
        assert_eq!(
            after.metadata.generation, before.metadata.generation,
            "{path}: its spec changed"
        );
        assert_eq!(after.spec, before.spec, "{path}");
        let st = after.status.unwrap();
        assert_eq!(
            (st.phase.as_str(), st.node.as_deref()),
            ("Reserved", Some("n1")),
            "{path}"
        );
        let r = filter(s.addr, &victim, &["n1", "n2"]).await;
        assert_eq!(r["NodeNames"], json!(["n1"]), "{path}: {r}");
    }
}

/// A pod recreated under the name of one that is gone (a StatefulSet's):
/// the gone pod's Reservation (here without an owner, so the garbage
/// collector leaves it) is deleted by the new pod's ask, which is then
/// decided like any other.
#[tokio::test]
async fn a_pod_recreated_under_its_name_replaces_the_gone_pods_reservation() {
    use steward_api::{PodRef, ReservationSpec};
    for (path, s) in [("direct", stand(1).await), ("api", stand_api_path(1).await)] {
        let api = Api::<Reservation>::namespaced(s.api.client(), NS);
        let old = ReservationSpec {
            pod: PodRef {
                namespace: NS.into(),
                name: "web-0".into(),
                uid: "the-gone-pod".into(),
            },
            slots: BTreeMap::from([("cam".to_owned(), 1)]),
            exclusive_cpus: 0,
            candidates: vec!["n1".into()],
            cancel: None,
        };
        let old = api
            .create(&PostParams::default(), &Reservation::new("web-0", old))
            .await
            .unwrap();
        let pod = pending_pod(&s.api, "web-0", 1).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let placed = loop {
            let r = filter(s.addr, &pod, &["n1", "n2"]).await;
            assert_eq!(r["Error"], Value::Null, "{path}: {r}");
            let nodes: Vec<String> = serde_json::from_value(r["NodeNames"].clone()).unwrap();
            if let Some(n) = nodes.first() {
                break n.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{path}: web-0 never placed: {r}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let now = api.get("web-0").await.unwrap();
        assert_ne!(now.metadata.uid, old.metadata.uid, "{path}");
        assert_eq!(now.spec.pod.uid, pod.metadata.uid.unwrap(), "{path}");
        assert_eq!(
            now.status.and_then(|s| s.node).as_deref(),
            Some(placed.as_str()),
            "{path}"
        );
    }
}

/// An ask beyond the bounds, straight to the leader (no extender checked
/// it): refused with the reason, nothing written and nothing held — the
/// same bounds the extender's Filter applies.
#[tokio::test]
async fn the_leader_refuses_asks_beyond_the_extenders_bounds() {
    let s = stand(2).await;
    let _pod = pending_pod(&s.api, "big", 1).await;
    let endpoint = s.extender.leader_endpoint().unwrap();
    let leader: SocketAddr = endpoint.trim_start_matches("http://").parse().unwrap();
    let many: Vec<String> = (0..6000).map(|i| format!("x{i}")).collect();
    for (spec, why) in [
        (
            json!({"pod": {"namespace": NS, "name": "big", "uid": "u-big"},
                "slots": {"cam": 2000}, "candidates": ["n1"]}),
            "2000 slots of cam asked",
        ),
        (
            json!({"pod": {"namespace": NS, "name": "big", "uid": "u-big"},
                "slots": {"cam": 1}, "exclusiveCpus": 5000, "candidates": ["n1"]}),
            "5000 exclusive CPUs asked",
        ),
        (
            json!({"pod": {"namespace": NS, "name": "big", "uid": "u-big"},
                "slots": {"cam": 1}, "candidates": many}),
            "6000 candidate nodes",
        ),
        (
            json!({"pod": {"namespace": NS, "name": "big", "uid": "u-big"},
                "slots": {"cam": 1}, "candidates": ["n1"], "cancel": "x"}),
            "does not cancel",
        ),
    ] {
        let ask = json!({"spec": spec, "timeoutMs": 2000});
        let (st, body) = http(
            leader,
            "POST",
            "/v1/decide",
            &serde_json::to_vec(&ask).unwrap(),
        )
        .await;
        let body = String::from_utf8_lossy(&body);
        assert_eq!(st, 422, "{why}: {body}");
        assert!(body.contains(why), "{body}");
    }
    assert!(
        Api::<Reservation>::namespaced(s.api.client(), NS)
            .get_opt("big")
            .await
            .unwrap()
            .is_none(),
        "an ask out of bounds was written"
    );
    // Both slots are still free: two pods of one slot each are reserved.
    for p in ["a", "b"] {
        let pod = pending_pod(&s.api, p, 1).await;
        let r = filter(s.addr, &pod, &["n1", "n2", "n3"]).await;
        let nodes: Vec<String> = serde_json::from_value(r["NodeNames"].clone()).unwrap();
        assert_eq!(nodes.len(), 1, "{p}: {r}");
    }
}
