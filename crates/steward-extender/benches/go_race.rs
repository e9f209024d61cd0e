//! Issue 24's bar scenario, scheduled by the Go peer `scheduler-extender`
//! (request bytes from kube-scheduler's own extender types through
//! encoding/json, never steward's serializers): 1,000 pods, two schedulers
//! each through its own extender replica, two controller replicas on the
//! direct path, Instances of 2 slots each seen by 3 of 50 nodes (advertised
//! 300 slots, real 100), the leader killed once half the Filters are
//! answered; an unmanaged pod filtered beside the race gives the floor in
//! the same run. First the same race without the kill, as the comparison.
//!
//! Asserts 0 over-commit, 0 stuck, 0 Filter errors (judged from the API's
//! objects, see `tests/go_race/mod.rs`); reports the Filter p99 against
//! the floor's, decisions/s and the pause around the kill.
//!
//! `cargo bench -p steward-extender --bench go_race` (needs the Go
//! peers: `eval "$(scripts/go-peers.sh)"; export STEWARD_GO_PEERS`);
//! `STEWARD_BENCH_SMOKE=1` for a short run (100 pods).
//! `STEWARD_BENCH_KILLS=10` then races that many times more, the leader
//! killed after 30 % and 60 % of the Filters in turn, each race held to the
//! bar, and reports the decision gap (the longest pause between answered
//! Filters from the kill on) over them: p50, p99 (nearest rank) and max.
//! Without the peer it is skipped outside CI, as the peer tests are.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/go_race/mod.rs"]
mod go_race;

use std::time::Duration;

use go_race::Shape;

fn main() {
    let Some(bin) = steward_testing_gopeers::binary("scheduler-extender") else {
        return;
    };
    let smoke = std::env::var_os("STEWARD_BENCH_SMOKE").is_some();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (pods, instances, nodes) = if smoke { (100, 5, 10) } else { (1000, 50, 50) };
    let kills: usize = std::env::var("STEWARD_BENCH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let shape = |kill: Option<usize>| Shape {
        pods,
        instances,
        capacity: 2,
        nodes,
        seen_by: 3,
        kill_after: kill,
        // The extenders' default: a Filter the leader cannot decide in
        // time is answered "retry", and would show as stuck.
        decision_timeout: Duration::from_secs(2),
        run_timeout: Duration::from_secs(if smoke { 120 } else { 600 }),
    };
    rt.block_on(async {
        for (kill, label) in [(None, "direct"), (Some(pods / 2), "direct, leader killed")] {
            let outcome = go_race::race(&bin, shape(kill)).await;
            for line in outcome.report(label) {
                println!("{line}");
            }
            outcome.assert_bar();
        }
        let mut gaps = Vec::new();
        for i in 0..kills {
            let after = if i % 2 == 0 { pods * 3 / 10 } else { pods * 6 / 10 };
            let outcome = go_race::race(&bin, shape(Some(after))).await;
            let label = format!("direct, leader killed after {after} Filters, race {}", i + 1);
            for line in outcome.report(&label) {
                println!("{line}");
            }
            outcome.assert_bar();
            let gap = outcome.summary["kill"]["longestPauseMs"].as_f64();
            gaps.push(gap.expect("the kill's pause in the peer's summary"));
        }
        if !gaps.is_empty() {
            gaps.sort_by(f64::total_cmp);
            let rank = |q: f64| gaps[((q * gaps.len() as f64).ceil() as usize).clamp(1, gaps.len()) - 1];
            println!(
                "go race decision gap over {} kills (the longest pause between answered Filters from the kill on): p50={} ms p99={} ms max={} ms; the Lease is 15 s",
                gaps.len(),
                rank(0.5),
                rank(0.99),
                gaps[gaps.len() - 1]
            );
        }
    });
}
