//! What one decision costs the controller as the cluster grows: the
//! baseline for "work grows with change, not with size".
//!
//! The controller's picture ([`ClusterPicture`]) is loaded with 5,000 nodes,
//! 4 local Instances of 8 slots per node, and `R` managed pods that hold a
//! slot each (bound, Running, their SlotClaim written, their Reservation
//! consumed). Then, again and again, one more pod is filtered: its
//! Reservation arrives and the decision loop reconciles the batch (the
//! kept ledger re-reads and decides that pod). The time of that batch is
//! reported per `R`, and its growth against the smallest `R`: work that
//! grows with change keeps that ratio near 1. Beside it, in the same run,
//! the baseline: the same picture's ledger rebuilt from every object
//! ([`ClusterPicture::audit`]), which is what every batch cost before the
//! ledger was kept.
//!
//! Memory: a counting allocator measures the picture's live bytes with the
//! pods and without them; the difference per pod is what one managed pod
//! (its Reservation, pod facts and claim as mirrored) costs the controller.
//!
//! `cargo bench -p steward-leader --bench ledger_scale`;
//! `STEWARD_BENCH_SMOKE=1` for a short run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use steward_api::{
    Instance, InstanceSpec, PodRef, Reservation, ReservationSpec, ReservationStatus, SlotClaim,
    SlotClaimSpec,
};
use steward_core::Millis;
use steward_kube::Change;
use steward_leader::cluster_picture::ClusterPicture;

/// Live heap bytes: what the picture holds is measured as a difference.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; only a counter is
// kept beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const NS: &str = "default";
const PER_NODE: usize = 4;
const CAPACITY: u32 = 8;
const TTL_MS: u64 = 120_000;

fn instance(k: usize) -> Instance {
    let spec = InstanceSpec {
        configuration_name: "cams".into(),
        device_id: format!("i{k}"),
        shared: false,
        nodes: vec![format!("n{}", k / PER_NODE)],
        capacity: CAPACITY,
        properties: BTreeMap::new(),
        mounts: Vec::new(),
        device_specs: Vec::new(),
        cdi_name: String::new(),
    };
    let mut i = Instance::new(&format!("i{k}"), spec);
    i.metadata.namespace = Some(NS.into());
    i
}

fn pod(name: &str, uid: &str, node: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": if node.is_some() { "Running" } else { "Pending" }},
    }))
    .unwrap()
}

fn pod_ref(name: &str, uid: &str) -> PodRef {
    PodRef {
        namespace: NS.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

fn reservation(name: &str, uid: &str, inst: &str, candidates: Vec<String>) -> Reservation {
    let spec = ReservationSpec {
        pod: pod_ref(name, uid),
        slots: BTreeMap::from([(inst.to_owned(), 1)]),
        exclusive_cpus: 0,
        candidates,
        cancel: None,
    };
    let mut r = Reservation::new(name, spec);
    r.metadata.namespace = Some(NS.into());
    r.metadata.uid = Some(format!("r-{uid}"));
    r.metadata.generation = Some(1);
    r.metadata.resource_version = Some("1".into());
    r
}

/// Pod `r` of the preload: the instance and slot it holds, and its node.
fn placement(r: usize, instances: usize) -> (usize, u32, String) {
    let k = r % instances;
    (
        k,
        u32::try_from(r / instances).unwrap(),
        format!("n{}", k / PER_NODE),
    )
}

fn now() -> Millis {
    Millis(1_800_000_000_000)
}

/// The picture with `nodes` nodes and their Instances, and `pods` managed
/// pods holding a slot each, settled (no write pending).
fn loaded(nodes: usize, pods: usize) -> ClusterPicture {
    let instances = nodes * PER_NODE;
    assert!(
        pods <= instances * CAPACITY as usize,
        "more pods than slots"
    );
    let mut p = ClusterPicture::default();
    p.nodes(Change::Relisted(
        (0..nodes)
            .map(|n| serde_json::from_value(json!({"metadata": {"name": format!("n{n}")}})))
            .collect::<Result<Vec<Node>, _>>()
            .unwrap(),
    ));
    p.instances(Change::Relisted((0..instances).map(instance).collect()));
    let mut ps = Vec::with_capacity(pods);
    let mut claims = Vec::with_capacity(pods);
    let mut rs = Vec::with_capacity(pods);
    for r in 0..pods {
        let (k, slot, node) = placement(r, instances);
        let (name, uid) = (format!("p{r}"), format!("u{r}"));
        ps.push(pod(&name, &uid, Some(&node)));
        let spec = SlotClaimSpec {
            instance: format!("i{k}"),
            slot,
            node: node.clone(),
            epoch: 1,
            pod: Some(pod_ref(&name, &uid)),
            container: Some("main".into()),
            since: 0,
            awaiting: None,
            reservation: Some(name.clone()),
            resource_claim: None,
        };
        let mut c = SlotClaim::new(&format!("i{k}-{slot}"), spec);
        c.metadata.namespace = Some(NS.into());
        claims.push(c);
        let mut res = reservation(&name, &uid, &format!("i{k}"), vec![node.clone()]);
        res.status = Some(ReservationStatus {
            phase: "Reserved".into(),
            node: Some(node),
            slots: vec![format!("i{k}-{slot}")],
            decided_at: Some(now().0),
            observed_generation: Some(1),
            ..ReservationStatus::default()
        });
        rs.push(res);
    }
    p.pods(Change::Relisted(ps));
    p.slot_claims(Change::Relisted(claims));
    p.reservations(Change::Relisted(rs));
    assert!(p.ready());
    // The first rebuild marks every Reservation consumed; written back, the
    // picture is settled.
    let writes = p.reconcile(TTL_MS, now());
    assert_eq!(
        writes.len(),
        pods,
        "every preloaded reservation is consumed"
    );
    for w in writes {
        p.reservations(Change::Applied(w.object));
    }
    assert!(p.reconcile(TTL_MS, now()).is_empty(), "settled");
    p
}

fn pct(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One batch per new pod, `rounds` of them, at `pods` preloaded; returns
/// the batch times, sorted.
fn decisions(p: &mut ClusterPicture, nodes: usize, pods: usize, rounds: usize) -> Vec<Duration> {
    let instances = nodes * PER_NODE;
    let mut times = Vec::with_capacity(rounds);
    for j in 0..rounds {
        // A free slot: the preload fills slots in order, so the next pods'
        // placements are free.
        let (k, _, node) = placement(pods + j, instances);
        let (name, uid) = (format!("new{j}"), format!("nu{j}"));
        // The candidates a scheduler would pass: its node among 49 others.
        let mut candidates: Vec<String> = (1..50)
            .map(|d| format!("n{}", (k / PER_NODE + d * 97) % nodes))
            .collect();
        candidates.push(node.clone());
        p.pods(Change::Applied(pod(&name, &uid, None)));
        p.reservations(Change::Applied(reservation(
            &name,
            &uid,
            &format!("i{k}"),
            candidates,
        )));
        let t = Instant::now();
        let writes = p.reconcile(TTL_MS, now());
        times.push(t.elapsed());
        assert_eq!(writes.len(), 1, "one decision per batch");
        let status = writes[0].object.status.as_ref().unwrap();
        assert_eq!(status.phase, "Reserved", "{status:?}");
        assert_eq!(status.node.as_deref(), Some(node.as_str()));
        for w in writes {
            p.reservations(Change::Applied(w.object));
        }
        // The echo of the write: the loop reads it back in the next batch.
        assert!(p.reconcile(TTL_MS, now()).is_empty());
    }
    times.sort();
    times
}

/// The rebuild from every object, `rounds` times; sorted times.
fn rebuilds(p: &ClusterPicture, rounds: usize) -> Vec<Duration> {
    let mut times: Vec<Duration> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            let writes = p.audit(TTL_MS, now());
            let took = t.elapsed();
            assert!(writes.is_empty(), "the kept ledger agrees with a rebuild");
            took
        })
        .collect();
    times.sort();
    times
}

fn main() {
    let smoke = std::env::var_os("STEWARD_BENCH_SMOKE").is_some();
    let (nodes, sizes, rounds, full): (usize, &[usize], usize, usize) = if smoke {
        (50, &[100, 1_000], 3, 1)
    } else {
        (5_000, &[1_000, 10_000, 150_000], 200, 3)
    };
    let mut first: Option<Duration> = None;
    for &pods in sizes {
        let before = LIVE.load(Ordering::Relaxed);
        let empty = loaded(nodes, 0);
        let base = LIVE.load(Ordering::Relaxed) - before;
        drop(empty);
        let before = LIVE.load(Ordering::Relaxed);
        let mut p = loaded(nodes, pods);
        let held = LIVE.load(Ordering::Relaxed) - before;
        let per_pod = (held - base) as f64 / pods as f64;
        let times = decisions(&mut p, nodes, pods, rounds);
        let rebuilt = rebuilds(&p, full);
        let p50 = pct(&times, 0.5);
        let growth = p50.as_secs_f64() / first.get_or_insert(p50).as_secs_f64();
        let rebuild_p50 = pct(&rebuilt, 0.5);
        println!(
            "ledger-scale nodes={nodes} instances={} reservations={pods}: one decision's batch p50={p50:.2?} p99={:.2?} n={rounds}, {growth:.2}x the batch at {} | baseline, the ledger rebuilt from every object: p50={rebuild_p50:.2?} n={full} ({:.0}x the batch) | picture {:.1} MB, {per_pod:.0} bytes per managed pod (Reservation + pod + SlotClaim as mirrored, the kept ledger included)",
            nodes * PER_NODE,
            pct(&times, 0.99),
            sizes[0],
            rebuild_p50.as_secs_f64() / p50.as_secs_f64(),
            held as f64 / 1e6,
        );
    }
}
