//! `steward get claims`: the SlotClaims, one per claimed slot.

use steward_api::SlotClaim;

use super::Format;
use super::cells::{claim_pod, claim_since_ms, claim_state, dash};
use super::kube_view::{Cluster, ClusterArgs, List, ScopeArgs, key, nothing_found, structured};
use super::output::table;
use super::times::{age, created_ms, now_ms};

#[derive(Debug, clap::Args)]
pub struct GetArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    scope: ScopeArgs,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    output: Format,
}

const HEADERS: [&str; 6] = ["NAME", "INSTANCE", "NODE", "POD", "STATE", "AGE"];
const WIDE: [&str; 4] = ["CONTAINER", "HELD-FOR", "EPOCH", "RESERVATION"];

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

fn row(c: &SlotClaim, all_namespaces: bool, wide: bool, now: i64) -> Vec<String> {
    let mut r = Vec::new();
    if all_namespaces {
        r.push(c.metadata.namespace.clone().unwrap_or_default());
    }
    r.extend([
        c.metadata.name.clone().unwrap_or_default(),
        c.spec.instance.clone(),
        c.spec.node.clone(),
        claim_pod(c),
        claim_state(c).to_string(),
        age(created_ms(c), now),
    ]);
    if wide {
        r.extend([
            dash(c.spec.container.clone().unwrap_or_default()),
            age(claim_since_ms(c), now),
            c.spec.epoch.to_string(),
            dash(c.spec.reservation.clone().unwrap_or_default()),
        ]);
    }
    r
}

/// The table for `claims`, in the order given.
pub fn render(claims: &[SlotClaim], all_namespaces: bool, wide: bool, now: i64) -> String {
    let rows: Vec<Vec<String>> = claims
        .iter()
        .map(|c| row(c, all_namespaces, wide, now))
        .collect();
    table(&headers(all_namespaces, wide), &rows)
}

pub async fn get(args: GetArgs) -> anyhow::Result<()> {
    let cluster = Cluster::connect(&args.cluster).await?;
    let mut claims: Vec<SlotClaim> = cluster.list(&args.scope).await?;
    // By namespace, instance, slot index (cam-10 after cam-9), then name.
    claims.sort_by(|a, b| {
        let ka = (key(a).0, &a.spec.instance, a.spec.slot, &a.metadata.name);
        let kb = (key(b).0, &b.spec.instance, b.spec.slot, &b.metadata.name);
        ka.cmp(&kb)
    });
    let text = match args.output {
        Format::Table | Format::Wide => {
            if claims.is_empty() {
                nothing_found(&cluster, &args.scope);
                return Ok(());
            }
            render(
                &claims,
                args.scope.all_namespaces,
                args.output == Format::Wide,
                now_ms(),
            )
        }
        Format::Json | Format::Yaml => {
            structured(&List::new(&claims), args.output == Format::Json)?
        }
    };
    print!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{CREATED_MS, claim};
    use super::*;

    #[test]
    fn a_claim_row_names_slot_instance_node_pod_and_state() {
        let mut awaiting = claim("default", "cam-a", 1, Some("apps/web"));
        awaiting.spec.awaiting = Some(7);
        let claims = [
            claim("default", "cam-a", 0, Some("apps/web")),
            awaiting,
            claim("default", "cam-b", 0, None),
        ];
        let now = CREATED_MS + 70_000;
        assert_eq!(
            render(&claims, false, false, now),
            "NAME      INSTANCE   NODE     POD        STATE      AGE\n\
             cam-a-0   cam-a      node-a   apps/web   Held       60s\n\
             cam-a-1   cam-a      node-a   apps/web   Awaiting   60s\n\
             cam-b-0   cam-b      node-a   <none>     Pending    60s\n"
        );
        let wide = render(&claims[..1], true, true, now);
        let lines: Vec<Vec<&str>> = wide
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[0],
            [
                "NAMESPACE",
                "NAME",
                "INSTANCE",
                "NODE",
                "POD",
                "STATE",
                "AGE",
                "CONTAINER",
                "HELD-FOR",
                "EPOCH",
                "RESERVATION"
            ]
        );
        assert_eq!(
            lines[1],
            [
                "default", "cam-a-0", "cam-a", "node-a", "apps/web", "Held", "60s", "main", "60s",
                "1", "-"
            ]
        );
    }
}
