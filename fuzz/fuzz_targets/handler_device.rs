//! A discovery handler's report (`DiscoverResponse` protobuf), as the agent
//! receives it from a handler it does not trust: decoded, converted,
//! validated against the default policy (host paths under `/dev`), named.
#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use steward_core::discovery::ConfigKey;
use steward_core::discovery::instances::{instance_name, is_dns1123_subdomain};
use steward_core::discovery::validate::{DevicePolicy, validate};
use steward_discovery::convert::device_from_proto;
use steward_proto::discovery::v0 as proto;

fuzz_target!(|data: &[u8]| {
    let Ok(report) = proto::DiscoverResponse::decode(data) else {
        return;
    };
    let devices: Vec<_> = report.devices.into_iter().map(device_from_proto).collect();
    let total = devices.len();
    let policy = DevicePolicy {
        max_devices: 4,
        ..DevicePolicy::default()
    };
    let (accepted, rejected) = validate(devices, &policy);
    // Every device is accounted for exactly once.
    assert_eq!(accepted.len() + rejected.len(), total);
    assert!(accepted.len() <= policy.max_devices);
    let ids: BTreeSet<&str> = accepted.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids.len(), accepted.len(), "duplicate ids accepted");
    let key = ConfigKey::new("default", "fuzz-config");
    for d in &accepted {
        assert!(!d.id.is_empty());
        for p in d
            .mounts
            .iter()
            .map(|m| &m.host_path)
            .chain(d.device_specs.iter().map(|s| &s.host_path))
        {
            assert!(p == "/dev" || p.starts_with("/dev/"), "{p:?} accepted");
            assert!(!p.split('/').any(|c| c == ".."), "{p:?} accepted");
        }
        for name in d.properties.keys() {
            // It becomes an environment variable name in the container.
            let mut chars = name.chars();
            let first = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
            assert!(
                first && chars.all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "property name {name:?} accepted"
            );
        }
        assert!(is_dns1123_subdomain(&instance_name(
            &key, &d.id, false, "node-a"
        )));
        assert!(is_dns1123_subdomain(&instance_name(
            &key, &d.id, true, "node-a"
        )));
    }
});
