//! One steward process following another's pod resources watch (the agent
//! following the CRI proxy), and kubelet's socket polled with List.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use steward_core::ledger::Source;
use steward_podresources::follow::{Resolver, follow_list, follow_watch};
use steward_podresources::{Hub, PodResourcesMetrics, WatchLimits};
use tokio_util::sync::CancellationToken;

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn names(hub: &Hub) -> Vec<String> {
    hub.snapshot().into_iter().map(|p| p.pod.name).collect()
}

#[tokio::test]
async fn a_follower_mirrors_the_peer_and_drops_what_went_while_it_was_away() {
    let peer = unlimited().await;
    peer.hub.upsert(
        Source::Cri,
        with_cpus(pod_with("a", &[]), "main", &[1], true),
    );
    let local = Hub::new(WatchLimits::default(), PodResourcesMetrics::default());
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    tokio::spawn(follow_watch(
        local.clone(),
        Source::Cri,
        peer.socket.clone(),
        cancel.clone(),
    ));
    eventually("the snapshot", || names(&local) == ["a"]).await;
    peer.hub.upsert(
        Source::Cri,
        with_cpus(pod_with("b", &[]), "main", &[2], true),
    );
    eventually("an added pod", || names(&local) == ["a", "b"]).await;
    let b = local
        .snapshot()
        .into_iter()
        .find(|p| p.pod.name == "b")
        .unwrap();
    assert_eq!(b.containers["main"].cpus.to_string(), "2");

    // The peer restarts with a different world: "a" went while it was down.
    let socket = peer.socket.clone();
    let _dir = peer.stop_keep_dir();
    let _ = std::fs::remove_file(&socket);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let hub2 = Hub::new(WatchLimits::default(), PodResourcesMetrics::default());
    hub2.upsert(
        Source::Cri,
        with_cpus(pod_with("b", &[]), "main", &[2], true),
    );
    let serve_cancel = CancellationToken::new();
    let _serve_stop = serve_cancel.clone().drop_guard();
    tokio::spawn(steward_podresources::serve::serve(
        hub2,
        listener,
        steward_podresources::serve::ServeOptions { qps: 0.0, burst: 1 },
        serve_cancel,
    ));
    eventually(
        "the restarted peer's snapshot to replace the old one",
        || names(&local) == ["b"],
    )
    .await;
}

#[tokio::test]
async fn polling_list_resolves_uids_and_keeps_the_last_report_through_an_outage() {
    let peer = unlimited().await;
    peer.hub.upsert(Source::Kubelet, pod_with("known", &["d1"]));
    peer.hub
        .upsert(Source::Kubelet, pod_with("unknown", &["d2"]));
    let local = Hub::new(WatchLimits::default(), PodResourcesMetrics::default());
    let resolve: Resolver =
        Arc::new(|_ns: &str, name: &str| (name == "known").then(|| "uid-known".to_string()));
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    tokio::spawn(follow_list(
        local.clone(),
        Source::Kubelet,
        peer.socket.clone(),
        Duration::from_millis(20),
        resolve,
        cancel,
    ));
    eventually("the resolved pod", || names(&local) == ["known"]).await;
    assert_eq!(local.snapshot()[0].pod.uid, "uid-known");
    drop(peer);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(names(&local), ["known"], "an outage keeps the last report");
}
