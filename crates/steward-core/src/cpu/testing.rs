//! Helpers shared by the model's and the policies' tests.

use std::collections::BTreeMap;

use crate::cpu::*;

pub(crate) fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

/// 2 sockets × 2 NUMA nodes × 2 cores × 2 threads = 16 CPUs. CPU ids:
/// core k has threads k and k+8; node n holds cores 2n, 2n+1.
pub(crate) fn smt16() -> Topology {
    Topology::synthetic(&SyntheticSpec {
        sockets: 2,
        nodes_per_die: 2,
        cores_per_node: 2,
        threads_per_core: 2,
        memory_per_node: 4 << 30,
        ..SyntheticSpec::default()
    })
    .unwrap()
}

pub(crate) fn req(pod: &str, qos: Qos, milli: u64) -> ContainerRequest {
    ContainerRequest {
        key: ContainerKey::new(pod, "c"),
        pod_namespace: "default".into(),
        pod_name: pod.into(),
        qos,
        cpu_request_milli: milli,
        cpu_limit_milli: (qos == Qos::Guaranteed).then_some(milli),
        memory_request_bytes: 0,
        memory_limit_bytes: None,
        annotations: BTreeMap::new(),
        cpu_claims: Vec::new(),
    }
}

pub(crate) fn annotated(mut r: ContainerRequest, k: &str, v: &str) -> ContainerRequest {
    r.annotations.insert(k.into(), v.into());
    r
}

pub(crate) fn key(pod: &str) -> ContainerKey {
    ContainerKey::new(pod, "c")
}

pub(crate) fn static_policy(t: &Topology, reserved: &str) -> Box<dyn Policy> {
    new_policy(
        PolicyKind::Static,
        t,
        &PolicyConfig {
            reserved_cpus: set(reserved),
            ..PolicyConfig::default()
        },
    )
    .unwrap()
}

pub(crate) fn btype(name: &str, min: u32, max: u32, max_balloons: u32) -> BalloonType {
    BalloonType {
        name: name.into(),
        min_cpus: min,
        max_cpus: max,
        min_balloons: 0,
        max_balloons,
        namespaces: Vec::new(),
        prefer_isolated: false,
    }
}
