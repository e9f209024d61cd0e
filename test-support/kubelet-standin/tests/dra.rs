//! DRA: claims prepared before the pod starts (CDI IDs handed to the
//! containers), per-claim errors, unprepare when the last pod using a
//! claim ends, the checkpoint across restarts, podresources.
// Test helpers: panicking on an unexpected answer is the point.
#![allow(clippy::unwrap_used)]

mod common;

use common::WAIT;
use common::dra::{DRIVER, DraEnv, NODE, dra_env};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::ListParams;
use steward_proto::podresources::v1::{
    GetPodResourcesRequest, ListPodResourcesRequest,
    pod_resources_lister_client::PodResourcesListerClient,
};
use steward_testing_kubelet::{
    ContainerSpec, Error, FAILED_PREPARE_DYNAMIC_RESOURCES, Kubelet, KubeletConfig, Phase, PodSpec,
    connect_unix,
};

fn pod(name: &str, claim: &str) -> PodSpec {
    PodSpec::new("default", name)
        .resource_claim("devs", claim)
        .container(ContainerSpec::new("main").claim("devs"))
        .container(ContainerSpec::new("plain"))
}

fn cdi(devices: &[&str]) -> Vec<String> {
    devices
        .iter()
        .map(|d| format!("{DRIVER}/test={d}"))
        .collect()
}

async fn started(env: &DraEnv, spec: PodSpec) -> steward_testing_kubelet::AdmittedPod {
    let spec = env.schedule(spec).await;
    env.kubelet.add_pod(spec).await.unwrap()
}

#[tokio::test]
async fn claims_are_prepared_before_start_and_cdi_ids_reach_the_containers() {
    let env = dra_env(&["d0", "d1", "d2"]).await;
    env.claim("pair", 2).await;
    let claim_uid = env.claim_uid("pair").await;
    let admitted = started(&env, pod("p", "pair")).await;

    assert_eq!(admitted.cdi_devices.get("main"), Some(&cdi(&["d0", "d1"])));
    assert!(!admitted.cdi_devices.contains_key("plain"));
    assert_eq!(
        env.kubelet.pod(&admitted.uid).unwrap().phase,
        Phase::Running
    );
    let calls = env.plugin.calls();
    assert_eq!(calls.prepare.len(), 1);
    let wire = &calls.prepare[0];
    assert_eq!(wire.len(), 1);
    assert_eq!(
        (
            wire[0].namespace.as_str(),
            wire[0].name.as_str(),
            wire[0].uid.as_str()
        ),
        ("default", "pair", claim_uid.as_str())
    );
    assert_eq!(env.plugin.prepared(), [claim_uid.clone()].into());

    // The claim info, and its checkpoint in kubelet's format.
    let info = env.kubelet.dra_claim("default", "pair").unwrap();
    assert!(info.prepared);
    assert_eq!(info.pod_uids, [admitted.uid.clone()].into());
    let devices = &info.drivers[DRIVER].devices;
    assert_eq!(devices.len(), 2);
    assert_eq!(
        (
            devices[0].pool_name.as_str(),
            devices[0].request_names.as_slice()
        ),
        (NODE, &["devs".to_string()][..])
    );
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.kubelet.dra_checkpoint_path()).unwrap()).unwrap();
    let data: serde_json::Value = serde_json::from_str(file["Data"].as_str().unwrap()).unwrap();
    assert_eq!(data["kind"], "DRACheckpoint");
    assert_eq!(data["Entries"][0]["ClaimUID"], claim_uid.as_str());
    assert!(
        data["Entries"][0]["PodUIDs"].get(&admitted.uid).is_some(),
        "{data}"
    );
    assert!(file["Checksum"].is_u64());

    // podresources reports the claim for the container that uses it.
    let channel = connect_unix(env.kubelet.pod_resources_socket())
        .await
        .unwrap();
    let mut client = PodResourcesListerClient::new(channel);
    let list = client
        .list(ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let containers = &list.pod_resources[0].containers;
    let main = containers.iter().find(|c| c.name == "main").unwrap();
    let plain = containers.iter().find(|c| c.name == "plain").unwrap();
    assert!(plain.dynamic_resources.is_empty());
    assert_eq!(main.dynamic_resources.len(), 1);
    let dynamic = &main.dynamic_resources[0];
    assert_eq!(
        (
            dynamic.claim_name.as_str(),
            dynamic.claim_namespace.as_str()
        ),
        ("pair", "default")
    );
    let rows: Vec<(String, String, String, Vec<String>)> = dynamic
        .claim_resources
        .iter()
        .map(|r| {
            (
                r.driver_name.clone(),
                r.pool_name.clone(),
                r.device_name.clone(),
                r.cdi_devices.iter().map(|c| c.name.clone()).collect(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (
                DRIVER.to_string(),
                NODE.to_string(),
                "d0".to_string(),
                cdi(&["d0"])
            ),
            (
                DRIVER.to_string(),
                NODE.to_string(),
                "d1".to_string(),
                cdi(&["d1"])
            ),
        ]
    );
    let got = client
        .get(GetPodResourcesRequest {
            pod_name: "p".into(),
            pod_namespace: "default".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.pod_resources.unwrap().containers, *containers);
    assert_eq!(
        env.kubelet.cdi_devices(&admitted.uid).unwrap(),
        admitted.cdi_devices
    );

    // The pod ends: the claim is unprepared and forgotten.
    env.kubelet
        .terminate_pod(&admitted.uid, Phase::Succeeded)
        .await
        .unwrap();
    assert_eq!(env.plugin.calls().unprepare, vec![wire.clone()]);
    assert!(env.plugin.prepared().is_empty());
    assert!(env.kubelet.dra_claims().is_empty());
}

#[tokio::test]
async fn a_per_claim_error_keeps_the_pod_from_starting() {
    let env = dra_env(&["d0", "d1"]).await;
    env.claim("good", 1).await;
    env.claim("broken", 1).await;
    env.plugin.fail_claim("broken", Some("device on fire"));
    let spec = PodSpec::new("default", "p")
        .resource_claim("a", "good")
        .resource_claim("b", "broken")
        .container(ContainerSpec::new("main").claim("a").claim("b"));
    let spec = env.schedule(spec).await;
    let uid = spec.uid.clone().unwrap();
    let err = env.kubelet.add_pod(spec).await.unwrap_err();
    let Error::PrepareResources {
        uid: failed,
        message,
    } = &err
    else {
        panic!("unexpected {err:?}");
    };
    assert_eq!(failed, &uid);
    assert_eq!(
        message,
        "prepare dynamic resources: NodePrepareResources failed for ResourceClaim broken: device on fire"
    );
    let record = env.kubelet.pod(&uid).unwrap();
    assert_eq!(record.phase, Phase::Pending);
    assert_eq!(
        record.reason.as_deref(),
        Some(FAILED_PREPARE_DYNAMIC_RESOURCES)
    );
    assert_eq!(
        record.message.as_deref(),
        Some(format!("Failed to prepare dynamic resources: {message}").as_str())
    );

    // As kubelet shows it: Pending, containers waiting, a Warning event.
    let pods: Api<Pod> = Api::default_namespaced(env.client.clone());
    let status = pods.get("p").await.unwrap().status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    let waiting = status.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
    let events: Api<Event> = Api::default_namespaced(env.client.clone());
    let events = events.list(&ListParams::default()).await.unwrap().items;
    let event = events
        .iter()
        .find(|e| e.reason.as_deref() == Some(FAILED_PREPARE_DYNAMIC_RESOURCES))
        .expect("a FailedPrepareDynamicResources event");
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.involved_object.uid.as_deref(), Some(uid.as_str()));
    assert!(event.message.as_deref().unwrap().contains("device on fire"));

    // Both claims reference the pod; neither is prepared.
    for name in ["good", "broken"] {
        let info = env.kubelet.dra_claim("default", name).unwrap();
        assert!(!info.prepared, "{name}");
        assert!(info.pod_uids.contains(&uid));
    }
    // Deleting the pod unprepares both (kubelet unprepares what it referenced).
    env.kubelet.delete_pod(&uid).await.unwrap();
    let unprepared: Vec<String> = env
        .plugin
        .calls()
        .unprepare
        .concat()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(unprepared, ["broken", "good"]);
    assert!(env.kubelet.dra_claims().is_empty());
}

#[tokio::test]
async fn a_shared_claim_is_unprepared_when_its_last_pod_ends() {
    let env = dra_env(&["d0"]).await;
    env.claim("shared", 1).await;
    let first = started(&env, pod("first", "shared")).await;
    let second = started(&env, pod("second", "shared")).await;
    // Prepared once; both pods get the same device.
    assert_eq!(env.plugin.calls().prepare.len(), 1);
    assert_eq!(first.cdi_devices["main"], cdi(&["d0"]));
    assert_eq!(second.cdi_devices, first.cdi_devices);
    let info = env.kubelet.dra_claim("default", "shared").unwrap();
    assert_eq!(
        info.pod_uids,
        [first.uid.clone(), second.uid.clone()].into()
    );

    env.kubelet
        .terminate_pod(&first.uid, Phase::Succeeded)
        .await
        .unwrap();
    assert!(
        env.plugin.calls().unprepare.is_empty(),
        "still used by the second pod"
    );
    let info = env.kubelet.dra_claim("default", "shared").unwrap();
    assert_eq!(info.pod_uids, [second.uid.clone()].into());

    env.kubelet
        .terminate_pod(&second.uid, Phase::Failed)
        .await
        .unwrap();
    let unprepare = env.plugin.calls().unprepare;
    assert_eq!(unprepare.len(), 1);
    assert_eq!(unprepare[0][0].name, "shared");
    assert!(env.kubelet.dra_claim("default", "shared").is_none());
    assert!(env.plugin.prepared().is_empty());
}

#[tokio::test]
async fn after_restarts_plugins_re_register_and_claims_are_still_unprepared() {
    let env = dra_env(&["d0", "d1"]).await;
    env.plugin.wait_for_notifications(1, WAIT).await.unwrap();
    env.claim("kept", 1).await;
    env.claim("later", 1).await;
    let kept = started(&env, pod("kept", "kept")).await;
    let later = started(&env, pod("later", "later")).await;
    let kept_uid = env.claim_uid("kept").await;

    // kubelet restarts: the registration socket stays and is registered again.
    env.kubelet.restart().await.unwrap();
    assert!(env.plugin.registration_socket().exists());
    let notes = env.plugin.wait_for_notifications(2, WAIT).await.unwrap();
    assert!(
        notes
            .iter()
            .all(|n| n.plugin_registered && n.error.is_empty()),
        "{notes:?}"
    );
    assert!(env.plugin.calls().get_info >= 2);
    env.kubelet.wait_for_dra_driver(DRIVER, WAIT).await.unwrap();
    let restored = env.kubelet.dra_claim("default", "kept").unwrap();
    assert_eq!(restored.uid, kept_uid);
    assert!(restored.pod_uids.contains(&kept.uid));
    assert!(
        !restored.prepared,
        "restored claim infos count as not prepared"
    );
    env.kubelet
        .terminate_pod(&kept.uid, Phase::Succeeded)
        .await
        .unwrap();
    let unprepared: Vec<String> = env
        .plugin
        .calls()
        .unprepare
        .concat()
        .into_iter()
        .map(|c| c.uid)
        .collect();
    assert_eq!(unprepared, [kept_uid]);

    // A new stand-in process on the same root: same story from the checkpoint.
    let root = env.dir.path().to_path_buf();
    let client = env.client.clone();
    let DraEnv {
        kubelet,
        plugin,
        dir,
        api,
        ..
    } = env;
    drop(kubelet);
    let kubelet = Kubelet::start(KubeletConfig {
        root_dir: root,
        node_name: NODE.into(),
        api: Some(client),
    })
    .await
    .unwrap();
    kubelet.wait_for_dra_driver(DRIVER, WAIT).await.unwrap();
    plugin.wait_for_notifications(3, WAIT).await.unwrap();
    assert_eq!(kubelet.dra_claims().len(), 1);
    kubelet.delete_pod(&later.uid).await.unwrap();
    let unprepare = plugin.calls().unprepare;
    assert_eq!(unprepare.last().unwrap()[0].name, "later");
    assert!(kubelet.dra_claims().is_empty());
    drop((dir, api));
}

#[tokio::test]
async fn missing_driver_and_missing_reservation_fail_like_kubelet() {
    let mut env = dra_env(&["d0", "d1"]).await;
    env.claim("unreserved", 1).await;
    let spec = pod("stranger", "unreserved");
    let uid = env.kubelet.create_pod_object(&spec).await.unwrap();
    let err = env
        .kubelet
        .add_pod(spec.uid(uid.clone()))
        .await
        .unwrap_err();
    let claim_uid = env.claim_uid("unreserved").await;
    assert!(
        err.to_string().ends_with(&format!(
            "prepare dynamic resources: pod stranger ({uid}) is not allowed to use ResourceClaim unreserved ({claim_uid})"
        )),
        "{err}"
    );
    assert!(
        env.kubelet.dra_claims().is_empty(),
        "validation changes nothing"
    );

    // The driver goes away: its claims cannot be prepared.
    env.plugin.stop().await;
    env.kubelet
        .wait_for_dra_plugins(|p| p.is_empty(), WAIT)
        .await
        .unwrap();
    env.claim("orphan", 1).await;
    let spec = env.schedule(pod("orphaned", "orphan")).await;
    let err = env.kubelet.add_pod(spec).await.unwrap_err();
    assert!(
        matches!(&err, Error::PrepareResources { message, .. } if message == "prepare dynamic resources: DRA driver steward.dev is not registered"),
        "{err}"
    );
    assert!(env.kubelet.dra_claims().is_empty());

    // Without an API server, claims cannot be read at all.
    let plain = common::start().await;
    let err = plain.kubelet.add_pod(pod("p", "c")).await.unwrap_err();
    assert!(matches!(err, Error::InvalidPod(_)), "{err}");
}

/// The DRA paths keep the stand-in's futures `Send` (tests spawn them on
/// multi-threaded runtimes); this only has to compile.
#[allow(dead_code)]
fn futures_stay_send(kubelet: &Kubelet, spec: PodSpec) {
    fn send<T: Send>(_: T) {}
    send(kubelet.add_pod(spec.clone()));
    send(kubelet.create_pod_object(&spec));
    send(kubelet.terminate_pod("uid", Phase::Succeeded));
    send(kubelet.delete_pod("uid"));
    send(kubelet.restart());
    send(kubelet.wait_for_dra_driver("steward.dev", WAIT));
}
