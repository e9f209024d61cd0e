//! Kubernetes Events on the objects the agent manages (`events.k8s.io/v1`,
//! through kube-runtime's `Recorder`, which folds repeats into a series).
//! Emitting never waits on the API: events go through a bounded queue to a
//! background task; when the queue is full an event is dropped and counted,
//! so a slow API server never slows Allocate or reclaim.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use steward_api::API_VERSION;
use tokio::sync::mpsc;

/// Events waiting to be written before new ones are dropped.
const QUEUE: usize = 256;

/// Where the agent's Events go. Cheap to clone.
#[derive(Clone, Debug)]
pub struct EventSink {
    tx: mpsc::Sender<(Event, ObjectReference)>,
}

impl EventSink {
    /// Starts the writer task; it ends when every sink is dropped.
    pub fn start(client: kube::Client, node: &str) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = mpsc::channel::<(Event, ObjectReference)>(QUEUE);
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "steward-agent".into(),
                instance: Some(node.to_owned()),
            },
        );
        let task = tokio::spawn(async move {
            while let Some((event, reference)) = rx.recv().await {
                if let Err(e) = recorder.publish(&event, &reference).await {
                    tracing::debug!(error = %e, reason = %event.reason, "writing an Event failed");
                }
            }
        });
        (Self { tx }, task)
    }

    /// Queues an Event about `reference`; never waits.
    pub fn emit(
        &self,
        reference: ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if self.tx.try_send((event, reference)).is_err() {
            tracing::debug!(%reason, "Event queue full; event dropped");
        }
    }

    /// A Normal event on an Instance.
    pub fn instance_normal(&self, namespace: &str, name: &str, reason: &str, note: String) {
        self.emit(
            instance_ref(namespace, name),
            EventType::Normal,
            reason,
            reason,
            note,
        );
    }

    /// A Warning event on an Instance.
    pub fn instance_warning(&self, namespace: &str, name: &str, reason: &str, note: String) {
        self.emit(
            instance_ref(namespace, name),
            EventType::Warning,
            reason,
            reason,
            note,
        );
    }
}

/// A reference to Instance `namespace/name`.
pub fn instance_ref(namespace: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(API_VERSION.into()),
        kind: Some("Instance".into()),
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        ..ObjectReference::default()
    }
}
