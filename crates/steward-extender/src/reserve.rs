//! Reserve and Unreserve with the scheduler framework's semantics, for a
//! scheduler plugin (kube-scheduler's extender protocol has no such verbs):
//! `POST /reserve` and `POST /unreserve` on the extender's endpoint, each
//! with a [`PodVerb`] body.
//!
//! - **Reserve** (pod, node) confirms that the pod's Reservation holds
//!   capacity on that node. Idempotent. A pod that asks steward for nothing
//!   has no Reservation: confirmed. Reserved elsewhere, not decided, or
//!   released: refused (409) with the reason; the framework then calls
//!   Unreserve.
//! - **Unreserve** (pod, reason) releases what was reserved: the
//!   Reservation's `spec.cancel` is set and the controller cancels it
//!   (`Canceled`, an Event). Idempotent; may arrive without Reserve, for a
//!   pod with no Reservation, or for an older pod of the same name (by uid):
//!   nothing happens.
//!
//! A failure after Reserve (a Permit or PreBind plugin, the binding) is the
//! framework's Unreserve; a binding that fails where no plugin hears of it
//! is caught by the controller (pod bound elsewhere, TTL).

use kube::Api;
use kube::api::PostParams;
use serde::{Deserialize, Serialize};
use steward_api::Reservation;
use steward_core::reservation::reservation_name;

/// Longest Unreserve reason kept, in characters: at most 1,024 bytes, the
/// CRD's limit for `spec.cancel`.
const MAX_REASON: usize = 256;

/// The body of `/reserve` and `/unreserve`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodVerb {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Reserve: the node the scheduler chose.
    #[serde(default)]
    pub node: Option<String>,
    /// Unreserve: why (recorded on the Reservation and its Event).
    #[serde(default)]
    pub reason: Option<String>,
}

/// What a verb answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Done (or nothing to do), with what happened.
    Ok(String),
    /// Reserve refused: the capacity is not held on that node.
    Refused(String),
    /// The request itself is wrong.
    Bad(String),
}

/// Reserve: whether `v.pod`'s capacity is held on `v.node`.
pub async fn reserve(client: kube::Client, v: &PodVerb) -> Result<Answer, kube::Error> {
    let Some(node) = v.node.as_deref().filter(|n| !n.is_empty()) else {
        return Ok(Answer::Bad("reserve needs the node".into()));
    };
    let api: Api<Reservation> = Api::namespaced(client, &v.namespace);
    let Some(r) = api
        .get_opt(&reservation_name(&v.namespace, &v.name))
        .await?
        .filter(|r| r.spec.pod.uid == v.uid)
    else {
        return Ok(Answer::Ok(
            "the pod has no Reservation: nothing to reserve".into(),
        ));
    };
    let status = r.status.unwrap_or_default();
    Ok(match (status.phase.as_str(), status.node.as_deref()) {
        ("Reserved", Some(n)) if n == node && r.spec.cancel.is_none() => {
            Answer::Ok(format!("reserved on {node}"))
        }
        ("Reserved", Some(n)) if r.spec.cancel.is_none() => {
            Answer::Refused(format!("the pod's capacity is reserved on {n}, not {node}"))
        }
        (phase, _) => Answer::Refused(format!(
            "the pod's Reservation is {}{}",
            match phase {
                "Canceled" | "Rejected" => phase,
                _ if r.spec.cancel.is_some() => "being canceled",
                "" | "Requested" => "not decided yet",
                _ => phase,
            },
            status.reason.map(|w| format!(": {w}")).unwrap_or_default()
        )),
    })
}

/// Unreserve: asks the controller to release `v.pod`'s reservation.
pub async fn unreserve(client: kube::Client, v: &PodVerb) -> Result<Answer, kube::Error> {
    let api: Api<Reservation> = Api::namespaced(client, &v.namespace);
    let name = reservation_name(&v.namespace, &v.name);
    let Some(r) = api.get_opt(&name).await? else {
        return Ok(Answer::Ok(
            "the pod has no Reservation: nothing to release".into(),
        ));
    };
    if r.spec.pod.uid != v.uid {
        return Ok(Answer::Ok(
            "the Reservation is another pod's: left alone".into(),
        ));
    }
    if r.spec.cancel.is_some()
        || r.status
            .as_ref()
            .is_some_and(|s| s.phase == "Canceled" || s.phase == "Rejected")
    {
        return Ok(Answer::Ok("already released".into()));
    }
    let reason = v
        .reason
        .as_deref()
        .filter(|w| !w.is_empty())
        .map(|w| w.chars().take(MAX_REASON).collect::<String>())
        .unwrap_or_else(|| "the scheduler unreserved the pod".into());
    // A replace is conditional on the resourceVersion read: a Reservation
    // replaced meanwhile (a new pod of that name) is not touched.
    let mut canceled = r.clone();
    canceled.spec.cancel = Some(reason.clone());
    match api.replace(&name, &PostParams::default(), &canceled).await {
        Ok(_) => Ok(Answer::Ok(format!("released: {reason}"))),
        // Changed meanwhile: the framework may call again (idempotent).
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Answer::Refused(
            "the Reservation changed meanwhile; call Unreserve again".into(),
        )),
        Err(e) => Err(e),
    }
}
