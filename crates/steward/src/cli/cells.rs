//! How a SlotClaim and empty values read in a table cell.

use steward_api::SlotClaim;

/// A SlotClaim's state: `Held` (by a known pod), `Awaiting` (an Allocate
/// awaits attribution to a pod; the pod shown may be stale) or `Pending`
/// (claimed by a node, no pod known yet).
pub fn claim_state(claim: &SlotClaim) -> &'static str {
    if claim.spec.resource_claim.is_some() {
        "Prepared"
    } else if claim.spec.awaiting.is_some() {
        "Awaiting"
    } else if claim.spec.pod.is_some() {
        "Held"
    } else {
        "Pending"
    }
}

/// `namespace/name` of a claim's pod, or `<none>`.
pub fn claim_pod(claim: &SlotClaim) -> String {
    match &claim.spec.pod {
        Some(p) => format!("{}/{}", p.namespace, p.name),
        None => "<none>".into(),
    }
}

/// When a claim's holder was recorded (wall-clock ms of the claiming node).
pub fn claim_since_ms(claim: &SlotClaim) -> Option<i64> {
    i64::try_from(claim.spec.since).ok().filter(|ms| *ms > 0)
}

/// `-` for an empty cell.
pub fn dash(s: String) -> String {
    if s.is_empty() { "-".into() } else { s }
}

/// `a,b` or `<none>`.
pub fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "<none>".into()
    } else {
        items.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_states() {
        let mut c = SlotClaim::new(
            "cam-0",
            steward_api::SlotClaimSpec {
                instance: "cam".into(),
                slot: 0,
                node: "n".into(),
                epoch: 1,
                pod: None,
                container: None,
                since: 0,
                awaiting: None,
                reservation: None,
                resource_claim: None,
            },
        );
        assert_eq!(claim_state(&c), "Pending");
        assert_eq!(claim_pod(&c), "<none>");
        assert_eq!(claim_since_ms(&c), None);
        c.spec.pod = Some(steward_api::PodRef {
            namespace: "apps".into(),
            name: "web".into(),
            uid: "u".into(),
        });
        assert_eq!(claim_state(&c), "Held");
        assert_eq!(claim_pod(&c), "apps/web");
        c.spec.awaiting = Some(5);
        assert_eq!(claim_state(&c), "Awaiting");
    }
}
