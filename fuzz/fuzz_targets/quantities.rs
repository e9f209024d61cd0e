//! Small text forms from configuration and Kubernetes objects: CPU and
//! memory quantities, Go-style durations, slot ids.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = steward_core::quantity::parse_cpu_quantity(text);
    let _ = steward_core::quantity::parse_memory_quantity(text);
    if let Ok(n) = steward_core::quantity::parse_count(text) {
        assert_eq!(steward_core::quantity::parse_memory_quantity(text), Ok(n));
    }
    if let Ok(d) = steward_discovery::duration::parse_duration(text) {
        assert!(d.as_secs() < u64::MAX);
    }
    if let Some((instance, n)) = steward_core::slots::parse_slot_id(text) {
        assert_eq!(steward_core::slots::slot_id(instance, n), text);
    }
});
