//! Errors of the resource manager and their mapping onto gRPC status codes.

use std::path::PathBuf;

/// Everything that can go wrong in the proxy, the pipelines, the cache and
/// the controllers.
#[derive(Debug, thiserror::Error)]
pub enum ResmgrError {
    /// Binding the pod resources socket failed.
    #[error("serving pod resources on {path}: {source}")]
    PodResources {
        path: std::path::PathBuf,
        #[source]
        source: steward_nodeio::NodeIoError,
    },
    /// Binding or preparing the proxy socket failed.
    #[error("listening on {path}: {source}")]
    Listen {
        /// Socket path.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The runtime socket could not be used.
    #[error("runtime at {path} is unreachable: {reason}")]
    RuntimeUnreachable {
        /// Runtime socket path.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// The runtime answered a call with an error.
    #[error("runtime {call} failed: {status}")]
    Runtime {
        /// Name of the CRI call.
        call: &'static str,
        /// Status the runtime returned.
        status: Box<tonic::Status>,
    },
    /// A CRI request carried something we refuse to act on.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A pod annotation this manager owns is malformed.
    #[error("annotation {key}: {reason}")]
    Annotation {
        /// Annotation key.
        key: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A container or pod the request names is not known.
    #[error("{kind} {id} is not known to the resource manager")]
    NotFound {
        /// `pod sandbox` or `container`.
        kind: &'static str,
        /// Its id.
        id: String,
    },
    /// The policy refused or failed.
    #[error("policy: {0}")]
    Policy(String),
    /// Topology discovery failed.
    #[error("topology: {0}")]
    Topology(String),
    /// Reading, writing or decoding the cache failed.
    #[error("cache {path}: {reason}")]
    Cache {
        /// Cache file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// Reading or parsing the configuration failed.
    #[error("configuration {path}: {reason}")]
    Config {
        /// Configuration file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A cgroup file could not be read or written.
    #[error("cgroup {path}: {reason}")]
    Cgroup {
        /// File path.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// An out-of-band controller failed.
    #[error("{controller} controller: {reason}")]
    Controller {
        /// Controller name.
        controller: &'static str,
        /// What failed.
        reason: String,
    },
    /// Talking to the API server (cluster configuration, node publishing)
    /// failed.
    #[error("cluster: {action}: {reason}")]
    Cluster {
        /// What was being done.
        action: String,
        /// What failed.
        reason: String,
    },
    /// The proxy is shutting down.
    #[error("the resource manager is shutting down")]
    ShuttingDown,
}

impl ResmgrError {
    /// The gRPC status the CRI client sees for this error.
    pub fn to_status(&self) -> tonic::Status {
        match self {
            ResmgrError::Runtime { status, .. } => {
                tonic::Status::new(status.code(), status.message().to_owned())
            }
            ResmgrError::RuntimeUnreachable { .. } => tonic::Status::unavailable(self.to_string()),
            ResmgrError::InvalidRequest(_) | ResmgrError::Annotation { .. } => {
                tonic::Status::invalid_argument(self.to_string())
            }
            ResmgrError::NotFound { .. } => tonic::Status::not_found(self.to_string()),
            ResmgrError::Policy(_) => tonic::Status::resource_exhausted(self.to_string()),
            ResmgrError::ShuttingDown => tonic::Status::unavailable(self.to_string()),
            _ => tonic::Status::internal(self.to_string()),
        }
    }

    /// Wrap a runtime status, keeping "cannot connect" apart from "the
    /// runtime said no".
    pub fn runtime(call: &'static str, status: tonic::Status) -> Self {
        ResmgrError::Runtime {
            call,
            status: Box::new(status),
        }
    }
}

impl From<ResmgrError> for tonic::Status {
    fn from(e: ResmgrError) -> Self {
        e.to_status()
    }
}
