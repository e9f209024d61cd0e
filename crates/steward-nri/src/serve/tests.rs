use prost::Message;

use super::*;
use crate::events::EventMask;
use crate::proto::nri::{
    ContainerAdjustment, CreateContainerResponse, Event, LinuxContainerAdjustment, LinuxCpu,
    LinuxResources,
};

#[derive(Default)]
struct Pinner {
    synced: Mutex<Vec<(usize, usize)>>,
}

impl Handler for Pinner {
    async fn configure(&self, _req: ConfigureRequest) -> Result<EventMask, RpcStatus> {
        Ok(EventMask::of(&[Event::CreateContainer]))
    }

    async fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
    ) -> Result<Vec<crate::proto::nri::ContainerUpdate>, RpcStatus> {
        if let Ok(mut s) = self.synced.lock() {
            s.push((pods.len(), containers.len()));
        }
        Ok(Vec::new())
    }

    async fn create_container(
        &self,
        req: CreateContainerRequest,
    ) -> Result<CreateContainerResponse, RpcStatus> {
        let name = req.container.map(|c| c.name).unwrap_or_default();
        if name == "greedy" {
            return Err(RpcStatus::new(
                Code::ResourceExhausted,
                "no exclusive CPUs left",
            ));
        }
        Ok(CreateContainerResponse {
            adjust: Some(ContainerAdjustment {
                linux: Some(LinuxContainerAdjustment {
                    resources: Some(LinuxResources {
                        cpu: Some(LinuxCpu {
                            cpus: "0".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

fn rt() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread().build() {
        Ok(rt) => rt,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn configure_answers_the_handlers_mask_and_keeps_the_timeout() {
    let svc = PluginService::new(Pinner::default());
    let req = ConfigureRequest {
        request_timeout: 1500,
        ..Default::default()
    };
    let out = rt().block_on(svc.call(PLUGIN_SERVICE, "Configure", &req.encode_to_vec()));
    let resp = out
        .ok()
        .and_then(|b| ConfigureResponse::decode(b.as_slice()).ok());
    assert_eq!(resp.map(|r| r.events), Some(1 << 3));
    assert_eq!(svc.request_timeout(), Duration::from_millis(1500));
}

#[test]
fn create_container_answers_the_adjustment_or_the_refusal() {
    let svc = PluginService::new(Pinner::default());
    let req = |name: &str| CreateContainerRequest {
        pod: None,
        container: Some(Container {
            name: name.into(),
            ..Default::default()
        }),
    };
    let rt = rt();
    let ok = rt.block_on(svc.call(PLUGIN_SERVICE, "CreateContainer", &req("c").encode_to_vec()));
    let cpus = ok
        .ok()
        .and_then(|b| CreateContainerResponse::decode(b.as_slice()).ok())
        .and_then(|r| r.adjust?.linux?.resources?.cpu)
        .map(|c| c.cpus);
    assert_eq!(cpus.as_deref(), Some("0"));
    let refused = rt.block_on(svc.call(
        PLUGIN_SERVICE,
        "CreateContainer",
        &req("greedy").encode_to_vec(),
    ));
    assert_eq!(
        refused.err(),
        Some(RpcStatus::new(
            Code::ResourceExhausted,
            "no exclusive CPUs left"
        ))
    );
}

/// Unknown services and methods (newer NRI's dedicated lifecycle calls, for
/// one) answer Unimplemented with upstream ttrpc's wording; calls the handler
/// does not override answer an empty success, as upstream's stub does.
#[test]
fn unserved_calls_answer_unimplemented() {
    let svc = PluginService::new(Pinner::default());
    let rt = rt();
    let e = rt
        .block_on(svc.call("other.Service", "Configure", &[]))
        .err();
    assert_eq!(
        e,
        Some(RpcStatus::new(Code::Unimplemented, "service other.Service"))
    );
    let e = rt
        .block_on(svc.call(PLUGIN_SERVICE, "RunPodSandbox", &[]))
        .err();
    assert_eq!(
        e,
        Some(RpcStatus::new(Code::Unimplemented, "method RunPodSandbox"))
    );
    let ok = rt.block_on(svc.call(PLUGIN_SERVICE, "StopContainer", &[]));
    assert_eq!(ok, Ok(Vec::new()));
    let ok = rt.block_on(svc.call(PLUGIN_SERVICE, "StateChange", &[]));
    assert_eq!(ok, Ok(Vec::new()));
    let e = rt
        .block_on(svc.call(PLUGIN_SERVICE, "CreateContainer", &[0xff]))
        .err();
    assert_eq!(e.map(|s| s.code), Some(Code::InvalidArgument));
}

/// A split Synchronize is answered `more` until its last part; the handler
/// sees everything once.
#[test]
fn split_synchronize_reaches_the_handler_once() {
    let svc = PluginService::new(Pinner::default());
    let rt = rt();
    let part = |pods: usize, ctrs: usize, more: bool| SynchronizeRequest {
        pods: vec![PodSandbox::default(); pods],
        containers: vec![Container::default(); ctrs],
        more,
    };
    for (p, more) in [(part(2, 3, true), true), (part(1, 4, false), false)] {
        let out = rt.block_on(svc.call(PLUGIN_SERVICE, "Synchronize", &p.encode_to_vec()));
        let resp = out
            .ok()
            .and_then(|b| SynchronizeResponse::decode(b.as_slice()).ok());
        assert_eq!(resp.map(|r| r.more), Some(more));
    }
    let synced = svc
        .handler()
        .synced
        .lock()
        .map(|s| s.clone())
        .unwrap_or_default();
    assert_eq!(synced, [(3, 7)]);
}
