//! Kubernetes Events on the objects the agent manages, through
//! `steward_kube::EventSink` (a bounded queue: a slow API server never
//! slows Allocate or reclaim; a full queue drops and counts).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use steward_api::API_VERSION;

/// Where the agent's Events go. Cheap to clone.
#[derive(Clone, Debug)]
pub struct EventSink {
    inner: steward_kube::EventSink,
}

impl EventSink {
    /// Starts the writer task; it ends when every sink is dropped.
    pub fn start(client: kube::Client, node: &str) -> (Self, tokio::task::JoinHandle<()>) {
        let (inner, task) = steward_kube::EventSink::start(client, "steward-agent", node);
        (Self { inner }, task)
    }

    /// Events dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped()
    }

    /// A Normal event on an Instance.
    pub fn instance_normal(&self, namespace: &str, name: &str, reason: &str, note: String) {
        self.inner.emit(
            instance_ref(namespace, name),
            EventType::Normal,
            reason,
            reason,
            note,
        );
    }

    /// A Warning event on an Instance.
    pub fn instance_warning(&self, namespace: &str, name: &str, reason: &str, note: String) {
        self.inner.emit(
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
