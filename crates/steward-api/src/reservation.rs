//! The `Reservation` custom resource: capacity held for one pod
//! at scheduling time. One per pod, in the pod's namespace, named after it
//! ([`steward_core::reservation::reservation_name`]) and owned by it.
//!
//! The scheduler extender writes the spec (the request, the candidate nodes
//! its Filter passed, and `cancel` on Unreserve); one controller, the only
//! writer of decisions, writes the status.
//!
//! Two versions are served, with the same schema (no conversion):
//! `v1alpha1`, stored, with the status subresource; and `v1alpha2`,
//! without it, through which the leading controller creates a Reservation
//! already decided (spec and status in one write). Every other reader and
//! writer uses `v1alpha1`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};
use steward_core::Millis;
use steward_core::reservation::{self as core, Phase};

use crate::PodRef;

/// Short name of the Reservation kind (`kubectl get srsv`).
pub const RESERVATION_SHORT_NAME: &str = "srsv";

/// The Reservation version without the status subresource: a create
/// through it keeps the status it carries, so a decision is persisted with
/// its ask in one write. Same schema as `v1alpha1`; not stored.
pub const RESERVATION_DECIDED_VERSION: &str = "v1alpha2";

/// The Reservation CRD: `v1alpha1` (stored, status subresource) and
/// [`RESERVATION_DECIDED_VERSION`] (the same schema and columns, no
/// subresource).
pub fn reservation_crd() -> CustomResourceDefinition {
    let mut crd = Reservation::crd();
    if let Some(stored) = crd.spec.versions.first() {
        let mut decided = stored.clone();
        decided.name = RESERVATION_DECIDED_VERSION.to_owned();
        decided.storage = false;
        decided.subresources = None;
        crd.spec.versions.push(decided);
    }
    crd
}

/// URL path of the Reservations of `namespace` at
/// [`RESERVATION_DECIDED_VERSION`].
pub fn decided_reservations_path(namespace: &str) -> String {
    format!(
        "/apis/{}/{RESERVATION_DECIDED_VERSION}/namespaces/{namespace}/reservations",
        crate::GROUP
    )
}

/// Capacity held for one pod at scheduling time.
// Several printer columns share a type: not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "steward.dev",
    version = "v1alpha1",
    kind = "Reservation",
    namespaced,
    status = "ReservationStatus",
    shortname = "srsv",
    // A node follows only the Reservations held on it (its resource
    // manager's CPU holds): a field selector on the chosen node.
    selectable = ".status.node",
    derive = "PartialEq",
    doc = "Capacity held for one pod at scheduling time: requested by the scheduler extender, decided by the steward controller.",
    printcolumn(
        name = "Pod",
        type_ = "string",
        json_path = ".spec.pod.name",
        description = "pod the capacity is held for"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Requested, Reserved, Rejected or Canceled"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".status.node",
        description = "node chosen"
    ),
    printcolumn(
        name = "NUMA",
        type_ = "integer",
        json_path = ".status.numaNode",
        priority = 1,
        description = "NUMA node of the chosen node the exclusive CPUs are held on"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.reason",
        priority = 1,
        description = "why it was rejected or canceled"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ReservationSpec {
    /// The pod (same namespace).
    pub pod: PodRef,
    /// Slots wanted per Instance: the pod's `steward.dev/<instance>`
    /// requests, every container combined.
    #[x_kube(validation = kube::core::Rule::new("self.all(k, self[k] >= 1 && self[k] <= 1024)").message("each Instance asks for 1 to 1024 slots"))]
    pub slots: BTreeMap<String, u32>,
    /// Exclusive CPUs wanted on one NUMA node: counted by the controller
    /// against what the node's CRI resource manager publishes, which CPUs
    /// exactly is the node's decision.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(max = 1024))]
    pub exclusive_cpus: u32,
    /// The nodes the scheduler's Filter passed, in its order.
    #[schemars(length(min = 1, max = 5000))]
    pub candidates: Vec<String>,
    /// Set by the scheduler extender on Unreserve: the reason to cancel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub cancel: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What the controller decided.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReservationStatus {
    /// `Requested`, `Reserved`, `Rejected` or `Canceled`.
    #[x_kube(validation = kube::core::Rule::new("self in ['Requested', 'Reserved', 'Rejected', 'Canceled']").message("phase must be Requested, Reserved, Rejected or Canceled"))]
    pub phase: String,
    /// The node chosen (`Reserved`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The slots held for the pod (`Reserved`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slots: Vec<String>,
    /// Exclusive CPUs held for the pod (`Reserved`), on `numaNode`.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(max = 1024))]
    pub cpus: u32,
    /// The NUMA node of `node` holding `cpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 4096))]
    pub numa_node: Option<u32>,
    /// Why it was rejected or canceled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it was decided, milliseconds of the controller's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<u64>,
    /// The spec generation this status answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Standard conditions: `Reserved` (True while capacity is held; its
    /// reason is the phase, or `Consumed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The condition type of a Reservation holding capacity.
pub const CONDITION_RESERVED: &str = "Reserved";

/// The wire name of a phase.
pub fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Requested => "Requested",
        Phase::Reserved => "Reserved",
        Phase::Rejected => "Rejected",
        Phase::Canceled => "Canceled",
    }
}

impl ReservationSpec {
    /// The core's view of the pod.
    pub fn pod_ref(&self) -> core::PodRef {
        core::PodRef {
            namespace: self.pod.namespace.clone(),
            name: self.pod.name.clone(),
            uid: self.pod.uid.clone(),
        }
    }
}

impl ReservationStatus {
    /// The status recording the core's reservation.
    pub fn from_core(r: &core::Reservation, generation: Option<i64>) -> Self {
        Self {
            phase: phase_name(r.phase).to_owned(),
            node: r.node.clone(),
            slots: r.slots.iter().cloned().collect(),
            cpus: if r.numa.is_some() { r.cpus } else { 0 },
            numa_node: r.numa,
            reason: r.reason.clone(),
            decided_at: r.decided_at.map(|Millis(m)| m),
            observed_generation: generation,
            conditions: Vec::new(),
        }
    }

    /// Sets the `Reserved` condition from the phase (`consumed`: the pod
    /// holds what was reserved), keeping its transition time while its
    /// status stays.
    pub fn set_reserved_condition(&mut self, consumed: bool, now: Time) {
        let (status, reason) = match (consumed, self.phase.as_str()) {
            (true, _) => ("False", "Consumed"),
            (false, "Reserved") => ("True", "Reserved"),
            (false, "") => ("False", "Requested"),
            (false, p) => ("False", p),
        };
        let reason = reason.to_owned();
        let message = self
            .reason
            .clone()
            .unwrap_or_else(|| match reason.as_str() {
                "Reserved" => format!(
                    "held on {}",
                    self.node.as_deref().unwrap_or("the chosen node")
                ),
                _ => "waiting for the controller's decision".to_owned(),
            });
        crate::condition::set_condition(
            &mut self.conditions,
            CONDITION_RESERVED,
            status,
            &reason,
            &message,
            self.observed_generation,
            now,
        );
    }

    /// The slots as a set.
    pub fn slot_set(&self) -> BTreeSet<String> {
        self.slots.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_records_the_core_decision() {
        let mut l = core::ReservationDecider::new(60_000);
        l.set_instance(
            "cam",
            core::InstanceCapacity {
                capacity: 2,
                nodes: ["n1".to_owned()].into(),
            },
        );
        let spec = ReservationSpec {
            pod: PodRef {
                namespace: "default".into(),
                name: "web-0".into(),
                uid: "u1".into(),
            },
            slots: [("cam".to_owned(), 1)].into(),
            exclusive_cpus: 0,
            candidates: vec!["n1".into()],
            cancel: None,
        };
        l.request(
            spec.pod_ref(),
            spec.slots.clone(),
            spec.candidates.clone(),
            Millis(5),
        )
        .unwrap();
        l.decide("u1", Millis(7)).unwrap();
        let status = ReservationStatus::from_core(l.reservation("u1").unwrap(), Some(1));
        assert_eq!(status.phase, "Reserved");
        assert_eq!(status.node.as_deref(), Some("n1"));
        assert_eq!(status.slots, ["cam-0"]);
        assert_eq!(status.decided_at, Some(7));
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["observedGeneration"], 1);
    }

    #[test]
    fn the_decided_version_is_the_stored_one_without_the_status_subresource() {
        let crd = reservation_crd();
        let [stored, decided] = crd.spec.versions.as_slice() else {
            panic!("two versions: {:?}", crd.spec.versions);
        };
        assert_eq!(
            (stored.name.as_str(), stored.storage, stored.served),
            ("v1alpha1", true, true)
        );
        assert!(
            stored
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some())
        );
        assert_eq!(
            (decided.name.as_str(), decided.storage, decided.served),
            (RESERVATION_DECIDED_VERSION, false, true)
        );
        assert_eq!(decided.subresources, None);
        assert_eq!(decided.schema, stored.schema);
        assert_eq!(
            decided.additional_printer_columns,
            stored.additional_printer_columns
        );
        assert_eq!(
            decided_reservations_path("team-a"),
            "/apis/steward.dev/v1alpha2/namespaces/team-a/reservations"
        );
    }
}
