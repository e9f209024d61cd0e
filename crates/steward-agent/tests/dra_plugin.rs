//! The DRA kubelet plugin over its real sockets, the way kubelet calls it:
//! registration (GetInfo / NotifyRegistrationStatus), then
//! NodePrepareResources / NodeUnprepareResources for ResourceClaims the
//! API server stand-in holds — beside the device plugins on the same slot
//! ledger, across an agent kill.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::path::Path;

use dp::*;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimConsumerReference, ResourceClaimStatus,
};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use steward_agent::dra::DraPluginConfig;
use steward_core::dra::device_name;
use steward_proto::dra::v1::{
    Claim, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourcesRequest, dra_plugin_client::DraPluginClient,
};
use steward_proto::dra_health::v1alpha1::{
    HealthStatus, NodeWatchResourcesRequest, NodeWatchResourcesResponse,
    dra_resource_health_client::DraResourceHealthClient,
};
use steward_proto::pluginregistration::v1::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use steward_proto::uds::{UnixConnector, endpoint};
use steward_testing_apiserver::ApiServer;
use tonic::transport::Channel;

async fn channel(path: &Path) -> Channel {
    eventually(&format!("socket {}", path.display()), WAIT, || async {
        endpoint()
            .connect_with_connector(UnixConnector::new(path))
            .await
            .ok()
    })
    .await
}

/// Creates a ResourceClaim allocated to `devices` (pool, device) of
/// driver steward.dev (or `driver`), reserved for pod `web`; returns its UID.
async fn allocated_claim(
    server: &ApiServer,
    name: &str,
    driver: &str,
    devices: &[(&str, String)],
) -> String {
    let results = devices
        .iter()
        .map(|(pool, device)| DeviceRequestAllocationResult {
            request: "cam".into(),
            driver: driver.into(),
            pool: (*pool).into(),
            device: device.clone(),
            ..DeviceRequestAllocationResult::default()
        })
        .collect();
    allocated_with(server, name, results).await
}

/// Creates a ResourceClaim allocated as `results`, reserved for pod `web`;
/// returns its UID.
async fn allocated_with(
    server: &ApiServer,
    name: &str,
    results: Vec<DeviceRequestAllocationResult>,
) -> String {
    let api: Api<ResourceClaim> = Api::namespaced(server.client(), NS);
    let mut claim = ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ResourceClaim::default()
    };
    claim = api.create(&PostParams::default(), &claim).await.unwrap();
    claim.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(results),
                ..DeviceAllocationResult::default()
            }),
            ..AllocationResult::default()
        }),
        reserved_for: Some(vec![ResourceClaimConsumerReference {
            resource: "pods".into(),
            name: "web".into(),
            uid: "web-uid".into(),
            api_group: None,
        }]),
        ..ResourceClaimStatus::default()
    });
    let claim = api
        .replace_status(name, &PostParams::default(), &claim)
        .await
        .unwrap();
    claim.metadata.uid.unwrap()
}

fn claim(name: &str, uid: &str) -> Claim {
    Claim {
        namespace: NS.into(),
        uid: uid.into(),
        name: name.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_and_unprepare_share_the_slot_ledger_with_the_device_plugins() {
    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let mut cfg = node.agent_config(dir.path(), server.client(), echo(false));
    let dra = DraPluginConfig::new(&node.root);
    cfg.dra_plugin = Some(dra.clone());
    let mut agent = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 2),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let instance = inst.metadata.name.clone().unwrap();
    let res = resource(&inst);
    node.kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 2, WAIT)
        .await
        .unwrap();

    // Registration, as kubelet's plugin watcher does it.
    let mut reg = RegistrationClient::new(channel(&dra.registration_socket()).await);
    let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "steward.dev");
    assert_eq!(info.supported_versions, SUPPORTED_SERVICES);
    assert_eq!(Path::new(&info.endpoint), dra.plugin_socket());
    reg.notify_registration_status(RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();
    let mut plugin = DraPluginClient::new(channel(Path::new(&info.endpoint)).await);

    // One batch: a good claim, a device of another node, another
    // driver's claim, a claim the API no longer has, a replaced claim.
    let dev0 = device_name(&instance, 0);
    let good = allocated_claim(&server, "good", "steward.dev", &[("node-a", dev0.clone())]).await;
    let elsewhere = allocated_claim(
        &server,
        "elsewhere",
        "steward.dev",
        &[("node-b", dev0.clone())],
    )
    .await;
    let foreign = allocated_claim(
        &server,
        "foreign",
        "gpu.example.com",
        &[("node-a", dev0.clone())],
    )
    .await;
    let answer = plugin
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![
                claim("good", &good),
                claim("elsewhere", &elsewhere),
                claim("foreign", &foreign),
                claim("gone", "gone-uid"),
                claim("good", "an-older-uid"),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims.len(), 5, "{answer:?}");
    let ok = &answer.claims[&good];
    assert_eq!(ok.error, "", "{answer:?}");
    assert_eq!(ok.devices.len(), 1);
    assert_eq!(ok.devices[0].device_name, dev0);
    assert_eq!(ok.devices[0].pool_name, "node-a");
    assert_eq!(ok.devices[0].request_names, ["cam"]);
    assert_eq!(
        ok.devices[0].cdi_device_ids,
        [format!("steward.dev/cams={NS}_{instance}")]
    );
    for (uid, says) in [
        (&elsewhere, "not a device of node node-a"),
        (&foreign, "no device of driver steward.dev"),
        (&"gone-uid".to_owned(), "no longer exists"),
        (&"an-older-uid".to_owned(), "was replaced"),
    ] {
        let err = &answer.claims[uid].error;
        assert!(err.contains(says), "{uid}: {err:?}");
        assert!(answer.claims[uid].devices.is_empty());
    }
    let slot0 = format!("{instance}-0");
    let held = claim_of(&server, &slot0)
        .await
        .expect("cluster claim of the prepared slot");
    let rc = held
        .spec
        .resource_claim
        .as_ref()
        .expect("held by the claim");
    assert_eq!((rc.name.as_str(), rc.uid.as_str()), ("good", good.as_str()));
    assert!(held.spec.pod.is_none());

    // The device plugin no longer offers the prepared slot: one pod gets
    // the other slot, the next finds no device.
    node.kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 1, WAIT)
        .await
        .unwrap();
    let a = node.kubelet.add_pod(pod("dp-a", &res)).await.unwrap();
    let slot1 = format!("{instance}-1");
    assert_eq!(
        slot_of(&node.kubelet, &a.uid, &res).as_deref(),
        Some(slot1.as_str())
    );
    assert!(node.kubelet.add_pod(pod("dp-b", &res)).await.is_err());
    wait_bound(&server, &slot1, &a.uid).await;

    // A claim on the device plugin's slot is refused; a second prepare of
    // the good claim is the same answer.
    let taken = allocated_claim(
        &server,
        "taken",
        "steward.dev",
        &[("node-a", device_name(&instance, 1))],
    )
    .await;
    let again = plugin
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![claim("good", &good), claim("taken", &taken)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims[&good], answer.claims[&good]);
    assert!(
        again.claims[&taken]
            .error
            .contains("in use through the device plugin"),
        "{again:?}"
    );

    // Killed between prepare and unprepare: the slot stays the claim's.
    let cfg = agent.kill().await;
    agent = Agent::start(cfg);
    // The restarted agent answers on fresh sockets (kubelet's plugin
    // watcher sees the registration socket re-created and dials it).
    let endpoint = eventually("the restarted agent's registration", WAIT, || async {
        let ch = endpoint()
            .connect_with_connector(UnixConnector::new(&dra.registration_socket()))
            .await
            .ok()?;
        let info = RegistrationClient::new(ch)
            .get_info(InfoRequest {})
            .await
            .ok()?;
        Some(info.into_inner().endpoint)
    })
    .await;
    let mut plugin = DraPluginClient::new(channel(Path::new(&endpoint)).await);
    // The restarted agent's device plugin (registered a second time)
    // still reports the prepared slot Unhealthy, the pod's slot Healthy.
    node.kubelet
        .wait_for_resource(
            &res,
            |s| {
                s.connected
                    && s.registrations >= 2
                    && s.unhealthy.contains(&slot0)
                    && s.healthy.contains(&slot1)
            },
            WAIT,
        )
        .await
        .unwrap();
    assert!(
        claim_of(&server, &slot0)
            .await
            .is_some_and(|c| c.spec.resource_claim.is_some())
    );

    // Unprepare frees exactly the claim's slot; never-prepared is a no-op.
    let un = plugin
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claim("good", &good), claim("never", "never-uid")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims[&good].error, "");
    assert_eq!(un.claims["never-uid"].error, "");
    wait_released(&server, &slot0).await;
    wait_bound(&server, &slot1, &a.uid).await;
    node.kubelet
        .wait_for_resource(&res, |s| s.healthy.len() == 2, WAIT)
        .await
        .unwrap();
    let b = node.kubelet.add_pod(pod("dp-c", &res)).await.unwrap();
    assert_eq!(
        slot_of(&node.kubelet, &b.uid, &res).as_deref(),
        Some(slot0.as_str())
    );

    // Device health on the resource health stream: both devices healthy,
    // then unhealthy once discovery no longer serves them here.
    let mut health = DraResourceHealthClient::new(channel(Path::new(&endpoint)).await)
        .node_watch_resources(NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = health.message().await.unwrap().unwrap();
    let states = |m: &NodeWatchResourcesResponse| -> Vec<(String, i32)> {
        m.devices
            .iter()
            .map(|d| (d.device.clone().unwrap().device_name, d.health))
            .collect()
    };
    let healthy = HealthStatus::Healthy as i32;
    let unhealthy = HealthStatus::Unhealthy as i32;
    assert_eq!(
        states(&first),
        [
            (dev0.clone(), healthy),
            (device_name(&instance, 1), healthy)
        ]
    );
    let configs: Api<steward_api::Configuration> = Api::namespaced(server.client(), NS);
    configs
        .delete("cams", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let gone = loop {
        let m = tokio::time::timeout(WAIT, health.message())
            .await
            .expect("a health update after the device left")
            .unwrap()
            .unwrap();
        if m.devices.iter().all(|d| d.health == unhealthy) {
            break m;
        }
    };
    assert_eq!(
        states(&gone),
        [(dev0, unhealthy), (device_name(&instance, 1), unhealthy)]
    );
    agent.stop().await.unwrap();
}

/// What GetInfo must list, in this order: the DRAPlugin service kubelet
/// picks (the first it knows; steward serves no v1beta1.DRAPlugin), then
/// the health services, v1 first (kubelet 1.37 takes the first it knows;
/// 1.34–1.36 dial v1alpha1 regardless).
const SUPPORTED_SERVICES: [&str; 3] = [
    "v1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
];

/// Whether this run is CI's, where a missing peer fails instead of
/// skipping.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A peer that cannot run: a loud skip, or under CI a failure.
fn skip(why: &str) {
    assert!(
        !in_ci(),
        "{why}: CI must run this test (scripts/test installs python3's grpcio and grpcio-tools)"
    );
    println!("SKIPPED: {why}");
}

/// One call from Python grpcio (gRPC C-core, as some kubelet-side tools
/// and monitoring agents are) over a unix socket: the response bytes, or
/// `None` (after saying why; under CI it fails instead) when python3 or
/// grpcio is missing.
fn grpcio(
    socket: &Path,
    method: &str,
    request: &impl prost::Message,
    kind: &str,
) -> Option<Vec<u8>> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../steward-nodeio/tests/fixtures/grpc_call.py");
    let hex: String = request
        .encode_to_vec()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let out = match std::process::Command::new("python3")
        .arg(script)
        .arg(socket)
        .arg(method)
        .arg(hex)
        .arg(kind)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            skip(&format!("python3 cannot be run ({e})"));
            return None;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.code() == Some(3) {
        skip(&format!("grpcio is not installed ({})", stdout.trim()));
        return None;
    }
    assert!(
        out.status.success(),
        "{method}: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.lines().next().unwrap_or_default();
    let hex = line
        .strip_prefix("OK ")
        .unwrap_or_else(|| panic!("{method}: {stdout}"));
    Some(
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_core_client_gets_info_prepares_watches_health_and_unprepares() {
    use prost::Message;
    use steward_proto::dra::v1::{NodePrepareResourcesResponse, NodeUnprepareResourcesResponse};
    use steward_proto::pluginregistration::v1::PluginInfo;

    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let mut cfg = node.agent_config(dir.path(), server.client(), echo(false));
    let dra = DraPluginConfig::new(&node.root);
    cfg.dra_plugin = Some(dra.clone());
    let agent = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 1),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let instance = inst.metadata.name.clone().unwrap();
    node.kubelet
        .wait_for_resource(&resource(&inst), |s| s.healthy.len() == 1, WAIT)
        .await
        .unwrap();
    // Both sockets are served once the registration socket answers.
    channel(&dra.registration_socket()).await;

    let Some(info) = grpcio(
        &dra.registration_socket(),
        "/pluginregistration.Registration/GetInfo",
        &InfoRequest {},
        "unary",
    ) else {
        return;
    };
    let info = PluginInfo::decode(info.as_slice()).unwrap();
    assert_eq!(
        (info.r#type.as_str(), info.name.as_str()),
        ("DRAPlugin", "steward.dev")
    );
    assert_eq!(info.supported_versions, SUPPORTED_SERVICES);
    let socket = Path::new(&info.endpoint).to_path_buf();

    let dev0 = device_name(&instance, 0);
    let uid = allocated_claim(&server, "cam", "steward.dev", &[("node-a", dev0.clone())]).await;
    let prepared = grpcio(
        &socket,
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        &NodePrepareResourcesRequest {
            claims: vec![claim("cam", &uid)],
        },
        "unary",
    )
    .unwrap();
    let prepared = NodePrepareResourcesResponse::decode(prepared.as_slice()).unwrap();
    assert_eq!(prepared.claims[&uid].error, "");
    assert_eq!(prepared.claims[&uid].devices[0].device_name, dev0);

    let health = grpcio(
        &socket,
        "/v1alpha1.DRAResourceHealth/NodeWatchResources",
        &NodeWatchResourcesRequest {},
        "stream",
    )
    .unwrap();
    let health = NodeWatchResourcesResponse::decode(health.as_slice()).unwrap();
    assert_eq!(health.devices.len(), 1);
    assert_eq!(health.devices[0].health, HealthStatus::Healthy as i32);

    let unprepared = grpcio(
        &socket,
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
        &NodeUnprepareResourcesRequest {
            claims: vec![claim("cam", &uid)],
        },
        "unary",
    )
    .unwrap();
    let unprepared = NodeUnprepareResourcesResponse::decode(unprepared.as_slice()).unwrap();
    assert_eq!(unprepared.claims[&uid].error, "");
    wait_released(&server, &format!("{instance}-0")).await;
    agent.stop().await.unwrap();
}

/// The kubelet-side client of `fixtures/kubelet-dra-client`: grpcio with
/// stubs generated from kubelet's own protos. `None` (after a loud skip;
/// under CI a failure) when python3, grpcio or grpcio-tools is missing.
fn kubelet_client() -> Option<std::process::Command> {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip(
            "python3 with grpcio and grpcio-tools not found; the upstream kubelet client did not run",
        );
        return None;
    }
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/kubelet-dra-client/kubelet_dra_client.py"),
    );
    Some(cmd)
}

/// One device as the upstream client decoded it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
struct UpstreamHealth {
    pool: String,
    device: String,
    health: String,
    message: String,
    last_updated_time: i64,
    health_check_timeout_seconds: i64,
}

impl UpstreamHealth {
    /// What kubelet keeps of it, less the time it was sent.
    fn state(&self) -> (String, String, String, String, i64) {
        (
            self.pool.clone(),
            self.device.clone(),
            self.health.clone(),
            self.message.clone(),
            self.health_check_timeout_seconds,
        )
    }
}

/// A running `watch` of the upstream client, read line by line.
struct UpstreamWatch {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl UpstreamWatch {
    fn start(mut cmd: std::process::Command, socket: &Path, version: &str) -> Self {
        cmd.arg("watch").arg(socket).arg(version).arg("60");
        let mut child = tokio::process::Command::from(cmd)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        Self {
            child,
            lines: tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout)),
        }
    }

    async fn next(&mut self, version: &str) -> Vec<UpstreamHealth> {
        let line = tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("{version}: no health update in time"))
            .unwrap()
            .unwrap_or_else(|| panic!("{version}: the client ended early"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{version}: {line}: {e}"))
    }

    /// Every update up to the first with an unhealthy device (the client
    /// exits after it), the last one returned.
    async fn until_unhealthy(mut self, version: &str) -> Vec<UpstreamHealth> {
        let mut last = Vec::new();
        while let Ok(Some(line)) = tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("{version}: no unhealthy update in time"))
        {
            last = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{version}: {line}: {e}"));
        }
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "{version}: the client exited {status}");
        last
    }
}

/// The bar of issue 23: a DRA kubelet client built from kubelet's own
/// protos (not steward's) reads the same device health from both health
/// versions, healthy at first and then unhealthy with the reason, and
/// GetInfo lists the services in the order kubelet chooses by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_kubelet_client_sees_the_same_health_on_v1alpha1_and_v1() {
    let Some(client) = kubelet_client() else {
        return;
    };
    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let mut cfg = node.agent_config(dir.path(), server.client(), echo(false));
    let dra = DraPluginConfig::new(&node.root);
    cfg.dra_plugin = Some(dra.clone());
    let agent = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 2),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let instance = inst.metadata.name.clone().unwrap();
    channel(&dra.registration_socket()).await;

    // GetInfo through upstream's pluginregistration stubs.
    let mut info = kubelet_client().unwrap();
    let out = info
        .arg("info")
        .arg(dra.registration_socket())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "info: {stdout}");
    let info: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(info["type"], "DRAPlugin");
    assert_eq!(
        info["supported_versions"],
        serde_json::json!(SUPPORTED_SERVICES)
    );
    let socket = Path::new(info["endpoint"].as_str().unwrap()).to_path_buf();

    // Both versions at once, as a 1.36 kubelet (v1alpha1) and a 1.37 one
    // (v1) would dial the same driver.
    let mut alpha = UpstreamWatch::start(client, &socket, "v1alpha1");
    let mut v1 = UpstreamWatch::start(kubelet_client().unwrap(), &socket, "v1");
    let states = |m: &[UpstreamHealth]| m.iter().map(UpstreamHealth::state).collect::<Vec<_>>();
    let healthy = |n: u32| {
        (
            "node-a".to_owned(),
            device_name(&instance, n),
            "HEALTHY".to_owned(),
            String::new(),
            30, // three times the default resend period, 10 s
        )
    };
    let first_alpha = alpha.next("v1alpha1").await;
    let first_v1 = v1.next("v1").await;
    assert_eq!(states(&first_alpha), [healthy(0), healthy(1)]);
    assert_eq!(states(&first_v1), states(&first_alpha));
    assert!(first_v1.iter().all(|d| d.last_updated_time > 0));

    // The devices leave the node: both streams say so, with the reason.
    let configs: Api<steward_api::Configuration> = Api::namespaced(server.client(), NS);
    configs
        .delete("cams", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let gone_alpha = alpha.until_unhealthy("v1alpha1").await;
    let gone_v1 = v1.until_unhealthy("v1").await;
    let unhealthy = |n: u32| {
        (
            "node-a".to_owned(),
            device_name(&instance, n),
            "UNHEALTHY".to_owned(),
            "the device is gone from this node".to_owned(),
            30,
        )
    };
    assert_eq!(states(&gone_alpha), [unhealthy(0), unhealthy(1)]);
    assert_eq!(states(&gone_v1), states(&gone_alpha));
    agent.stop().await.unwrap();
}

/// kubelet counts a device's health Unknown once no report named it for
/// its health timeout, so a quiet stream sends the same state again every
/// `health_resend`, each report saying it is stale after three periods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_health_stream_repeats_the_state_before_kubelet_forgets_it() {
    use steward_proto::dra_health::v1;
    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let mut cfg = node.agent_config(dir.path(), server.client(), echo(false));
    let mut dra = DraPluginConfig::new(&node.root);
    dra.health_resend = std::time::Duration::from_millis(300);
    cfg.dra_plugin = Some(dra.clone());
    let agent = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 1),
    )
    .await;
    instance_of(&server, "cams", &["node-a"]).await;
    let mut health = v1::dra_resource_health_client::DraResourceHealthClient::new(
        channel(&dra.plugin_socket()).await,
    )
    .node_watch_resources(v1::NodeWatchResourcesRequest {})
    .await
    .unwrap()
    .into_inner();
    let first = loop {
        let m = tokio::time::timeout(WAIT, health.message())
            .await
            .expect("the device in the health stream")
            .unwrap()
            .unwrap();
        if m.devices.len() == 1 {
            break m;
        }
    };
    let started = std::time::Instant::now();
    for _ in 0..3 {
        let again = tokio::time::timeout(WAIT, health.message())
            .await
            .expect("the state again while nothing changes")
            .unwrap()
            .unwrap();
        assert_eq!(again.devices.len(), 1);
        let (a, b) = (&again.devices[0], &first.devices[0]);
        assert_eq!(
            (&a.device, a.health, &a.message),
            (&b.device, b.health, &b.message)
        );
        assert!(a.last_updated_time >= b.last_updated_time);
        // 3 × 300 ms, in whole seconds.
        assert_eq!(a.health_check_timeout_seconds, 1);
    }
    // Three repeats take about three periods, not a burst.
    assert!(started.elapsed() >= std::time::Duration::from_millis(800));
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_whose_claim_left_the_api_is_released_and_a_live_one_is_kept() {
    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let mut cfg = node.agent_config(dir.path(), server.client(), echo(false));
    let mut dra = DraPluginConfig::new(&node.root);
    dra.gc_interval = std::time::Duration::from_millis(200);
    cfg.dra_plugin = Some(dra.clone());
    let agent = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 2),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let instance = inst.metadata.name.clone().unwrap();
    node.kubelet
        .wait_for_resource(&resource(&inst), |s| s.healthy.len() == 2, WAIT)
        .await
        .unwrap();
    let mut plugin = DraPluginClient::new(channel(&dra.plugin_socket()).await);
    let live = allocated_claim(
        &server,
        "live",
        "steward.dev",
        &[("node-a", device_name(&instance, 0))],
    )
    .await;
    let lost = allocated_claim(
        &server,
        "lost",
        "steward.dev",
        &[("node-a", device_name(&instance, 1))],
    )
    .await;
    let answer = plugin
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![claim("live", &live), claim("lost", &lost)],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        answer.claims.values().all(|c| c.error.is_empty()),
        "{answer:?}"
    );

    // kubelet's record of "lost" is gone (node rebuilt) and so is the
    // claim: nobody will unprepare it.
    Api::<ResourceClaim>::namespaced(server.client(), NS)
        .delete("lost", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    wait_released(&server, &format!("{instance}-1")).await;
    // The claim still allocated keeps its slot, sweep after sweep.
    let slot0 = format!("{instance}-0");
    let until = tokio::time::Instant::now() + std::time::Duration::from_millis(1_500);
    while tokio::time::Instant::now() < until {
        let held = claim_of(&server, &slot0).await;
        assert!(
            held.is_some_and(|c| c.spec.resource_claim.is_some_and(|r| r.uid == live)),
            "the live claim lost its slot"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    agent.stop().await.unwrap();
}

/// The pool the ResourceSlices publish `device` in, once they do.
async fn published_pool(server: &ApiServer, device: &str, pool: &str) {
    let slices: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(server.client());
    eventually(
        &format!("device {device} published in pool {pool}"),
        WAIT,
        || async {
            let items = slices
                .list(&kube::api::ListParams::default())
                .await
                .ok()?
                .items;
            let pools: Vec<&str> = items
                .iter()
                .filter(|s| s.spec.devices.iter().flatten().any(|d| d.name == device))
                .map(|s| s.spec.pool.name.as_str())
                .collect();
            (pools == [pool]).then_some(())
        },
    )
    .await;
}

/// The health of `device` of `pool` in message `m`, if it names it.
fn health_in(m: &NodeWatchResourcesResponse, pool: &str, device: &str) -> Option<i32> {
    m.devices
        .iter()
        .find(|d| {
            d.device
                .as_ref()
                .is_some_and(|id| id.pool_name == pool && id.device_name == device)
        })
        .map(|d| d.health)
}

/// The first health message naming `device` in `pool` (the stream sends
/// the whole state on each change).
async fn health_naming(
    health: &mut tonic::Streaming<NodeWatchResourcesResponse>,
    pool: &str,
    device: &str,
) -> NodeWatchResourcesResponse {
    loop {
        let m = tokio::time::timeout(WAIT, health.message())
            .await
            .unwrap_or_else(|_| panic!("no health message names {pool}/{device}"))
            .unwrap()
            .unwrap();
        if health_in(&m, pool, device).is_some() {
            return m;
        }
    }
}

async fn prepare(
    plugin: &mut DraPluginClient<Channel>,
    claims: Vec<Claim>,
) -> NodePrepareResourcesResponse {
    plugin
        .node_prepare_resources(NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_instance_is_prepared_and_watched_in_the_pool_its_slices_publish() {
    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let cfg = dra_agent_config(&a, dir.path(), server.client(), echo(true));
    let dra = cfg.dra_plugin.clone().unwrap();
    let agent_a = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 3),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    assert!(inst.spec.shared, "a shared handler's Instance");
    let instance = inst.metadata.name.clone().unwrap();
    a.kubelet
        .wait_for_resource(&resource(&inst), |s| s.healthy.len() == 3, WAIT)
        .await
        .unwrap();
    let dev = |n| device_name(&instance, n);
    let shared_pool = format!("shared/{instance}");

    // Seen by one node: the slices put it in that node's pool, and prepare
    // and the health stream name the same pool.
    published_pool(&server, &dev(0), "node-a").await;
    let mut plugin = DraPluginClient::new(channel(&dra.plugin_socket()).await);
    let first = allocated_claim(&server, "first", "steward.dev", &[("node-a", dev(0))]).await;
    let unpublished = allocated_claim(
        &server,
        "unpublished",
        "steward.dev",
        &[(shared_pool.as_str(), dev(2))],
    )
    .await;
    let answer = prepare(
        &mut plugin,
        vec![claim("first", &first), claim("unpublished", &unpublished)],
    )
    .await;
    assert_eq!(answer.claims[&first].error, "", "{answer:?}");
    assert_eq!(answer.claims[&first].devices[0].pool_name, "node-a");
    assert!(
        answer.claims[&unpublished]
            .error
            .contains("is not a device of node node-a"),
        "a claim allocated from a pool nobody publishes: {answer:?}"
    );
    let mut health = DraResourceHealthClient::new(channel(&dra.plugin_socket()).await)
        .node_watch_resources(NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let m = health_naming(&mut health, "node-a", &dev(1)).await;
    assert_eq!(
        health_in(&m, "node-a", &dev(1)),
        Some(HealthStatus::Healthy as i32)
    );
    assert_eq!(health_in(&m, &shared_pool, &dev(1)), None, "{m:?}");

    // A second node sees it: its devices move to the shared pool.
    let b = Node::start(dir.path(), "node-b", Some(server.client())).await;
    let agent_b = Agent::start(b.agent_config(dir.path(), server.client(), echo(true)));
    instance_of(&server, "cams", &["node-a", "node-b"]).await;
    published_pool(&server, &dev(1), &shared_pool).await;
    let m = health_naming(&mut health, &shared_pool, &dev(1)).await;
    assert_eq!(
        health_in(&m, &shared_pool, &dev(1)),
        Some(HealthStatus::Healthy as i32)
    );
    // The device the claim holds from the old pool keeps its health under
    // that name.
    assert_eq!(
        health_in(&m, "node-a", &dev(0)),
        Some(HealthStatus::Healthy as i32),
        "{m:?}"
    );
    // The claim prepared from the old pool keeps its slot: a repeat is the
    // same answer.
    let again = prepare(&mut plugin, vec![claim("first", &first)]).await;
    assert_eq!(again.claims[&first], answer.claims[&first]);
    // A new claim from the old pool is refused, one from the new pool is
    // prepared.
    let stale = allocated_claim(&server, "stale", "steward.dev", &[("node-a", dev(1))]).await;
    let moved = allocated_claim(
        &server,
        "moved",
        "steward.dev",
        &[(shared_pool.as_str(), dev(2))],
    )
    .await;
    let answer = prepare(
        &mut plugin,
        vec![claim("stale", &stale), claim("moved", &moved)],
    )
    .await;
    assert!(
        answer.claims[&stale]
            .error
            .contains("is not a device of node node-a"),
        "{answer:?}"
    );
    assert_eq!(answer.claims[&moved].error, "", "{answer:?}");
    assert_eq!(answer.claims[&moved].devices[0].pool_name, shared_pool);
    agent_b.stop().await.unwrap();
    agent_a.stop().await.unwrap();
}

/// A single node with the DRA plugin on (safety net every `gc`): the
/// server, the node, the agent, the Instance's name and a plugin client.
async fn single_dra(
    capacity: u32,
    gc: Option<std::time::Duration>,
) -> (
    ApiServer,
    tempfile::TempDir,
    Node,
    Agent,
    String,
    DraPluginClient<Channel>,
) {
    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let mut cfg = node.agent_config(dir.path(), server.client(), echo(false));
    let mut dra = DraPluginConfig::new(&node.root);
    if let Some(gc) = gc {
        dra.gc_interval = gc;
    }
    cfg.dra_plugin = Some(dra.clone());
    let agent = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), capacity),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    node.kubelet
        .wait_for_resource(
            &resource(&inst),
            |s| s.healthy.len() == capacity as usize,
            WAIT,
        )
        .await
        .unwrap();
    let plugin = DraPluginClient::new(channel(&dra.plugin_socket()).await);
    (
        server,
        dir,
        node,
        agent,
        inst.metadata.name.unwrap(),
        plugin,
    )
}

fn claim_ops(agent: &Agent, store: &str) -> u64 {
    agent
        .metrics
        .device_plugins
        .claim_ops
        .get_or_create(&steward_agent::deviceplugin::ClaimOpLabels {
            store: store.into(),
            op: "write".into(),
            result: "ok".into(),
        })
        .get()
}

fn prepares(agent: &Agent, result: &str) -> u64 {
    agent
        .metrics
        .device_plugins
        .prepares
        .get_or_create(&steward_agent::deviceplugin::ResultLabels {
            result: result.into(),
        })
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_prepare_writes_nothing() {
    let (server, _dir, _node, agent, instance, mut plugin) = single_dra(1, None).await;
    let uid = allocated_claim(
        &server,
        "cam",
        "steward.dev",
        &[("node-a", device_name(&instance, 0))],
    )
    .await;
    let first = prepare(&mut plugin, vec![claim("cam", &uid)]).await;
    assert_eq!(first.claims[&uid].error, "", "{first:?}");
    let slot = format!("{instance}-0");
    let held = claim_of(&server, &slot).await.expect("the SlotClaim");
    let writes = server.stats().writes_for("slotclaims.steward.dev");
    let (local, cluster) = (claim_ops(&agent, "local"), claim_ops(&agent, "cluster"));
    for _ in 0..3 {
        let again = prepare(&mut plugin, vec![claim("cam", &uid)]).await;
        assert_eq!(again.claims[&uid], first.claims[&uid]);
    }
    let after = claim_of(&server, &slot).await.expect("the SlotClaim");
    assert_eq!(
        after.metadata.resource_version, held.metadata.resource_version,
        "a repeated prepare rewrote the SlotClaim"
    );
    assert_eq!(
        server.stats().writes_for("slotclaims.steward.dev"),
        writes,
        "API writes of a repeated prepare"
    );
    assert_eq!(claim_ops(&agent, "local"), local, "local record rewritten");
    assert_eq!(claim_ops(&agent, "cluster"), cluster);
    assert_eq!(prepares(&agent, "ok"), 4);
    agent.stop().await.unwrap();
}

/// A consumable device (KEP-5075) in one claim under two shares, one
/// consuming one slot and one two: three distinct slots, the same three on
/// every repeat, each share named back to kubelet; a second claim finds
/// none free and is refused, and unprepare frees all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shares_of_a_consumable_device_get_distinct_slots_and_keep_them() {
    let (server, _dir, _node, agent, instance, mut plugin) = single_dra(3, None).await;
    let device = steward_core::dra::consumable_device_name(&instance);
    // Written as kube-scheduler's JSON names them (resource.k8s.io/v1
    // DeviceRequestAllocationResult: `shareID`, `consumedCapacity`).
    let share = |id: &str, slots: &str| -> DeviceRequestAllocationResult {
        serde_json::from_value(serde_json::json!({
            "request": "cam",
            "driver": "steward.dev",
            "pool": "node-a",
            "device": device,
            "shareID": id,
            "consumedCapacity": {"slots": slots},
        }))
        .unwrap()
    };
    let uid = allocated_with(&server, "cam", vec![share("s1", "1"), share("s2", "2")]).await;
    let first = prepare(&mut plugin, vec![claim("cam", &uid)]).await;
    let answer = &first.claims[&uid];
    assert_eq!(answer.error, "", "{first:?}");
    let shares: Vec<Option<&str>> = answer
        .devices
        .iter()
        .map(|d| d.share_id.as_deref())
        .collect();
    assert_eq!(shares, [Some("s1"), Some("s2")]);
    let mut held: Vec<(String, String)> = slot_claims(&server)
        .await
        .into_iter()
        .map(|c| {
            let h = c.spec.resource_claim.clone().unwrap();
            (h.share_id, c.spec.slot_id())
        })
        .collect();
    held.sort();
    let slots: std::collections::BTreeSet<&str> = held.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(slots.len(), 3, "{held:?}");
    assert_eq!(
        held.iter().filter(|(s, _)| s == "s2").count(),
        2,
        "{held:?}"
    );
    for _ in 0..2 {
        let again = prepare(&mut plugin, vec![claim("cam", &uid)]).await;
        assert_eq!(again.claims[&uid], first.claims[&uid]);
    }
    assert_eq!(slot_claims(&server).await.len(), 3);
    let other = allocated_with(&server, "other", vec![share("s3", "1")]).await;
    let refused = prepare(&mut plugin, vec![claim("other", &other)]).await;
    assert!(
        refused.claims[&other].error.contains("0 free on this node"),
        "{refused:?}"
    );
    assert_eq!(prepares(&agent, "device_full"), 1);
    plugin
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claim("cam", &uid)],
        })
        .await
        .unwrap();
    for (_, slot) in &held {
        wait_released(&server, slot).await;
    }
    let now = prepare(&mut plugin, vec![claim("other", &other)]).await;
    assert_eq!(now.claims[&other].error, "", "{now:?}");
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_prepares_are_counted_by_what_was_wrong_with_the_claim() {
    let (server, _dir, _node, agent, instance, mut plugin) = single_dra(1, None).await;
    let dev0 = device_name(&instance, 0);
    let foreign = allocated_claim(
        &server,
        "foreign",
        "gpu.example.com",
        &[("node-a", dev0.clone())],
    )
    .await;
    allocated_claim(
        &server,
        "replaced",
        "steward.dev",
        &[("node-a", dev0.clone())],
    )
    .await;
    let bare = Api::<ResourceClaim>::namespaced(server.client(), NS)
        .create(
            &PostParams::default(),
            &ResourceClaim {
                metadata: ObjectMeta {
                    name: Some("bare".into()),
                    ..ObjectMeta::default()
                },
                ..ResourceClaim::default()
            },
        )
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let answer = prepare(
        &mut plugin,
        vec![
            claim("foreign", &foreign),
            claim("replaced", "an-older-uid"),
            claim("bare", &bare),
            claim("gone", "gone-uid"),
        ],
    )
    .await;
    assert!(
        answer.claims.values().all(|c| !c.error.is_empty()),
        "{answer:?}"
    );
    for label in [
        "no_devices",
        "claim_replaced",
        "not_allocated",
        "claim_gone",
    ] {
        assert_eq!(prepares(&agent, label), 1, "result={label}");
    }
    assert_eq!(prepares(&agent, "claim_unreadable"), 0);
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_is_released_within_one_interval_of_its_claim_going() {
    let interval = std::time::Duration::from_secs(3);
    let (server, _dir, _node, agent, instance, mut plugin) = single_dra(2, Some(interval)).await;
    let claims: Api<ResourceClaim> = Api::namespaced(server.client(), NS);
    // A first hold released by a sweep: the next sweep is one interval
    // after this.
    let uid = allocated_claim(
        &server,
        "early",
        "steward.dev",
        &[("node-a", device_name(&instance, 0))],
    )
    .await;
    assert_eq!(
        prepare(&mut plugin, vec![claim("early", &uid)])
            .await
            .claims[&uid]
            .error,
        ""
    );
    claims
        .delete("early", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    wait_released(&server, &format!("{instance}-0")).await;
    // Prepared right after a sweep and gone at once: released within one
    // interval, not at the sweep after next.
    let uid = allocated_claim(
        &server,
        "late",
        "steward.dev",
        &[("node-a", device_name(&instance, 1))],
    )
    .await;
    assert_eq!(
        prepare(&mut plugin, vec![claim("late", &uid)]).await.claims[&uid].error,
        ""
    );
    claims
        .delete("late", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let gone = std::time::Instant::now();
    wait_released(&server, &format!("{instance}-1")).await;
    let took = gone.elapsed();
    println!("released {took:?} after the claim went (interval {interval:?})");
    assert!(
        took < interval + std::time::Duration::from_millis(1_500),
        "released {took:?} after the claim went, interval {interval:?}"
    );
    agent.stop().await.unwrap();
}

/// Prepares `claims` on `plugin`; the answer's error for each, by UID.
async fn prepare_errors(
    plugin: &mut DraPluginClient<Channel>,
    claims: Vec<Claim>,
) -> std::collections::HashMap<String, String> {
    plugin
        .node_prepare_resources(NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
        .claims
        .into_iter()
        .map(|(uid, answer)| (uid, answer.error))
        .collect()
}

/// A DaemonSet rolling with maxSurge: the new agent, its sockets named
/// after its pod, serves its kubelet plugin beside the old one's while the
/// old one holds the node's store, relaying each call to it; a call made
/// while the old one stops waits for the new one to hold the store; the
/// new one then serves on the same ledger (what the old one prepared is
/// still held). No call refused, no claim lost, the old sockets gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_relays_to_the_agent_before_it_then_takes_its_ledger_over() {
    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Some(server.client())).await;
    let agent_of_pod = |uid: &str| {
        let mut cfg = node.agent_config(dir.path(), server.client(), echo(false));
        let mut dra = DraPluginConfig::new(&node.root);
        dra.instance = Some(uid.into());
        cfg.dra_plugin = Some(dra.clone());
        (cfg, dra)
    };
    let (cfg, old_dra) = agent_of_pod("old-pod");
    let old = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 3),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let instance = inst.metadata.name.clone().unwrap();
    node.kubelet
        .wait_for_resource(&resource(&inst), |s| s.healthy.len() == 3, WAIT)
        .await
        .unwrap();
    let on = |slot: u32| vec![("node-a", device_name(&instance, slot))];
    let first = allocated_claim(&server, "first", "steward.dev", &on(0)).await;
    let mut to_old = DraPluginClient::new(channel(&old_dra.plugin_socket()).await);
    let errors = prepare_errors(&mut to_old, vec![claim("first", &first)]).await;
    assert_eq!(errors[&first], "");

    // The successor: both sockets named after its pod, served while the
    // old agent still holds the store.
    let (cfg, new_dra) = agent_of_pod("new-pod");
    assert!(
        new_dra
            .registration_socket()
            .ends_with("plugins_registry/steward.dev-new-pod-reg.sock")
    );
    assert!(
        new_dra
            .plugin_socket()
            .ends_with("steward.dev/dra-new-pod.sock")
    );
    let state_dir = cfg.state_dir.clone();
    let new = Agent::start(cfg);
    let mut to_new = DraPluginClient::new(channel(&new_dra.plugin_socket()).await);
    let second = allocated_claim(&server, "second", "steward.dev", &on(1)).await;
    let errors = prepare_errors(&mut to_new, vec![claim("second", &second)]).await;
    assert_eq!(errors[&second], "", "relayed to the old agent");
    assert!(
        matches!(
            steward_agent::NodeStore::open(&state_dir),
            Err(steward_agent::StateError::Busy { .. })
        ),
        "the old agent still holds the store, so it prepared the claim"
    );
    wait_held_by(&server, &format!("{instance}-1"), "second").await;

    // The old agent stops while a call is on its way: the call waits for
    // the new agent's ledger instead of being refused.
    let third = allocated_claim(&server, "third", "steward.dev", &on(2)).await;
    let mut racing = to_new.clone();
    let during =
        tokio::spawn(
            async move { prepare_errors(&mut racing, vec![claim("third", &third)]).await },
        );
    old.stop().await.unwrap();
    let errors = during.await.unwrap();
    assert!(errors.values().all(String::is_empty), "{errors:?}");
    for gone in [old_dra.plugin_socket(), old_dra.registration_socket()] {
        assert!(!gone.exists(), "{} left behind", gone.display());
    }

    // The new agent's ledger is the old one's: what the old one prepared
    // is held (a claim on its device refused until it is unprepared), and
    // preparing it again is the same answer.
    let errors = prepare_errors(&mut to_new, vec![claim("first", &first)]).await;
    assert_eq!(errors[&first], "");
    let fourth = allocated_claim(&server, "fourth", "steward.dev", &on(1)).await;
    let errors = prepare_errors(&mut to_new, vec![claim("fourth", &fourth)]).await;
    assert!(
        !errors[&fourth].is_empty(),
        "slot 1 is still the second claim's"
    );
    let answer = to_new
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claim("second", &second)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims[&second].error, "");
    let errors = prepare_errors(&mut to_new, vec![claim("fourth", &fourth)]).await;
    assert_eq!(errors[&fourth], "");
    wait_held_by(&server, &format!("{instance}-1"), "fourth").await;
    new.stop().await.unwrap();
}

/// Waits until slot `slot`'s SlotClaim in the cluster is held by the
/// ResourceClaim named `name`.
async fn wait_held_by(server: &ApiServer, slot: &str, name: &str) {
    eventually(&format!("{slot} held by claim {name}"), WAIT, || async {
        let held = claim_of(server, slot).await?;
        (held.spec.resource_claim.as_ref()?.name == name).then_some(())
    })
    .await;
}
