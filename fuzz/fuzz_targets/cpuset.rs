//! The Linux cpuset list form (`0-3,8`), read from sysfs, cgroup files,
//! CRI requests and annotations. Whatever parses must print back to a
//! string that parses to the same set.
#![no_main]

use libfuzzer_sys::fuzz_target;
use steward_core::cpu::CpuSet;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(set) = CpuSet::parse(text) {
        let printed = set.to_string();
        let again = CpuSet::parse(&printed);
        assert_eq!(again.as_ref(), Ok(&set), "{text:?} printed as {printed:?}");
        assert_eq!(set.iter().count(), set.len());
    }
    // The CRI request path wraps the same parser with the field's name.
    let _ = steward_resmgr::requests::parse_cpuset("cpuset_cpus", text);
});
