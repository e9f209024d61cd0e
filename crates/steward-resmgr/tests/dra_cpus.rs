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
//!
//! With a runtime (a private containerd 2.1.9, the harness's `Containerd2`,
//! reading the CDI specs the plugin writes): a claim's container created
//! while the plugin is away (restarting) starts unpinned, the runtime's
//! fail-open; when the plugin is back, Synchronize hands it over and it is
//! moved to exactly the claim's CPUs (read from its environment as at
//! CreateContainer), while a pod that sets the claim's variable itself and
//! the shared containers stay off them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

mod common;

use common::{container, cpus_inside, eventually, init_tracing, read_cgroup, run_pod, run_sandbox};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimConsumerReference, ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use serde_json::Value;
use steward_core::cpu::devices::{CPU_DRIVER, claim_env, cpu_of_device};
use steward_core::cpu::{CLAIM_POOL, CpuSet};
use steward_core::dra::NUMA_NODE_ATTRIBUTE;
use steward_proto::cri::runtime::v1 as cri;
use steward_resmgr::dra::DraCpuConfig;
use steward_resmgr::nri::{NriConfig, NriPlugin};
use steward_resmgr::{ClusterConfig, ManagerConfig};
use steward_testing_apiserver::ApiServer;
use steward_testing_containerd as harness;

const NODE: &str = "n1";
const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(60);
/// The DRA side runs as the chart's ServiceAccount would (impersonated):
/// what it calls is checked against what the chart grants.
const DRA_USER: &str = "system:serviceaccount:steward-system:t-steward-nri-plugin";

/// The API server stand-in serving DRA, with steward's CRDs (the NRI
/// plugin's reservation holds watch them), the Node [`NODE`] and the
/// namespaces of the claims and of the containerd harness's pods (Events
/// on a Pod go there).
async fn cluster() -> ApiServer {
    let api = ApiServer::start().await.unwrap();
    api.serve_dra();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let node: Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NODE}})).unwrap();
    Api::<Node>::all(api.client())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    for name in [NS, harness::POD_NAMESPACE] {
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
        let _ = Api::<Namespace>::all(api.client())
            .create(&PostParams::default(), &ns)
            .await;
    }
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
    allocated_claim_for(api, NS, name, devices, ("web", "web-uid")).await
}

/// [`allocated_claim`] in namespace `ns`, reserved for pod `(name, uid)`.
async fn allocated_claim_for(
    api: &ApiServer,
    ns: &str,
    name: &str,
    devices: &[&str],
    pod: (&str, &str),
) -> String {
    let claims: Api<ResourceClaim> = Api::namespaced(api.client(), ns);
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
            name: pod.0.into(),
            uid: pod.1.into(),
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

/// Waits for the plugin's registration socket under `kubelet_dir` and
/// registers it as kubelet's plugin watcher does: the plugin's sockets, the
/// registration socket's path and the peer's lines.
async fn register(
    bin: &Path,
    kubelet_dir: &Path,
) -> (
    steward_nodeio::kubelet_plugin::KubeletPlugin,
    String,
    Vec<Value>,
) {
    let kubelet_plugin = steward_nodeio::kubelet_plugin::KubeletPlugin::new(
        kubelet_dir,
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
        bin,
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
    (kubelet_plugin, reg, lines)
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
    let (kubelet_plugin, reg, lines) = register(&bin, &paths.kubelet).await;
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

/// The plugin attached to `ctrd` with `--dra-cpus`, in cluster mode on
/// `api`, its state, configuration and kubelet directory under `dir` and
/// its CDI specs where `ctrd` reads them; registered with the runtime.
async fn start_nri_plugin(ctrd: &harness::Containerd2, api: &ApiServer, dir: &Path) -> NriPlugin {
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join("config.yaml");
    std::fs::write(&file, "policy: { active: static }").unwrap();
    let mut cfg = ManagerConfig::new(dir.join("state"));
    cfg.config_file = Some(file);
    cfg.config_poll = Duration::from_millis(100);
    cfg.verify_interval = Duration::ZERO;
    let mut cluster = ClusterConfig::new(api.client(), NODE);
    cluster.initial_timeout = Duration::from_secs(1);
    cluster.publish_retry = Duration::from_millis(100);
    cfg.cluster = Some(cluster);
    let mut nri = NriConfig::new(cfg);
    nri.socket = ctrd.nri_sock();
    nri.name = "steward-test".into();
    nri.reconnect = Duration::from_millis(100);
    nri.dra = Some(DraCpuConfig::new(
        api.client_as(DRA_USER).unwrap(),
        NODE.into(),
        &dir.join("kubelet"),
        ctrd.cdi_spec_dir(),
        steward_nodeio::Readiness::new(),
    ));
    let plugin = NriPlugin::start(nri).await.expect("plugin starts");
    assert!(
        plugin.registered(1, Duration::from_secs(20)).await,
        "the plugin did not register:\n{}",
        ctrd.log()
    );
    plugin
}

fn online() -> CpuSet {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    CpuSet::parse(s.trim()).unwrap()
}

/// A container's `cpuset.cpus` (its cgroup, as the runtime set it).
fn cgroup_cpus(sandbox: &cri::PodSandboxConfig, id: &str) -> CpuSet {
    CpuSet::parse(&read_cgroup("cpuset", sandbox, id, "cpuset.cpus")).unwrap()
}

/// Issue 40: the plugin restarts while kubelet starts a pod whose
/// container names a prepared CPU claim (its CDI device, the environment
/// variable containerd injects). The runtime creates it unadjusted (its
/// fail-open, on every CPU); when the plugin is back, Synchronize lists it
/// and it is adopted onto exactly the claim's CPUs. A pod that sets the
/// claim's variable itself is placed without it (it runs already, it cannot
/// be refused: the refusal is a Warning Event on it), and neither it nor the
/// shared containers (one known before, one created while away) keep the
/// claim's CPUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_container_created_while_the_plugin_is_away_is_moved_to_its_cpus() {
    let Some(ctrd_bin) = harness::bin_dir_or_skip("dra_cpus (claim adopted at Synchronize)") else {
        return;
    };
    let Some(bin) = steward_testing_gopeers::binary("kubelet-grpc") else {
        return;
    };
    init_tracing();
    // Dropped last, also when the test panics: containerd, its shims and
    // the pods' cgroups stopped and removed (containerd.sh stop).
    let ctrd = harness::Containerd2::start(ctrd_bin);
    let api = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = start_nri_plugin(&ctrd, &api, dir.path()).await;
    let (mut rt, _img) = harness::cri_client(ctrd.sock()).await.expect("CRI client");
    let all = online();

    // A shared container, placed by the plugin: every CPU.
    let sa = harness::pod_sandbox_config(&ctrd.cgroup_parent, "shared", harness::PodNetwork::Host);
    let (sid_a, a) = run_pod(&mut rt, &sa, container(&sa, "a", 512, 0, 64 << 20)).await;
    assert_eq!(cgroup_cpus(&sa, &a), all);

    // The claim: the node's last published CPU, reserved for pod `web`,
    // prepared over kubelet's wire; the shared container leaves its CPU.
    let mut cpus: Vec<u32> = cpu_slices(&api)
        .await
        .iter()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .filter_map(|d| cpu_of_device(&d.name))
        .collect();
    cpus.sort_unstable();
    assert!(
        cpus.len() >= 2,
        "a claim of one CPU beside a shared pool needs 2 CPUs a claim may take, have {cpus:?}"
    );
    let claimed = *cpus.last().unwrap();
    let device = steward_core::cpu::devices::device_name(claimed);
    let claim_cpus = CpuSet::parse(&claimed.to_string()).unwrap();
    let rest = all.difference(&claim_cpus);
    let sw = harness::pod_sandbox_config(&ctrd.cgroup_parent, "web", harness::PodNetwork::Host);
    let web = sw.metadata.clone().unwrap();
    let uid = allocated_claim_for(&api, NS, "cpus", &[&device], (&web.name, &web.uid)).await;
    let (_sockets, reg, _) = register(&bin, &dir.path().join("kubelet")).await;
    let claim_arg = format!("{NS}/cpus/{uid}");
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
            &claim_arg,
        ],
    )
    .await;
    let prepared = &event(&lines, "prepared")["claims"][&uid];
    assert_eq!(prepared["error"], "", "{prepared}");
    let cdi_device = strings(&prepared["devices"][0]["cdi"]);
    assert_eq!(cdi_device, [format!("cpu.steward.dev/claim={uid}")]);
    assert!(
        ctrd.cdi_spec_dir()
            .join(format!("cpu.steward.dev-{uid}.json"))
            .is_file(),
        "the CDI spec is where containerd reads specs"
    );
    let want = rest.clone();
    eventually(10, "the shared container left the claim's CPU", || {
        let (sa, a, want) = (sa.clone(), a.clone(), want.clone());
        async move { cgroup_cpus(&sa, &a) == want }
    })
    .await;

    // The plugin goes (a restart); the runtime carries on without it.
    plugin.shutdown().await;

    // Meanwhile kubelet starts pod `web`, its container naming the claim's
    // CDI device; a pod that sets the claim's variable itself; and a
    // shared pod. The runtime creates them unadjusted.
    let sid_w = run_sandbox(&mut rt, &sw).await;
    let mut cw = container(&sw, "w", 512, 0, 64 << 20);
    cw.cdi_devices = cdi_device
        .iter()
        .map(|name| cri::CdiDevice { name: name.clone() })
        .collect();
    let w = common::create(&mut rt, &sid_w, &sw, cw)
        .await
        .expect("CreateContainer with the claim's CDI device");
    common::start(&mut rt, &w).await;
    let sf = harness::pod_sandbox_config(&ctrd.cgroup_parent, "forger", harness::PodNetwork::Host);
    let (var, value) = claim_env(&uid);
    let mut cf = container(&sf, "f", 512, 0, 64 << 20);
    cf.envs.push(cri::KeyValue {
        key: var.clone(),
        value: value.clone().into_bytes(),
    });
    let (sid_f, f) = run_pod(&mut rt, &sf, cf).await;
    let sb = harness::pod_sandbox_config(&ctrd.cgroup_parent, "later", harness::PodNetwork::Host);
    let (sid_b, b) = run_pod(&mut rt, &sb, container(&sb, "b", 512, 0, 64 << 20)).await;
    let env = harness::exec_sync(&mut rt, &w, &["env"])
        .await
        .expect("exec env");
    assert!(
        env.stdout.lines().any(|l| l == format!("{var}={value}")),
        "containerd injected the claim's variable from its CDI spec:\n{}",
        env.stdout
    );
    for (s, id) in [(&sw, &w), (&sf, &f), (&sb, &b)] {
        assert_eq!(cgroup_cpus(s, id), all, "{id} created unadjusted");
    }

    // The plugin is back: Synchronize hands it every container; the claim's
    // is adopted onto the claim's CPUs, the others off them.
    let plugin = start_nri_plugin(&ctrd, &api, dir.path()).await;
    let want = claim_cpus.clone();
    eventually(
        30,
        "the claim's container moved to the claim's CPUs",
        || {
            let (sw, w, want) = (sw.clone(), w.clone(), want.clone());
            async move { cgroup_cpus(&sw, &w) == want }
        },
    )
    .await;
    assert_eq!(cpus_inside(&mut rt, &w).await, claim_cpus.to_string());
    for (s, id) in [(&sa, &a), (&sf, &f), (&sb, &b)] {
        let want = rest.clone();
        eventually(30, &format!("{id} off the claim's CPUs"), || {
            let (s, id, want) = (s.clone(), id.clone(), want.clone());
            async move { cgroup_cpus(&s, &id) == want }
        })
        .await;
        assert_eq!(cpus_inside(&mut rt, id).await, rest.to_string(), "{id}");
    }
    let snap = plugin.manager().snapshot().await;
    let asg = snap.containers[&w].assignment.clone().unwrap();
    assert!(asg.exclusive && asg.pool == CLAIM_POOL, "{asg:?}");
    assert_eq!(
        snap.containers[&w].request.cpu_claims,
        std::slice::from_ref(&uid)
    );
    assert!(snap.containers[&f].request.cpu_claims.is_empty());
    assert_eq!(
        plugin.manager().metrics().drift_count("cpu-claim-refused"),
        1
    );
    for r in plugin.manager().verify().await {
        assert!(r.drift.is_empty() && r.error.is_none(), "{r:?}");
    }

    // The forger is told on its Pod why it runs without the claim.
    let forger = sf.metadata.clone().unwrap();
    let events: Api<Event> = Api::namespaced(api.client(), &forger.namespace);
    let refusal = |items: Vec<Event>| {
        items.into_iter().find(|e| {
            e.reason.as_deref() == Some(steward_resmgr::POLICY_DECISION_FAILED)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                    == Some(forger.name.as_str())
        })
    };
    eventually(30, "the forger's PolicyDecisionFailed Event", || {
        let (events, refusal) = (events.clone(), &refusal);
        async move {
            events
                .list(&Default::default())
                .await
                .is_ok_and(|l| refusal(l.items).is_some())
        }
    })
    .await;
    let note = refusal(events.list(&Default::default()).await.unwrap().items)
        .and_then(|e| e.note)
        .unwrap_or_default();
    assert!(note.contains("not reserved for its pod"), "{note}");
    eprintln!(
        "claim {uid} on CPU {claim_cpus}: adopted onto it at Synchronize; shared pool {rest}; \
         forger told: {note}"
    );

    for sid in [&sid_w, &sid_f, &sid_b, &sid_a] {
        harness::cleanup_pod(&mut rt, sid).await.unwrap();
    }
    plugin.shutdown().await;
}
