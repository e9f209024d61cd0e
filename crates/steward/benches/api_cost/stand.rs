//! The cluster side: one API server stand-in with the CRDs, the Nodes and
//! the two Configurations; two controller replicas (direct path, leader
//! Lease) and two extenders as `steward controller` and `steward extender`
//! wire them (their defaults), each naming itself; and kubelet's periodic
//! Node status report, the one Node write every real node makes at rest.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use steward_api::Configuration;
use steward_extender::{Extender, ExtenderConfig, LeaderLease, server};
use steward_leader::{ControllerConfig, DecideConfig};
use steward_testing_apiserver::{ApiServer, Options};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const NS: &str = "default";
pub const SYSTEM_NS: &str = "steward-system";
/// The Configurations: one of local devices (one node each), one of
/// shared devices (three nodes each); the handler of each is named after it.
pub const LOCAL: &str = "bench-local";
pub const SHARED: &str = "bench-shared";
/// Slots per device.
pub const CAPACITY: u32 = 2;
/// Nodes that see each shared device.
pub const SEEN_BY: usize = 3;
/// kubelet's `nodeStatusReportFrequency` (with node leases, the default):
/// an unchanged Node status is still posted this often.
pub const NODE_STATUS_REPORT: Duration = Duration::from_secs(300);
/// kube-apiserver sends a watch bookmark to each watcher about once a
/// minute (the stand-in's default is every second, for tests).
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);

/// The bench's own clients, apart from steward's in the counters.
pub const USER: &str = "bench-user/1";
pub const SCHEDULER: &str = "bench-scheduler/1";
pub const KUBELET: &str = "bench-kubelet/1";
pub const PROBE: &str = "bench-probe/1";

pub fn node_name(i: usize) -> String {
    format!("n{i}")
}

/// Device ids of node `i` of `n`: its local device, and the shared
/// devices that list it (shared device `k` is seen by nodes `3k`, `3k+1`,
/// `3k+2` modulo `n`, as the extender bench lays them out).
pub fn devices_of(i: usize, n: usize) -> (Vec<String>, Vec<String>) {
    let local = vec![format!("{}-local", node_name(i))];
    let shared = (0..n)
        .filter(|k| (0..SEEN_BY).any(|j| (k * SEEN_BY + j) % n == i))
        .map(shared_device)
        .collect();
    (local, shared)
}

pub fn shared_device(k: usize) -> String {
    format!("shared-{k}")
}

pub struct Stand {
    pub api: ApiServer,
    pub extenders: Vec<SocketAddr>,
    pub stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Stand {
    pub async fn start(nodes: usize, dra: bool) -> Stand {
        let api = ApiServer::start_with(Options {
            bookmark_interval: BOOKMARK_INTERVAL,
            ..Options::default()
        })
        .await
        .unwrap();
        if dra {
            api.serve_dra();
        }
        let admin = api.client_with_user_agent(USER).unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
        for crd in steward_api::crds() {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": SYSTEM_NS}})).unwrap();
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        for i in 0..nodes {
            Api::<Node>::all(admin.clone())
                .create(&PostParams::default(), &node_object(&node_name(i)))
                .await
                .unwrap();
        }
        for (name, shared) in [(LOCAL, false), (SHARED, true)] {
            let c: Configuration = serde_json::from_value(json!({
                "apiVersion": "steward.dev/v1alpha1", "kind": "Configuration",
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "discoveryHandler": {"name": name, "details": format!("shared: {shared}")},
                    "capacity": CAPACITY,
                },
            }))
            .unwrap();
            Api::<Configuration>::namespaced(admin.clone(), NS)
                .create(&PostParams::default(), &c)
                .await
                .unwrap();
        }
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        for r in 0..2 {
            let identity = format!("c{r}");
            // `steward controller` with the chart's settings: its defaults,
            // the direct path on.
            let mut cfg = ControllerConfig::new(SYSTEM_NS, &identity);
            cfg.decide = Some(DecideConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                advertise: None,
            });
            let ua = steward_kube::client::user_agent("controller", Some(&identity));
            let client = api.client_with_user_agent(&ua).unwrap();
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                if let Err(e) = steward_leader::run(client, cfg, stop).await {
                    eprintln!("api_cost: controller {identity} stopped: {e}");
                }
            }));
        }
        let mut extenders = Vec::new();
        let mut waiting = Vec::new();
        for r in 0..2 {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            extenders.push(listener.local_addr().unwrap());
            let ua = steward_kube::client::user_agent("extender", Some(&format!("e{r}")));
            let client = api.client_with_user_agent(&ua).unwrap();
            let cfg = ExtenderConfig {
                leader: Some(LeaderLease {
                    namespace: SYSTEM_NS.into(),
                    name: "steward-controller".into(),
                }),
                ..ExtenderConfig::default()
            };
            let ext = Arc::new(Extender::new(client, cfg));
            waiting.push(ext.clone());
            tasks.push(tokio::spawn(server::serve(listener, ext, stop.clone())));
        }
        // Filters go the direct path from the first pod on.
        let until = Instant::now() + Duration::from_secs(60);
        while waiting.iter().any(|e| e.leader_endpoint().is_none()) {
            assert!(
                Instant::now() < until,
                "no controller said where it decides"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tasks.push(tokio::spawn(node_status_reports(
            api.client_with_user_agent(KUBELET).unwrap(),
            nodes,
            stop.clone(),
        )));
        Stand {
            api,
            extenders,
            stop,
            tasks,
        }
    }

    pub fn client(&self, user_agent: &str) -> kube::Client {
        self.api.client_with_user_agent(user_agent).unwrap()
    }

    pub async fn shutdown(self) {
        self.stop.cancel();
        for t in self.tasks {
            let abort = t.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), t)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        self.api.shutdown().await;
    }
}

/// A Node as a kubelet registers it: labels, capacity, conditions,
/// addresses, node info and a short image list (a real one lists up to 50
/// images; its size matters to every watcher of Nodes).
fn node_object(name: &str) -> Node {
    let images: Vec<Value> = (0..20)
        .map(|i| {
            json!({
                "names": [format!("registry.example/team/image-{i}@sha256:{:064x}", i),
                          format!("registry.example/team/image-{i}:v1.{i}.0")],
                "sizeBytes": 10_000_000 + i * 1_000_000,
            })
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "bench.large",
                "topology.kubernetes.io/zone": "zone-a",
            },
        },
        "spec": {"podCIDR": "10.244.0.0/24", "providerID": format!("bench://{name}")},
        "status": {
            "capacity": {"cpu": "16", "memory": "65536Mi", "pods": "110", "ephemeral-storage": "100Gi"},
            "allocatable": {"cpu": "15", "memory": "63488Mi", "pods": "110", "ephemeral-storage": "90Gi"},
            "conditions": conditions(),
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "0123456789abcdef0123456789abcdef",
                "systemUUID": "01234567-89ab-cdef-0123-456789abcdef",
                "bootID": "fedcba98-7654-3210-fedc-ba9876543210",
                "kernelVersion": "6.12.0", "osImage": "Debian GNU/Linux 13",
                "containerRuntimeVersion": "containerd://2.1.9",
                "kubeletVersion": "v1.35.0", "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64",
            },
            "images": images,
        },
    }))
    .unwrap()
}

fn conditions() -> Value {
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let c = |t: &str, s: &str, r: &str| {
        json!({"type": t, "status": s, "reason": r, "message": format!("kubelet says {r}"),
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!([
        c("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        c("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        c("PIDPressure", "False", "KubeletHasSufficientPID"),
        c("Ready", "True", "KubeletReady"),
    ])
}

/// kubelet posts each Node's (unchanged) status every
/// [`NODE_STATUS_REPORT`]; the nodes take turns, evenly spread.
async fn node_status_reports(client: kube::Client, nodes: usize, stop: CancellationToken) {
    let api: Api<Node> = Api::all(client);
    let step = NODE_STATUS_REPORT / u32::try_from(nodes.max(1)).unwrap();
    let mut tick = tokio::time::interval(step);
    tick.tick().await;
    let mut i = 0;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let patch = json!({"status": {"conditions": conditions()}});
        let name = node_name(i % nodes);
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            eprintln!("api_cost: node status of {name}: {e}");
        }
        i += 1;
    }
}

/// Instances by device id: (name, nodes).
pub async fn instances(api: &ApiServer) -> BTreeMap<String, (String, Vec<String>)> {
    let client = api.client_with_user_agent(PROBE).unwrap();
    Api::<steward_api::Instance>::all(client)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|i| {
            (
                i.spec.device_id.clone(),
                (i.metadata.name.clone().unwrap_or_default(), i.spec.nodes),
            )
        })
        .collect()
}

/// The controller replica holding the Lease (its identity), if any.
pub async fn leader(api: &ApiServer) -> Option<String> {
    let client = api.client_with_user_agent(PROBE).unwrap();
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client, SYSTEM_NS)
        .get("steward-controller")
        .await
        .ok()?
        .spec?
        .holder_identity
}
