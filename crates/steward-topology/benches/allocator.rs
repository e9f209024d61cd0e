//! Allocator decision time on a 256-CPU / 8-NUMA machine (read back from a
//! generated sysfs tree) with 250 containers: Guaranteed integer-CPU,
//! Burstable and BestEffort mixed, allocated then released. Prints p50/p99
//! per decision for each policy. `STEWARD_BENCH_SMOKE=1` runs 2 rounds.
//!
//! Run: `cargo bench -p steward-topology --bench allocator`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use steward_core::cpu::{
    ContainerKey, ContainerRequest, PolicyConfig, PolicyKind, Qos, Topology, new_policy,
};

fn requests(n: usize) -> Vec<ContainerRequest> {
    (0..n)
        .map(|i| {
            // 1 in 5 Guaranteed with 1, 2 or 4 exclusive CPUs; then Burstable,
            // BestEffort
            let (qos, cpu, limit) = match i % 5 {
                0 => {
                    let c = [1000, 2000, 4000][(i / 5) % 3];
                    (Qos::Guaranteed, c, Some(c))
                }
                1 | 2 => (Qos::Burstable, 250 + (i as u64 % 4) * 100, Some(2000)),
                3 => (Qos::Burstable, 100, None),
                _ => (Qos::BestEffort, 0, None),
            };
            ContainerRequest {
                key: ContainerKey::new(format!("pod-{i:04}"), "main"),
                pod_namespace: "bench".into(),
                pod_name: format!("pod-{i:04}"),
                qos,
                cpu_request_milli: cpu,
                cpu_limit_milli: limit,
                memory_request_bytes: if qos == Qos::BestEffort { 0 } else { 256 << 20 },
                memory_limit_bytes: if qos == Qos::Guaranteed {
                    Some(256 << 20)
                } else {
                    None
                },
                annotations: BTreeMap::new(),
                cpu_claims: Vec::new(),
            }
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn run(kind: PolicyKind, topo: &Topology, rounds: usize) -> Result<(), String> {
    let cfg = PolicyConfig {
        reserved_cpus: steward_core::cpu::CpuSet::parse("0,128").map_err(|e| e.to_string())?,
        ..PolicyConfig::default()
    };
    let reqs = requests(250);
    let mut alloc = Vec::with_capacity(rounds * reqs.len());
    let mut release = Vec::with_capacity(rounds * reqs.len());
    for _ in 0..rounds {
        let mut policy = new_policy(kind, topo, &cfg).map_err(|e| e.to_string())?;
        for r in &reqs {
            let t = Instant::now();
            let d = policy.allocate(r).map_err(|e| format!("{}: {e}", r.key))?;
            alloc.push(t.elapsed());
            std::hint::black_box(d);
        }
        for r in &reqs {
            let t = Instant::now();
            let d = policy.release(&r.key);
            release.push(t.elapsed());
            std::hint::black_box(d);
        }
        if !policy.assignments().is_empty() {
            return Err("containers left after release".into());
        }
    }
    let mut all: Vec<Duration> = alloc.iter().chain(&release).copied().collect();
    all.sort_unstable();
    alloc.sort_unstable();
    release.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "allocator/{} p50={:.1}us p99={:.1}us max={:.1}us (allocate p50={:.1}us p99={:.1}us, release p50={:.1}us p99={:.1}us; {} decisions)",
        kind.as_str(),
        us(percentile(&all, 0.50)),
        us(percentile(&all, 0.99)),
        us(percentile(&all, 1.0)),
        us(percentile(&alloc, 0.50)),
        us(percentile(&alloc, 0.99)),
        us(percentile(&release, 0.50)),
        us(percentile(&release, 0.99)),
        all.len(),
    );
    Ok(())
}

fn main() -> Result<(), String> {
    let smoke = std::env::var("STEWARD_BENCH_SMOKE").is_ok_and(|v| v == "1");
    let rounds = if smoke { 2 } else { 40 };
    // the fixture goes through sysfs and back, like production
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let machine = steward_topology::fixture::bench_topology().map_err(|e| e.to_string())?;
    steward_topology::fixture::write_sysfs(dir.path(), &machine).map_err(|e| e.to_string())?;
    let topo = steward_topology::discover(dir.path()).map_err(|e| e.to_string())?;
    println!(
        "machine: {} CPUs, {} NUMA nodes, {} rounds of 250 containers",
        topo.online_cpus().len(),
        topo.node_ids().len(),
        rounds
    );
    for kind in [
        PolicyKind::Static,
        PolicyKind::TopologyAware,
        PolicyKind::Balloons,
    ] {
        run(kind, &topo, rounds)?;
    }
    Ok(())
}
