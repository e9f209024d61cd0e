//! `steward get instances`: the Instances of a namespace (or all), with how
//! many of their slots are held (from the SlotClaims) and whether every node
//! listed serves them (`Ready`).

use steward_api::Instance;

use super::Format;
use super::cells::list_or_none;
use super::kube_view::{
    Cluster, ClusterArgs, List, ScopeArgs, Snapshot, nothing_found, structured,
};
use super::output::table;
use super::times::{age, created_ms, now_ms};

#[derive(Debug, clap::Args)]
pub struct GetArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Read a standalone agent instead of a cluster: its state directory
    /// (the running agent's read API there, else its store).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["kubeconfig", "context", "all_namespaces", "namespace"])]
    state_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    scope: ScopeArgs,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    output: Format,
}

const HEADERS: [&str; 7] = [
    "NAME",
    "CONFIGURATION",
    "CAPACITY",
    "HELD",
    "NODES",
    "READY",
    "AGE",
];
const WIDE: [&str; 3] = ["SHARED", "PROPERTIES", "DEVICE"];

/// The header line: NAMESPACE with `-A`, the wide columns after AGE.
fn headers(all_namespaces: bool, wide: bool) -> Vec<&'static str> {
    let mut h = Vec::new();
    if all_namespaces {
        h.push("NAMESPACE");
    }
    h.extend(HEADERS);
    if wide {
        h.extend(WIDE);
    }
    h
}

fn row(snap: &Snapshot, i: &Instance, all_namespaces: bool, wide: bool, now: i64) -> Vec<String> {
    let mut r = Vec::new();
    if all_namespaces {
        r.push(i.metadata.namespace.clone().unwrap_or_default());
    }
    r.extend([
        i.metadata.name.clone().unwrap_or_default(),
        i.spec.configuration_name.clone(),
        i.spec.capacity.to_string(),
        snap.held(i).to_string(),
        list_or_none(&i.spec.nodes),
        ready(i),
        age(created_ms(i), now),
    ]);
    if wide {
        r.extend([
            i.spec.shared.to_string(),
            i.spec.properties.len().to_string(),
            i.spec.device_id.clone(),
        ]);
    }
    r
}

/// The `Ready` condition's status (as `kubectl get` prints the CRD's
/// column), `<none>` before any agent wrote it.
fn ready(i: &Instance) -> String {
    i.status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == steward_api::CONDITION_READY)
        })
        .map_or_else(|| "<none>".to_owned(), |c| c.status.clone())
}

/// The table for a snapshot.
pub fn render(snap: &Snapshot, all_namespaces: bool, wide: bool, now: i64) -> String {
    let rows: Vec<Vec<String>> = snap
        .instances
        .iter()
        .map(|i| row(snap, i, all_namespaces, wide, now))
        .collect();
    table(&headers(all_namespaces, wide), &rows)
}

pub async fn get(args: GetArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.state_dir {
        return get_local(dir, &args).await;
    }
    let cluster = Cluster::connect(&args.cluster).await?;
    let text = match args.output {
        Format::Table | Format::Wide => {
            let snap = Snapshot::read(&cluster, &args.scope).await?;
            if snap.instances.is_empty() {
                nothing_found(&cluster, &args.scope);
                return Ok(());
            }
            render(
                &snap,
                args.scope.all_namespaces,
                args.output == Format::Wide,
                now_ms(),
            )
        }
        Format::Json | Format::Yaml => {
            let mut items: Vec<Instance> = cluster.list(&args.scope).await?;
            items.sort_by_key(super::kube_view::key);
            structured(&List::new(&items), args.output == Format::Json)?
        }
    };
    print!("{text}");
    Ok(())
}

/// `get instances --state-dir`: a standalone agent's Instances. It holds
/// no slots (device plugins need kubelet), so HELD is 0.
async fn get_local(dir: &std::path::Path, args: &GetArgs) -> anyhow::Result<()> {
    let (items, _) = super::standalone_view::instances(dir, args.cluster.request_timeout).await?;
    let text = match args.output {
        Format::Table | Format::Wide => {
            if items.is_empty() {
                eprintln!("No resources found in {}.", dir.display());
                return Ok(());
            }
            let snap = Snapshot {
                instances: items,
                claims: Default::default(),
            };
            // Standalone Instances all live in their Configurations'
            // namespaces: show them, as `-A` does.
            render(&snap, true, args.output == Format::Wide, now_ms())
        }
        Format::Json | Format::Yaml => structured(&List::new(&items), args.output == Format::Json)?,
    };
    print!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{claim, instance};
    use super::super::kube_view::by_instance;
    use super::*;

    #[test]
    fn held_counts_claims_of_the_instances_slots_only() {
        let now = 1_700_000_100_000;
        let mut served = instance("default", "cam-a", 2, &["node-a", "node-b"]);
        let mut status = steward_api::InstanceStatus::default();
        let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        );
        for n in &served.spec.nodes {
            status.set_serving(n, Some((true, None)), &served.spec.nodes, None, at.clone());
        }
        served.status = Some(status);
        let snap = Snapshot {
            instances: vec![served, instance("default", "cam-b", 1, &[])],
            claims: by_instance(vec![
                claim("default", "cam-a", 1, Some("apps/web")),
                // beyond capacity: not one of cam-b's slots
                claim("default", "cam-b", 3, None),
                // another namespace's instance of the same name
                claim("other", "cam-b", 0, None),
            ]),
        };
        let t = render(&snap, false, false, now);
        assert_eq!(
            t,
            "NAME    CONFIGURATION   CAPACITY   HELD   NODES           READY    AGE\n\
             cam-a   cams            2          1      node-a,node-b   True     100s\n\
             cam-b   cams            1          0      <none>          <none>   100s\n"
        );
        let wide = render(&snap, true, true, now);
        let lines: Vec<Vec<&str>> = wide
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[0],
            [
                "NAMESPACE",
                "NAME",
                "CONFIGURATION",
                "CAPACITY",
                "HELD",
                "NODES",
                "READY",
                "AGE",
                "SHARED",
                "PROPERTIES",
                "DEVICE"
            ]
        );
        assert_eq!(
            lines[1],
            [
                "default",
                "cam-a",
                "cams",
                "2",
                "1",
                "node-a,node-b",
                "True",
                "100s",
                "false",
                "2",
                "dev-cam-a"
            ]
        );
    }
}
