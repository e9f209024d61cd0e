//! Tests of request derivation from CRI calls and annotations.

use super::*;
use proptest::prelude::*;

fn pod<'a>(annotations: &'a BTreeMap<String, String>, parent: &'static str) -> PodFacts<'a> {
    PodFacts {
        uid: "u1",
        name: "p",
        namespace: "ns",
        cgroup_parent: parent,
        annotations,
    }
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
fn resources_annotation_overrides_and_supplies_memory_request() {
    let mut a = BTreeMap::new();
    a.insert(
        format!("{RESOURCES_PREFIX}c"),
        r#"{"requests":{"cpu":"250m","memory":"32Mi"},"limits":{"cpu":"1","memory":"64Mi"}}"#
            .to_owned(),
    );
    let r = derive_request(&pod(&a, "/x"), "c", &res(2, 0, 0, 0)).unwrap();
    assert_eq!(r.cpu_request_milli, 250);
    assert_eq!(r.cpu_limit_milli, Some(1000));
    assert_eq!(r.memory_request_bytes, 32 << 20);
    assert_eq!(r.memory_limit_bytes, Some(64 << 20));
    assert_eq!(r.qos, Qos::Burstable);
    // Other containers of the pod do not pick it up.
    let other = derive_request(&pod(&a, "/x"), "d", &res(2, 0, 0, 0)).unwrap();
    assert_eq!(other.cpu_request_milli, 0);
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
