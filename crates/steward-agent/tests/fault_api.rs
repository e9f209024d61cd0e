//! API server faults, with figures (RELIABILITY.md): the node cut off from
//! the API while the cluster goes on (a partition, its watches closed, 503
//! to every call), history compacted meanwhile so the agent's watches come
//! back to 410 Gone and must list again, and a slow API server.
//!
//! `STEWARD_FAULT_ROUNDS` sets the partition rounds (default 4).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::time::{Duration, Instant};

use dp::*;
use kube::Api;
use kube::api::ListParams;
use steward_api::{Configuration, SlotClaim};
use steward_testing_apiserver::client::replace_with_retry;
use steward_testing_kubelet::{Phase, UNEXPECTED_ADMISSION_ERROR};

/// The test's own identity: the partition does not cut it off.
const OPERATOR: &str = "operator";

fn rounds() -> usize {
    std::env::var("STEWARD_FAULT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// Polls `f` every 2 ms (a catch-up time is only as fine as this).
async fn until<F, Fut>(what: &str, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < WAIT, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_from_the_api_the_node_catches_up_after() {
    let server = api_server().await;
    let operator = server.client_as(OPERATOR).unwrap();
    let claims: Api<SlotClaim> = Api::namespaced(operator.clone(), NS);
    let configs: Api<Configuration> = Api::namespaced(operator.clone(), NS);
    let dir = tempfile::tempdir().unwrap();
    // kubelet mirrors its pods into the API (the agent learns pod UIDs
    // there) as the operator, on the reachable side: only the agent is cut
    // off, which is what is measured.
    let node = Node::start(dir.path(), "node-a", Some(operator.clone())).await;
    let _agent = Agent::start(node.agent_config(dir.path(), server.client(), echo(true)));
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 2),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let res = resource(&inst);
    node.kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 2, WAIT)
        .await
        .unwrap();

    let (mut released, mut resized) = (Vec::new(), Vec::new());
    let mut capacity = 2;
    let rounds = rounds();
    for round in 0..rounds {
        let admitted = node
            .kubelet
            .add_pod(pod(&format!("p{round}"), &res))
            .await
            .unwrap();
        let slot = slot_of(&node.kubelet, &admitted.uid, &res).unwrap();
        wait_bound(&server, &slot, &admitted.uid).await;

        // Cut off. The pod's containers end on the node (its Pod object
        // stays, so no garbage collection frees the claim: the agent
        // must); the operator resizes the Configuration in the cluster; odd
        // rounds also compact the history, so the agent's watches resume
        // to 410 Gone.
        server.partition(&[OPERATOR]);
        node.kubelet
            .terminate_pod(&admitted.uid, Phase::Succeeded)
            .await
            .unwrap();
        capacity = if capacity == 2 { 3 } else { 2 };
        replace_with_retry(&configs, "cams", |c| c.spec.capacity = capacity)
            .await
            .unwrap();
        let compact = round % 2 == 1;
        if compact {
            server.compact();
        }
        tokio::time::sleep(Duration::from_millis(300 + 200 * (round as u64 % 4))).await;
        // The claim could not be deleted while cut off.
        assert!(
            claims.get_opt(&slot).await.unwrap().is_some(),
            "round {round}: the claim of {slot} was deleted during the partition"
        );
        let expired_before = server.stats().requests_for("expired");

        server.set_available(true);
        let back = Instant::now();
        let gone = until("the ended pod's claim released", || {
            let claims = claims.clone();
            let slot = slot.clone();
            async move { matches!(claims.get_opt(&slot).await, Ok(None)) }
        })
        .await;
        released.push(gone);
        node.kubelet
            .wait_for_resource(&res, |s| s.healthy.len() == capacity as usize, WAIT)
            .await
            .unwrap();
        resized.push(back.elapsed());
        if compact {
            assert!(
                server.stats().requests_for("expired") > expired_before,
                "round {round}: no watch resumed to 410 Gone"
            );
        }
        // Nothing leaked: no claim left, every slot free again.
        assert!(
            claims
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty(),
            "round {round}: claims left after catching up"
        );
    }
    eprintln!(
        "partition rounds={rounds} 503s={} 410s={} claim released after reconnect p50={} p99={} \
         capacity change reached kubelet p50={} p99={}",
        server.stats().requests_for("unavailable"),
        server.stats().requests_for("expired"),
        ms(pct(&mut released, 0.5)),
        ms(pct(&mut released, 0.99)),
        ms(pct(&mut resized, 0.5)),
        ms(pct(&mut resized, 0.99)),
    );
    assert!(server.stats().requests_for("unavailable") > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_api_slows_shared_allocations_and_past_the_limit_fails_closed() {
    // op_timeout is 2 s in these agents.
    let s = Single::start_with(1, true).await;
    let (server, node, res, slot) = (&s.server, &s.node, &s.res, s.slot(0));

    let mut line = Vec::new();
    for delay_ms in [0u64, 50, 200] {
        server.set_delay(Duration::from_millis(delay_ms));
        let before = node.kubelet.allocate_durations(res).len();
        for i in 0..3 {
            let p = node
                .kubelet
                .add_pod(pod(&format!("d{delay_ms}-{i}"), res))
                .await
                .unwrap();
            wait_bound(server, &slot, &p.uid).await;
            node.kubelet.delete_pod(&p.uid).await.unwrap();
            wait_released(server, &slot).await;
            node.kubelet
                .wait_for_resource(res, |s| s.healthy.len() == 1, WAIT)
                .await
                .unwrap();
        }
        let mut took: Vec<_> = node.kubelet.allocate_durations(res)[before..].to_vec();
        let p50 = pct(&mut took, 0.5);
        // A claim is a create in the API: the Allocate waits for it.
        assert!(
            p50 >= Duration::from_millis(delay_ms),
            "delay {delay_ms} ms, Allocate p50 {p50:?}"
        );
        line.push(format!("delay {delay_ms} ms: Allocate p50 {}", ms(p50)));
    }

    // Slower than the agent's limit for an API call: the shared slot is
    // refused (fail closed), nothing is claimed, and once the API answers
    // in time again the slot is granted.
    server.set_delay(Duration::from_millis(2500));
    let refused = node
        .kubelet
        .add_pod(pod("too-slow", res))
        .await
        .unwrap_err();
    let text = refused.to_string();
    assert!(text.contains(UNEXPECTED_ADMISSION_ERROR), "{text}");
    server.set_delay(Duration::ZERO);
    let settled = until("no claim left after the refused Allocate", || async {
        claim_of(server, &slot).await.is_none()
    })
    .await;
    let p = node.kubelet.add_pod(pod("after", res)).await.unwrap();
    wait_bound(server, &slot, &p.uid).await;
    eprintln!(
        "slow API: {}; delay 2500 ms: refused ({}), no claim left after {}",
        line.join(", "),
        text.lines().next().unwrap_or_default(),
        ms(settled)
    );
}
