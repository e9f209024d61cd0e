//! `steward get assignments` and `steward watch assignments`: the node view
//! over the pod resources socket.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use serde::Serialize;
use steward_core::cpu::CpuSet;
use steward_podresources::{INITIAL_EVENTS_HEADER, convert};
use steward_proto::podresources::v1 as wire;
use steward_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use tonic::transport::Channel;

use super::output::{bytes, table};
use super::{Format, SocketArg};

#[derive(Debug, clap::Args)]
pub struct GetArgs {
    #[command(flatten)]
    socket: SocketArg,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    output: Format,
    /// Only pods of this namespace.
    #[arg(short = 'n', long)]
    namespace: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    #[command(flatten)]
    socket: SocketArg,
    /// Stop after this many events (default: follow until interrupted).
    #[arg(long)]
    count: Option<usize>,
    /// Skip the events describing the state at the start; show changes only.
    #[arg(long)]
    changes_only: bool,
    /// Print each event as one JSON object per line.
    #[arg(long)]
    json: bool,
}

pub(super) async fn connect(socket: &Path) -> anyhow::Result<PodResourcesListerClient<Channel>> {
    if !socket.exists() {
        bail!(
            "no pod resources socket at {} (is the steward agent running with --pod-resources-socket? set --socket)",
            socket.display()
        );
    }
    let channel = steward_proto::uds::endpoint()
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(steward_proto::uds::UnixConnector::new(socket))
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    Ok(PodResourcesListerClient::new(channel))
}

pub(super) fn status(call: &str, socket: &Path, s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(
        "{call} on {}: {}: {}",
        socket.display(),
        s.code(),
        s.message()
    )
}

fn numa(t: Option<&wire::TopologyInfo>) -> BTreeSet<i64> {
    t.map(|t| t.nodes.iter().map(|n| n.id).collect())
        .unwrap_or_default()
}

fn join_numa(set: &BTreeSet<i64>) -> String {
    set.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

fn cpus(ids: &[i64]) -> String {
    let set: CpuSet = ids.iter().filter_map(|i| u32::try_from(*i).ok()).collect();
    set.to_string()
}

/// One container as table cells: devices, CPUs, memory, NUMA nodes.
fn cells(c: &wire::ContainerResources, wide: bool) -> [String; 4] {
    let mut numa_all = BTreeSet::new();
    let devices: Vec<String> = c
        .devices
        .iter()
        .map(|d| {
            numa_all.extend(numa(d.topology.as_ref()));
            if wide {
                format!("{}={}", d.resource_name, d.device_ids.join(","))
            } else {
                d.device_ids.join(",")
            }
        })
        .chain(
            c.dynamic_resources
                .iter()
                .map(|d| format!("claim:{}/{}", d.claim_namespace, d.claim_name)),
        )
        .collect();
    let memory: Vec<String> = c
        .memory
        .iter()
        .map(|m| {
            let nodes = numa(m.topology.as_ref());
            numa_all.extend(nodes.iter().copied());
            if wide {
                format!("{}:{}@{}", m.memory_type, bytes(m.size), join_numa(&nodes))
            } else {
                bytes(m.size)
            }
        })
        .collect();
    let dash = |s: String| if s.is_empty() { "-".to_string() } else { s };
    [
        dash(devices.join(" ")),
        dash(cpus(&c.cpu_ids)),
        dash(memory.join(",")),
        dash(join_numa(&numa_all)),
    ]
}

fn rows(pods: &[wire::PodResources], wide: bool) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for p in pods {
        if p.containers.is_empty() {
            out.push(vec![
                p.namespace.clone(),
                p.name.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
        }
        for c in &p.containers {
            let [devices, cpus, memory, numa] = cells(c, wide);
            out.push(vec![
                p.namespace.clone(),
                p.name.clone(),
                c.name.clone(),
                devices,
                cpus,
                memory,
                numa,
            ]);
        }
    }
    out
}

const HEADERS: [&str; 7] = [
    "NAMESPACE",
    "POD",
    "CONTAINER",
    "DEVICES",
    "CPUS",
    "MEMORY",
    "NUMA",
];

/// The structured form of a pod for `-o json|yaml`.
#[derive(Serialize)]
struct PodOut {
    namespace: String,
    name: String,
    containers: std::collections::BTreeMap<String, steward_core::ledger::ContainerAssignments>,
}

fn structured(pods: &[wire::PodResources]) -> Vec<PodOut> {
    pods.iter()
        .map(|p| {
            let a = convert::pod_assignments("", p);
            PodOut {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                containers: a.containers,
            }
        })
        .collect()
}

pub async fn get(args: GetArgs) -> anyhow::Result<()> {
    let socket = &args.socket.socket;
    let mut client = connect(socket).await?;
    let mut pods = client
        .list(wire::ListPodResourcesRequest {})
        .await
        .map_err(|s| status("List", socket, s))?
        .into_inner()
        .pod_resources;
    if let Some(ns) = &args.namespace {
        pods.retain(|p| &p.namespace == ns);
    }
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let text = match args.output {
        Format::Table | Format::Wide => {
            if pods.is_empty() {
                eprintln!("No pods hold resources on this node.");
                return Ok(());
            }
            table(&HEADERS, &rows(&pods, args.output == Format::Wide))
        }
        Format::Json => serde_json::to_string_pretty(&structured(&pods))? + "\n",
        Format::Yaml => serde_saphyr::to_string(&structured(&pods))?,
    };
    print!("{text}");
    Ok(())
}

fn action(a: i32) -> &'static str {
    match wire::WatchPodAction::try_from(a) {
        Ok(wire::WatchPodAction::Added) => "ADDED",
        Ok(wire::WatchPodAction::Deleted) => "DELETED",
        Ok(wire::WatchPodAction::Updated) => "UPDATED",
        Err(_) => "UNKNOWN",
    }
}

/// One event as one line: action, pod, then each container's holdings.
fn event_line(e: &wire::ListAndWatchPodResourcesResponse) -> String {
    let mut line = format!("{:<8}", action(e.action));
    for p in &e.pod_resources {
        line.push_str(&format!(" {}/{} uid={}", p.namespace, p.name, e.uid));
        for c in &p.containers {
            let [devices, cpus, memory, numa] = cells(c, true);
            line.push_str(&format!(
                " | {}: devices={devices} cpus={cpus} memory={memory} numa={numa}",
                c.name
            ));
        }
    }
    line
}

pub async fn watch(args: WatchArgs) -> anyhow::Result<()> {
    let socket = &args.socket.socket;
    let mut client = connect(socket).await?;
    let resp = client
        .list_and_watch(wire::ListAndWatchPodResourcesRequest {})
        .await
        .map_err(|s| status("ListAndWatch", socket, s))?;
    let mut skip: usize = if args.changes_only {
        resp.metadata()
            .get(INITIAL_EVENTS_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    } else {
        0
    };
    let mut stream = resp.into_inner();
    let mut shown = 0usize;
    while let Some(msg) = stream.next().await {
        let e = msg.map_err(|s| status("ListAndWatch", socket, s))?;
        if skip > 0 {
            skip -= 1;
            continue;
        }
        if args.json {
            let pods = structured(&e.pod_resources);
            let obj =
                serde_json::json!({"action": action(e.action), "uid": e.uid, "pod": pods.first()});
            println!("{obj}");
        } else {
            println!("{}", super::escape::term(&event_line(&e)));
        }
        shown += 1;
        if args.count.is_some_and(|n| shown >= n) {
            return Ok(());
        }
    }
    bail!(
        "the pod resources server at {} ended the watch",
        socket.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(name: &str) -> wire::ContainerResources {
        wire::ContainerResources {
            name: name.into(),
            devices: vec![wire::ContainerDevices {
                resource_name: "steward.dev/cam".into(),
                device_ids: vec!["cam-0".into(), "cam-1".into()],
                topology: Some(wire::TopologyInfo {
                    nodes: vec![wire::NumaNode { id: 1 }],
                }),
            }],
            cpu_ids: vec![2, 3, 4],
            memory: vec![wire::ContainerMemory {
                memory_type: "memory".into(),
                size: 1 << 30,
                topology: Some(wire::TopologyInfo {
                    nodes: vec![wire::NumaNode { id: 0 }],
                }),
            }],
            dynamic_resources: vec![],
        }
    }

    #[test]
    fn a_container_row_shows_devices_cpus_memory_and_numa() {
        let pods = vec![wire::PodResources {
            name: "web".into(),
            namespace: "apps".into(),
            containers: vec![
                container("main"),
                wire::ContainerResources {
                    name: "side".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }];
        let t = table(&HEADERS, &rows(&pods, false));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("NAMESPACE   POD   CONTAINER   DEVICES"));
        let main: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            main,
            ["apps", "web", "main", "cam-0,cam-1", "2-4", "1Gi", "0,1"]
        );
        let side: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(side, ["apps", "web", "side", "-", "-", "-", "-"]);
    }

    #[test]
    fn an_event_is_one_line() {
        let e = wire::ListAndWatchPodResourcesResponse {
            action: wire::WatchPodAction::Deleted as i32,
            uid: "u1".into(),
            pod_resources: vec![wire::PodResources {
                name: "web".into(),
                namespace: "apps".into(),
                containers: vec![container("main")],
                ..Default::default()
            }],
        };
        let line = event_line(&e);
        assert!(!line.contains('\n'));
        assert!(line.starts_with("DELETED  apps/web uid=u1 | main: devices=steward.dev/cam=cam-0,cam-1 cpus=2-4 memory=memory:1Gi@0 numa=0,1"), "{line}");
    }
}
