//! `steward get slots`: one row per slot of each Instance (`<instance>-<n>`
//! for n in 0..capacity) and who holds it, from the SlotClaims.

use serde::Serialize;
use steward_api::{Instance, PodRef, SlotClaim, slot_id};

use super::Format;
use super::cells::{claim_since_ms, claim_state, dash};
use super::kube_view::{Cluster, ClusterArgs, ScopeArgs, Snapshot, nothing_found, structured};
use super::output::table;
use super::times::{age, now_ms, rfc3339};

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

/// The state of a slot without a claim.
pub const FREE: &str = "Free";

/// One slot and its claim, if any.
pub struct SlotRow<'a> {
    pub instance: &'a Instance,
    pub index: u32,
    pub claim: Option<&'a SlotClaim>,
}

impl SlotRow<'_> {
    pub fn id(&self) -> String {
        slot_id(
            self.instance.metadata.name.as_deref().unwrap_or_default(),
            self.index,
        )
    }

    /// `Free`, or the claim's state.
    pub fn state(&self) -> &'static str {
        self.claim.map(claim_state).unwrap_or(FREE)
    }

    /// `<free>`, `ns/pod@node`, `claim:ns/name@node` for a DRA
    /// ResourceClaim, or `<pending>@node` while no pod is known.
    pub fn holder(&self) -> String {
        match self.claim {
            None => "<free>".into(),
            Some(c) => match (&c.spec.resource_claim, &c.spec.pod) {
                (Some(rc), _) => format!("claim:{}/{}@{}", rc.namespace, rc.name, c.spec.node),
                (None, Some(p)) => format!("{}/{}@{}", p.namespace, p.name, c.spec.node),
                (None, None) => format!("<pending>@{}", c.spec.node),
            },
        }
    }
}

/// Every slot of every Instance of the snapshot, in order.
pub fn slot_rows(snap: &Snapshot) -> Vec<SlotRow<'_>> {
    let mut out = Vec::new();
    for i in &snap.instances {
        let claims = snap.claims_of(i);
        for n in 0..i.spec.capacity {
            out.push(SlotRow {
                instance: i,
                index: n,
                claim: claims.and_then(|c| c.get(&n)),
            });
        }
    }
    out
}

/// The table for a snapshot.
pub fn render(snap: &Snapshot, all_namespaces: bool, wide: bool, now: i64) -> String {
    let mut headers = Vec::new();
    if all_namespaces {
        headers.push("NAMESPACE");
    }
    headers.extend(["SLOT", "INSTANCE", "HOLDER"]);
    if wide {
        headers.extend(["STATE", "CONTAINER", "HELD-FOR"]);
    }
    let rows: Vec<Vec<String>> = slot_rows(snap)
        .iter()
        .map(|s| {
            let mut r = Vec::new();
            if all_namespaces {
                r.push(s.instance.metadata.namespace.clone().unwrap_or_default());
            }
            r.extend([
                s.id(),
                s.instance.metadata.name.clone().unwrap_or_default(),
                s.holder(),
            ]);
            if wide {
                r.extend([
                    s.state().to_string(),
                    dash(
                        s.claim
                            .and_then(|c| c.spec.container.clone())
                            .unwrap_or_default(),
                    ),
                    match s.claim {
                        Some(c) => age(claim_since_ms(c), now),
                        None => "-".into(),
                    },
                ]);
            }
            r
        })
        .collect();
    table(&headers, &rows)
}

/// A slot for `-o json|yaml`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SlotOut {
    namespace: String,
    instance: String,
    slot: String,
    index: u32,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod: Option<PodRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    container: Option<String>,
    /// The DRA ResourceClaim holding the slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_claim: Option<steward_api::ResourceClaimHold>,
    #[serde(skip_serializing_if = "Option::is_none")]
    since: Option<String>,
}

fn slot_out(s: &SlotRow<'_>) -> SlotOut {
    SlotOut {
        namespace: s.instance.metadata.namespace.clone().unwrap_or_default(),
        instance: s.instance.metadata.name.clone().unwrap_or_default(),
        slot: s.id(),
        index: s.index,
        state: s.state(),
        node: s.claim.map(|c| c.spec.node.clone()),
        pod: s.claim.and_then(|c| c.spec.pod.clone()),
        container: s.claim.and_then(|c| c.spec.container.clone()),
        resource_claim: s.claim.and_then(|c| c.spec.resource_claim.clone()),
        since: s.claim.and_then(claim_since_ms).map(rfc3339),
    }
}

pub async fn get(args: GetArgs) -> anyhow::Result<()> {
    let cluster = Cluster::connect(&args.cluster).await?;
    let snap = Snapshot::read(&cluster, &args.scope).await?;
    let text = match args.output {
        Format::Table | Format::Wide => {
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
            let out: Vec<SlotOut> = slot_rows(&snap).iter().map(slot_out).collect();
            structured(&out, args.output == Format::Json)?
        }
    };
    print!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{CREATED_MS, claim, instance};
    use super::super::kube_view::by_instance;
    use super::*;

    fn snap() -> Snapshot {
        Snapshot {
            instances: vec![
                instance("default", "cam-a", 3, &["node-a"]),
                instance("default", "cam-b", 1, &["node-a"]),
            ],
            claims: by_instance(vec![
                claim("default", "cam-a", 0, Some("apps/web")),
                claim("default", "cam-a", 2, None),
                // beyond cam-b's capacity: no row
                claim("default", "cam-b", 5, Some("apps/db")),
            ]),
        }
    }

    #[test]
    fn every_slot_has_a_row_free_or_held() {
        let s = snap();
        assert_eq!(
            render(&s, false, false, CREATED_MS + 20_000),
            "SLOT      INSTANCE   HOLDER\n\
             cam-a-0   cam-a      apps/web@node-a\n\
             cam-a-1   cam-a      <free>\n\
             cam-a-2   cam-a      <pending>@node-a\n\
             cam-b-0   cam-b      <free>\n"
        );
        let wide = render(&s, true, true, CREATED_MS + 20_000);
        let lines: Vec<Vec<&str>> = wide
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[0],
            [
                "NAMESPACE",
                "SLOT",
                "INSTANCE",
                "HOLDER",
                "STATE",
                "CONTAINER",
                "HELD-FOR"
            ]
        );
        assert_eq!(
            lines[1],
            [
                "default",
                "cam-a-0",
                "cam-a",
                "apps/web@node-a",
                "Held",
                "main",
                "10s"
            ]
        );
        assert_eq!(
            lines[2],
            ["default", "cam-a-1", "cam-a", "<free>", "Free", "-", "-"]
        );
    }

    #[test]
    fn structured_slots_carry_the_holder() {
        let s = snap();
        let out: Vec<SlotOut> = slot_rows(&s).iter().map(slot_out).collect();
        let v = serde_json::to_value(&out).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 4);
        assert_eq!(v[0]["slot"], "cam-a-0");
        assert_eq!(v[0]["state"], "Held");
        assert_eq!(v[0]["pod"]["name"], "web");
        assert_eq!(v[0]["since"], "2023-11-14T22:13:30Z");
        assert_eq!(v[1]["state"], "Free");
        assert!(v[1].get("node").is_none());
    }
}
