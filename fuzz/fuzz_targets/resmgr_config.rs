//! The CRI proxy's configuration: the file an operator edits and the
//! ConfigMap it can follow in the cluster.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use steward_resmgr::FileConfig;
use steward_resmgr::cluster_config::{Selected, parse_selected};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/etc/steward/resmgr.yaml");
    let _ = FileConfig::parse(text, path);
    let _ = FileConfig::parse_initial(text, path);
    let _ = parse_selected(
        "kube-system",
        Some(Selected {
            name: "steward-resmgr".into(),
            document: Some(text.to_owned()),
        }),
    );
});
