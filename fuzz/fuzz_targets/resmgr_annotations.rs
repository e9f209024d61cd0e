//! Pod annotations the resource manager reads (`*.steward.dev` policy
//! hints, per-container resources, block I/O and RDT classes). Input: one
//! `key=value` per line; the container is named `c`.
#![no_main]

use std::collections::{BTreeMap, HashMap};

use libfuzzer_sys::fuzz_target;
use steward_core::cpu::Hints;
use steward_proto::cri::runtime::v1 as cri;
use steward_resmgr::ResmgrError;
use steward_resmgr::requests::{PodFacts, classes_for, derive_request, validate_annotations};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let pairs: HashMap<String, String> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let valid = validate_annotations(&pairs).is_ok();
    let annotations: BTreeMap<String, String> = pairs.into_iter().collect();
    let facts = PodFacts {
        uid: "0c7e1f9a-uid",
        name: "pod",
        namespace: "default",
        cgroup_parent: "/kubepods/burstable/pod0c7e1f9a",
        annotations: &annotations,
    };
    let resources = cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 200_000,
        cpu_shares: 2048,
        memory_limit_in_bytes: 1 << 30,
        ..Default::default()
    };
    let derived = derive_request(&facts, "c", &resources);
    // Annotations the proxy accepted at RunPodSandbox must not fail the
    // pod's CreateContainer later for being malformed (they may still
    // contradict that container's own CRI resources).
    if valid {
        assert!(
            !matches!(derived, Err(ResmgrError::Annotation { .. })),
            "accepted {annotations:?}, then {derived:?}"
        );
    }
    let _ = classes_for(&annotations, "c");
    if let Ok(request) = derived {
        let _ = Hints::parse(&request);
    }
});
