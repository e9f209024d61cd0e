//! `steward describe instance NAME`: one Instance as kubectl describes
//! objects: its metadata, Configuration, device, nodes, conditions and
//! which nodes serve it to kubelet, properties, and every slot with who
//! holds it since when.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::bail;
use kube::Api;
use steward_api::{Configuration, Instance, InstanceStatus, SlotClaim, slot_id};

use super::cells::{claim_pod, claim_since_ms, claim_state, dash};
use super::escape::term;
use super::kube_view::{Cluster, ClusterArgs, ScopeArgs, by_instance, one_line, plural};
use super::output::table;
use super::slots::FREE;
use super::times::{created_ms, now_ms, when};

#[derive(Debug, clap::Args)]
pub struct InstanceArgs {
    /// Name of the Instance.
    name: String,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Namespace (default: the context's namespace, else "default").
    #[arg(short = 'n', long)]
    namespace: Option<String>,
}

/// What could be learnt of the Instance's Configuration.
pub enum ConfigInfo {
    Found(Box<Configuration>),
    NotFound,
    /// Reading it failed (e.g. forbidden); the describe goes on.
    Unreadable(String),
}

/// Width of a `Label:` column, as kubectl's describers line values up.
const LABEL_WIDTH: usize = 16;

/// `Label:  value`, the value escaped for the terminal ([`term`]).
fn field(out: &mut String, indent: usize, label: &str, value: &str) {
    let label = format!("{label}:");
    let width = LABEL_WIDTH.saturating_sub(indent).max(label.len() + 1);
    let value = term(value);
    let _ = writeln!(out, "{:indent$}{label:<width$}{value}", "");
}

/// `key<sep>value` lines: the first beside the label, the rest under it.
fn map_field(out: &mut String, label: &str, map: &BTreeMap<String, String>, sep: &str) {
    if map.is_empty() {
        field(out, 0, label, "<none>");
        return;
    }
    let mut first = true;
    for (k, v) in map {
        // Escaped before folding: a `\r` or `\n` shows, not a space.
        let line = format!("{}{sep}{}", term(k), one_line(&term(v)));
        if first {
            field(out, 0, label, &line);
            first = false;
        } else {
            let _ = writeln!(out, "{:LABEL_WIDTH$}{}", "", term(&line));
        }
    }
}

/// `items` one per line under `label`, indented; `<none>` beside it when empty.
fn list_field(out: &mut String, label: &str, items: &[String]) {
    if items.is_empty() {
        field(out, 0, label, "<none>");
        return;
    }
    let _ = writeln!(out, "{label}:");
    for i in items {
        let _ = writeln!(out, "  {}", term(i));
    }
}

/// A table indented by two spaces.
fn indented_table(out: &mut String, headers: &[&str], rows: &[Vec<String>]) {
    for line in table(headers, rows).lines() {
        let _ = writeln!(out, "  {line}");
    }
}

fn claim_row(id: String, c: Option<&SlotClaim>, now: i64) -> Vec<String> {
    match c {
        None => vec![
            id,
            FREE.into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
        ],
        Some(c) => vec![
            id,
            claim_state(c).into(),
            c.spec.node.clone(),
            claim_pod(c),
            dash(c.spec.container.clone().unwrap_or_default()),
            when(claim_since_ms(c), now),
        ],
    }
}

const CONDITION_HEADERS: [&str; 5] = ["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"];
const SERVING_HEADERS: [&str; 4] = ["NODE", "REGISTERED", "SINCE", "MESSAGE"];

/// The Instance's conditions and which nodes serve it to kubelet.
fn status_fields(out: &mut String, status: Option<&InstanceStatus>, now: i64) {
    let (conditions, nodes) = status.map_or((&[][..], &[][..]), |s| {
        (s.conditions.as_slice(), s.nodes.as_slice())
    });
    if conditions.is_empty() {
        field(out, 0, "Conditions", "<none>");
    } else {
        let _ = writeln!(out, "Conditions:");
        let rows: Vec<Vec<String>> = conditions
            .iter()
            .map(|c| {
                vec![
                    c.type_.clone(),
                    c.status.clone(),
                    dash(c.reason.clone()),
                    when(Some(c.last_transition_time.0.as_millisecond()), now),
                    dash(one_line(&c.message)),
                ]
            })
            .collect();
        indented_table(out, &CONDITION_HEADERS, &rows);
    }
    if nodes.is_empty() {
        field(out, 0, "Served On", "<none>");
    } else {
        let _ = writeln!(out, "Served On:");
        let rows: Vec<Vec<String>> = nodes
            .iter()
            .map(|n| {
                vec![
                    n.node.clone(),
                    n.registered.to_string(),
                    when(Some(n.since.0.as_millisecond()), now),
                    dash(one_line(n.message.as_deref().unwrap_or_default())),
                ]
            })
            .collect();
        indented_table(out, &SERVING_HEADERS, &rows);
    }
}

const SLOT_HEADERS: [&str; 6] = ["SLOT", "STATE", "NODE", "POD", "CONTAINER", "SINCE"];

/// The description of `instance`, whose slot claims are `claims` (by index).
pub fn render(
    instance: &Instance,
    config: &ConfigInfo,
    claims: &BTreeMap<u32, SlotClaim>,
    now: i64,
) -> String {
    let mut out = String::new();
    let meta = &instance.metadata;
    let name = meta.name.clone().unwrap_or_default();
    let spec = &instance.spec;
    field(&mut out, 0, "Name", &name);
    field(
        &mut out,
        0,
        "Namespace",
        meta.namespace.as_deref().unwrap_or_default(),
    );
    map_field(
        &mut out,
        "Labels",
        meta.labels.as_ref().unwrap_or(&BTreeMap::new()),
        "=",
    );
    map_field(
        &mut out,
        "Annotations",
        meta.annotations.as_ref().unwrap_or(&BTreeMap::new()),
        ": ",
    );
    field(&mut out, 0, "UID", meta.uid.as_deref().unwrap_or("<none>"));
    field(&mut out, 0, "Created", &when(created_ms(instance), now));
    let owners: Vec<String> = meta
        .owner_references
        .iter()
        .flatten()
        .map(|o| format!("{}/{}", o.kind, o.name))
        .collect();
    field(
        &mut out,
        0,
        "Owner",
        &if owners.is_empty() {
            "<none>".to_string()
        } else {
            owners.join(", ")
        },
    );
    match config {
        ConfigInfo::Found(c) => {
            field(&mut out, 0, "Configuration", &spec.configuration_name);
            field(&mut out, 2, "Handler", &c.spec.discovery_handler.name);
            field(&mut out, 2, "Capacity", &c.spec.capacity.to_string());
        }
        ConfigInfo::NotFound => field(
            &mut out,
            0,
            "Configuration",
            &format!("{} (not found)", spec.configuration_name),
        ),
        ConfigInfo::Unreadable(why) => field(
            &mut out,
            0,
            "Configuration",
            &format!("{} (cannot read: {why})", spec.configuration_name),
        ),
    }
    field(&mut out, 0, "Device ID", &one_line(&term(&spec.device_id)));
    field(&mut out, 0, "CDI Name", &spec.cdi_name);
    field(&mut out, 0, "Shared", &spec.shared.to_string());
    field(&mut out, 0, "Capacity", &spec.capacity.to_string());
    let held = claims.range(..spec.capacity).count();
    field(&mut out, 0, "Held", &format!("{held}/{}", spec.capacity));
    field(
        &mut out,
        0,
        "Nodes",
        &if spec.nodes.is_empty() {
            "<none>".to_string()
        } else {
            spec.nodes.join(", ")
        },
    );
    status_fields(&mut out, instance.status.as_ref(), now);
    map_field(&mut out, "Properties", &spec.properties, "=");
    let mounts: Vec<String> = spec
        .mounts
        .iter()
        .map(|m| {
            format!(
                "{} -> {}{}",
                m.host_path,
                m.container_path,
                if m.read_only { " (ro)" } else { "" }
            )
        })
        .collect();
    list_field(&mut out, "Mounts", &mounts);
    let devices: Vec<String> = spec
        .device_specs
        .iter()
        .map(|d| {
            format!(
                "{} -> {} ({})",
                d.host_path,
                d.container_path,
                dash(d.permissions.clone())
            )
        })
        .collect();
    list_field(&mut out, "Device Specs", &devices);
    let _ = writeln!(out, "Slots:");
    let rows: Vec<Vec<String>> = (0..spec.capacity)
        .map(|n| claim_row(slot_id(&name, n), claims.get(&n), now))
        .collect();
    indented_table(&mut out, &SLOT_HEADERS, &rows);
    let beyond: Vec<Vec<String>> = claims
        .range(spec.capacity..)
        .map(|(n, c)| claim_row(slot_id(&name, *n), Some(c), now))
        .collect();
    if !beyond.is_empty() {
        let _ = writeln!(out, "Claims Beyond Capacity:");
        indented_table(&mut out, &SLOT_HEADERS, &beyond);
    }
    out
}

pub async fn instance(args: InstanceArgs) -> anyhow::Result<()> {
    let cluster = Cluster::connect(&args.cluster).await?;
    let scope = ScopeArgs {
        namespace: args.namespace,
        all_namespaces: false,
    };
    let ns = cluster.namespace(&scope);
    let instances: Api<Instance> = cluster.api(&scope);
    let what = format!("{} {:?}", plural::<Instance>(), args.name);
    let Some(instance) = instances
        .get_opt(&args.name)
        .await
        .map_err(|e| cluster.error(&format!("reading {what} in namespace {ns:?}"), e))?
    else {
        bail!("{what} not found in namespace {ns:?}");
    };
    let configs: Api<Configuration> = cluster.api(&scope);
    let config = match configs.get_opt(&instance.spec.configuration_name).await {
        Ok(Some(c)) => ConfigInfo::Found(Box::new(c)),
        Ok(None) => ConfigInfo::NotFound,
        Err(e) => ConfigInfo::Unreadable(cluster.cause(e)),
    };
    let claims: Vec<SlotClaim> = cluster.list(&scope).await?;
    let mut by = by_instance(claims);
    let mine = by.remove(&(ns, args.name)).unwrap_or_default();
    print!("{}", render(&instance, &config, &mine, now_ms()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{CREATED_MS, claim, instance};
    use super::super::kube_view::by_instance;
    use super::*;

    #[test]
    fn every_slot_and_its_holder_is_described() {
        let mut i = instance("default", "cam-a", 2, &["node-a", "node-b"]);
        i.spec.mounts.push(steward_api::InstanceMount {
            container_path: "/data".into(),
            host_path: "/srv/data".into(),
            read_only: true,
        });
        let mut claims = by_instance(vec![
            claim("default", "cam-a", 1, Some("apps/web")),
            claim("default", "cam-a", 4, None),
        ]);
        let claims = claims
            .remove(&("default".to_string(), "cam-a".to_string()))
            .unwrap();
        let text = render(&i, &ConfigInfo::NotFound, &claims, CREATED_MS + 100_000);
        assert_eq!(
            text,
            "\
Name:           cam-a
Namespace:      default
Labels:         <none>
Annotations:    <none>
UID:            uid-cam-a
Created:        2023-11-14T22:13:20Z (100s ago)
Owner:          <none>
Configuration:  cams (not found)
Device ID:      dev-cam-a
CDI Name:       steward.dev/cams=cam-a
Shared:         false
Capacity:       2
Held:           1/2
Nodes:          node-a, node-b
Conditions:     <none>
Served On:      <none>
Properties:     A=1
                B=2
Mounts:
  /srv/data -> /data (ro)
Device Specs:   <none>
Slots:
  SLOT      STATE   NODE     POD        CONTAINER   SINCE
  cam-a-0   Free    -        -          -           -
  cam-a-1   Held    node-a   apps/web   main        2023-11-14T22:13:30Z (90s ago)
Claims Beyond Capacity:
  SLOT      STATE     NODE     POD      CONTAINER   SINCE
  cam-a-4   Pending   node-a   <none>   -           2023-11-14T22:13:30Z (90s ago)
"
        );
    }

    /// The attack: a discovery handler (or whoever writes the Instance)
    /// puts terminal controls in a property, the device id, a mount path,
    /// a condition message. `describe` prints them as visible escapes: no
    /// ESC or CR reaches the terminal to clear the screen or overwrite a
    /// line.
    #[test]
    fn controls_from_the_instance_are_printed_escaped() {
        let mut i = instance("default", "cam-a", 1, &["node-a"]);
        i.spec
            .properties
            .insert("EVIL".into(), "x\x1b[2J\ry".into());
        i.spec.device_id = "dev\x1b]0;owned\x07".into();
        i.spec.mounts.push(steward_api::InstanceMount {
            container_path: "/data\r/ok".into(),
            host_path: "/srv".into(),
            read_only: false,
        });
        let mut status = steward_api::InstanceStatus::default();
        status
            .conditions
            .push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: "Bad\u{9b}2J".into(),
                message: "gone\x1b[2K\rall fine".into(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: None,
            });
        i.status = Some(status);
        let text = render(&i, &ConfigInfo::NotFound, &BTreeMap::new(), CREATED_MS);
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(text.contains("EVIL=x\\u{1b}[2J\\ry"), "{text}");
        assert!(
            text.contains("Device ID:      dev\\u{1b}]0;owned\\u{7}"),
            "{text}"
        );
        assert!(text.contains("/srv -> /data\\r/ok"), "{text}");
        assert!(text.contains("Bad\\u{9b}2J"), "{text}");
        // A message's lines are folded into one (a `\r` is whitespace
        // there), its escape sequences shown.
        assert!(text.contains("gone\\u{1b}[2K all fine"), "{text}");
        // Each described line is still one line: nothing was injected.
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("Properties:"))
                .count(),
            1
        );
    }
}
