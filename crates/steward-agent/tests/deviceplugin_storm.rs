//! Storms of pod creates and deletes over few slots, with the agent killed
//! (in-process kill -9) and kubelet restarted in the middle.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use dp::*;
use steward_testing_kubelet::Phase;

const CAPACITY: u32 = 3;

/// A deterministic pseudo-random sequence (no extra dependency).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

struct Storm {
    live: Vec<String>,
    /// Pods terminated (Succeeded) but not deleted yet.
    done: Vec<String>,
    next: usize,
    rng: Lcg,
    admitted: usize,
}

impl Storm {
    fn new(seed: u64) -> Self {
        Self {
            live: Vec::new(),
            done: Vec::new(),
            next: 0,
            rng: Lcg(seed),
            admitted: 0,
        }
    }

    /// Creates `pods` pods, never more than CAPACITY live: each create comes
    /// when a slot is free and must be admitted; a random live pod is
    /// deleted or terminated first when all slots are taken (and sometimes
    /// anyway).
    async fn run(&mut self, s: &Single, pods: usize) {
        for _ in 0..pods {
            while self.live.len() >= CAPACITY as usize
                || (!self.live.is_empty() && self.rng.next(3) == 0)
            {
                let victim = self.live.remove(self.rng.next(self.live.len()));
                if self.rng.next(2) == 0 {
                    s.node.kubelet.delete_pod(&victim).await.unwrap();
                } else {
                    s.node
                        .kubelet
                        .terminate_pod(&victim, Phase::Succeeded)
                        .await
                        .unwrap();
                    self.done.push(victim);
                }
            }
            if self.done.len() > 4 {
                let old = self.done.remove(0);
                s.node.kubelet.delete_pod(&old).await.unwrap();
            }
            let name = format!("storm-{}", self.next);
            self.next += 1;
            let admitted = s
                .node
                .kubelet
                .add_pod(pod(&name, &s.res))
                .await
                .unwrap_or_else(|e| panic!("{name} refused although a slot was free: {e}"));
            self.admitted += 1;
            self.live.push(admitted.uid);
            assert_no_double_grant(s, &self.live);
        }
    }
}

/// Live pods hold distinct slots in kubelet's accounting.
fn assert_no_double_grant(s: &Single, live: &[String]) {
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for uid in live {
        let slot = slot_of(&s.node.kubelet, uid, &s.res).unwrap();
        if let Some(other) = seen.insert(slot.clone(), uid.clone()) {
            panic!("slot {slot} granted to {other} and {uid}");
        }
    }
}

/// The cluster's claims are exactly the live pods' slots, each bound to
/// its pod.
async fn assert_claims_match(s: &Single, live: &[String]) {
    let want: BTreeMap<String, String> = live
        .iter()
        .map(|uid| (slot_of(&s.node.kubelet, uid, &s.res).unwrap(), uid.clone()))
        .collect();
    eventually("claims match the live pods", WAIT, || async {
        let claims = slot_claims(&s.server).await;
        let have: BTreeMap<String, String> = claims
            .iter()
            .filter_map(|c| Some((c.metadata.name.clone()?, c.spec.pod.as_ref()?.uid.clone())))
            .collect();
        (have == want && claims.len() == want.len()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_of_200_pods_over_3_slots() {
    let s = Single::start(CAPACITY).await;
    let mut storm = Storm::new(7);
    storm.run(&s, 200).await;
    assert_eq!(storm.admitted, 200);
    assert_claims_match(&s, &storm.live).await;
    let ok = s
        .agent
        .as_ref()
        .map(|a| {
            a.metrics
                .device_plugins
                .allocations
                .get_or_create(&steward_agent::deviceplugin::ResultLabels {
                    result: "ok".into(),
                })
                .get()
        })
        .unwrap();
    assert!(ok >= 200, "every admission went through Allocate: {ok}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_mid_storm_rebuilds_its_state() {
    let mut s = Single::start(CAPACITY).await;
    let mut storm = Storm::new(11);
    storm.run(&s, 60).await;
    assert_claims_match(&s, &storm.live).await;

    // kill -9: nothing of the agent's shutdown path runs.
    let cfg = s.agent.take().unwrap().kill().await;
    // While it is down: one pod deleted, one terminated, the rest stay.
    let gone = storm.live.remove(0);
    s.node.kubelet.delete_pod(&gone).await.unwrap();
    let finished = storm.live.remove(0);
    s.node
        .kubelet
        .terminate_pod(&finished, Phase::Succeeded)
        .await
        .unwrap();
    let regs = s.node.kubelet.resource(&s.res).unwrap().registrations;

    s.agent = Some(Agent::start(cfg));
    s.node
        .kubelet
        .wait_for_resource(
            &s.res,
            |r| r.registrations > regs && r.connected && r.healthy.len() == CAPACITY as usize,
            WAIT,
        )
        .await
        .unwrap();
    // Rebuilt: surviving pods keep their slots, the others are free.
    assert_claims_match(&s, &storm.live).await;
    storm.run(&s, 60).await;
    assert_claims_match(&s, &storm.live).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_mid_storm_reregisters_within_a_second() {
    let s = Single::start(CAPACITY).await;
    let mut storm = Storm::new(23);
    for round in 0..3 {
        storm.run(&s, 30).await;
        let t = Instant::now();
        s.node.kubelet.restart().await.unwrap();
        s.node
            .kubelet
            .wait_for_resource(
                &s.res,
                |r| r.connected && r.healthy.len() == CAPACITY as usize,
                WAIT,
            )
            .await
            .unwrap();
        let took = t.elapsed();
        println!("kubelet restart round {round}: plugin registered again after {took:?}");
        assert!(
            took < Duration::from_secs(1),
            "round {round}: re-registered after {took:?}"
        );
        // The stand-in forgets resources on restart: exactly one fresh
        // registration brought it back.
        let after = s.node.kubelet.resource(&s.res).unwrap().registrations;
        assert_eq!(after, 1, "round {round}");
    }
    storm.run(&s, 30).await;
    assert_claims_match(&s, &storm.live).await;
    let live: BTreeSet<&String> = storm.live.iter().collect();
    assert_eq!(live.len(), storm.live.len());
}
