//! Settle: a pod deleted right after admission, before any pod-resources
//! snapshot attributed its slot to it, gives the slot back about
//! `settle_ms` after the Allocate, not after the pending timeout (20 s
//! here): the other node sees it Healthy again and admits the next pod.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::path::Path;
use std::time::{Duration, Instant};

use dp::*;
use steward_agent::AgentConfig;
use steward_core::slots::SlotConfig;
use steward_testing_kubelet::Kubelet;

const SETTLE_MS: u64 = 300;
/// The bound asked for: the slot is back within settle + 1 s of the delete.
const PROMPT: Duration = Duration::from_millis(SETTLE_MS + 1_000);
/// Far below the pending timeout.
const PENDING_TIMEOUT_MS: u64 = 20_000;

fn short_settle(node: &Node, dir: &Path, client: kube::Client) -> AgentConfig {
    let mut cfg = node.agent_config(dir, client, echo(true));
    if let Some(dp) = cfg.device_plugins.as_mut() {
        dp.slots = SlotConfig {
            pending_timeout_ms: PENDING_TIMEOUT_MS,
            settle_ms: SETTLE_MS,
        };
    }
    cfg
}

/// Two nodes sharing one single-slot device.
struct Pair {
    server: steward_testing_apiserver::ApiServer,
    _dir: tempfile::TempDir,
    a: Node,
    b: Node,
    _agents: (Agent, Agent),
    res: String,
    slot: String,
}

/// `mirror_a`: node-a's kubelet creates its pods in the API server (the
/// agent's pod watch sees them); without it the agent only ever learns of
/// node-a's pods from pod resources, so they are never attributed.
async fn pair(mirror_a: bool) -> Pair {
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(dir.path(), "node-a", mirror_a.then(|| server.client())).await;
    let b = Node::start(dir.path(), "node-b", Some(server.client())).await;
    let agent_a = Agent::start(short_settle(&a, dir.path(), server.client()));
    let agent_b = Agent::start(short_settle(&b, dir.path(), server.client()));
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 1),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a", "node-b"]).await;
    assert!(inst.spec.shared);
    let res = resource(&inst);
    for n in [&a, &b] {
        n.kubelet
            .wait_for_resource(&res, |s| s.healthy.len() == 1, WAIT)
            .await
            .unwrap();
    }
    let slot = format!("{}-0", inst.metadata.name.clone().unwrap());
    Pair {
        server,
        _dir: dir,
        a,
        b,
        _agents: (agent_a, agent_b),
        res,
        slot,
    }
}

/// Waits until `kubelet` reports `slot` Healthy; panics after `within`.
async fn healthy_within(kubelet: &Kubelet, res: &str, slot: &str, within: Duration, what: &str) {
    kubelet
        .wait_for_resource(res, |s| s.healthy.contains(slot), within)
        .await
        .unwrap_or_else(|e| panic!("{what}: {slot} not Healthy within {within:?}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_deleted_right_after_admission_frees_the_slot_for_the_other_node() {
    let p = pair(true).await;
    // Back and forth: a pod is admitted on one node and deleted at once;
    // the other node gets the slot promptly.
    for round in 0..4 {
        let (from, to) = if round % 2 == 0 {
            (&p.a, &p.b)
        } else {
            (&p.b, &p.a)
        };
        let admitted = from
            .kubelet
            .add_pod(pod(&format!("{}-{round}", from.name), &p.res))
            .await
            .unwrap_or_else(|e| panic!("round {round}: {} refused the pod: {e}", from.name));
        // Durable in the cluster before Allocate was answered.
        let claim = claim_of(&p.server, &p.slot).await;
        assert_eq!(
            claim.map(|c| c.spec.node),
            Some(from.name.clone()),
            "round {round}"
        );
        let deleted = Instant::now();
        from.kubelet.delete_pod(&admitted.uid).await.unwrap();
        healthy_within(
            &to.kubelet,
            &p.res,
            &p.slot,
            PROMPT,
            &format!("round {round}"),
        )
        .await;
        eventually(
            &format!("round {round}: claim released"),
            PROMPT,
            || async { claim_of(&p.server, &p.slot).await.is_none().then_some(()) },
        )
        .await;
        let took = deleted.elapsed();
        assert!(
            took <= PROMPT,
            "round {round}: released {took:?} after the delete"
        );
        tracing::info!(round, ?took, "slot back after the delete");
    }
    // And the next pod on either node is admitted.
    let next = p.b.kubelet.add_pod(pod("next", &p.res)).await.unwrap();
    wait_bound(&p.server, &p.slot, &next.uid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_attributed_slot_is_kept_while_kubelet_lists_it_and_freed_once_gone() {
    // node-a's pods never reach the API server: no pod-resources snapshot
    // can attribute their slots and no Deleted event reaches the agent, so
    // only the settle rule (or the 20 s pending timeout) gives a slot back.
    let p = pair(false).await;

    // Deleted right after admission (once node-b saw the claim).
    let admitted = p.a.kubelet.add_pod(pod("quick", &p.res)).await.unwrap();
    p.b.kubelet
        .wait_for_resource(&p.res, |s| s.unhealthy.contains(&p.slot), WAIT)
        .await
        .unwrap();
    let deleted = Instant::now();
    p.a.kubelet.delete_pod(&admitted.uid).await.unwrap();
    healthy_within(&p.b.kubelet, &p.res, &p.slot, PROMPT, "quick pod deleted").await;
    assert!(claim_of(&p.server, &p.slot).await.is_none());
    let took = deleted.elapsed();
    assert!(took <= PROMPT, "released {took:?} after the delete");
    let on_b = p.b.kubelet.add_pod(pod("on-b", &p.res)).await.unwrap();
    p.b.kubelet.delete_pod(&on_b.uid).await.unwrap();
    healthy_within(&p.a.kubelet, &p.res, &p.slot, PROMPT, "pod on b deleted").await;
    wait_released(&p.server, &p.slot).await;

    // A pod that stays: kubelet lists it, so the claim is kept long past
    // the settle time although it is never attributed.
    let stays = p.a.kubelet.add_pod(pod("stays", &p.res)).await.unwrap();
    let keep = Duration::from_millis(6 * SETTLE_MS);
    let until = Instant::now() + keep;
    while Instant::now() < until {
        let claim = claim_of(&p.server, &p.slot).await;
        assert_eq!(
            claim.map(|c| c.spec.node).as_deref(),
            Some("node-a"),
            "claim of a running pod lost"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let refused = p.b.kubelet.add_pod(pod("refused", &p.res)).await;
    assert!(refused.is_err(), "slot of a running pod handed to node-b");
    // Once it is gone, the slot comes back well before the pending timeout
    // (the agent lists with back-off capped at 2 s when no event pokes it).
    let deleted = Instant::now();
    p.a.kubelet.delete_pod(&stays.uid).await.unwrap();
    healthy_within(
        &p.b.kubelet,
        &p.res,
        &p.slot,
        Duration::from_millis(2_000) + PROMPT,
        "running pod deleted",
    )
    .await;
    let took = deleted.elapsed();
    assert!(
        took < Duration::from_millis(PENDING_TIMEOUT_MS / 4),
        "released {took:?} after the delete"
    );
    p.b.kubelet.add_pod(pod("after", &p.res)).await.unwrap();
}
