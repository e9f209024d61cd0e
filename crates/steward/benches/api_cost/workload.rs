//! The pods: a scheduler driver (Filter at an extender, then the Binding,
//! as kube-scheduler does with one feasible node: no Prioritize) and a
//! kubelet simulator (on binding: the pod's status Running and the node's
//! claims written through the agent's claim store for the reserved slots;
//! on deletion: the pod removed, the claims released).
//!
//! Timings of every claim write are kept per Instance: Akri's model
//! (usage inside the Instance object) would have made one read-modify-write
//! of the Instance for each, and writes to one Instance that overlap in
//! time are the conflicts it would have met.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use steward_api::{Reservation, SlotClaim};
use steward_core::ledger::PodRef;
use steward_testing_apiserver::ApiServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::node::SimNode;
use crate::stand::{KUBELET, NS, PROBE, SCHEDULER, Stand, USER};

/// A pod to place: its name, the Instance it asks one slot of, and the
/// nodes that see it (what the scheduler's own filters pass to Filter).
#[derive(Clone, Debug)]
pub struct Ask {
    pub pod: String,
    pub instance: String,
    pub nodes: Vec<String>,
}

/// A pod placed and running.
#[derive(Debug)]
pub struct Placed {
    pub pod: String,
    pub node: usize,
    pub instance: String,
    pub held: Vec<(String, u64)>,
}

/// Write intervals per Instance (Akri's read-modify-writes).
#[derive(Debug, Default)]
pub struct Timeline {
    pub writes: BTreeMap<String, Vec<(Instant, Instant, String)>>,
}

impl Timeline {
    fn record(&mut self, instance: &str, from: Instant, to: Instant, node: &str) {
        self.writes
            .entry(instance.to_owned())
            .or_default()
            .push((from, to, node.to_owned()));
    }

    /// Writes that overlap an earlier-started write of another node to
    /// the same Instance: each would have lost the optimistic-concurrency
    /// race and been retried at least once.
    pub fn conflicts(&self) -> (u64, u64) {
        let (mut writes, mut conflicts) = (0, 0);
        for list in self.writes.values() {
            for (i, (from, to, node)) in list.iter().enumerate() {
                writes += 1;
                let lost = list.iter().enumerate().any(|(j, (f, t, n))| {
                    j != i && n != node && (f < from || (f == from && j < i)) && t > from
                });
                if lost {
                    conflicts += 1;
                }
                let _ = to;
            }
        }
        (writes, conflicts)
    }
}

async fn http(addr: SocketAddr, path: &str, body: &[u8]) -> Value {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    serde_json::from_slice(&out[at..]).unwrap()
}

fn pod_object(ask: &Ask) -> Pod {
    let resource = format!("steward.dev/{}", ask.instance);
    serde_json::from_value(json!({
        "metadata": {"name": ask.pod, "namespace": NS, "labels": {"app": "api-cost"}},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [{
                "name": "main",
                "image": "registry.example/team/app:v1",
                "resources": {"limits": {&resource: "1"}, "requests": {&resource: "1"}},
            }],
        },
    }))
    .unwrap()
}

/// How the scheduling went.
#[derive(Debug, Default)]
pub struct Scheduling {
    /// Filter calls made (retries included).
    pub filters: usize,
    /// Filters that placed the pod nowhere (retried, as kube-scheduler
    /// retries an unschedulable pod after a backoff), with the first
    /// reason seen.
    pub retried: usize,
    pub reason: Option<String>,
    /// Pods never placed (deleted with the others).
    pub unplaced: Vec<String>,
}

/// Rounds of Filter for the pods not placed yet, one second apart.
const ROUNDS: usize = 10;

/// Creates the pods, filters and binds them one at a time, and runs each
/// bound pod on its node.
pub async fn admit(
    stand: &Stand,
    nodes: &Arc<Vec<SimNode>>,
    asks: &[Ask],
    timeline: &Arc<Mutex<Timeline>>,
) -> (Vec<Placed>, Scheduling) {
    let user = Api::<Pod>::namespaced(stand.client(USER), NS);
    let created: Vec<Pod> = futures::stream::iter(asks.iter().map(|a| {
        let user = user.clone();
        async move {
            user.create(&PostParams::default(), &pod_object(a))
                .await
                .unwrap()
        }
    }))
    .buffered(16)
    .collect()
    .await;
    let scheduler = Api::<Pod>::namespaced(stand.client(SCHEDULER), NS);
    let kubelet = Api::<Pod>::namespaced(stand.client(KUBELET), NS);
    let probe = Api::<Reservation>::namespaced(stand.client(PROBE), NS);
    let mut running = Vec::new();
    let mut sched = Scheduling::default();
    let mut queue: Vec<(&Ask, Pod)> = asks.iter().zip(created).collect();
    for round in 0..ROUNDS {
        if queue.is_empty() {
            break;
        }
        if round > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let mut again = Vec::new();
        for (ask, pod) in queue {
            let body =
                serde_json::to_vec(&json!({"Pod": pod, "Nodes": null, "NodeNames": ask.nodes}))
                    .unwrap();
            // kube-scheduler's Service reaches either extender replica.
            let ext = stand.extenders[sched.filters % stand.extenders.len()];
            sched.filters += 1;
            let r = http(ext, "/filter", &body).await;
            let Some(node) = r["NodeNames"]
                .as_array()
                .and_then(|a| a.first())
                .and_then(Value::as_str)
                .map(str::to_owned)
            else {
                sched.retried += 1;
                if sched.reason.is_none() {
                    sched.reason = Some(format!("{} {}", r["FailedNodes"], r["Error"]));
                }
                again.push((ask, pod));
                continue;
            };
            let binding = json!({"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": ask.pod}, "target": {"kind": "Node", "name": node}});
            let _: Value = scheduler
                .create_subresource("binding", &ask.pod, &PostParams::default(), &binding)
                .await
                .unwrap();
            let (nodes, kubelet, probe, timeline, ask) = (
                nodes.clone(),
                kubelet.clone(),
                probe.clone(),
                timeline.clone(),
                ask.clone(),
            );
            let uid = pod.metadata.uid.clone().unwrap();
            running.push(tokio::spawn(async move {
                run_pod(&nodes, &kubelet, &probe, &timeline, &ask, &node, &uid).await
            }));
        }
        queue = again;
    }
    sched.unplaced = queue.into_iter().map(|(a, _)| a.pod.clone()).collect();
    let mut placed = Vec::new();
    for t in running {
        placed.push(t.await.unwrap());
    }
    (placed, sched)
}

/// kubelet on `node` starts the pod: the device plugin's claims on the
/// reserved slots, the pod's status Running.
async fn run_pod(
    nodes: &[SimNode],
    kubelet: &Api<Pod>,
    probe: &Api<Reservation>,
    timeline: &Mutex<Timeline>,
    ask: &Ask,
    node: &str,
    uid: &str,
) -> Placed {
    let index = nodes.iter().position(|n| n.name == node).unwrap();
    // The slots the agent steers kubelet to (GetPreferredAllocation): the
    // reserved ones.
    let slots = reserved_slots(probe, &ask.pod, uid).await;
    let from = Instant::now();
    let held = nodes[index]
        .hold(&PodRef::new(uid, NS, &ask.pod), &slots)
        .await;
    timeline
        .lock()
        .unwrap()
        .record(&ask.instance, from, Instant::now(), node);
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let status = json!({"status": {
        "phase": "Running",
        "hostIP": "10.0.0.1", "podIP": "10.244.0.10", "startTime": now,
        "conditions": [
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0, "started": true,
            "image": "registry.example/team/app:v1", "imageID": "registry.example/team/app@sha256:0",
            "containerID": "containerd://0", "state": {"running": {"startedAt": now}}}],
    }});
    kubelet
        .patch_status(&ask.pod, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    Placed {
        pod: ask.pod.clone(),
        node: index,
        instance: ask.instance.clone(),
        held,
    }
}

async fn reserved_slots(probe: &Api<Reservation>, pod: &str, uid: &str) -> Vec<String> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let found = match probe.get_opt(pod).await.unwrap() {
            Some(r) if r.spec.pod.uid == uid => Some(r),
            _ => probe
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|r| r.spec.pod.uid == uid),
        };
        if let Some(st) = found.and_then(|r| r.status)
            && st.phase == "Reserved"
            && !st.slots.is_empty()
        {
            return st.slots;
        }
        assert!(Instant::now() < until, "no Reserved reservation for {pod}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Deletes the pods as a user does (graceful), then kubelet ends them
/// (grace 0) and the agent releases their slots.
pub async fn delete(
    stand: &Stand,
    nodes: &Arc<Vec<SimNode>>,
    placed: Vec<Placed>,
    unplaced: &[String],
    timeline: &Arc<Mutex<Timeline>>,
) {
    let user = Api::<Pod>::namespaced(stand.client(USER), NS);
    for pod in unplaced {
        // Never bound: gone at once.
        let _ = user.delete(pod, &DeleteParams::default()).await;
    }
    let kubelet = Api::<Pod>::namespaced(stand.client(KUBELET), NS);
    futures::stream::iter(placed.into_iter().map(|p| {
        let (user, kubelet, nodes, timeline) = (
            user.clone(),
            kubelet.clone(),
            nodes.clone(),
            timeline.clone(),
        );
        async move {
            user.delete(&p.pod, &DeleteParams::default()).await.unwrap();
            let _ = kubelet
                .delete(&p.pod, &DeleteParams::default().grace_period(0))
                .await;
            let from = Instant::now();
            nodes[p.node].release(&p.held).await;
            let node = &nodes[p.node].name;
            timeline
                .lock()
                .unwrap()
                .record(&p.instance, from, Instant::now(), node);
        }
    }))
    .buffer_unordered(16)
    .collect::<Vec<()>>()
    .await;
    // Everything gone before the window closes.
    let pods = Api::<Pod>::namespaced(stand.client(PROBE), NS);
    let claims = Api::<SlotClaim>::all(stand.client(PROBE));
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        let left = pods.list(&ListParams::default()).await.unwrap().items.len()
            + claims
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until steward's components have made no request but Lease
/// renewals and watches for `quiet` (at most `cap`).
pub async fn settle(api: &ApiServer, quiet: Duration, cap: Duration) -> Duration {
    let started = Instant::now();
    let mut last = busy(api);
    let mut since = Instant::now();
    while started.elapsed() < cap {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = busy(api);
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            break;
        }
    }
    started.elapsed()
}

fn busy(api: &ApiServer) -> u64 {
    api.stats()
        .by_client
        .iter()
        .filter(|(k, _)| {
            k.component.starts_with("steward-")
                && k.verb != "watch"
                && !k.resource.starts_with("leases")
        })
        .map(|(_, c)| c.requests)
        .sum()
}
