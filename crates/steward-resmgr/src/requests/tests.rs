//! Tests of request derivation from CRI calls and annotations.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

fn pod<'a>(annotations: &'a BTreeMap<String, String>, parent: &'static str) -> PodFacts<'a> {
    PodFacts {
        uid: "u1",
        name: "p",
        namespace: "ns",
        cgroup_parent: parent,
        annotations,
    }
}

/// How many exclusive CPUs the static policy gives `req` on a 16-CPU node.
fn exclusive_cpus(req: &ContainerRequest) -> usize {
    use steward_core::cpu::{PolicyConfig, PolicyKind, SyntheticSpec, Topology, new_policy};
    let topo = Topology::synthetic(&SyntheticSpec {
        cores_per_node: 16,
        ..SyntheticSpec::default()
    })
    .unwrap();
    let mut p = new_policy(PolicyKind::Static, &topo, &PolicyConfig::default()).unwrap();
    p.allocate(req).unwrap();
    let a = p.assignments().get(&req.key).unwrap();
    if a.exclusive { a.cpus.len() } else { 0 }
}

fn res(shares: i64, quota: i64, period: i64, mem: i64) -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_shares: shares,
        cpu_quota: quota,
        cpu_period: period,
        memory_limit_in_bytes: mem,
        ..Default::default()
    }
}

#[test]
fn quantities_in_the_annotation_use_the_whole_grammar() {
    let ok = |v: &str| parse_resources_annotation(v).unwrap();
    assert_eq!(
        ok(r#"{"requests":{"cpu":"1.5","memory":"1.5Gi"},"limits":{"cpu":"2","memory":"2e9"}}"#),
        (Some(1500), Some(2000), Some(3 << 29), Some(2_000_000_000))
    );
    let err = |v: &str| parse_resources_annotation(v).unwrap_err();
    assert!(matches!(
        err(r#"{"requests":{"memory":"1Qi"}}"#),
        ResourcesAnnotationError::Quantity {
            resource: "memory",
            ..
        }
    ));
    assert!(matches!(
        err(r#"{"limits":{"cpu":"5000"}}"#),
        ResourcesAnnotationError::Absurd {
            resource: "cpu",
            ..
        }
    ));
    assert!(matches!(
        err(r#"{"requests":{"cpu":"2"},"limits":{"cpu":"1"}}"#),
        ResourcesAnnotationError::RequestAboveLimit {
            resource: "cpu",
            request: 2000,
            limit: 1000
        }
    ));
    assert!(matches!(
        err("42"),
        ResourcesAnnotationError::NotAnObject(_)
    ));
}

#[test]
fn guaranteed_from_kubelet_resources() {
    let a = BTreeMap::new();
    // 1 CPU, 64 MiB, request == limit, no cgroup-parent hint.
    let r = derive_request(&pod(&a, "/x"), "c", &res(1024, 100_000, 100_000, 64 << 20)).unwrap();
    assert_eq!(r.qos, Qos::Guaranteed);
    assert_eq!(r.cpu_request_milli, 1000);
    assert_eq!(r.cpu_limit_milli, Some(1000));
    assert_eq!(r.memory_limit_bytes, Some(64 << 20));
    assert_eq!(r.memory_request_bytes, 64 << 20);
    assert_eq!(r.key.pod_uid, "u1");
    assert_eq!(r.key.container, "c");
}

#[test]
fn qos_from_parent_and_annotation() {
    let a = BTreeMap::new();
    let be = derive_request(&pod(&a, "/kubepods/besteffort/pod1"), "c", &res(2, 0, 0, 0)).unwrap();
    assert_eq!(be.qos, Qos::BestEffort);
    assert_eq!(be.cpu_request_milli, 0);
    let bu = derive_request(
        &pod(&a, "kubepods-burstable-pod1.slice"),
        "c",
        &res(1024, 100_000, 100_000, 64 << 20),
    )
    .unwrap();
    assert_eq!(bu.qos, Qos::Burstable);
    assert_eq!(bu.memory_request_bytes, 0);
    let g = derive_request(&pod(&a, "/kubepods/pod1"), "c", &res(512, 0, 0, 0)).unwrap();
    assert_eq!(g.qos, Qos::Guaranteed);
    let mut hinted = BTreeMap::new();
    hinted.insert(QOS_ANNOTATION.to_owned(), "BestEffort".to_owned());
    let h = derive_request(&pod(&hinted, "/kubepods/pod1"), "c", &res(512, 0, 0, 0)).unwrap();
    assert_eq!(h.qos, Qos::BestEffort);
    let none = derive_request(&pod(&a, "/x"), "c", &res(0, 0, 0, 0)).unwrap();
    assert_eq!(none.qos, Qos::BestEffort);
    let burst = derive_request(&pod(&a, "/x"), "c", &res(512, 0, 0, 0)).unwrap();
    assert_eq!(burst.qos, Qos::Burstable);
}

#[test]
fn resources_annotation_narrows_within_the_spec() {
    // A Burstable container: 1 CPU request and limit, 64 MiB limit.
    let mut a = BTreeMap::new();
    a.insert(
        format!("{RESOURCES_PREFIX}c"),
        r#"{"requests":{"cpu":"250m","memory":"32Mi"},"limits":{"cpu":"1","memory":"64Mi"}}"#
            .to_owned(),
    );
    let spec = res(1024, 100_000, 100_000, 64 << 20);
    let d = derive(&pod(&a, "/kubepods/burstable/pod1"), "c", &spec).unwrap();
    // No memory request known from the runtime (no `memory.min`): an
    // annotated one would be memory the scheduler never counted.
    let reasons: Vec<&str> = d.overreach.iter().map(|o| o.reason.as_str()).collect();
    assert_eq!(
        reasons,
        vec![
            "asks a memory request of 33554432 bytes, above the 0 bytes the pod spec is known \
             to give; the pod spec's is used"
        ]
    );
    let r = d.request;
    assert_eq!(r.cpu_request_milli, 250);
    assert_eq!(r.cpu_limit_milli, Some(1000));
    assert_eq!(r.memory_request_bytes, 0);
    assert_eq!(r.memory_limit_bytes, Some(64 << 20));
    assert_eq!(r.qos, Qos::Burstable);
    // With the kubelet's `memory.min` (Memory QoS) the request is known,
    // and the annotation may narrow it.
    let mut with_min = spec.clone();
    with_min
        .unified
        .insert("memory.min".into(), (48u64 << 20).to_string());
    let d = derive(&pod(&a, "/kubepods/burstable/pod1"), "c", &with_min).unwrap();
    assert!(d.overreach.is_empty(), "{:?}", d.overreach);
    assert_eq!(d.request.memory_request_bytes, 32 << 20);
    // Other containers of the pod do not pick it up.
    let other = derive_request(&pod(&a, "/kubepods/burstable/pod1"), "d", &spec).unwrap();
    assert_eq!(other.cpu_request_milli, 1000);
}

/// The attack: a BestEffort pod (no requests in its spec, so nothing the
/// scheduler or ResourceQuota counted) annotates itself Guaranteed with
/// 8 CPUs. It stays BestEffort with no CPU request, so no policy gives it
/// an exclusive CPU, and the refusal is reported.
#[test]
fn annotations_never_raise_a_best_effort_pod() {
    let a = BTreeMap::from([
        (QOS_ANNOTATION.to_owned(), "Guaranteed".to_owned()),
        (
            format!("{RESOURCES_PREFIX}c"),
            r#"{"requests":{"cpu":"8","memory":"1Gi"},"limits":{"cpu":"8","memory":"1Gi"}}"#
                .to_owned(),
        ),
    ]);
    // BestEffort as the kubelet creates it: 2 shares, no quota, no limit;
    // with its cgroup parent, and without one (the class then guessed
    // from the resources alone).
    for parent in [
        "/kubepods/besteffort/pod1",
        "kubepods-besteffort-pod1.slice",
        "/x",
    ] {
        let d = derive(&pod(&a, parent), "c", &res(2, 0, 0, 0)).unwrap();
        let r = &d.request;
        assert_eq!(r.qos, Qos::BestEffort, "{parent}");
        assert_eq!(r.cpu_request_milli, 0, "{parent}");
        assert_eq!(r.memory_request_bytes, 0, "{parent}");
        assert_eq!(exclusive_cpus(r), 0, "{parent}: {r:?}");
        let keys: Vec<&str> = d.overreach.iter().map(|o| o.key.as_str()).collect();
        assert!(keys.contains(&QOS_ANNOTATION), "{:?}", d.overreach);
        let text: Vec<String> = d.overreach.iter().map(|o| o.to_string()).collect();
        let text = text.join("\n");
        assert!(
            text.contains("asks Guaranteed, above the pod's QoS class BestEffort"),
            "{text}"
        );
        assert!(
            text.contains("cpu request of 8000m, above the 0m"),
            "{text}"
        );
        assert!(
            text.contains("memory request of 1073741824 bytes"),
            "{text}"
        );
    }
}

/// A Guaranteed pod may still narrow what it is given: fewer exclusive
/// CPUs than its spec, or none (Burstable).
#[test]
fn a_guaranteed_pod_may_narrow() {
    // Guaranteed, 4 CPUs, 256 MiB.
    let spec = res(4096, 400_000, 100_000, 256 << 20);
    let fewer = BTreeMap::from([(
        format!("{RESOURCES_PREFIX}c"),
        r#"{"requests":{"cpu":"2","memory":"128Mi"}}"#.to_owned(),
    )]);
    let d = derive(&pod(&fewer, "/kubepods/pod1"), "c", &spec).unwrap();
    assert!(d.overreach.is_empty(), "{:?}", d.overreach);
    assert_eq!(d.request.qos, Qos::Guaranteed);
    assert_eq!(d.request.cpu_request_milli, 2000);
    assert_eq!(d.request.memory_request_bytes, 128 << 20);
    assert_eq!(exclusive_cpus(&d.request), 2);
    let out = BTreeMap::from([(QOS_ANNOTATION.to_owned(), "Burstable".to_owned())]);
    let d = derive(&pod(&out, "/kubepods/pod1"), "c", &spec).unwrap();
    assert!(d.overreach.is_empty(), "{:?}", d.overreach);
    assert_eq!(d.request.qos, Qos::Burstable);
    assert_eq!(exclusive_cpus(&d.request), 0);
    // Saying what the spec says is no overreach.
    let same = BTreeMap::from([(QOS_ANNOTATION.to_owned(), "Guaranteed".to_owned())]);
    let d = derive(&pod(&same, "/kubepods/pod1"), "c", &spec).unwrap();
    assert!(d.overreach.is_empty(), "{:?}", d.overreach);
    assert_eq!(d.request.cpu_request_milli, 4000);
    assert_eq!(exclusive_cpus(&d.request), 4);
}

/// A request or limit above the spec is clamped to the spec, with the
/// reason; what stays within it is kept.
#[test]
fn annotations_above_the_spec_are_clamped_with_a_reason() {
    // Burstable: 1 CPU request, 2 CPU limit, 64 MiB limit.
    let spec = res(1024, 200_000, 100_000, 64 << 20);
    let a = BTreeMap::from([
        (QOS_ANNOTATION.to_owned(), "Guaranteed".to_owned()),
        (
            format!("{RESOURCES_PREFIX}c"),
            r#"{"requests":{"cpu":"3"},"limits":{"cpu":"4","memory":"32Mi"}}"#.to_owned(),
        ),
    ]);
    let d = derive(&pod(&a, "/kubepods/burstable/pod1"), "c", &spec).unwrap();
    let r = &d.request;
    assert_eq!(r.qos, Qos::Burstable);
    assert_eq!(r.cpu_request_milli, 1000);
    assert_eq!(r.cpu_limit_milli, Some(2000));
    // A lower memory limit is a narrowing: kept.
    assert_eq!(r.memory_limit_bytes, Some(32 << 20));
    let reasons: Vec<String> = d.overreach.iter().map(|o| o.to_string()).collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(
        reasons.iter().any(|t| t
            == "annotation resources.resmgr.steward.dev/spec.container.c asks a cpu limit of 4000m, \
                above the 2000m of the pod spec; the pod spec's is used"),
        "{reasons:?}"
    );
    // An unlimited spec may be limited by the annotation.
    let unlimited = res(1024, 0, 0, 0);
    let lim = BTreeMap::from([(
        format!("{RESOURCES_PREFIX}c"),
        r#"{"limits":{"cpu":"2","memory":"1Gi"}}"#.to_owned(),
    )]);
    let d = derive(&pod(&lim, "/kubepods/burstable/pod1"), "c", &unlimited).unwrap();
    assert!(d.overreach.is_empty(), "{:?}", d.overreach);
    assert_eq!(d.request.cpu_limit_milli, Some(2000));
    assert_eq!(d.request.memory_limit_bytes, Some(1 << 30));
}

#[test]
fn malformed_annotations_are_rejected() {
    let cases = [
        (QOS_ANNOTATION.to_owned(), "Platinum"),
        (format!("{RESOURCES_PREFIX}c"), "{not json"),
        (
            format!("{RESOURCES_PREFIX}c"),
            r#"{"requests":{"cpu":"lots"}}"#,
        ),
        (
            format!("{RESOURCES_PREFIX}c"),
            r#"{"requests":{"cpu":"2"},"limits":{"cpu":"1"}}"#,
        ),
        (
            format!("{RESOURCES_PREFIX}c"),
            r#"{"requests":{"gpu":"1"}}"#,
        ),
        (
            format!("{RESOURCES_PREFIX}c"),
            r#"{"requests":{"memory":"9Ei"}}"#,
        ),
        (RESOURCES_PREFIX.to_string(), "{}"),
        (BLOCKIO_POD.to_owned(), "has space"),
        ("frobnicate.resmgr.steward.dev/pod".to_owned(), "x"),
        // Found by the resmgr_annotations fuzz target: a malformed
        // policy hint used to pass RunPodSandbox and fail every
        // CreateContainer of the pod afterwards.
        ("memory.steward.dev/tier".to_owned(), "DRAM,P\rEM"),
        (
            "cpu.steward.dev/prefer-isolated.container.c".to_owned(),
            "yes",
        ),
        ("cpu.steward.dev/no-such-hint".to_owned(), "true"),
    ];
    for (k, v) in cases {
        let m = HashMap::from([(k.clone(), v.to_owned())]);
        let e = validate_annotations(&m).unwrap_err();
        assert!(matches!(e, ResmgrError::Annotation { .. }), "{k}={v}: {e}");
        assert_eq!(e.to_status().code(), tonic::Code::InvalidArgument);
    }
    let ok = HashMap::from([
        (QOS_ANNOTATION.to_owned(), "Burstable".to_owned()),
        (format!("{BLOCKIO_PREFIX}c"), "slow-io".to_owned()),
        ("some.other.io/thing".to_owned(), "whatever {".to_owned()),
        (
            "cpu.steward.dev/prefer-shared".to_owned(),
            "true".to_owned(),
        ),
        ("plain".to_owned(), "x".to_owned()),
    ]);
    validate_annotations(&ok).unwrap();
}

#[test]
fn absurd_resources_are_rejected() {
    let good = res(1024, 100_000, 100_000, 64 << 20);
    validate_resources(&good).unwrap();
    let cases = vec![
        cri::LinuxContainerResources {
            cpu_shares: 1,
            ..good.clone()
        },
        cri::LinuxContainerResources {
            cpu_shares: 1 << 40,
            ..good.clone()
        },
        cri::LinuxContainerResources {
            cpu_period: 10,
            ..good.clone()
        },
        cri::LinuxContainerResources {
            cpu_quota: 5,
            ..good.clone()
        },
        cri::LinuxContainerResources {
            cpu_quota: i64::MAX,
            ..good.clone()
        },
        cri::LinuxContainerResources {
            memory_limit_in_bytes: -5,
            ..good.clone()
        },
        cri::LinuxContainerResources {
            memory_limit_in_bytes: 1 << 62,
            ..good.clone()
        },
        cri::LinuxContainerResources {
            oom_score_adj: 5000,
            ..good.clone()
        },
        cri::LinuxContainerResources {
            cpuset_cpus: "0-".into(),
            ..good.clone()
        },
        cri::LinuxContainerResources {
            cpuset_cpus: "3-1".into(),
            ..good.clone()
        },
        cri::LinuxContainerResources {
            cpuset_mems: "a".into(),
            ..good.clone()
        },
        cri::LinuxContainerResources {
            hugepage_limits: vec![cri::HugepageLimit {
                page_size: "huge".into(),
                limit: 1,
            }],
            ..good.clone()
        },
    ];
    for c in cases {
        let e = validate_resources(&c).unwrap_err();
        assert_eq!(e.to_status().code(), tonic::Code::InvalidArgument, "{c:?}");
    }
    validate_resources(&cri::LinuxContainerResources {
        cpu_quota: -1,
        cpuset_cpus: "0-1".into(),
        hugepage_limits: vec![cri::HugepageLimit {
            page_size: "2MB".into(),
            limit: 0,
        }],
        ..good
    })
    .unwrap();
}

#[test]
fn classes_prefer_container_annotation() {
    let mut a = BTreeMap::new();
    a.insert(BLOCKIO_POD.to_owned(), "pod-class".to_owned());
    a.insert(format!("{BLOCKIO_PREFIX}db"), "db-class".to_owned());
    a.insert(RDT_POD.to_owned(), "gold".to_owned());
    assert_eq!(classes_for(&a, "db").blockio.as_deref(), Some("db-class"));
    assert_eq!(classes_for(&a, "web").blockio.as_deref(), Some("pod-class"));
    assert_eq!(classes_for(&a, "web").rdt.as_deref(), Some("gold"));
    assert_eq!(classes_for(&BTreeMap::new(), "web"), Classes::default());
}

proptest! {
    /// Whatever the kubelet derives from a whole-millicore request
    /// comes back as that request.
    #[test]
    fn kubelet_shares_roundtrip(milli in 3u64..=256_000) {
        let shares = ((milli * 1024) / 1000) as i64;
        let a = BTreeMap::new();
        let r = derive_request(&pod(&a, "/kubepods/burstable/p"), "c", &res(shares, 0, 0, 0)).unwrap();
        prop_assert_eq!(r.cpu_request_milli, milli);
    }
}
