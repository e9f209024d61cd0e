//! The KEP's watch through a real unix socket: snapshot then changes, the
//! D1 ordering under concurrency, slow watchers cut off without slowing
//! others, and the watcher cap.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use steward_core::ledger::Source;
use steward_podresources::serve::ServeOptions;
use steward_podresources::{INITIAL_EVENTS_HEADER, WatchLimits};
use steward_proto::podresources::v1 as wire;

type ClientView = BTreeMap<String, wire::PodResources>;

fn fold(view: &mut ClientView, e: &wire::ListAndWatchPodResourcesResponse) {
    match wire::WatchPodAction::try_from(e.action) {
        Ok(wire::WatchPodAction::Deleted) => {
            view.remove(&e.uid);
        }
        _ => {
            view.insert(e.uid.clone(), e.pod_resources[0].clone());
        }
    }
}

/// No device held by two pods in a client's view.
fn double_held(view: &ClientView) -> Option<String> {
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (uid, p) in view {
        for c in &p.containers {
            for d in &c.devices {
                for id in &d.device_ids {
                    if let Some(other) = seen.insert(id.clone(), uid.clone())
                        && other != *uid
                    {
                        return Some(format!("{id} held by {other} and {uid}"));
                    }
                }
            }
        }
    }
    None
}

#[tokio::test]
async fn a_watch_starts_with_the_snapshot_then_streams_changes() {
    let server = unlimited().await;
    server.hub.upsert(Source::Slots, pod_with("a", &["d1"]));
    server.hub.upsert(Source::Slots, pod_with("b", &["d2"]));
    let mut c = client(&server).await;
    let resp = c
        .list_and_watch(wire::ListAndWatchPodResourcesRequest {})
        .await
        .unwrap();
    assert_eq!(
        resp.metadata()
            .get(INITIAL_EVENTS_HEADER)
            .unwrap()
            .to_str()
            .unwrap(),
        "2"
    );
    let mut stream = resp.into_inner();
    let mut view = ClientView::new();
    for _ in 0..2 {
        let e = stream.next().await.unwrap().unwrap();
        assert_eq!(e.action, wire::WatchPodAction::Added as i32);
        fold(&mut view, &e);
    }
    // The KEP's example: A holding D1 deleted, B given D1.
    server.hub.pod_gone("a");
    server.hub.upsert(Source::Slots, pod_with("c", &["d1"]));
    let first = stream.next().await.unwrap().unwrap();
    let second = stream.next().await.unwrap().unwrap();
    assert_eq!(
        (first.action, first.uid.as_str()),
        (wire::WatchPodAction::Deleted as i32, "a")
    );
    assert_eq!(
        (second.action, second.uid.as_str()),
        (wire::WatchPodAction::Added as i32, "c")
    );
    fold(&mut view, &first);
    fold(&mut view, &second);
    let list = c
        .list(wire::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let listed: BTreeSet<String> = list.pod_resources.iter().map(|p| p.name.clone()).collect();
    let folded: BTreeSet<String> = view.values().map(|p| p.name.clone()).collect();
    assert_eq!(listed, folded);
}

/// Many allocate/delete pairs racing from several tasks; two watchers. After
/// every event no device is held twice, and each watcher's folded view ends
/// equal to List.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_allocate_delete_pairs_keep_every_watcher_consistent() {
    let server = start(
        WatchLimits {
            max_watchers: 8,
            buffer: 1 << 16,
        },
        ServeOptions { qps: 0.0, burst: 1 },
    )
    .await;
    let mut watchers = Vec::new();
    for _ in 0..2 {
        let mut c = client(&server).await;
        watchers.push(
            c.list_and_watch(wire::ListAndWatchPodResourcesRequest {})
                .await
                .unwrap()
                .into_inner(),
        );
    }
    const DEVICES: usize = 4;
    const ROUNDS: usize = 200;
    // Each task owns one device: pod n holds it, is deleted, pod n+1 gets it.
    let mut tasks = Vec::new();
    for d in 0..DEVICES {
        let hub = server.hub.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let uid = format!("p{d}-{round}");
                let prev = format!("p{d}-{}", round.wrapping_sub(1));
                if round > 0 {
                    hub.pod_gone(&prev);
                }
                hub.upsert(Source::Slots, pod_with(&uid, &[&format!("d{d}")]));
                tokio::task::yield_now().await;
            }
        }));
    }
    // A stale source racing too: it reports old holders of the devices.
    let stale = {
        let hub = server.hub.clone();
        tokio::spawn(async move {
            for round in 0..ROUNDS {
                let uid = format!("p0-{}", round / 2);
                hub.upsert(Source::Kubelet, pod_with(&uid, &["d0"]));
                tokio::task::yield_now().await;
            }
        })
    };
    for t in tasks {
        t.await.unwrap();
    }
    stale.await.unwrap();
    let mut c = client(&server).await;
    let list = c
        .list(wire::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let want: BTreeSet<String> = list.pod_resources.iter().map(|p| p.name.clone()).collect();
    for mut stream in watchers {
        let mut view = ClientView::new();
        let mut events = 0;
        loop {
            let folded: BTreeSet<String> = view.values().map(|p| p.name.clone()).collect();
            if folded == want && events > 0 {
                // Drain anything still buffered, then compare again.
                match tokio::time::timeout(Duration::from_millis(200), stream.next()).await {
                    Err(_) => break,
                    Ok(Some(e)) => {
                        let e = e.unwrap();
                        fold(&mut view, &e);
                        events += 1;
                        assert_eq!(double_held(&view), None);
                        continue;
                    }
                    Ok(None) => panic!("stream ended"),
                }
            }
            let e = tokio::time::timeout(Duration::from_secs(20), stream.next())
                .await
                .expect("an event within 20 s")
                .unwrap()
                .unwrap();
            fold(&mut view, &e);
            events += 1;
            if let Some(bad) = double_held(&view) {
                panic!("after event {events}: {bad}");
            }
        }
        let folded: BTreeSet<String> = view.values().map(|p| p.name.clone()).collect();
        assert_eq!(folded, want);
        assert!(events >= DEVICES * ROUNDS, "{events} events");
    }
}

#[tokio::test]
async fn a_watcher_that_never_reads_is_cut_off_and_others_keep_up() {
    let server = start(
        WatchLimits {
            max_watchers: 8,
            buffer: 64,
        },
        ServeOptions { qps: 0.0, burst: 1 },
    )
    .await;
    let mut slow_client = client(&server).await;
    let mut slow = slow_client
        .list_and_watch(wire::ListAndWatchPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut fast_client = client(&server).await;
    let mut fast = fast_client
        .list_and_watch(wire::ListAndWatchPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let reader = tokio::spawn(async move {
        let mut n = 0;
        while let Some(e) = fast.next().await {
            e.unwrap();
            n += 1;
            if n == 2_000 {
                return (n, Some(fast));
            }
        }
        (n, None)
    });
    // Far more than the buffer plus whatever the socket and h2 windows hold.
    let payload: Vec<String> = (0..64).map(|i| format!("bulky-device-id-{i:04}")).collect();
    let ids: Vec<&str> = payload.iter().map(String::as_str).collect();
    for i in 0..2_000 {
        server.hub.upsert(Source::Slots, {
            let mut p = pod_with(&format!("p{}", i % 50), &[]);
            p.container_mut(&format!("c{i}")).add_devices(
                "steward.dev/bulk",
                ids.iter().copied(),
                &BTreeSet::new(),
            );
            p
        });
        // A burst never outruns the buffer of a watcher that reads.
        tokio::task::yield_now().await;
    }
    let (read, fast) = tokio::time::timeout(Duration::from_secs(30), reader)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read, 2_000);
    assert!(fast.is_some(), "the fast watcher's stream is still open");
    // The slow watcher was cut: after what was buffered, ABORTED.
    let end = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match slow.next().await {
                Some(Ok(_)) => continue,
                Some(Err(status)) => return Some(status),
                None => return None,
            }
        }
    })
    .await
    .unwrap()
    .expect("the cut watcher gets a status");
    assert_eq!(end.code(), tonic::Code::Aborted);
    assert!(
        end.message().contains("list and watch again"),
        "{}",
        end.message()
    );
    let kind = steward_podresources::metrics::WatchKind { stream: "pods" };
    assert!(server.hub.metrics().watchers_cut.get_or_create(&kind).get() >= 1);
    assert_eq!(server.hub.watchers().0, 1, "only the fast watcher is left");
}

#[tokio::test]
async fn watchers_beyond_the_cap_are_resource_exhausted_and_slots_free_on_hangup() {
    let server = start(
        WatchLimits {
            max_watchers: 2,
            buffer: 16,
        },
        ServeOptions { qps: 0.0, burst: 1 },
    )
    .await;
    let mut c = client(&server).await;
    let w1 = c
        .list_and_watch(wire::ListAndWatchPodResourcesRequest {})
        .await
        .unwrap();
    let _w2 = c
        .list_and_watch(wire::ListAndWatchPodResourcesRequest {})
        .await
        .unwrap();
    let err = c
        .list_and_watch(wire::ListAndWatchPodResourcesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    drop(w1);
    // The server notices the hang-up and frees the slot.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if server.hub.watchers().0 == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "watcher never released"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c.list_and_watch(wire::ListAndWatchPodResourcesRequest {})
        .await
        .unwrap();
}

#[tokio::test]
async fn allocatable_watch_sends_the_snapshot_then_deletes_before_adds() {
    let server = unlimited().await;
    let mut a = steward_core::ledger::Allocatable::default();
    a.devices.insert(
        "steward.dev/cam".into(),
        [("c0".to_string(), BTreeSet::new())].into(),
    );
    server.hub.replace_allocatable(Source::Slots, a.clone());
    let mut c = client(&server).await;
    let mut stream = c
        .list_and_watch_allocatable_resources(wire::ListAndWatchAllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(
        first.action,
        wire::WatchResourceAction::ResourceAdded as i32
    );
    assert_eq!(first.devices[0].device_ids, vec!["c0"]);
    a.devices.insert(
        "steward.dev/cam".into(),
        [("c1".to_string(), BTreeSet::new())].into(),
    );
    server.hub.replace_allocatable(Source::Slots, a);
    let del = stream.next().await.unwrap().unwrap();
    let add = stream.next().await.unwrap().unwrap();
    assert_eq!(
        del.action,
        wire::WatchResourceAction::ResourceDeleted as i32
    );
    assert_eq!(del.devices[0].device_ids, vec!["c0"]);
    assert_eq!(add.action, wire::WatchResourceAction::ResourceAdded as i32);
}
