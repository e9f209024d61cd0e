//! Refusals the operator should see where they look first: a container the
//! policy cannot place (not enough exclusive CPUs on one NUMA node, memory
//! that fits no node, a bad resource-manager annotation) is refused to
//! kubelet, which only shows `CreateContainerError`; the reason goes on the
//! Pod as a Warning Event `PolicyDecisionFailed`.

use kube::runtime::events::EventType;
use steward_proto::cri::runtime::v1 as cri;

use super::ResourceManager;
use crate::error::ResmgrError;

/// Reason of the Warning Event on a Pod whose container the policy refused.
pub const POLICY_DECISION_FAILED: &str = "PolicyDecisionFailed";

/// `steward_resmgr_events_total{kind=...}` of a container the policy refused.
pub(crate) const CONTAINER_REFUSED: &str = "container-refused";

impl ResourceManager {
    /// Writes Events on Pods through `sink` from now on (cluster mode). A
    /// second call is ignored.
    pub fn emit_events(&self, sink: steward_kube::EventSink) {
        let _ = self.pod_events.set(sink);
    }

    /// `CreateContainer`: the policy decides, then the runtime creates (see
    /// `create_container_decided`); a policy refusal is also reported on
    /// the Pod.
    pub async fn create_container(
        &self,
        req: cri::CreateContainerRequest,
    ) -> Result<cri::CreateContainerResponse, ResmgrError> {
        let pod = req.sandbox_config.as_ref().and_then(|c| c.metadata.clone());
        let container = req
            .config
            .as_ref()
            .and_then(|c| c.metadata.as_ref())
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let result = self.create_container_decided(req).await;
        if let Err(e) = &result
            && is_policy_refusal(e)
        {
            self.metrics.event(CONTAINER_REFUSED);
        }
        if let (Err(e), Some(pod), Some(sink)) = (&result, pod, self.pod_events.get())
            && is_policy_refusal(e)
        {
            sink.emit(
                steward_kube::pod_ref(&pod.namespace, &pod.name, Some(&pod.uid)),
                EventType::Warning,
                POLICY_DECISION_FAILED,
                "CreateContainer",
                format!("container {container:?} refused by the resource manager: {e}"),
            );
        }
        result
    }
}

/// Whether `e` is the policy's (or the request's) refusal rather than a
/// runtime or transport failure.
pub(crate) fn is_policy_refusal(e: &ResmgrError) -> bool {
    matches!(
        e,
        ResmgrError::Policy { .. }
            | ResmgrError::InvalidRequest { .. }
            | ResmgrError::Annotation { .. }
    )
}
