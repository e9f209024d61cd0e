//! Errors of node-local I/O.

use std::path::PathBuf;

/// A node-local I/O operation failed; names the path and what was attempted.
#[derive(Debug, thiserror::Error)]
pub enum NodeIoError {
    /// A path argument cannot be used (relative, no parent, no file name).
    #[error("{path}: {reason}")]
    InvalidPath {
        /// The path given.
        path: PathBuf,
        /// Why it cannot be used.
        reason: &'static str,
    },
    /// A live server already accepts connections on the socket.
    #[error("{path} is in use by a running server")]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// Something other than a socket exists at the socket path.
    #[error("{path} exists and is not a socket")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A system call failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was attempted ("bind", "rename into", ...).
        action: &'static str,
        /// The path it was attempted on.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl NodeIoError {
    pub(crate) fn io(action: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }

    /// The kind of I/O error this corresponds to.
    pub fn kind(&self) -> std::io::ErrorKind {
        match self {
            Self::InvalidPath { .. } => std::io::ErrorKind::InvalidInput,
            Self::InUse { .. } => std::io::ErrorKind::AddrInUse,
            Self::NotASocket { .. } => std::io::ErrorKind::AlreadyExists,
            Self::Io { source, .. } => source.kind(),
        }
    }
}

impl From<NodeIoError> for std::io::Error {
    fn from(e: NodeIoError) -> Self {
        std::io::Error::new(e.kind(), e)
    }
}
