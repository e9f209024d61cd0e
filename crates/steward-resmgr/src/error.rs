//! Errors of the resource manager and their mapping onto gRPC status codes.

use std::path::PathBuf;

/// A cause kept as the error's source (an I/O, decoding, API or transport
/// error), so the whole chain reaches the log and the caller.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

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
        /// The transport error, when there is one.
        #[source]
        source: Option<Cause>,
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
    #[error("policy: {source}")]
    Policy {
        /// The policy's own error.
        #[source]
        source: Box<steward_core::cpu::PolicyError>,
    },
    /// Switching policies failed placing a running container; the running
    /// policy stays.
    #[error("switching to {to} failed placing {container}; keeping {keeping}")]
    PolicySwitch {
        /// The policy switched to.
        to: &'static str,
        /// The container it could not place.
        container: String,
        /// The policy kept.
        keeping: &'static str,
        /// Why.
        #[source]
        source: Box<steward_core::cpu::PolicyError>,
    },
    /// The policy answered without an assignment for a container it placed.
    #[error("policy gave {key} no assignment")]
    NoAssignment {
        /// The container key.
        key: String,
    },
    /// Topology discovery failed.
    #[error("topology: {source}")]
    Topology {
        /// The sysfs reader's error.
        #[source]
        source: Box<steward_topology::TopologyError>,
    },
    /// Reading, writing or decoding the cache failed.
    #[error("cache {path}: {action} failed")]
    Cache {
        /// Cache file.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// Why it failed.
        #[source]
        source: Cause,
    },
    /// The cache was written by a newer steward: refused untouched, since
    /// rebuilding it from the runtime would place running containers again
    /// (exclusive CPUs could move).
    #[error(
        "cache {path} holds format {found}, written by a newer steward; this build reads format {supported}. Run that release (or a newer one) on this node: see docs/UPGRADES.md"
    )]
    CacheNewer {
        /// Cache file.
        path: PathBuf,
        /// The file's `version`.
        found: u32,
        /// What this build reads.
        supported: u32,
    },
    /// Reading or parsing the configuration failed.
    #[error("configuration {path}: {reason}")]
    Config {
        /// Configuration file.
        path: PathBuf,
        /// What failed.
        reason: String,
        /// The reader's or parser's error, when there is one.
        #[source]
        source: Option<Cause>,
    },
    /// A cgroup file could not be read or written.
    #[error("cgroup {path}: {reason}")]
    Cgroup {
        /// File path.
        path: PathBuf,
        /// What failed.
        reason: String,
        /// The I/O error, when there is one.
        #[source]
        source: Option<std::io::Error>,
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
    #[error("cluster: {action} failed")]
    Cluster {
        /// What was being done.
        action: String,
        /// The API or encoding error.
        #[source]
        source: Cause,
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
            ResmgrError::Policy { .. } => tonic::Status::resource_exhausted(self.chain()),
            ResmgrError::ShuttingDown => tonic::Status::unavailable(self.to_string()),
            _ => tonic::Status::internal(self.chain()),
        }
    }

    /// The message with every cause in its chain, `: `-separated, for a
    /// caller that sees only text (a gRPC status message).
    pub fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut next = std::error::Error::source(self);
        while let Some(e) = next {
            let text = e.to_string();
            if !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            next = e.source();
        }
        out
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
