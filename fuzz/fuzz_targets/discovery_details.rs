//! A Configuration's `discoveryHandler.details`, as each embedded handler
//! parses it before it discovers anything. The first byte picks the
//! handler; nothing here touches the machine (the udev handler's rules
//! are parsed, not monitored; the network handler plans, never probes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use steward_discovery::DiscoverRequest;
use steward_discovery::DiscoveryHandler;
use steward_discovery::handlers::debug_echo::DebugEcho;
use steward_discovery::handlers::network;
use steward_discovery::handlers::udev::RuleSet;

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let Ok(details) = std::str::from_utf8(bytes) else {
        return;
    };
    match which % 3 {
        0 => {
            // Parsing happens in `discover`; the stream is lazy and dropped.
            let _ = DebugEcho::new(which & 0x80 != 0).discover(DiscoverRequest::new(details));
        }
        1 => {
            let _ = network::plan(details, &network::ProbeScope::default());
        }
        _ => {
            let _ = RuleSet::from_details(details);
        }
    }
});
