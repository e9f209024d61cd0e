//! The standalone agent's Configurations file (multi-document YAML), and
//! the conversions the agent makes of each Configuration it accepts.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use steward_agent::source::parse_configurations;
use steward_api::{config_key, owner_reference};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(configs) = parse_configurations(Path::new("configurations.yaml"), text) else {
        return;
    };
    for c in &configs {
        assert!(c.metadata.name.as_deref().is_some_and(|n| !n.is_empty()));
        let _ = config_key(c);
        let _ = owner_reference(c);
        let _ = c.spec.device_policy();
    }
});
