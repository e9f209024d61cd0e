//! The names of a client certificate, read from its DER by steward's own
//! reader (the extender's client-name check). Only certificates the TLS
//! verifier accepted reach it, but the reader must hold on any bytes:
//! never a panic, and every name it returns is bytes of the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use steward_nodeio::bounded::certificate_names;

fuzz_target!(|data: &[u8]| {
    for name in certificate_names(data) {
        assert!(
            name.is_empty() || data.windows(name.len()).any(|w| w == name.as_bytes()),
            "{name:?} is not in the input"
        );
    }
});
