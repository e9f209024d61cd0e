//! Kubernetes Events on Instances, as `kubectl describe instance` shows
//! them: `Discovered` when the agent creates one, `SlotReleased` when a
//! pod's slot is freed, `DeviceLost` when the node no longer sees it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use dp::*;
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;

async fn reasons_about(s: &Single) -> Vec<(String, String)> {
    let events: kube::Api<Event> = kube::Api::namespaced(s.server.client(), NS);
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(s.instance.as_str())
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Instance")
        })
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_carry_discovered_released_and_lost_events() {
    let mut s = Single::start(1).await;
    eventually("a Discovered event", WAIT, || async {
        reasons_about(&s)
            .await
            .into_iter()
            .find(|(r, n)| r == "Discovered" && n.contains("node-a"))
    })
    .await;

    let p = s.node.kubelet.add_pod(pod("user", &s.res)).await.unwrap();
    let slot = slot_of(&s.node.kubelet, &p.uid, &s.res).unwrap();
    wait_bound(&s.server, &slot, &p.uid).await;
    assert!(
        !reasons_about(&s)
            .await
            .iter()
            .any(|(r, _)| r == "SlotReleased"),
        "nothing released yet"
    );
    s.node.kubelet.delete_pod(&p.uid).await.unwrap();
    wait_released(&s.server, &slot).await;
    let (_, note) = eventually("a SlotReleased event", WAIT, || async {
        reasons_about(&s)
            .await
            .into_iter()
            .find(|(r, _)| r == "SlotReleased")
    })
    .await;
    assert!(note.contains(&slot), "{note}");

    // The device goes away (the handler no longer reports it): DeviceLost.
    let api: kube::Api<steward_api::Configuration> = kube::Api::namespaced(s.server.client(), NS);
    steward_testing_apiserver::client::replace_with_retry(&api, "cams", |c| {
        c.spec.discovery_handler.details = echo_details(&["another-cam"]);
    })
    .await
    .unwrap();
    let (_, note) = eventually("a DeviceLost event", WAIT, || async {
        reasons_about(&s)
            .await
            .into_iter()
            .find(|(r, _)| r == "DeviceLost")
    })
    .await;
    assert!(
        note.contains("node node-a no longer sees the device"),
        "{note}"
    );
    s.agent.take().unwrap().stop().await.unwrap();
}
