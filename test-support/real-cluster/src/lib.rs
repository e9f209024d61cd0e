//! Helpers for the stories run against upstream's kube-apiserver,
//! kube-scheduler and kubelet (`scripts/real-cluster up`). Test support: a
//! cluster that is not there, or a wait that runs out, panics with what was
//! expected and what was seen.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod bench;

use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use steward_api::{Configuration, Instance};

/// The label on every namespace a story creates (`Cluster::namespace`).
const TEST_LABEL: &str = "steward.dev/real-cluster-story=true";

/// The busybox image every node's containerd holds (scripts/build-images.sh).
pub const BUSYBOX: &str = "steward.local/busybox:latest";

/// The cluster the tier started: `KUBECONFIG`, `STEWARD_CLUSTER_NODES`,
/// `STEWARD_CLUSTER_DIR`, `STEWARD_KUBECTL` and `STEWARD_RELEASE_NAMESPACE`,
/// as `scripts/real-cluster up` prints them.
pub struct Cluster {
    pub client: Client,
    pub nodes: Vec<String>,
    pub dir: PathBuf,
    pub kubectl: PathBuf,
    pub kubeconfig: PathBuf,
    pub release_namespace: String,
    pub version: String,
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: these tests run against the cluster `scripts/real-cluster up DIR` starts \
             (eval its output first); scripts/test runs them in the real-cluster tier"
        )
    })
}

impl Cluster {
    /// Connects with the admin kubeconfig and checks every node is Ready.
    pub async fn connect() -> Cluster {
        let kubeconfig = PathBuf::from(env("KUBECONFIG"));
        let client = Client::try_default()
            .await
            .unwrap_or_else(|e| panic!("kube client from {}: {e}", kubeconfig.display()));
        let cluster = Cluster {
            client,
            nodes: env("STEWARD_CLUSTER_NODES")
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
            dir: PathBuf::from(env("STEWARD_CLUSTER_DIR")),
            kubectl: PathBuf::from(env("STEWARD_KUBECTL")),
            kubeconfig,
            release_namespace: env("STEWARD_RELEASE_NAMESPACE"),
            version: env("STEWARD_CLUSTER_VERSION"),
        };
        let nodes: Api<Node> = Api::all(cluster.client.clone());
        for n in &cluster.nodes {
            let node = nodes
                .get(n)
                .await
                .unwrap_or_else(|e| panic!("node {n}: {e}"));
            assert!(node_ready(&node), "node {n} is not Ready");
        }
        cluster
    }

    /// A container's cgroup cpuset (cgroup v1: runc mounts the container's
    /// own cpuset cgroup there), read through the real kubelet's exec in
    /// the pod's first container.
    pub fn cpuset(&self, ns: &str, pod: &str) -> BTreeSet<u32> {
        cpus_of(&self.kubectl(&[
            "exec",
            "-n",
            ns,
            pod,
            "--",
            "cat",
            "/sys/fs/cgroup/cpuset/cpuset.cpus",
        ]))
    }

    /// `kubectl --kubeconfig <admin> ARGS`: stdout, or a panic with stderr.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.kubectl.display()));
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A namespace of the test's own, deleted when the guard drops (also when
    /// the test panics).
    pub async fn namespace(&self, prefix: &str) -> TestNamespace {
        let name = format!(
            "{prefix}-{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64 & 0xffffff)
                .unwrap_or(0)
        );
        let api: Api<Namespace> = Api::all(self.client.clone());
        // Every story starts on a cluster the previous one has left: its
        // namespace (pods, exclusive CPUs, slots) is gone, even when its
        // deletion outlived the guard's wait. Otherwise a pod of the
        // previous story could hold the CPU or slot this one needs, and the
        // runtime's refusals would put this one's containers in kubelet's
        // back-off.
        let labelled = ListParams::default().labels(TEST_LABEL);
        let left = eventually(
            "the previous stories' namespaces gone",
            Duration::from_secs(180),
            || {
                let api = api.clone();
                let labelled = labelled.clone();
                async move {
                    let list = api.list(&labelled).await.ok()?;
                    list.items.is_empty().then_some(())
                }
            },
        );
        left.await;
        let ns: Namespace = serde_json::from_value(json!({"metadata": {
            "name": name,
            "labels": {TEST_LABEL.split_once('=').unwrap().0: "true"},
        }}))
        .unwrap();
        api.create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        // Pods may be created once the namespace's default ServiceAccount is.
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.client.clone(), &name);
        eventually(
            &format!("the default ServiceAccount of {name}"),
            Duration::from_secs(60),
            || {
                let sas = sas.clone();
                async move { sas.get_opt("default").await.ok().flatten() }
            },
        )
        .await;
        TestNamespace {
            name,
            kubectl: self.kubectl.clone(),
            kubeconfig: self.kubeconfig.clone(),
        }
    }

    pub fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    pub fn instances(&self, ns: &str) -> Api<Instance> {
        Api::namespaced(self.client.clone(), ns)
    }

    pub fn configurations(&self, ns: &str) -> Api<Configuration> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Creates a pod from JSON.
    pub async fn create_pod(&self, ns: &str, pod: Value) -> Pod {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        self.pods(ns)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("create pod {:?}: {e}", pod.metadata.name))
    }

    /// Deletes a pod at once (grace period 0) and waits until it is gone.
    pub async fn delete_pod_now(&self, ns: &str, name: &str) {
        let pods = self.pods(ns);
        let _ = pods
            .delete(name, &DeleteParams::default().grace_period(0))
            .await;
        eventually(
            &format!("pod {ns}/{name} gone"),
            Duration::from_secs(90),
            || {
                let pods = pods.clone();
                async move {
                    match pods.get_opt(name).await {
                        Ok(None) => Some(()),
                        _ => None,
                    }
                }
            },
        )
        .await;
    }

    /// Waits until pod `name` is Running (all containers started); panics
    /// early when it fails admission or ends, and on timeout with what the
    /// cluster says about the pod (`why_not_running`).
    pub async fn running(&self, ns: &str, name: &str, timeout: Duration) -> Pod {
        let pods = self.pods(ns);
        let start = Instant::now();
        loop {
            if let Some(pod) = pods.get_opt(name).await.ok().flatten() {
                let status = pod.status.clone().unwrap_or_default();
                match status.phase.as_deref() {
                    Some("Running") => return pod,
                    Some("Failed") => panic!(
                        "pod {ns}/{name} failed: reason {:?}, message {:?}",
                        status.reason, status.message
                    ),
                    _ => {}
                }
            }
            if start.elapsed() >= timeout {
                panic!(
                    "timed out after {timeout:?} waiting for pod {ns}/{name} Running\n{}",
                    self.why_not_running(ns, name)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What the cluster says about a pod that is not running: its status
    /// (phase, conditions, container states), the namespace's events, and
    /// the last lines of the steward pods' logs on its node. Best effort:
    /// a part that cannot be read says so.
    pub fn why_not_running(&self, ns: &str, name: &str) -> String {
        let run = |args: &[&str]| -> String {
            match Command::new(&self.kubectl)
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args)
                .output()
            {
                Ok(out) => format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
                Err(e) => format!("kubectl {args:?}: {e}\n"),
            }
        };
        let mut report = String::new();
        report += "--- pod status\n";
        report += &run(&[
            "get",
            "pod",
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.nodeName} {.status}",
        ]);
        report += "\n--- events\n";
        report += &run(&["get", "events", "-n", ns, "--sort-by=.lastTimestamp"]);
        report += "--- pods on the nodes\n";
        report += &run(&["get", "pods", "-A", "-o", "wide"]);
        let node = run(&[
            "get",
            "pod",
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.nodeName}",
        ]);
        if !node.trim().is_empty() && !node.contains(' ') {
            let selector = format!("spec.nodeName={}", node.trim());
            let steward = run(&[
                "get",
                "pods",
                "-n",
                &self.release_namespace,
                "--field-selector",
                &selector,
                "-o",
                "jsonpath={.items[*].metadata.name}",
            ]);
            for pod in steward.split_whitespace() {
                report += &format!("--- logs of {pod} (last 40 lines)\n");
                report += &run(&[
                    "logs",
                    "-n",
                    &self.release_namespace,
                    pod,
                    "--all-containers",
                    "--tail=40",
                ]);
            }
        }
        report
    }

    /// The node's allocatable quantity of `resource` (0 when absent).
    pub async fn allocatable(&self, node: &str, resource: &str) -> i64 {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes
            .get(node)
            .await
            .unwrap_or_else(|e| panic!("node {node}: {e}"));
        node.status
            .and_then(|s| s.allocatable)
            .and_then(|a| a.get(resource).map(|q| q.0.clone()))
            .and_then(|q| q.parse().ok())
            .unwrap_or(0)
    }

    /// Instances of `configuration` in `ns`.
    pub async fn instances_of(&self, ns: &str, configuration: &str) -> Vec<Instance> {
        self.instances(ns)
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("list instances in {ns}: {e}"))
            .items
            .into_iter()
            .filter(|i| i.spec.configuration_name == configuration)
            .collect()
    }

    /// Creates `conf` in `ns`.
    pub async fn create_configuration(&self, ns: &str, conf: &Configuration) {
        self.configurations(ns)
            .create(&PostParams::default(), conf)
            .await
            .unwrap_or_else(|e| panic!("create Configuration {:?}: {e}", conf.metadata.name));
    }

    /// Waits for the Instance of `configuration` that only `node` sees.
    pub async fn instance_on(&self, ns: &str, configuration: &str, node: &str) -> Instance {
        eventually(
            &format!("an Instance of {configuration} on {node}"),
            Duration::from_secs(90),
            || async {
                self.instances_of(ns, configuration)
                    .await
                    .into_iter()
                    .find(|i| i.spec.nodes.len() == 1 && i.spec.nodes[0] == node)
            },
        )
        .await
    }

    /// Waits until `node` advertises `n` of `resource` (kubelet's allocatable).
    pub async fn wait_allocatable(&self, node: &str, resource: &str, n: i64) {
        eventually(
            &format!("{node} allocatable {resource} = {n}"),
            Duration::from_secs(90),
            || async { (self.allocatable(node, resource).await == n).then_some(()) },
        )
        .await
    }

    /// Waits for the controller's DeviceClass of `configuration` in `ns`;
    /// returns its name.
    pub async fn device_class(&self, ns: &str, configuration: &str) -> String {
        let class = format!("{configuration}.{ns}.steward.dev");
        eventually(
            &format!("DeviceClass {class}"),
            Duration::from_secs(90),
            || {
                let class = class.clone();
                async move {
                    self.kubectl(&["get", "deviceclasses", "-o", "name"])
                        .contains(&format!("deviceclass.resource.k8s.io/{class}"))
                        .then_some(())
                }
            },
        )
        .await;
        class
    }

    /// `kubectl apply` of one object into `ns` (kubectl's own serializer on
    /// the wire).
    pub fn apply(&self, ns: &str, obj: &Value) {
        let dir = std::env::temp_dir().join(format!("steward-rc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!(
            "{}-{}.json",
            obj["kind"].as_str().unwrap_or("obj"),
            obj["metadata"]["name"].as_str().unwrap_or("x")
        ));
        std::fs::write(&file, obj.to_string()).unwrap();
        self.kubectl(&["apply", "-n", ns, "-f", file.to_str().unwrap()]);
    }

    /// Every SlotClaim in `ns`, as JSON.
    pub fn slotclaims(&self, ns: &str) -> Vec<Value> {
        let v: Value =
            serde_json::from_str(&self.kubectl(&["get", "slotclaims", "-n", ns, "-o", "json"]))
                .unwrap();
        v["items"].as_array().cloned().unwrap_or_default()
    }

    /// Every event in `ns` whose reason is `reason`, as "object: message".
    pub fn events_with_reason(&self, ns: &str, reason: &str) -> Vec<String> {
        let out = self.kubectl(&["get", "events", "-n", ns, "-o", "json"]);
        let v: Value = serde_json::from_str(&out).unwrap();
        v["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|e| e["reason"] == reason)
                    .map(|e| {
                        format!(
                            "{}: {}",
                            e["involvedObject"]["name"].as_str().unwrap_or(""),
                            e["message"].as_str().unwrap_or("")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A namespace deleted when dropped, waiting (a minute at most) until it
/// is gone: the next story starts on nodes this one's pods have left (an
/// exclusive CPU or a slot still held would change what it sees).
pub struct TestNamespace {
    pub name: String,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let _ = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args([
                "delete",
                "namespace",
                &self.name,
                "--wait=true",
                "--timeout=60s",
            ])
            .output();
    }
}

/// Polls `f` every 200 ms until it returns `Some`, for at most `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A cpuset list ("0-2,4") as a set.
pub fn cpus_of(list: &str) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
            None => {
                out.insert(part.parse().unwrap());
            }
        }
    }
    out
}

/// A pod of busybox running `sh -c script`, asking `resources` (as limits,
/// so requests equal them), on no node in particular.
pub fn busybox_pod(name: &str, script: &str, limits: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
            "containers": [{
                "name": "c",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "resources": {"limits": limits},
            }],
        },
    })
}

/// The standard NUMA node attribute of DRA devices.
pub const NUMA_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";
/// The resource manager's CPU driver and DeviceClass.
pub const CPU_DRIVER: &str = "cpu.steward.dev";

/// [`debug_echo_configuration`] whose devices say they are on NUMA node
/// `numa` (the debug-echo `properties`, read as `NUMA_NODE`).
pub fn debug_echo_on_numa(
    name: &str,
    descriptions: &[&str],
    capacity: u32,
    numa: u32,
) -> Configuration {
    let mut c = debug_echo_configuration(name, descriptions, capacity);
    c.spec.discovery_handler.details = serde_json::to_string(&json!({
        "descriptions": descriptions,
        "properties": {"NUMA_NODE": numa.to_string()},
    }))
    .unwrap();
    c
}

/// A ResourceClaim spec asking one device of `class` (request `dev`) and
/// `cpus` CPUs of [`CPU_DRIVER`] (request `cpu`), all on one NUMA node.
pub fn aligned_claim_spec(class: &str, cpus: u32) -> Value {
    json!({"devices": {
        "requests": [
            {"name": "dev", "exactly": {"deviceClassName": class}},
            {"name": "cpu", "exactly": {"deviceClassName": CPU_DRIVER, "count": cpus}},
        ],
        "constraints": [{"requests": ["dev", "cpu"], "matchAttribute": NUMA_ATTRIBUTE}],
    }})
}

/// A Configuration of the embedded debug-echo handler: one device per
/// description, `capacity` slots each.
pub fn debug_echo_configuration(name: &str, descriptions: &[&str], capacity: u32) -> Configuration {
    serde_json::from_value(json!({
        "apiVersion": "steward.dev/v1alpha1",
        "kind": "Configuration",
        "metadata": {"name": name},
        "spec": {
            "discoveryHandler": {
                "name": "debug-echo",
                "details": serde_json::to_string(&json!({"descriptions": descriptions})).unwrap(),
            },
            "capacity": capacity,
            "brokerProperties": {"STORY": name},
        },
    }))
    .unwrap()
}
