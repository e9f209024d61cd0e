//! Crash safety under a storm: the agent is killed (in-process kill -9: its
//! task aborted, no shutdown path runs) at a random moment while pods are
//! being admitted (Allocate in flight), deleted and terminated through the
//! kubelet stand-in, then started again from its durable state. After each
//! restart the node must hold: no slot granted to two live pods, no claim
//! left on a pod that is gone (leak), no live pod without its claim (lost).
//!
//! Rounds: `STEWARD_FAULT_ROUNDS` (default 20 in the suite; RELIABILITY.md
//! has the figures of longer runs). The figures are printed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dp::*;
use steward_testing_kubelet::Phase;
use tokio::sync::Mutex;

const CAPACITY: u32 = 3;

struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n.max(1)
    }
}

/// Counts of the storm.
#[derive(Default)]
struct Pods {
    next: usize,
    admitted: u64,
    refused: u64,
}

/// The pods kubelet has that are not done (they hold, or may hold, a slot):
/// the truth the claims must match, whatever the storm's calls returned.
fn live(s: &Single) -> Vec<String> {
    s.node
        .kubelet
        .pods()
        .into_iter()
        .filter(|p| !p.phase.is_terminal())
        .map(|p| p.uid)
        .collect()
}

/// One storm step: end a live pod (delete or terminate) or admit one.
async fn step(s: &Single, pods: &Mutex<Pods>, rng: &mut Lcg) {
    let live = live(s);
    if live.len() >= CAPACITY as usize || (!live.is_empty() && rng.next(3) == 0) {
        let victim = &live[rng.next(live.len())];
        if rng.next(2) == 0 {
            let _ = s.node.kubelet.delete_pod(victim).await;
        } else {
            let _ = s.node.kubelet.terminate_pod(victim, Phase::Succeeded).await;
        }
        return;
    }
    let name = {
        let mut p = pods.lock().await;
        p.next += 1;
        format!("crash-{}", p.next)
    };
    // The agent may be dead mid-call: admission then fails, as a kubelet's
    // would.
    let outcome = s.node.kubelet.add_pod(pod(&name, &s.res)).await;
    let mut p = pods.lock().await;
    match outcome {
        Ok(_) => p.admitted += 1,
        Err(_) => p.refused += 1,
    }
}

#[derive(Debug, Default)]
struct Figures {
    rounds: u64,
    double_grants: u64,
    leaked: u64,
    lost: u64,
    recovery: Vec<Duration>,
}

/// Live pods' slots in kubelet's accounting; counts slots granted twice.
fn live_slots(s: &Single, live: &[String], f: &mut Figures) -> BTreeMap<String, String> {
    let mut seen = BTreeMap::new();
    for uid in live {
        if let Some(slot) = slot_of(&s.node.kubelet, uid, &s.res)
            && let Some(other) = seen.insert(slot.clone(), uid.clone())
        {
            eprintln!("double grant: {slot} held by {other} and {uid}");
            f.double_grants += 1;
        }
    }
    seen
}

/// Waits until the cluster's claims are exactly the live pods' slots; on
/// timeout counts what differs. Returns how long it took.
async fn settle(s: &Single, want: &BTreeMap<String, String>, f: &mut Figures) -> Duration {
    let t = Instant::now();
    let deadline = t + Duration::from_secs(30);
    loop {
        let claims = slot_claims(&s.server).await;
        let have: BTreeMap<String, String> = claims
            .iter()
            .filter_map(|c| Some((c.metadata.name.clone()?, c.spec.pod.as_ref()?.uid.clone())))
            .collect();
        if &have == want {
            return t.elapsed();
        }
        if Instant::now() > deadline {
            let leaked = have.iter().filter(|(k, v)| want.get(*k) != Some(v)).count();
            let lost = want.iter().filter(|(k, v)| have.get(*k) != Some(v)).count();
            eprintln!("not settled: have {have:?}, want {want:?}");
            f.leaked += leaked as u64;
            f.lost += lost as u64;
            return t.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_at_random_points_of_a_storm_loses_and_leaks_nothing() {
    let rounds: u64 = std::env::var("STEWARD_FAULT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mut s = Single::start(CAPACITY).await;
    let pods = Arc::new(Mutex::new(Pods::default()));
    let mut rng = Lcg(0x5eed);
    let mut f = Figures::default();
    let started = Instant::now();
    for round in 0..rounds {
        // A storm runs; the agent dies at a random moment of it.
        let agent = s.agent.take().unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let kill_after = Duration::from_millis(20 + rng.next(380) as u64);
        let mut storm_rng = Lcg(1000 + round);
        let storm = async {
            while !stop.is_cancelled() {
                step(&s, &pods, &mut storm_rng).await;
            }
        };
        let killer = async {
            tokio::time::sleep(kill_after).await;
            let cfg = agent.kill().await;
            stop.cancel();
            cfg
        };
        let ((), cfg) = tokio::join!(storm, killer);
        // Sometimes a pod ends while the agent is down.
        if let Some(gone) = live(&s).first()
            && rng.next(2) == 0
        {
            s.node.kubelet.delete_pod(gone).await.unwrap();
        }
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
            .unwrap_or_else(|e| panic!("round {round}: not re-registered: {e}"));
        let want = live_slots(&s, &live(&s), &mut f);
        let took = settle(&s, &want, &mut f).await;
        f.recovery.push(took);
        f.rounds += 1;
    }
    let p = pods.lock().await;
    f.recovery.sort();
    let pct = |q: f64| {
        f.recovery[((q * f.recovery.len() as f64).ceil() as usize).clamp(1, f.recovery.len()) - 1]
    };
    println!(
        "crash storm: {} rounds in {:.1}s, {} pods admitted, {} admissions refused (agent down mid-Allocate); \
         double grants {}, leaked claims {}, lost claims {}; claims settled after restart p50 {:?} p99 {:?}",
        f.rounds,
        started.elapsed().as_secs_f64(),
        p.admitted,
        p.refused,
        f.double_grants,
        f.leaked,
        f.lost,
        pct(0.50),
        pct(0.99),
    );
    assert!(
        p.admitted >= rounds,
        "the storm admitted too little to mean anything"
    );
    assert_eq!((f.double_grants, f.leaked, f.lost), (0, 0, 0), "{f:?}");
}
