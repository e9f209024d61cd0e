//! The node's side of exclusive-CPU reservations (the scheduler extender
//! and `steward controller` decide them cluster-wide).
//!
//! **What the node publishes** ([`node_cpus`]): per NUMA node, the CPUs it
//! can still hand out exclusively, and the pods already holding exclusive
//! CPUs — one document in the Node annotation
//! [`steward_core::reservation::NODE_CPUS_ANNOTATION`], rewritten whenever
//! it changes. The controller counts a reservation against a NUMA node
//! until its pod is named there.
//!
//! **What the node honours** ([`watch_holds`]): every Reservation `Reserved`
//! on this node with CPUs on a NUMA node becomes a hold in the policy
//! ([`steward_core::cpu::Policy::set_holds`]), so no other pod's exclusive
//! placement takes those CPUs before the pod they are held for starts.

use std::collections::{BTreeMap, BTreeSet};

use futures::{Stream, StreamExt};
use kube::Api;
use kube::api::ListParams;
use kube::runtime::watcher;
use steward_api::Reservation;
use steward_core::cpu::{Assignment, ContainerKey, CpuSet, PolicyConfig, PolicyKind, Topology};
use steward_core::reservation::NodeCpus;
use steward_kube::{Mirror, SharedWatch};

/// Pod uid → (NUMA node, CPUs) held for it on this node.
pub type Holds = BTreeMap<String, (u32, u32)>;

/// What this node can still hand out exclusively under `policy`: per NUMA
/// node, its online CPUs that are neither reserved for the system nor
/// isolated nor already exclusive; the shared pool keeps one CPU, taken off
/// the NUMA node with the most. `balloons` and `none` hand out no per-pod
/// exclusive CPUs: nothing is free.
pub fn node_cpus(
    topology: &Topology,
    policy: PolicyKind,
    config: &PolicyConfig,
    assignments: &BTreeMap<ContainerKey, Assignment>,
) -> NodeCpus {
    let mut taken = CpuSet::new();
    let mut holders = BTreeSet::new();
    for (key, a) in assignments.iter().filter(|(_, a)| a.exclusive) {
        taken.union_with(&a.cpus);
        holders.insert(key.pod_uid.clone());
    }
    let mut free = BTreeMap::new();
    if matches!(policy, PolicyKind::Static | PolicyKind::TopologyAware) {
        let usable = topology
            .online_cpus()
            .difference(&config.reserved_cpus)
            .difference(topology.isolated_cpus())
            .difference(&taken);
        for id in topology.node_ids().iter() {
            let n = usable.intersection(&topology.node_cpus(id)).len();
            free.insert(id, u32::try_from(n).unwrap_or(u32::MAX));
        }
        if let Some((_, most)) = free
            .iter_mut()
            .max_by_key(|(id, n)| (**n, std::cmp::Reverse(**id)))
        {
            *most = most.saturating_sub(1);
        }
    }
    NodeCpus { free, holders }
}

/// The holds on `node` in a set of Reservations.
pub fn holds_of<'a>(node: &str, all: impl IntoIterator<Item = &'a Reservation>) -> Holds {
    all.into_iter()
        .filter_map(|r| {
            let s = r.status.as_ref()?;
            let numa = s.numa_node?;
            (s.phase == "Reserved" && s.node.as_deref() == Some(node) && s.cpus > 0)
                .then(|| (r.spec.pod.uid.clone(), (numa, s.cpus)))
        })
        .collect()
}

/// The holds on `node`, anew after every change of a Reservation held
/// there (from the first list on; a watch that fails is retried with
/// backoff and the holds last seen stay). Only those are followed: a field
/// selector on `status.node` (a selectable field of the CRD), so a
/// decision on another node costs this node nothing, and one that leaves
/// it arrives as a deletion. An API server that refuses the selector (the
/// CRDs are older than this node: 400) is watched whole, as before.
pub fn watch_holds(client: kube::Client, node: String) -> impl Stream<Item = Holds> + Send {
    let api: Api<Reservation> = Api::all(client);
    let mut all: Mirror<Reservation> = Mirror::new();
    let selector = format!("status.node={node}");
    let probe = {
        let api = api.clone();
        async move {
            let here = ListParams::default().fields(&selector).limit(1);
            match api.list_metadata(&here).await {
                Err(kube::Error::Api(e)) if e.code == 400 => {
                    tracing::warn!(error = %e.message, "the API server refuses a field selector on Reservations' status.node (CRDs older than this node): following every Reservation");
                    watcher::Config::default()
                }
                _ => watcher::Config::default().fields(&selector),
            }
        }
    };
    futures::stream::once(probe)
        .flat_map(move |config| SharedWatch::start(api.clone(), config).subscribe())
        .filter_map(move |change| {
        let changed = match all.apply(change) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, "the Reservation watch failed; retrying (holds as last seen)");
                false
            }
        };
        let out = changed.then(|| holds_of(&node, all.values()));
        futures::future::ready(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use steward_core::cpu::{SyntheticSpec, new_policy};

    fn topo() -> Topology {
        // 2 NUMA nodes × 2 cores × 2 threads: node 0 = 0,1,4,5; node 1 = 2,3,6,7.
        Topology::synthetic(&SyntheticSpec {
            sockets: 1,
            nodes_per_die: 2,
            cores_per_node: 2,
            threads_per_core: 2,
            memory_per_node: 1 << 30,
            ..SyntheticSpec::default()
        })
        .unwrap()
    }

    #[test]
    fn free_cpus_per_numa_node_leave_the_reserved_the_exclusive_and_one_shared() {
        let t = topo();
        let cfg = PolicyConfig {
            reserved_cpus: CpuSet::parse("0").unwrap(),
            ..PolicyConfig::default()
        };
        let mut p = new_policy(PolicyKind::Static, &t, &cfg).unwrap();
        let none = node_cpus(&t, PolicyKind::Static, &cfg, p.assignments());
        let per_node: Vec<u32> = t
            .node_ids()
            .iter()
            .map(|id| t.node_cpus(id).len() as u32)
            .collect();
        assert_eq!(per_node, [4, 4]);
        // node 0 loses the reserved CPU; the fuller node 1 keeps one shared.
        assert_eq!(none.free, BTreeMap::from([(0, 3), (1, 3)]));
        assert!(none.holders.is_empty());
        let req = steward_core::cpu::ContainerRequest {
            key: ContainerKey::new("u1", "c"),
            pod_namespace: "ns".into(),
            pod_name: "p".into(),
            qos: steward_core::cpu::Qos::Guaranteed,
            cpu_request_milli: 2000,
            cpu_limit_milli: Some(2000),
            memory_request_bytes: 0,
            memory_limit_bytes: None,
            annotations: BTreeMap::new(),
            cpu_claims: Vec::new(),
        };
        let d = p.allocate(&req).unwrap();
        let got = d.get(&req.key).unwrap().cpus.clone();
        let after = node_cpus(&t, PolicyKind::Static, &cfg, p.assignments());
        assert_eq!(after.holders, BTreeSet::from(["u1".to_owned()]));
        assert_eq!(
            after.free.values().sum::<u32>() + got.len() as u32,
            none.free.values().sum::<u32>(),
            "{after:?} after {got}"
        );
        assert!(
            node_cpus(&t, PolicyKind::Balloons, &cfg, p.assignments())
                .free
                .is_empty()
        );
    }

    #[test]
    fn only_reserved_reservations_on_this_node_with_cpus_hold() {
        let mk = |uid: &str, phase: &str, node: &str, numa: Option<u32>, cpus: u32| {
            let mut r: Reservation = serde_json::from_value(serde_json::json!({
                "apiVersion": "steward.dev/v1alpha1", "kind": "Reservation",
                "metadata": {"name": uid, "namespace": "ns"},
                "spec": {"pod": {"namespace": "ns", "name": uid, "uid": uid},
                         "slots": {}, "exclusiveCpus": cpus, "candidates": [node]},
            }))
            .unwrap();
            r.status = Some(steward_api::ReservationStatus {
                phase: phase.into(),
                node: Some(node.into()),
                cpus,
                numa_node: numa,
                ..Default::default()
            });
            r
        };
        let all = [
            mk("a", "Reserved", "n1", Some(1), 2),
            mk("b", "Reserved", "n2", Some(0), 2),
            mk("c", "Canceled", "n1", Some(0), 2),
            mk("d", "Reserved", "n1", None, 0),
        ];
        assert_eq!(
            holds_of("n1", &all),
            Holds::from([("a".to_owned(), (1, 2))])
        );
    }
}
