//! Writing a batch's decisions: a status replaced under the
//! resourceVersion it was decided from, or a proposed Reservation created
//! with its decision; an Event on a rejection or a cancellation the pod
//! outlives.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::events::EventType;
use steward_api::{API_VERSION, Reservation};
use steward_kube::EventSink;

use crate::cluster_picture::Write;
use steward_reservations::ask;

/// Writes of one batch sent at once, at most.
pub(super) const WRITES_IN_FLIGHT: usize = 32;

/// What a status write came to.
pub(super) enum Wrote {
    Done(Box<Reservation>),
    /// The object is gone.
    Gone,
    /// A decided create found its version not served (404).
    Unserved,
    /// Not written (a conflict, the API failing): decided again.
    Not,
}

/// Writes one status under the resourceVersion it was decided from, or
/// creates a proposed Reservation with its status; a conflict is left to
/// the next rebuild (the watch brings the newer object).
pub(super) async fn write(client: &kube::Client, events: &EventSink, w: Write) -> Wrote {
    let api = Api::<Reservation>::namespaced(client.clone(), &w.namespace);
    let status = w.object.status.clone().unwrap_or_default();
    let written = if w.creates() {
        ask::create_decided(client, &w.object).await
    } else {
        api.replace_status(&w.name, &PostParams::default(), &w.object)
            .await
    };
    match written {
        Ok(written) => {
            tracing::debug!(reservation = %w.name, phase = %status.phase, "decided");
            if w.announce {
                let (type_, note) = match status.phase.as_str() {
                    "Rejected" => (
                        EventType::Warning,
                        status.reason.clone().unwrap_or_default(),
                    ),
                    _ => (EventType::Normal, status.reason.clone().unwrap_or_default()),
                };
                events.emit(
                    reservation_ref(&w.namespace, &w.name),
                    type_,
                    &status.phase,
                    "Decide",
                    note,
                );
            }
            Wrote::Done(Box::new(written))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            tracing::debug!(reservation = %w.name, "changed since read; deciding again");
            Wrote::Not
        }
        Err(kube::Error::Api(e)) if e.code == 404 && w.creates() => Wrote::Unserved,
        Err(kube::Error::Api(e)) if e.code == 404 => Wrote::Gone,
        Err(e) => {
            tracing::warn!(reservation = %w.name, error = %e, "writing a decision failed");
            Wrote::Not
        }
    }
}

fn reservation_ref(namespace: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(API_VERSION.into()),
        kind: Some("Reservation".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}
