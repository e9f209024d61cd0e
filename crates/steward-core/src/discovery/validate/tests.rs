use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;
use crate::discovery::{DeviceSpec, Mount};

fn device(id: &str) -> Device {
    Device {
        id: id.to_owned(),
        properties: BTreeMap::new(),
        mounts: Vec::new(),
        device_specs: Vec::new(),
    }
}

fn with_spec(id: &str, host_path: &str) -> Device {
    let mut d = device(id);
    d.device_specs.push(DeviceSpec {
        container_path: "/dev/x".to_owned(),
        host_path: host_path.to_owned(),
        permissions: "rw".to_owned(),
    });
    d
}

fn with_mount(id: &str, host_path: &str) -> Device {
    let mut d = device(id);
    d.mounts.push(Mount {
        container_path: "/data".to_owned(),
        host_path: host_path.to_owned(),
        read_only: true,
    });
    d
}

fn policy(max: usize, allowed: &[&str]) -> DevicePolicy {
    DevicePolicy {
        max_devices: max,
        allowed_host_paths: allowed.iter().map(|s| (*s).to_owned()).collect(),
    }
}

fn reasons(rejections: &[Rejection]) -> Vec<(String, RejectReason)> {
    rejections
        .iter()
        .map(|r| (r.device_id.clone(), r.reason.clone()))
        .collect()
}

#[test]
fn env_var_names() {
    for good in ["A", "_", "UDEV_DEVNODE", "a1", "_x_9"] {
        assert!(is_env_var_name(good), "{good}");
    }
    for bad in ["", "1A", "A-B", "A.B", "A B", "É", "A=B", "-"] {
        assert!(!is_env_var_name(bad), "{bad}");
    }
}

#[test]
fn host_path_normalization() {
    assert_eq!(
        normalize_host_path("/dev//video0/"),
        Some("/dev/video0".to_owned())
    );
    assert_eq!(normalize_host_path("/dev/./x"), Some("/dev/x".to_owned()));
    assert_eq!(normalize_host_path("/"), Some("/".to_owned()));
    assert_eq!(normalize_host_path("dev/x"), None);
    assert_eq!(normalize_host_path(""), None);
    assert_eq!(normalize_host_path("/dev/../etc/shadow"), None);
    assert_eq!(normalize_host_path("/dev/x\0"), None);
}

#[test]
fn prefixes_match_whole_components() {
    let allowed = vec!["/dev".to_owned(), "/run/udev/".to_owned()];
    assert_eq!(
        allowed_host_path("/dev/ttyUSB0", &allowed),
        Some("/dev/ttyUSB0".to_owned())
    );
    assert_eq!(allowed_host_path("/dev", &allowed), Some("/dev".to_owned()));
    assert_eq!(
        allowed_host_path("/run/udev/data", &allowed),
        Some("/run/udev/data".to_owned())
    );
    assert_eq!(allowed_host_path("/devices/x", &allowed), None);
    assert_eq!(allowed_host_path("/run", &allowed), None);
    assert_eq!(allowed_host_path("/dev/../etc", &allowed), None);
    // Malformed prefixes match nothing.
    let bad = vec!["dev".to_owned(), "/dev/../".to_owned()];
    assert_eq!(allowed_host_path("/dev/x", &bad), None);
    assert_eq!(
        allowed_host_path("/etc/x", &["/".to_owned()]),
        Some("/etc/x".to_owned())
    );
}

#[test]
fn each_reason_is_reported() {
    let mut bad_prop = device("p");
    bad_prop
        .properties
        .insert("NOT-VALID".to_owned(), "v".to_owned());
    bad_prop.properties.insert("OK".to_owned(), "v".to_owned());
    let input = vec![
        device("b"),
        device(""),
        device("b"),
        bad_prop,
        with_spec("s", "/etc/shadow"),
        with_mount("m", "/dev/../etc"),
        with_spec("good", "//dev//video0"),
        device("a"),
    ];
    let (ok, rejected) = validate(input, &policy(2, &["/dev"]));
    let ids: Vec<&str> = ok.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, vec!["a", "b"]);
    assert_eq!(
        reasons(&rejected),
        vec![
            (String::new(), RejectReason::EmptyId),
            ("b".to_owned(), RejectReason::DuplicateId),
            (
                "p".to_owned(),
                RejectReason::InvalidPropertyName("NOT-VALID".to_owned())
            ),
            (
                "s".to_owned(),
                RejectReason::HostPathNotAllowed("/etc/shadow".to_owned())
            ),
            (
                "m".to_owned(),
                RejectReason::HostPathNotAllowed("/dev/../etc".to_owned())
            ),
            ("good".to_owned(), RejectReason::OverLimit { limit: 2 }),
        ]
    );
}

#[test]
fn accepted_paths_are_normalized() {
    let (ok, rejected) = validate(
        vec![
            with_spec("v", "/dev//video0/"),
            with_mount("m", "/dev/./shm"),
        ],
        &DevicePolicy::default(),
    );
    assert!(rejected.is_empty());
    assert_eq!(ok[0].id, "m");
    assert_eq!(ok[0].mounts[0].host_path, "/dev/shm");
    assert_eq!(ok[1].device_specs[0].host_path, "/dev/video0");
}

#[test]
fn duplicate_of_a_rejected_first_copy_is_still_a_duplicate() {
    let (ok, rejected) = validate(
        vec![with_spec("x", "/etc"), device("x")],
        &DevicePolicy::default(),
    );
    assert!(ok.is_empty());
    assert_eq!(
        reasons(&rejected),
        vec![
            (
                "x".to_owned(),
                RejectReason::HostPathNotAllowed("/etc".to_owned())
            ),
            ("x".to_owned(), RejectReason::DuplicateId),
        ]
    );
}

#[test]
fn zero_limit_rejects_everything_valid() {
    let (ok, rejected) = validate(vec![device("a"), device("b")], &policy(0, &[]));
    assert!(ok.is_empty());
    assert_eq!(rejected.len(), 2);
    assert!(
        rejected
            .iter()
            .all(|r| r.reason == RejectReason::OverLimit { limit: 0 })
    );
}

#[test]
fn rejection_display_names_device_and_reason() {
    let r = Rejection {
        device_id: "cam".to_owned(),
        reason: RejectReason::HostPathNotAllowed("/etc".to_owned()),
    };
    assert_eq!(
        r.to_string(),
        "device \"cam\" rejected: host path \"/etc\" is not under an allowed prefix"
    );
    assert_eq!(
        RejectReason::OverLimit { limit: 3 }.to_string(),
        "report exceeds the limit of 3 devices"
    );
}

// ---------------------------------------------------------------------------
// Property tests.

fn path() -> impl Strategy<Value = String> {
    let part = prop::sample::select(vec![
        "", ".", "..", "dev", "devil", "etc", "video0", "run", "udev", "x",
    ]);
    (any::<bool>(), prop::collection::vec(part, 0..5)).prop_map(|(abs, parts)| {
        let joined = parts.join("/");
        if abs { format!("/{joined}") } else { joined }
    })
}

fn prop_name() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["A", "B_1", "_x", "1x", "a-b", "", "Z"]).prop_map(str::to_owned)
}

fn arb_device() -> impl Strategy<Value = Device> {
    (
        prop::sample::select(vec!["", "a", "b", "c", "d", "e", "f"]),
        prop::collection::btree_map(prop_name(), "[a-z]{0,3}", 0..3),
        prop::collection::vec(path(), 0..3),
        prop::collection::vec(path(), 0..3),
    )
        .prop_map(|(id, properties, mounts, specs)| Device {
            id: id.to_owned(),
            properties,
            mounts: mounts
                .into_iter()
                .map(|host_path| Mount {
                    container_path: "/c".to_owned(),
                    host_path,
                    read_only: false,
                })
                .collect(),
            device_specs: specs
                .into_iter()
                .map(|host_path| DeviceSpec {
                    container_path: "/c".to_owned(),
                    host_path,
                    permissions: "r".to_owned(),
                })
                .collect(),
        })
}

fn arb_policy() -> impl Strategy<Value = DevicePolicy> {
    (
        0usize..8,
        prop::collection::vec(
            prop::sample::select(vec!["/dev", "/run/udev", "/", "/dev/video0", "dev"]),
            0..3,
        ),
    )
        .prop_map(|(max_devices, allowed)| DevicePolicy {
            max_devices,
            allowed_host_paths: allowed.into_iter().map(str::to_owned).collect(),
        })
}

/// Independent oracle: a normalized absolute path equal to, or below, a
/// well-formed allowed prefix (compared as strings).
fn oracle_allowed(path: &str, allowed: &[String]) -> bool {
    let normalized = path.starts_with('/')
        && !path.split('/').any(|p| p == ".." || p == ".")
        && (path == "/" || (!path.ends_with('/') && !path.contains("//")));
    normalized
        && allowed.iter().any(|prefix| {
            let p = prefix.trim_end_matches('/');
            prefix.starts_with('/')
                && !prefix.split('/').any(|c| c == "..")
                && (p.is_empty() || path == p || path.starts_with(&format!("{p}/")))
        })
}

fn id_multiset<'a>(ids: impl Iterator<Item = &'a str>) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for id in ids {
        *m.entry(id.to_owned()).or_insert(0) += 1;
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn validation_partitions_and_enforces_policy(
        devices in prop::collection::vec(arb_device(), 0..12),
        policy in arb_policy(),
    ) {
        let input_ids = id_multiset(devices.iter().map(|d| d.id.as_str()));
        let (ok, rejected) = validate(devices.clone(), &policy);

        // Output and rejections partition the input.
        let mut out_ids = id_multiset(ok.iter().map(|d| d.id.as_str()));
        for r in &rejected {
            *out_ids.entry(r.device_id.clone()).or_insert(0) += 1;
        }
        prop_assert_eq!(out_ids, input_ids);

        // Ids unique, non-empty, sorted; within the limit.
        let ids: Vec<&str> = ok.iter().map(|d| d.id.as_str()).collect();
        let unique: BTreeSet<&str> = ids.iter().copied().collect();
        prop_assert_eq!(unique.len(), ids.len());
        prop_assert!(ids.iter().all(|id| !id.is_empty()));
        prop_assert!(ids.windows(2).all(|w| w[0] < w[1]));
        prop_assert!(ok.len() <= policy.max_devices);

        // Nothing outside the allowlist survives; properties are env names.
        for d in &ok {
            for p in d.mounts.iter().map(|m| &m.host_path)
                .chain(d.device_specs.iter().map(|s| &s.host_path))
            {
                prop_assert!(oracle_allowed(p, &policy.allowed_host_paths), "{p} survived");
            }
            prop_assert!(d.properties.keys().all(|k| is_env_var_name(k)));
        }

        // Accepted devices keep their data apart from path normalization.
        for d in &ok {
            let original = devices.iter().find(|o| o.id == d.id);
            prop_assert!(original.is_some());
            if let Some(o) = original {
                prop_assert_eq!(&o.properties, &d.properties);
                prop_assert_eq!(o.mounts.len(), d.mounts.len());
                prop_assert_eq!(o.device_specs.len(), d.device_specs.len());
            }
        }

        // The first copy of each non-empty id is never a DuplicateId.
        let mut seen = BTreeSet::new();
        let mut dup_expected = 0usize;
        for d in &devices {
            if !d.id.is_empty() && !seen.insert(d.id.as_str()) {
                dup_expected += 1;
            }
        }
        let dups = rejected.iter().filter(|r| r.reason == RejectReason::DuplicateId).count();
        prop_assert_eq!(dups, dup_expected);

        // Over the limit only if the limit was reached, and only ids above
        // every accepted id.
        for r in &rejected {
            if r.reason == (RejectReason::OverLimit { limit: policy.max_devices }) {
                prop_assert_eq!(ok.len(), policy.max_devices);
                prop_assert!(ok.iter().all(|d| d.id < r.device_id));
            }
        }
    }

    #[test]
    fn validation_is_idempotent(
        devices in prop::collection::vec(arb_device(), 0..12),
        policy in arb_policy(),
    ) {
        let (ok, _) = validate(devices, &policy);
        let (again, rejected) = validate(ok.clone(), &policy);
        prop_assert_eq!(again, ok);
        prop_assert!(rejected.is_empty());
    }
}
