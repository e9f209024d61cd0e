//! Errors of the kubelet stand-in.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Errors returned by the stand-in's public API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A filesystem operation failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint could not be serialized.
    #[error("cannot encode checkpoint: {0}")]
    CheckpointEncode(#[source] serde_json::Error),
    /// The checkpoint on disk is unreadable or its checksum does not match.
    #[error("checkpoint is corrupted: {0}")]
    CheckpointCorrupt(String),
    /// Binding or serving a gRPC socket failed.
    #[error("gRPC transport error on {socket}: {message}")]
    Transport { socket: PathBuf, message: String },
    /// The pod spec handed to `add_pod` is not acceptable.
    #[error("invalid pod: {0}")]
    InvalidPod(String),
    /// No pod with this UID is known.
    #[error("unknown pod {0}")]
    UnknownPod(String),
    /// `terminate_pod` was given a non-terminal phase.
    #[error("{0:?} is not a terminal pod phase")]
    NotTerminal(crate::pods::Phase),
    /// Admission rejected the pod; `reason`/`message` are what kubelet would
    /// put in the pod status (message without the "Pod was rejected: " prefix).
    #[error("pod {uid} rejected ({reason}): {message}")]
    Admission {
        uid: String,
        reason: String,
        message: String,
    },
    /// The pod was admitted but a container could not be started because the
    /// plugin's PreStartContainer failed (the pod stays Pending).
    #[error("pod {uid} container {container}: {message}")]
    ContainerStart {
        uid: String,
        container: String,
        message: String,
    },
    /// DRA: preparing the pod's ResourceClaims failed (`message` is
    /// kubelet's error, starting with `prepare dynamic resources: `). The pod
    /// stays Pending with reason `FailedPrepareDynamicResources`; kubelet
    /// would retry, the stand-in does not.
    #[error("pod {uid}: Failed to prepare dynamic resources: {message}")]
    PrepareResources { uid: String, message: String },
    /// DRA: unpreparing the pod's ResourceClaims failed (`message` starts
    /// with `unprepare dynamic resources: `); the pod was left as it was.
    #[error("pod {uid}: {message}")]
    UnprepareResources { uid: String, message: String },
    /// A waiter ran out of time.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
    /// The stand-in has been shut down.
    #[error("the kubelet stand-in is shut down")]
    Stopped,
    /// A call to the API server failed.
    #[error("API server: {0}")]
    Api(#[source] Box<kube::Error>),
    /// The API server returned an object without the expected field.
    #[error("API server returned an unusable object: {0}")]
    ApiObject(String),
    /// The test device plugin failed.
    #[error("test device plugin: {0}")]
    Plugin(String),
}

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Error::Api(Box::new(e))
    }
}

/// Renders a gRPC status the way Go's `status.Error` prints it, which is what
/// kubelet embeds in its admission messages.
pub fn go_status_text(status: &tonic::Status) -> String {
    let code = match status.code() {
        tonic::Code::Ok => "OK".to_string(),
        other => format!("{other:?}"),
    };
    format!("rpc error: code = {code} desc = {}", status.message())
}
