//! The session's errors.

use std::path::PathBuf;

use crate::mux::MuxError;
use crate::status::RpcStatus;
use crate::ttrpc::TtrpcError;

/// Why a plugin session could not start or ended.
#[derive(Debug, thiserror::Error)]
pub enum NriError {
    /// Nothing listens at the socket: the runtime has no NRI, or it is off.
    #[error(
        "no NRI socket at {}: containerd 1.6 has no NRI (use the CRI proxy); on 1.7 enable it with [plugins.\"io.containerd.nri.v1.nri\"] disable = false; on 2.x check [plugins.'io.containerd.nri.v1.nri'] (disable, socket_path)",
        path.display()
    )]
    NoSocket {
        /// The socket path tried.
        path: PathBuf,
    },
    /// Connecting failed for another reason.
    #[error("connecting to the NRI socket at {}: {source}", path.display())]
    Connect {
        /// The socket path tried.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// An NRI plugin index is two digits.
    #[error("invalid NRI plugin index {0:?}: must be two digits (00-99)")]
    InvalidIndex(String),
    /// The runtime refused RegisterPlugin.
    #[error("the runtime refused to register NRI plugin {name}: {status}")]
    Registration {
        /// `idx-name`.
        name: String,
        /// The runtime's answer.
        status: RpcStatus,
    },
    /// A call to the runtime got an error status.
    #[error("NRI runtime call {method} failed: {status}")]
    Rpc {
        /// The method called.
        method: &'static str,
        /// The runtime's answer.
        status: RpcStatus,
    },
    /// A call to the runtime got no answer in time.
    #[error("NRI runtime call {method} got no answer within {timeout_ms} ms")]
    Timeout {
        /// The method called.
        method: &'static str,
        /// The time waited.
        timeout_ms: u128,
    },
    /// The runtime's answer did not decode.
    #[error("NRI runtime call {method}: malformed answer: {source}")]
    Decode {
        /// The method called.
        method: &'static str,
        /// prost's reason.
        source: prost::DecodeError,
    },
    /// The connection is gone (the runtime closed it, or it failed).
    #[error("the NRI connection is closed")]
    Closed,
    /// Reading or writing the socket failed.
    #[error("NRI socket I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The runtime sent a frame the multiplexer refuses.
    #[error(transparent)]
    Mux(#[from] MuxError),
    /// A ttrpc message could not be built or read.
    #[error(transparent)]
    Ttrpc(#[from] TtrpcError),
}
