//! CRI requests as the proxy receives them from kubelet: protobuf bytes,
//! decoded, then taken through every check and derivation the proxy does
//! before it decides anything (the runtime is never reached here). The
//! first byte picks the message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use steward_core::cpu::Hints;
use steward_proto::cri::runtime::v1 as cri;
use steward_resmgr::cache::PodRecord;
use steward_resmgr::requests::{
    PodFacts, classes_for, derive_request, validate_annotations, validate_own_annotations,
    validate_resources,
};

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => {
            let Ok(req) = cri::RunPodSandboxRequest::decode(bytes) else {
                return;
            };
            if let Some(config) = &req.config
                && validate_annotations(&config.annotations).is_ok()
            {
                let _ = PodRecord::from_config("sandbox", config);
            }
        }
        1 => {
            let Ok(req) = cri::CreateContainerRequest::decode(bytes) else {
                return;
            };
            create_container(&req);
        }
        _ => {
            let Ok(req) = cri::UpdateContainerResourcesRequest::decode(bytes) else {
                return;
            };
            if let Some(linux) = &req.linux {
                let _ = validate_resources(linux);
            }
        }
    }
});

/// What `CreateContainer` does before the policy and the runtime.
fn create_container(req: &cri::CreateContainerRequest) {
    let Some(config) = &req.config else { return };
    let Some(name) = config.metadata.as_ref().map(|m| m.name.clone()) else {
        return;
    };
    let kubelet = config
        .linux
        .as_ref()
        .and_then(|l| l.resources.clone())
        .unwrap_or_default();
    if validate_resources(&kubelet).is_err() {
        return;
    }
    let Some(sc) = &req.sandbox_config else {
        return;
    };
    if validate_own_annotations(&sc.annotations).is_err() {
        return;
    }
    let pod = PodRecord::from_config(&req.pod_sandbox_id, sc);
    let facts = PodFacts {
        uid: &pod.uid,
        name: &pod.name,
        namespace: &pod.namespace,
        cgroup_parent: &pod.cgroup_parent,
        annotations: &pod.annotations,
    };
    let Ok(request) = derive_request(&facts, &name, &kubelet) else {
        return;
    };
    let _ = classes_for(&pod.annotations, &name);
    let _ = Hints::parse(&request);
}
