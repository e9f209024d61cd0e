//! The agent's kubelet-facing wires against grpc-go clients built from
//! kubelet's own generated code (the Go peer `kubelet-grpc`), dialing as
//! kubelet does: the device manager (Registration served by the peer,
//! GetDevicePluginOptions, ListAndWatch, GetPreferredAllocation, Allocate,
//! PreStartContainer) feeding kubelet's pod resources, steward's pod
//! resources socket (List, Get, GetAllocatableResources), and the plugin
//! watcher and DRA manager (GetInfo, NotifyRegistrationStatus,
//! NodePrepareResources, NodeUnprepareResources) on a claim the API server
//! stand-in's DRA allocator allocated. The peer exits non-zero on any
//! answer kubelet would refuse.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dp;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use dp::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::Value;
use steward_agent::dra::DraPluginConfig;
use steward_agent::pod_resources::PodResourcesConfig;
use steward_testing_apiserver::dra_alloc::allocate_claim;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// Generous: the peer and the agent share two cores with other tests.
const PEER_WAIT: Duration = Duration::from_secs(60);

fn peer() -> Option<PathBuf> {
    steward_testing_gopeers::binary("kubelet-grpc")
}

/// A long-running peer: its JSON lines arrive on a channel; killed on drop.
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<Value>,
    seen: Vec<Value>,
}

impl Running {
    fn start(bin: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("peer printed non-JSON {line:?}: {e}"));
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        Self {
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The next line whose `event` is `event`; a violation or error the
    /// peer reports fails the test with its message.
    async fn next(&mut self, event: &str) -> Value {
        loop {
            let v = match tokio::time::timeout(PEER_WAIT, self.lines.recv()).await {
                Ok(Some(v)) => v,
                Ok(None) => panic!(
                    "peer exited before {event:?} ({:?}); saw {:#?}",
                    self.child.try_wait(),
                    self.seen
                ),
                Err(_) => panic!(
                    "no {event:?} from the peer in {PEER_WAIT:?}; saw {:#?}",
                    self.seen
                ),
            };
            self.seen.push(v.clone());
            match v["event"].as_str() {
                Some(e) if e == event => return v,
                Some("violation" | "error" | "timeout") => {
                    panic!("the peer (as kubelet) refused steward's answer: {v}")
                }
                _ => {}
            }
        }
    }

    /// Closes stdin (the peer's cue to stop) and waits for a clean exit.
    async fn finish(mut self) {
        drop(self.stdin.take());
        self.next("done").await;
        let status = tokio::time::timeout(PEER_WAIT, self.child.wait())
            .await
            .expect("peer exits")
            .unwrap();
        assert!(status.success(), "peer exit {status}; saw {:#?}", self.seen);
    }
}

/// Runs the peer to completion; its JSON lines, failing the test on a
/// non-zero exit (a protocol violation is exit 2).
async fn run(bin: &Path, args: &[&str]) -> Vec<Value> {
    let out = tokio::time::timeout(
        PEER_WAIT,
        Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("peer finishes")
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

/// Pod `web` bound to `node` in the API (what the agent resolves kubelet's
/// pod resources against); its UID.
async fn create_pod(client: &kube::Client, node: &str, resource: &str) -> String {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"nodeName": node, "containers": [{
            "name": "main", "image": "busybox",
            "resources": {"limits": {resource: "1"}}
        }]}
    }))
    .unwrap();
    let pod = Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    pod.metadata.uid.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugin_and_pod_resources_wires_as_kubelet_dials_them() {
    let Some(bin) = peer() else { return };
    let server = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("node-a-kubelet");
    let kubelet_podres = root.join("pod-resources").join("kubelet.sock");
    // The peer is kubelet here: its Registration and pod resources
    // sockets are up before the agent starts.
    let mut kubelet = Running::start(
        &bin,
        &[
            "deviceplugin",
            "-dir",
            root.join("device-plugins").to_str().unwrap(),
            "-podresources-socket",
            kubelet_podres.to_str().unwrap(),
            "-devices",
            "2",
            "-namespace",
            NS,
            "-pod",
            "web",
            "-container",
            "main",
            "-timeout",
            "300s",
            // steward does not require PreStartContainer; call it anyway
            // so its answer crosses this wire too.
            "-prestart",
        ],
    );
    kubelet.next("listening").await;

    let mut cfg = agent_config_at(
        "node-a",
        &root,
        &dir.path().join("node-a-cdi"),
        dir.path(),
        server.client(),
        echo(false),
    );
    let socket = dir.path().join("steward-pod-resources.sock");
    let mut pr = PodResourcesConfig::new(&socket);
    pr.kubelet_socket = Some(kubelet_podres.clone());
    pr.kubelet_poll = Duration::from_millis(200);
    cfg.pod_resources = Some(pr);
    let _agent = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 2),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let instance = inst.metadata.name.clone().unwrap();
    let res = resource(&inst);
    let uid = create_pod(&server.client(), "node-a", &res).await;

    // Registration accepted (the peer validated version, name, endpoint).
    let registered = kubelet.next("registered").await;
    assert_eq!(registered["version"], "v1beta1");
    assert_eq!(registered["resource"], res.as_str());

    // ListAndWatch: both slots, healthy.
    let devices = loop {
        let d = kubelet.next("devices").await;
        if d["devices"]
            .as_array()
            .is_some_and(|a| a.len() == 2 && a.iter().all(|d| d["health"] == "Healthy"))
        {
            break d;
        }
    };
    let mut ids: Vec<String> = devices["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    assert_eq!(ids, [format!("{instance}-0"), format!("{instance}-1")]);

    // steward offers GetPreferredAllocation: one of the available slots.
    assert_eq!(registered["preferred_allocation"], true, "{registered}");
    let preferred = strings(&kubelet.next("preferred").await["preferred"]);
    assert_eq!(preferred.len(), 1, "{preferred:?}");

    // Allocate grants the preferred slot (one container response, checked
    // by the peer), naming the Instance's CDI device; the SlotClaim follows
    // and is attributed to the pod through kubelet's pod resources.
    let allocated = kubelet.next("allocated").await;
    let granted = strings(&allocated["devices"]);
    assert_eq!(granted, preferred, "{allocated}");
    let slot = granted[0].clone();
    assert!(ids.contains(&slot));
    assert_eq!(
        strings(&allocated["cdi_devices"]),
        [format!("steward.dev/cams={NS}_{instance}")],
        "{allocated}"
    );
    let prestarted = kubelet.next("prestarted").await;
    assert_eq!(strings(&prestarted["devices"]), granted);
    kubelet.next("ready").await;
    let claim = wait_bound(&server, &slot, &uid).await;
    assert_eq!(claim.spec.node, "node-a");

    // steward's pod resources socket, read by kubelet's v1 client: the pod
    // holds the slot (List and Get), both slots are allocatable.
    let socket_arg = socket.to_str().unwrap().to_owned();
    let lines = eventually("the slot of web on steward's pod resources", WAIT, || {
        let (bin, socket_arg, res, slot) =
            (bin.clone(), socket_arg.clone(), res.clone(), slot.clone());
        async move {
            let lines = run(
                &bin,
                &[
                    "podresources",
                    "-socket",
                    &socket_arg,
                    "-namespace",
                    NS,
                    "-pod",
                    "web",
                ],
            )
            .await;
            let holds = |pod: &Value| {
                pod["containers"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c["name"] == "main"
                            && c["devices"].as_array().is_some_and(|ds| {
                                ds.iter().any(|d| {
                                    d["resource"] == res.as_str()
                                        && strings(&d["ids"]) == [slot.clone()]
                                })
                            })
                    })
                })
            };
            let listed = event(&lines, "list")["pods"].as_array().is_some_and(|ps| {
                ps.iter()
                    .any(|p| p["name"] == "web" && p["namespace"] == NS && holds(p))
            });
            let got = lines
                .iter()
                .find(|v| v["event"] == "get")
                .is_some_and(|g| holds(&g["pod"]));
            (listed && got).then_some(lines)
        }
    })
    .await;
    let allocatable = &event(&lines, "allocatable")["devices"];
    let mut alloc_ids: Vec<String> = allocatable
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["resource"] == res.as_str())
        .flat_map(|d| strings(&d["ids"]))
        .collect();
    alloc_ids.sort();
    assert_eq!(alloc_ids, ids, "{allocatable}");

    kubelet.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_registration_prepare_and_unprepare_as_kubelet_dials_them() {
    let Some(bin) = peer() else { return };
    let server = api_server().await;
    server.serve_dra();
    let dir = tempfile::tempdir().unwrap();
    // No kubelet stand-in: the peer is kubelet's plugin watcher and DRA
    // manager on this root.
    let root = dir.path().join("node-a-kubelet");
    let mut cfg = agent_config_at(
        "node-a",
        &root,
        &dir.path().join("node-a-cdi"),
        dir.path(),
        server.client(),
        echo(false),
    );
    let dra = DraPluginConfig::new(&root);
    cfg.dra_plugin = Some(dra.clone());
    cfg.dra_slices = true;
    let _agent = Agent::start(cfg);
    create_configuration(
        &server,
        &configuration("cams", "debug-echo", &echo_details(&["cam"]), 2),
    )
    .await;
    let inst = instance_of(&server, "cams", &["node-a"]).await;
    let instance = inst.metadata.name.clone().unwrap();
    wait_for_devices(&server, 2).await;
    let reg_socket = dra.registration_socket();
    eventually("the DRA registration socket", WAIT, || async {
        reg_socket.exists().then_some(())
    })
    .await;
    let reg_arg = reg_socket.to_str().unwrap().to_owned();

    // The plugin watcher: GetInfo validated, registration notified.
    let lines = run(
        &bin,
        &[
            "dra",
            "-registration-socket",
            &reg_arg,
            "-driver",
            "steward.dev",
            "-register",
        ],
    )
    .await;
    let info = event(&lines, "info");
    assert_eq!(info["type"], "DRAPlugin");
    assert_eq!(info["name"], "steward.dev");
    assert_eq!(
        Path::new(info["endpoint"].as_str().unwrap()),
        dra.plugin_socket()
    );
    assert!(strings(&info["versions"]).contains(&"v1.DRAPlugin".to_owned()));
    assert_eq!(event(&lines, "registration-notified")["registered"], true);

    // A claim allocated by the stand-in's allocator (as kube-scheduler).
    create_device_class(&server, "cams").await;
    create_claim(&server.client(), "cam", "cams.default.steward.dev").await;
    let allocated = allocate_claim(&server.client(), NS, "cam", "web", "web-uid", "node-a")
        .await
        .unwrap();
    let claim_uid = allocated.metadata.uid.clone().unwrap();
    let result = allocated
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap()
        .remove(0);
    let claim_arg = format!("{NS}/cam/{claim_uid}");

    // NodePrepareResources (v1): one result for the claim, its device with
    // the Instance's CDI device; the slot is held.
    let lines = run(
        &bin,
        &[
            "dra",
            "-registration-socket",
            &reg_arg,
            "-driver",
            "steward.dev",
            "-prepare",
            "-claim",
            &claim_arg,
        ],
    )
    .await;
    let prepared = &event(&lines, "prepared")["claims"][&claim_uid];
    assert_eq!(prepared["error"], "", "{prepared}");
    let devices = prepared["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "{prepared}");
    assert_eq!(devices[0]["device"], result.device.as_str());
    assert_eq!(devices[0]["pool"], result.pool.as_str());
    assert_eq!(strings(&devices[0]["requests"]), ["cam"]);
    assert_eq!(
        strings(&devices[0]["cdi"]),
        [format!("steward.dev/cams={NS}_{instance}")]
    );
    let held = claim_of(&server, &result.device)
        .await
        .expect("prepared claim holds its slot");
    assert!(held.spec.resource_claim.is_some());

    // NodeUnprepareResources (v1): one result, no error; the slot is free.
    let lines = run(
        &bin,
        &[
            "dra",
            "-registration-socket",
            &reg_arg,
            "-driver",
            "steward.dev",
            "-unprepare",
            "-claim",
            &claim_arg,
        ],
    )
    .await;
    assert_eq!(
        event(&lines, "unprepared")["claims"][&claim_uid]["error"],
        "",
        "{lines:?}"
    );
    wait_released(&server, &result.device).await;
}
