//! `steward explain pod NS/NAME`: which slots, CPUs and memory a pod holds,
//! since when, and why — from the cluster (the pod, its SlotClaims, its
//! Reservation) and, with `--socket`, from the node's pod resources view
//! (devices, exclusive CPUs and memory per container). `--local` reads only
//! the socket, for a node without cluster access.

use super::escape::term;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::bail;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde::Serialize;
use steward_api::{Reservation, SlotClaim};
use steward_core::ledger::ContainerAssignments;
use steward_core::reservation::reservation_name;
use steward_proto::podresources::v1 as wire;

use super::Format;
use super::cells::{claim_since_ms, claim_state};
use super::kube_view::{Cluster, ClusterArgs, ScopeArgs, structured};
use super::output::table;
use super::times::{now_ms, when};

#[derive(Debug, clap::Args)]
pub struct PodArgs {
    /// The pod: NAMESPACE/NAME, or NAME in the context's namespace.
    pod: String,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Also read this node's pod resources socket (steward's) for the pod's
    /// devices, CPUs and memory per container.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Read only the pod resources socket (no cluster); needs --socket and
    /// NAMESPACE/NAME.
    #[arg(long, requires = "socket")]
    local: bool,
    /// Output format (table: a description; json or yaml: one object).
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    output: Format,
}

/// One slot the pod holds.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeldSlot {
    pub instance: String,
    pub slot: String,
    pub node: String,
    pub container: Option<String>,
    pub since_ms: Option<i64>,
    pub state: String,
    pub why: String,
}

/// The reservation made for the pod at scheduling time.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReservationInfo {
    pub phase: String,
    pub node: Option<String>,
    pub slots: Vec<String>,
    /// Exclusive CPUs held, on NUMA node `numa_node` of `node`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    pub reason: Option<String>,
}

/// Everything `explain pod` found.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub node: Option<String>,
    pub phase: Option<String>,
    /// Slots per Instance the pod's containers ask for.
    pub requests: BTreeMap<String, u32>,
    pub slots: Vec<HeldSlot>,
    pub reservation: Option<ReservationInfo>,
    /// Instance → (wanted, held) where the pod holds fewer than it asks.
    pub short: BTreeMap<String, (u32, u32)>,
    /// Per container, from the node's pod resources (with --socket).
    pub containers: Option<BTreeMap<String, ContainerAssignments>>,
}

/// Why a claim holds its slot, in words.
fn why(claim: &SlotClaim) -> String {
    let node = &claim.spec.node;
    match claim_state(claim) {
        "Held" => format!(
            "{node}'s device plugin granted it at Allocate; the pod was matched to it from kubelet's pod resources"
        ),
        "Awaiting" => format!(
            "{node}'s device plugin granted it at Allocate; not yet matched to a pod (kubelet's pod resources will tell)"
        ),
        _ => format!("claimed by {node}; no pod recorded"),
    }
}

fn slot_of(claim: &SlotClaim) -> HeldSlot {
    HeldSlot {
        instance: claim.spec.instance.clone(),
        slot: claim.spec.slot_id(),
        node: claim.spec.node.clone(),
        container: claim.spec.container.clone(),
        since_ms: claim_since_ms(claim),
        state: claim_state(claim).to_owned(),
        why: why(claim),
    }
}

/// The explanation from what the cluster says.
pub fn explain(pod: &Pod, claims: &[SlotClaim], reservation: Option<&Reservation>) -> Explanation {
    let uid = pod.metadata.uid.clone();
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mine = |c: &&SlotClaim| {
        c.spec.pod.as_ref().is_some_and(|p| match &uid {
            Some(u) if !p.uid.is_empty() => &p.uid == u,
            _ => p.namespace == namespace && p.name == name,
        })
    };
    let mut slots: Vec<HeldSlot> = claims.iter().filter(mine).map(slot_of).collect();
    slots.sort_by(|a, b| a.slot.cmp(&b.slot));
    let requests = steward_extender::slot_request(pod);
    let mut short = BTreeMap::new();
    for (instance, want) in &requests {
        let held = slots.iter().filter(|s| &s.instance == instance).count();
        let held = u32::try_from(held).unwrap_or(u32::MAX);
        if held < *want {
            short.insert(instance.clone(), (*want, held));
        }
    }
    Explanation {
        namespace,
        name,
        uid,
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
        requests,
        slots,
        reservation: reservation.and_then(|r| {
            r.status.as_ref().map(|s| ReservationInfo {
                phase: s.phase.clone(),
                node: s.node.clone(),
                slots: s.slots.clone(),
                cpus: s.numa_node.map(|_| s.cpus),
                numa_node: s.numa_node,
                reason: s.reason.clone(),
            })
        }),
        short,
        containers: None,
    }
}

/// The description `explain pod` prints.
pub fn render(e: &Explanation, now_ms: i64) -> String {
    let mut out = String::new();
    let dash = |o: &Option<String>| o.clone().unwrap_or_else(|| "<none>".into());
    let _ = writeln!(
        out,
        "Pod:          {}/{}",
        term(&e.namespace),
        term(&e.name)
    );
    let _ = writeln!(out, "UID:          {}", term(&dash(&e.uid)));
    let _ = writeln!(out, "Node:         {}", term(&dash(&e.node)));
    let _ = writeln!(out, "Phase:        {}", term(&dash(&e.phase)));
    let requests: Vec<String> = e
        .requests
        .iter()
        .map(|(i, n)| format!("steward.dev/{i}: {n}"))
        .collect();
    let _ = writeln!(
        out,
        "Requests:     {}",
        if requests.is_empty() {
            "<none>".into()
        } else {
            term(&requests.join(", ")).into_owned()
        }
    );
    if e.slots.is_empty() {
        let _ = writeln!(out, "Slots:        <none>");
    } else {
        let _ = writeln!(out, "Slots:");
        let rows: Vec<Vec<String>> = e
            .slots
            .iter()
            .map(|s| {
                vec![
                    s.slot.clone(),
                    s.node.clone(),
                    s.container.clone().unwrap_or_else(|| "-".into()),
                    when(s.since_ms, now_ms),
                    s.state.clone(),
                ]
            })
            .collect();
        for line in table(&["SLOT", "NODE", "CONTAINER", "SINCE", "STATE"], &rows).lines() {
            let _ = writeln!(out, "  {line}");
        }
        let _ = writeln!(out, "Why:");
        for s in &e.slots {
            let _ = writeln!(out, "  {}: {}", term(&s.slot), term(&s.why));
        }
    }
    for (instance, (want, held)) in &e.short {
        let _ = writeln!(
            out,
            "Not held:     steward.dev/{}: asks for {want}, holds {held}",
            term(instance)
        );
    }
    match &e.reservation {
        None => {
            let _ = writeln!(out, "Reservation:  <none>");
        }
        Some(r) => {
            let mut line = r.phase.clone();
            if let Some(n) = &r.node {
                let _ = write!(line, " on {n}");
            }
            let mut held = r.slots.clone();
            if let (Some(n), Some(k)) = (r.cpus, r.numa_node) {
                held.push(format!("{n} exclusive CPUs on NUMA node {k}"));
            }
            if !held.is_empty() {
                let _ = write!(line, " ({})", held.join(", "));
            }
            if let Some(why) = &r.reason {
                let _ = write!(line, ": {why}");
            }
            let _ = writeln!(out, "Reservation:  {}", term(&line));
        }
    }
    if let Some(containers) = &e.containers {
        if containers.is_empty() {
            let _ = writeln!(out, "On the node:  nothing assigned (pod resources)");
        } else {
            let _ = writeln!(out, "On the node (pod resources):");
            let rows: Vec<Vec<String>> = containers
                .iter()
                .map(|(name, c)| {
                    let devices: Vec<String> = c
                        .devices
                        .iter()
                        .map(|d| {
                            let ids: Vec<&str> = d.device_ids.iter().map(String::as_str).collect();
                            format!("{}={}", d.resource_name, ids.join(","))
                        })
                        .collect();
                    let memory: Vec<String> = c
                        .memory
                        .iter()
                        .map(|m| format!("{}:{}", m.memory_type, m.size))
                        .collect();
                    let or_dash = |v: Vec<String>| {
                        if v.is_empty() {
                            "-".into()
                        } else {
                            v.join(" ")
                        }
                    };
                    vec![
                        name.clone(),
                        or_dash(devices),
                        if c.cpus.is_empty() {
                            "-".into()
                        } else {
                            c.cpus.to_string()
                        },
                        or_dash(memory),
                    ]
                })
                .collect();
            for line in table(&["CONTAINER", "DEVICES", "CPUS", "MEMORY"], &rows).lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
    out
}

/// The pod's containers as the node's pod resources show them (`None` if
/// the node does not know the pod).
async fn from_socket(
    socket: &std::path::Path,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Option<BTreeMap<String, ContainerAssignments>>> {
    let mut client = super::assignments::connect(socket).await?;
    let answer = client
        .get(wire::GetPodResourcesRequest {
            pod_name: name.to_owned(),
            pod_namespace: namespace.to_owned(),
        })
        .await;
    match answer {
        Ok(r) => {
            let Some(p) = r.into_inner().pod_resources else {
                return Ok(None);
            };
            Ok(Some(
                steward_podresources::convert::pod_assignments("", &p).containers,
            ))
        }
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(super::assignments::status("Get", socket, s)),
    }
}

pub async fn pod(args: PodArgs) -> anyhow::Result<()> {
    let (ns_given, name) = match args.pod.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            (Some(ns.to_owned()), name.to_owned())
        }
        None if !args.pod.is_empty() => (None, args.pod.clone()),
        _ => bail!("{:?} is not NAMESPACE/NAME or NAME", args.pod),
    };
    let mut e = if args.local {
        let Some(ns) = ns_given.clone() else {
            bail!("--local needs the pod as NAMESPACE/NAME");
        };
        Explanation {
            namespace: ns,
            name: name.clone(),
            ..Explanation::default()
        }
    } else {
        let cluster = Cluster::connect(&args.cluster).await?;
        let scope = ScopeArgs {
            namespace: ns_given.clone(),
            all_namespaces: false,
        };
        let ns = cluster.namespace(&scope);
        let pods: Api<Pod> = cluster.api(&scope);
        let Some(pod) = pods
            .get_opt(&name)
            .await
            .map_err(|e| cluster.error(&format!("reading pod {ns}/{name}"), e))?
        else {
            bail!("pod {ns}/{name} not found");
        };
        let all = ScopeArgs {
            namespace: None,
            all_namespaces: true,
        };
        let claims: Vec<SlotClaim> = cluster.list(&all).await?;
        let reservations: Api<Reservation> = cluster.api(&scope);
        let reservation = reservations
            .get_opt(&reservation_name(&ns, &name))
            .await
            .map_err(|e| cluster.error("reading the pod's Reservation", e))?
            .filter(|r| Some(&r.spec.pod.uid) == pod.metadata.uid.as_ref());
        explain(&pod, &claims, reservation.as_ref())
    };
    if let Some(socket) = &args.socket {
        let containers = from_socket(socket, &e.namespace, &e.name).await?;
        if args.local && containers.is_none() {
            bail!(
                "pod {}/{} is not known to the pod resources at {}",
                e.namespace,
                e.name,
                socket.display()
            );
        }
        e.containers = Some(containers.unwrap_or_default());
    }
    match args.output {
        Format::Json => println!("{}", structured(&e, true)?),
        Format::Yaml => print!("{}", structured(&e, false)?),
        Format::Table | Format::Wide => print!("{}", render(&e, now_ms())),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::claim;
    use super::*;

    #[test]
    fn a_pod_is_explained_from_its_claims_and_reservation() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "apps", "uid": "u-web"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "main",
                "resources": {"limits": {"steward.dev/cam-a": "2"}}}]},
            "status": {"phase": "Running"},
        }))
        .unwrap();
        let held = claim("default", "cam-a", 1, Some("apps/web"));
        let pod = {
            let mut pod = pod;
            pod.metadata.uid = held.spec.pod.as_ref().map(|p| p.uid.clone());
            pod
        };
        let other = claim("default", "cam-a", 0, Some("apps/other"));
        let e = explain(&pod, &[held, other], None);
        assert_eq!(e.slots.len(), 1, "{e:?}");
        assert_eq!(e.slots[0].slot, "cam-a-1");
        assert_eq!(e.short.get("cam-a"), Some(&(2, 1)));
        let text = render(&e, e.slots[0].since_ms.unwrap_or(0) + 60_000);
        assert!(text.contains("Pod:          apps/web"), "{text}");
        assert!(text.contains("Node:         node-a"), "{text}");
        assert!(
            text.contains("Requests:     steward.dev/cam-a: 2"),
            "{text}"
        );
        assert!(text.contains("cam-a-1"), "{text}");
        assert!(
            !text.contains("cam-a-0"),
            "another pod's slot shown: {text}"
        );
        assert!(
            text.contains("Not held:     steward.dev/cam-a: asks for 2, holds 1"),
            "{text}"
        );
        assert!(text.contains("Reservation:  <none>"), "{text}");

        let r: Reservation = serde_json::from_value(serde_json::json!({
            "apiVersion": "steward.dev/v1alpha1", "kind": "Reservation",
            "metadata": {"name": "web", "namespace": "apps"},
            "spec": {"pod": {"namespace": "apps", "name": "web", "uid": "u-web"},
                     "slots": {"cam-a": 2}, "exclusiveCpus": 4, "candidates": ["node-a"]},
            "status": {"phase": "Reserved", "node": "node-a", "slots": ["cam-a-0", "cam-a-1"],
                       "cpus": 4, "numaNode": 1},
        }))
        .unwrap();
        let text = render(&explain(&pod, &[], Some(&r)), 0);
        assert!(
            text.contains(
                "Reservation:  Reserved on node-a (cam-a-0, cam-a-1, 4 exclusive CPUs on NUMA node 1)"
            ),
            "{text}"
        );
    }
}
