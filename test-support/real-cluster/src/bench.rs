//! What the real-cluster benchmarks share: how many rounds, percentiles,
//! the report line (a figure against its baseline from the same run) and
//! a graceful delete.

use std::time::Duration;

use kube::api::DeleteParams;

use crate::{Cluster, eventually};

/// `STEWARD_BENCH_SMOKE=1`: 2 rounds (the test command's real-cluster tier
/// runs the benchmarks so); otherwise `STEWARD_BENCH_ROUNDS` (default 20).
pub fn rounds() -> usize {
    if std::env::var_os("STEWARD_BENCH_SMOKE").is_some() {
        2
    } else {
        std::env::var("STEWARD_BENCH_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20)
    }
}

/// The `p` quantile (0..=1) of `v`, nearest rank.
pub fn pct(v: &[Duration], p: f64) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    s[(((s.len() - 1) as f64) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Prints `what`: p50 and p99 of `v` against `base`, and their ratio.
pub fn line(what: &str, v: &[Duration], base: &[Duration]) {
    println!(
        "{what}: p50 {:.0} ms p99 {:.0} ms | baseline p50 {:.0} ms p99 {:.0} ms | ratio p50 {:.2}x p99 {:.2}x ({} rounds)",
        ms(pct(v, 0.5)),
        ms(pct(v, 0.99)),
        ms(pct(base, 0.5)),
        ms(pct(base, 0.99)),
        ms(pct(v, 0.5)) / ms(pct(base, 0.5)),
        ms(pct(v, 0.99)) / ms(pct(base, 0.99)),
        v.len()
    );
}

/// Deletes a pod with its own grace period and waits until the object is
/// gone (kubelet has stopped its containers).
pub async fn delete_gracefully(cluster: &Cluster, ns: &str, name: &str) {
    let pods = cluster.pods(ns);
    let _ = pods.delete(name, &DeleteParams::default()).await;
    eventually(&format!("pod {name} gone"), Duration::from_secs(90), || {
        let pods = pods.clone();
        async move { matches!(pods.get_opt(name).await, Ok(None)).then_some(()) }
    })
    .await;
}
