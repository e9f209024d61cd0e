//! Kubernetes Events (`events.k8s.io/v1`, through kube-runtime's
//! `Recorder`, which folds repeats into a series) that never slow the
//! caller: events go through a bounded queue to a background task; when the
//! queue is full an event is dropped and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

/// Events waiting to be written before new ones are dropped.
pub const QUEUE: usize = 256;

/// Where a component's Events go. Cheap to clone; clones share the queue.
#[derive(Clone, Debug)]
pub struct EventSink {
    tx: mpsc::Sender<(Event, ObjectReference)>,
    dropped: Arc<AtomicU64>,
}

impl EventSink {
    /// Starts the writer task, reporting as `controller` (e.g.
    /// `steward-agent`) from `instance` (the node). The task ends when every
    /// sink is dropped.
    pub fn start(
        client: kube::Client,
        controller: &str,
        instance: &str,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = mpsc::channel::<(Event, ObjectReference)>(QUEUE);
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: controller.to_owned(),
                instance: Some(instance.to_owned()),
            },
        );
        let task = tokio::spawn(async move {
            while let Some((event, reference)) = rx.recv().await {
                if let Err(e) = recorder.publish(&event, &reference).await {
                    tracing::debug!(error = %e, reason = %event.reason, "writing an Event failed");
                }
            }
        });
        let sink = Self {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        };
        (sink, task)
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
            self.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%reason, "Event queue full; event dropped");
        }
    }

    /// Events dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// A reference to the Pod `namespace/name` (with its UID when known, so an
/// Event never lands on a later pod of the same name).
pub fn pod_ref(namespace: &str, name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        uid: uid.filter(|u| !u.is_empty()).map(str::to_owned),
        ..ObjectReference::default()
    }
}
