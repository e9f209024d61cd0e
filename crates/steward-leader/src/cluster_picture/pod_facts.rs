//! What the reservation controller needs to know of a pod.

use k8s_openapi::api::core::v1::Pod;

/// A pod as the controller needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    /// `spec.nodeName`, once bound.
    pub node: Option<String>,
    /// Why it will never use a reservation (ended, refused by its node,
    /// being deleted); `None` while it may.
    pub ended: Option<String>,
    /// Being deleted or Succeeded: nobody reads an Event about its
    /// Reservation (which goes with it).
    pub gone: bool,
}

impl PodFacts {
    pub(super) fn of(p: &Pod) -> Self {
        let status = p.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref());
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let ended = if p.metadata.deletion_timestamp.is_some() {
            Some("the pod is gone (being deleted)".to_owned())
        } else if matches!(phase, Some("Succeeded" | "Failed")) {
            // kubelet's admission failures (a device plugin's Allocate or
            // the resource manager refusing) end the pod Failed with the
            // reason, e.g. UnexpectedAdmissionError.
            let reason = status.and_then(|s| s.reason.as_deref()).unwrap_or("");
            let message = status.and_then(|s| s.message.as_deref()).unwrap_or("");
            Some(match (phase, reason) {
                (Some("Failed"), r) if !r.is_empty() => format!(
                    "allocation failed on {}: {r}: {message}",
                    node.as_deref().unwrap_or("its node")
                ),
                (Some(ph), _) => format!("the pod ended ({ph})"),
                (None, _) => "the pod ended".to_owned(),
            })
        } else {
            None
        };
        let gone = p.metadata.deletion_timestamp.is_some() || phase == Some("Succeeded");
        PodFacts { node, ended, gone }
    }
}
