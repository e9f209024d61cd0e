//! `steward nri-plugin --dra-cpus`: the resource manager as the DRA driver
//! `cpu.steward.dev`, against the API server stand-in and kubelet's side of
//! the wire as upstream's Go code speaks it (the Go peer `kubelet-grpc`,
//! built from k8s.io/kubelet's generated types and grpc-go, dialing the
//! plugin watcher's registration socket and the DRA socket as kubelet
//! does). The node's CPUs are published as ResourceSlices with their NUMA
//! node; a claim allocated `cpu-N` is prepared (the answer names the
//! claim's CDI device, the CDI spec carries the claim's environment
//! variable); a claim naming a device that is no CPU gets its own error
//! and disturbs no other; unprepare removes the spec.
//!
//! No runtime: the NRI session keeps retrying a socket that is not there,
//! which changes nothing of the DRA side.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimConsumerReference, ResourceClaimStatus, ResourceSlice,
};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use serde_json::Value;
use steward_core::cpu::devices::{CPU_DRIVER, claim_env, cpu_of_device};
use steward_core::dra::NUMA_NODE_ATTRIBUTE;
use steward_resmgr::dra::DraCpuConfig;
use steward_resmgr::nri::{NriConfig, NriPlugin};
use steward_resmgr::{ClusterConfig, ManagerConfig};
use steward_testing_apiserver::ApiServer;

const NODE: &str = "n1";
const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(60);
/// The DRA side runs as the chart's ServiceAccount would (impersonated):
/// what it calls is checked against what the chart grants.
const DRA_USER: &str = "system:serviceaccount:steward-system:t-steward-nri-plugin";

async fn cluster() -> ApiServer {
    let api = ApiServer::start().await.unwrap();
    api.serve_dra();
    let node: Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NODE}})).unwrap();
    Api::<Node>::all(api.client())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NS}})).unwrap();
    let _ = Api::<Namespace>::all(api.client())
        .create(&PostParams::default(), &ns)
        .await;
    api
}

struct Paths {
    kubelet: PathBuf,
    cdi: PathBuf,
}

async fn start_plugin(api: &ApiServer, dir: &Path) -> (NriPlugin, Paths) {
    let mut cfg = ManagerConfig::new(dir.join("state"));
    cfg.cgroup_root = dir.join("cgroup");
    std::fs::create_dir_all(&cfg.cgroup_root).unwrap();
    cfg.verify_interval = Duration::ZERO;
    cfg.cluster = Some(ClusterConfig::new(api.client(), NODE));
    let paths = Paths {
        kubelet: dir.join("kubelet"),
        cdi: dir.join("cdi"),
    };
    let mut nri = NriConfig::new(cfg);
    nri.socket = dir.join("no-runtime/nri.sock");
    nri.reconnect = Duration::from_millis(500);
    nri.dra = Some(DraCpuConfig::new(
        api.client_as(DRA_USER).unwrap(),
        NODE.into(),
        &paths.kubelet,
        paths.cdi.clone(),
        steward_nodeio::Readiness::new(),
    ));
    let plugin = NriPlugin::start(nri).await.expect("plugin starts");
    (plugin, paths)
}

/// This node's CPU slices, once there are some.
async fn cpu_slices(api: &ApiServer) -> Vec<ResourceSlice> {
    let slices: Api<ResourceSlice> = Api::all(api.client());
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mine: Vec<ResourceSlice> = slices
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|s| s.spec.driver == CPU_DRIVER)
            .collect();
        if !mine.is_empty() {
            return mine;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ResourceSlice of driver {CPU_DRIVER} within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A ResourceClaim allocated `devices` of this driver on this node,
/// reserved for pod `web`; its UID.
async fn allocated_claim(api: &ApiServer, name: &str, devices: &[&str]) -> String {
    let claims: Api<ResourceClaim> = Api::namespaced(api.client(), NS);
    let mut claim = ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ResourceClaim::default()
    };
    claim = claims.create(&PostParams::default(), &claim).await.unwrap();
    claim.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(
                    devices
                        .iter()
                        .map(|d| DeviceRequestAllocationResult {
                            request: "cpus".into(),
                            driver: CPU_DRIVER.into(),
                            pool: NODE.into(),
                            device: (*d).into(),
                            ..DeviceRequestAllocationResult::default()
                        })
                        .collect(),
                ),
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
    claims
        .replace_status(name, &PostParams::default(), &claim)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}

/// Runs the Go peer as kubelet's plugin watcher and DRA manager; its JSON
/// lines (a non-zero exit, e.g. an answer kubelet would refuse, fails).
async fn kubelet(bin: &Path, args: &[&str]) -> Vec<Value> {
    let out = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the peer finishes")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kubelet-grpc {args:?} exited {}:\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn event<'a>(lines: &'a [Value], name: &str) -> &'a Value {
    lines
        .iter()
        .find(|v| v["event"] == name)
        .unwrap_or_else(|| panic!("no {name:?} in {lines:#?}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpus_are_published_prepared_as_cdi_devices_and_unprepared_over_kubelets_wire() {
    let Some(bin) = steward_testing_gopeers::binary("kubelet-grpc") else {
        return;
    };
    let api = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let (plugin, paths) = start_plugin(&api, dir.path()).await;

    // Published: this node's pool, one device per CPU, each with its NUMA
    // node; at most 128 devices per slice, every slice counting them all.
    let slices = cpu_slices(&api).await;
    let mut names = Vec::new();
    for s in &slices {
        assert_eq!(s.spec.pool.name, NODE);
        assert_eq!(s.spec.node_name.as_deref(), Some(NODE));
        assert_eq!(
            s.spec.pool.resource_slice_count,
            i64::try_from(slices.len()).unwrap()
        );
        let devices = s.spec.devices.as_deref().unwrap_or_default();
        assert!(devices.len() <= 128);
        for d in devices {
            assert!(cpu_of_device(&d.name).is_some(), "{} is no CPU", d.name);
            let numa = d
                .attributes
                .as_ref()
                .and_then(|a| a.get(NUMA_NODE_ATTRIBUTE))
                .and_then(|a| a.int);
            assert!(numa.is_some(), "{} lacks {NUMA_NODE_ATTRIBUTE}", d.name);
            names.push(d.name.clone());
        }
    }
    let device = names.first().cloned().expect("at least one CPU published");

    // Registered as kubelet's plugin watcher checks it.
    let kubelet_plugin = steward_nodeio::kubelet_plugin::KubeletPlugin::new(
        &paths.kubelet,
        CPU_DRIVER,
        &steward_resmgr::dra::SUPPORTED_SERVICES,
        steward_resmgr::dra::READINESS,
    );
    let reg = kubelet_plugin.registration_socket();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !reg.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {}",
            reg.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reg = reg.to_str().unwrap().to_owned();
    let lines = kubelet(
        &bin,
        &[
            "dra",
            "-registration-socket",
            &reg,
            "-driver",
            CPU_DRIVER,
            "-register",
        ],
    )
    .await;
    let info = event(&lines, "info");
    assert_eq!(info["type"], "DRAPlugin");
    assert_eq!(info["name"], CPU_DRIVER);
    assert_eq!(
        Path::new(info["endpoint"].as_str().unwrap()),
        kubelet_plugin.plugin_socket()
    );

    // One claim of a published CPU, one naming a device that is no CPU:
    // one batch, two answers.
    let good = allocated_claim(&api, "cpus", &[&device]).await;
    let bad = allocated_claim(&api, "not-cpus", &["gpu-0"]).await;
    let good_arg = format!("{NS}/cpus/{good}");
    let bad_arg = format!("{NS}/not-cpus/{bad}");
    let lines = kubelet(
        &bin,
        &[
            "dra",
            "-registration-socket",
            &reg,
            "-driver",
            CPU_DRIVER,
            "-prepare",
            "-claim",
            &good_arg,
            "-claim",
            &bad_arg,
        ],
    )
    .await;
    let prepared = &event(&lines, "prepared")["claims"];
    assert_eq!(prepared[&good]["error"], "", "{prepared}");
    let devices = prepared[&good]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "{prepared}");
    assert_eq!(devices[0]["device"], device.as_str());
    assert_eq!(devices[0]["pool"], NODE);
    assert_eq!(strings(&devices[0]["requests"]), ["cpus"]);
    assert_eq!(
        strings(&devices[0]["cdi"]),
        [format!("cpu.steward.dev/claim={good}")]
    );
    let refused = prepared[&bad]["error"].as_str().unwrap();
    assert!(refused.contains("gpu-0"), "{prepared}");
    assert!(
        prepared[&bad]["devices"]
            .as_array()
            .is_none_or(Vec::is_empty)
    );

    // The CDI spec names the claim in the container's environment.
    let spec_path = paths.cdi.join(format!("cpu.steward.dev-{good}.json"));
    let spec: Value = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    assert_eq!(spec["kind"], "cpu.steward.dev/claim");
    assert_eq!(spec["devices"][0]["name"], good.as_str());
    let (name, value) = claim_env(&good);
    assert_eq!(
        strings(&spec["devices"][0]["containerEdits"]["env"]),
        [format!("{name}={value}")]
    );
    assert!(plugin.manager().cpu_claims().await.contains_key(&good));
    assert!(
        !paths
            .cdi
            .join(format!("cpu.steward.dev-{bad}.json"))
            .exists()
    );

    // Unprepare: the CPUs given back, the spec gone; an unknown claim is
    // no error.
    let lines = kubelet(
        &bin,
        &[
            "dra",
            "-registration-socket",
            &reg,
            "-driver",
            CPU_DRIVER,
            "-unprepare",
            "-claim",
            &good_arg,
            "-claim",
            &bad_arg,
        ],
    )
    .await;
    let unprepared = &event(&lines, "unprepared")["claims"];
    assert_eq!(unprepared[&good]["error"], "", "{unprepared}");
    assert_eq!(unprepared[&bad]["error"], "", "{unprepared}");
    assert!(!spec_path.exists());
    assert!(!plugin.manager().cpu_claims().await.contains_key(&good));
    plugin.shutdown().await;

    // Only what the chart grants (crates/steward/tests/chart/dra_cpus.rs
    // checks the chart's rules are exactly these).
    let granted = [
        ("resourceslices", "list"),
        ("resourceslices", "create"),
        ("resourceslices", "update"),
        ("resourceslices", "delete"),
        ("resourceclaims", "get"),
    ];
    let done: Vec<_> = api
        .stats()
        .access
        .into_iter()
        .filter(|a| a.user == DRA_USER)
        .collect();
    assert!(!done.is_empty(), "no call seen as {DRA_USER}");
    for a in &done {
        assert!(
            a.group == "resource.k8s.io"
                && granted.contains(&(a.resource.as_str(), a.verb.as_str())),
            "the CPU driver calls what the chart does not grant: {a:?}"
        );
    }
}
