//! kube-scheduler's `ExtenderArgs` JSON as the extender's `/filter` and
//! `/prioritize` read it: parsed, then the candidate nodes and the slots
//! the pod asks for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use steward_extender::{ExtenderArgs, slot_request};

fuzz_target!(|data: &[u8]| {
    let Ok(args) = serde_json::from_slice::<ExtenderArgs>(data) else {
        return;
    };
    let _ = args.candidates();
    let asked = slot_request(&args.pod);
    assert!(asked.values().all(|n| *n > 0));
});
