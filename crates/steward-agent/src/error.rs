//! Errors of the agent.

use std::path::PathBuf;

/// Errors that stop the agent (or one of its adapters).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid agent configuration: {0}")]
    Config(String),
    #[error("serving pod resources on {path}: {source}")]
    PodResources {
        path: PathBuf,
        #[source]
        source: steward_nodeio::NodeIoError,
    },
    #[error("creating state directory {path}: {source}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("node state store: {0}")]
    State(#[from] StateError),
    #[error("instance store: {0}")]
    Store(#[from] StoreError),
    #[error("discovery handler registration server: {0}")]
    Registration(#[source] steward_discovery::DiscoveryError),
    #[error("configuration source: {0}")]
    Source(#[from] SourceError),
    #[error("agent task {task} failed: {message}")]
    Task { task: &'static str, message: String },
}

/// Errors of the embedded (redb) node store.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("opening {path}: {message}")]
    Open { path: PathBuf, message: String },
    /// Another open handle holds the store: a previous agent still stopping
    /// (a DaemonSet rollout overlapping two pods on one node).
    #[error("{path} is held by another steward agent (still stopping?)")]
    Busy { path: PathBuf },
    /// The store was written by a newer steward: refused untouched.
    #[error(
        "{path} holds node store format {found}, written by a newer steward; this build reads format {supported}. Run that release (or a newer one) on this node: see docs/UPGRADES.md"
    )]
    NewerFormat {
        path: PathBuf,
        found: u64,
        supported: u64,
    },
    #[error("{path} holds node store format {found}, which no steward release wrote")]
    UnknownFormat { path: PathBuf, found: u64 },
    #[error("{op}: {message}")]
    Db { op: &'static str, message: String },
    #[error("encoding {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl StateError {
    pub(crate) fn db(op: &'static str, e: impl std::fmt::Display) -> Self {
        StateError::Db {
            op,
            message: e.to_string(),
        }
    }
}

/// Errors of an [`crate::InstanceStore`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The stored state moved since it was read (409, already exists, gone):
    /// re-read and plan again.
    #[error("instance {name}: conflicting concurrent change ({detail})")]
    Conflict { name: String, detail: String },
    #[error("instance API request {op} {name}: {source}")]
    Api {
        op: &'static str,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("converting instance: {0}")]
    Convert(#[from] steward_api::ConversionError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("instance store gave up after {attempts} conflicting attempts for {config}")]
    TooManyConflicts { config: String, attempts: u32 },
}

/// Errors reading Configurations.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("reading configurations file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing configurations file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("resolving discovery property {property}: {message}")]
    Property { property: String, message: String },
    /// Reading the Secret or ConfigMap a property refers to failed.
    #[error("resolving discovery property {property}: reading {kind} {namespace}/{name}")]
    PropertySource {
        property: String,
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
}

/// Why a Configuration's discovery properties could not be resolved; the
/// text is the `DetailsValid` condition's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unresolved {
    /// Standalone mode reads no Secret or ConfigMap.
    #[error("standalone mode cannot resolve valueFrom for discovery properties {0:?}")]
    Standalone(Vec<String>),
    /// Reading a property or its source failed: the [`SourceError`]'s text
    /// (it holds an API error, which is neither cloned nor compared, and a
    /// re-resolve is reported only when the outcome differs).
    #[error("{0}")]
    Source(String),
}

/// Why a Configuration's discovery details are not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDetails {
    /// Its discovery properties could not be resolved.
    #[error(transparent)]
    Unresolved(#[from] Unresolved),
    /// A discovery handler refused the details, with its message.
    #[error("{0}")]
    Refused(String),
    /// The details were not sent: a property read from a Secret goes only
    /// to a handler inside the agent or on a unix socket, never over a
    /// network connection without TLS.
    #[error(
        "discovery property {property} is read from a Secret and is sent only to a handler \
         embedded in the agent or on a unix socket; handler {handler} is at {endpoint}, a \
         network endpoint without TLS, so nothing was sent to it"
    )]
    SecretWithheld {
        property: String,
        handler: String,
        endpoint: String,
    },
}
