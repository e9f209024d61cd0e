//! Reclaim: the three allocate/delete orderings (documented in `steward_core::slots`), the last slot
//! (akri#849), terminated versus deleted pods.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::time::Duration;

use dp::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use steward_testing_kubelet::Phase;

const SETTLE: Duration = Duration::from_millis(800);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_1_allocate_after_the_delete_completed() {
    let s = Single::start(1).await;
    let slot = s.slot(0);
    let a = s.node.kubelet.add_pod(pod("a", &s.res)).await.unwrap();
    wait_bound(&s.server, &slot, &a.uid).await;
    s.node.kubelet.delete_pod(&a.uid).await.unwrap();
    // The delete is complete: the claim is gone before B arrives.
    wait_released(&s.server, &slot).await;
    let b = s.node.kubelet.add_pod(pod("b", &s.res)).await.unwrap();
    assert_eq!(
        slot_of(&s.node.kubelet, &b.uid, &s.res).as_deref(),
        Some(slot.as_str())
    );
    wait_bound(&s.server, &slot, &b.uid).await;
    assert_stays_bound(&s.server, &slot, &b.uid, SETTLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_2_allocate_while_the_delete_is_processed() {
    // kubelet frees the device and admits the next pod right away, racing
    // the agent's handling of the Deleted event; repeated to hit both sides.
    let s = Single::start(1).await;
    let slot = s.slot(0);
    let mut prev = s.node.kubelet.add_pod(pod("p0", &s.res)).await.unwrap();
    for i in 1..=10 {
        s.node.kubelet.delete_pod(&prev.uid).await.unwrap();
        let next = s
            .node
            .kubelet
            .add_pod(pod(&format!("p{i}"), &s.res))
            .await
            .unwrap_or_else(|e| panic!("round {i}: the freed slot was refused: {e}"));
        wait_bound(&s.server, &slot, &next.uid).await;
        prev = next;
    }
    assert_stays_bound(&s.server, &slot, &prev.uid, SETTLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_3_allocate_before_the_delete_is_seen() {
    // A finalizer keeps pod A's object (and the agent's view of it) alive
    // after kubelet dropped it: kubelet allocates A's slot to B before the
    // agent sees A's Deleted event.
    let s = Single::start(1).await;
    let slot = s.slot(0);
    let pods: Api<Pod> = Api::namespaced(s.server.client(), NS);
    let a = s.node.kubelet.add_pod(pod("a", &s.res)).await.unwrap();
    wait_bound(&s.server, &slot, &a.uid).await;
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["test.steward.dev/hold"]}})),
    )
    .await
    .unwrap();
    s.node.kubelet.delete_pod(&a.uid).await.unwrap();
    let still = pods.get("a").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());

    let b = s.node.kubelet.add_pod(pod("b", &s.res)).await.unwrap();
    assert_eq!(
        slot_of(&s.node.kubelet, &b.uid, &s.res).as_deref(),
        Some(slot.as_str())
    );
    wait_bound(&s.server, &slot, &b.uid).await;

    // A's Deleted event arrives late and must not free B's slot.
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    eventually("pod a gone", WAIT, || async {
        pods.get_opt("a").await.unwrap().is_none().then_some(())
    })
    .await;
    assert_stays_bound(&s.server, &slot, &b.uid, SETTLE).await;

    s.node.kubelet.delete_pod(&b.uid).await.unwrap();
    wait_released(&s.server, &slot).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_slot_goes_to_the_next_pod() {
    // akri#849: pod A holds the only slot, is deleted, pod B is scheduled
    // onto it: B must be admitted, never UnexpectedAdmissionError.
    let s = Single::start(1).await;
    let slot = s.slot(0);
    for i in 0..15 {
        let a = s
            .node
            .kubelet
            .add_pod(pod(&format!("a{i}"), &s.res))
            .await
            .unwrap();
        if i % 3 == 0 {
            // sometimes the agent has bound A already, sometimes not
            wait_bound(&s.server, &slot, &a.uid).await;
        }
        if i % 2 == 0 {
            s.node.kubelet.delete_pod(&a.uid).await.unwrap();
        } else {
            s.node
                .kubelet
                .terminate_pod(&a.uid, Phase::Succeeded)
                .await
                .unwrap();
        }
        let b = match s.node.kubelet.add_pod(pod(&format!("b{i}"), &s.res)).await {
            Ok(b) => b,
            Err(e) => panic!("round {i}: pod B refused the last slot: {e}"),
        };
        wait_bound(&s.server, &slot, &b.uid).await;
        s.node.kubelet.delete_pod(&b.uid).await.unwrap();
        if i % 2 == 1 {
            s.node.kubelet.delete_pod(&a.uid).await.unwrap();
        }
    }
    wait_released(&s.server, &slot).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_and_deleted_pods_both_release_at_once() {
    let s = Single::start(2).await;
    let pods: Api<Pod> = Api::namespaced(s.server.client(), NS);

    // Succeeded: released while the Pod object still exists.
    let done = s.node.kubelet.add_pod(pod("done", &s.res)).await.unwrap();
    let done_slot = slot_of(&s.node.kubelet, &done.uid, &s.res).unwrap();
    wait_bound(&s.server, &done_slot, &done.uid).await;
    s.node
        .kubelet
        .terminate_pod(&done.uid, Phase::Succeeded)
        .await
        .unwrap();
    wait_released(&s.server, &done_slot).await;
    let obj = pods.get("done").await.unwrap();
    assert_eq!(obj.status.unwrap().phase.as_deref(), Some("Succeeded"));

    // Failed: the same.
    let failed = s.node.kubelet.add_pod(pod("failed", &s.res)).await.unwrap();
    let failed_slot = slot_of(&s.node.kubelet, &failed.uid, &s.res).unwrap();
    wait_bound(&s.server, &failed_slot, &failed.uid).await;
    s.node
        .kubelet
        .terminate_pod(&failed.uid, Phase::Failed)
        .await
        .unwrap();
    wait_released(&s.server, &failed_slot).await;

    // A pod on the other slot is unaffected by either; then deleted.
    let keep = s.node.kubelet.add_pod(pod("keep", &s.res)).await.unwrap();
    let keep_slot = slot_of(&s.node.kubelet, &keep.uid, &s.res).unwrap();
    wait_bound(&s.server, &keep_slot, &keep.uid).await;
    // Deleting the terminated pods later changes nothing for "keep".
    s.node.kubelet.delete_pod(&done.uid).await.unwrap();
    s.node.kubelet.delete_pod(&failed.uid).await.unwrap();
    assert_stays_bound(&s.server, &keep_slot, &keep.uid, SETTLE).await;
    s.node.kubelet.delete_pod(&keep.uid).await.unwrap();
    wait_released(&s.server, &keep_slot).await;
    assert!(slot_claims(&s.server).await.is_empty());
}
